"""Integer index arithmetic that runs the same in Python, numpy and MLIR.

Fragment layouts, ldmatrix lane addresses and shared-memory swizzles are written once as plain
Python functions over "int-like" values using ``+ - * // % ^ & | >> <<``. Called with Python ints
(or numpy arrays) they give the tables the CPU tests check and the warp simulator uses; called with
an `IntVal` (an i32 SSA value of a kernel, e.g. the lane id) the same expression emits ``arith``
ops. So the layout a kernel uses is, by construction, the layout the tests verified.

Semantics: every value is a *non-negative* 32-bit integer (lane ids, offsets, coordinates);
``//`` and ``%`` are unsigned and become shifts/masks for power-of-two divisors. Expressions with
only Python ints fold in Python and emit nothing.
"""
from __future__ import annotations

from typing import Union

from ..._mlir import arith, ir


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


class IntVal:
    """An i32 value with Python integer operators (emits ``arith`` at the insertion point).

    ``+``, ``-`` and ``*`` by a Python int stay symbolic: an IntVal is an affine form
    ``sum(coeff * atom) + const`` over SSA values (atoms), emitted when its ``value`` is asked
    for. An address like ``(row0 + 8) * 129 + (col + 72) + 4096`` is thus emitted as one shared
    variable part plus one constant, instead of every element re-deriving its own product:
    LLVM's straight-line strength reduction is quadratic in such products (38 of 48 s of the
    NVPTX backend on the largest kernel), and ptxas folds a constant into the load's offset.
    The value is the same modulo 2^32 (``+ - *`` are ring operations); every other operator
    emits its op on the materialized value and starts a new atom."""

    __slots__ = ("_terms", "_const", "_value", "_block")

    def __init__(self, value):
        if isinstance(value, IntVal):
            self._terms, self._const = value._terms, value._const
            self._value, self._block = value._value, value._block
            return
        if not isinstance(value.type, ir.IntegerType) or ir.IntegerType(value.type).width != 32:
            if isinstance(value.type, ir.IndexType):
                value = arith.index_cast(_i32(), value)
            else:
                raise TypeError(f"IntVal needs an i32 or index value, got {value.type}")
        self._terms = ((value, 1),)
        self._const = 0
        self._value = value
        self._block = _ATOM             # valid wherever its value is

    @classmethod
    def _affine(cls, terms: dict, const: int) -> "IntLike":
        terms = {v: c for v, c in terms.items() if c}
        if not terms:
            return const
        out = cls.__new__(cls)
        out._terms = tuple(terms.items())
        out._const = const
        out._value = None
        out._block = None
        return out

    @property
    def value(self) -> ir.Value:
        """The i32 SSA value (the affine form emitted at the insertion point, once per block)."""
        block = _append_block()
        if self._value is not None and (self._block is _ATOM or
                                        (block is not None and block == self._block)):
            return self._value
        acc = None
        for v, c in self._terms:
            term = v if c in (1, -1) else _scaled(v, abs(c))
            if acc is None:
                acc = term if c > 0 else arith.subi(as_i32(0), term)
            else:
                acc = arith.addi(acc, term) if c > 0 else arith.subi(acc, term)
        if self._const > 0:
            acc = arith.addi(acc, as_i32(self._const))
        elif self._const < 0:
            acc = arith.subi(acc, as_i32(-self._const))
        if block is not None:   # reused only by later ops of this block (they follow it)
            self._value, self._block = acc, block
        return acc

    def split_const(self) -> tuple["IntVal", int]:
        """(the variable part, the constant part): an address ``base + const`` as the shared
        base and an immediate offset."""
        if not self._const:
            return self, 0
        return self._affine(dict(self._terms), 0), self._const

    def _linear(self, other, sign: int):
        if isinstance(other, bool):
            other = int(other)
        if isinstance(other, int):
            return self._affine(dict(self._terms), self._const + sign * other)
        if not isinstance(other, IntVal):
            other = IntVal(as_i32(other))
        terms = dict(self._terms)
        for v, c in other._terms:
            terms[v] = terms.get(v, 0) + sign * c
        return self._affine(terms, self._const + sign * other._const)

    # -- binary operators ------------------------------------------------------------------
    def __add__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return self._linear(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return self._linear(other, -1)

    def __rsub__(self, other):
        return (-1 * self)._linear(other, 1)

    def __mul__(self, other):
        if isinstance(other, bool):
            other = int(other)
        if isinstance(other, int):
            if other == 0:
                return 0
            if other == 1:
                return self
            return self._affine({v: c * other for v, c in self._terms}, self._const * other)
        return IntVal(arith.muli(self.value, as_i32(other)))

    __rmul__ = __mul__

    def __floordiv__(self, other):
        if isinstance(other, int):
            if other == 1:
                return self
            if _is_pow2(other):
                return IntVal(arith.shrui(self.value, as_i32(other.bit_length() - 1)))
        return IntVal(arith.divui(self.value, as_i32(other)))

    def __rfloordiv__(self, other):
        return IntVal(arith.divui(as_i32(other), self.value))

    def __mod__(self, other):
        if isinstance(other, int):
            if other == 1:
                return 0
            if _is_pow2(other):
                return IntVal(arith.andi(self.value, as_i32(other - 1)))
        return IntVal(arith.remui(self.value, as_i32(other)))

    def __rmod__(self, other):
        return IntVal(arith.remui(as_i32(other), self.value))

    def __xor__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return IntVal(arith.xori(self.value, as_i32(other)))

    __rxor__ = __xor__

    def __and__(self, other):
        if isinstance(other, int) and other == 0:
            return 0
        return IntVal(arith.andi(self.value, as_i32(other)))

    __rand__ = __and__

    def __or__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return IntVal(arith.ori(self.value, as_i32(other)))

    __ror__ = __or__

    def __rshift__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return IntVal(arith.shrui(self.value, as_i32(other)))

    def __lshift__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return IntVal(arith.shli(self.value, as_i32(other)))

    # -- comparisons return i1 values (for masks / predicates) ------------------------------
    def lt(self, other) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.ult, self.value, as_i32(other))

    def le(self, other) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.ule, self.value, as_i32(other))

    def eq(self, other) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.eq, self.value, as_i32(other))

    def __repr__(self) -> str:
        return f"IntVal({self.value.get_name() if hasattr(self.value, 'get_name') else self.value})"


IntLike = Union[int, IntVal]


_ATOM = object()


def _append_block():
    """The block the insertion point appends to (None when it inserts before an op: a value
    emitted there may follow a later insertion point, so it is not reused)."""
    try:
        ip = ir.InsertionPoint.current
    except ValueError:          # no insertion point: nothing can be emitted either
        return None
    return ip.block if ip.ref_operation is None else None


def _scaled(v: ir.Value, k: int) -> ir.Value:
    """``v * k`` for k > 1 (a shift for a power of two)."""
    if _is_pow2(k):
        return arith.shli(v, as_i32(k.bit_length() - 1))
    return arith.muli(v, as_i32(k))


def as_i32(x) -> ir.Value:
    """An i32 SSA value for an int, an `IntVal`, or an existing i32/index value."""
    if isinstance(x, IntVal):
        return x.value
    if isinstance(x, bool):
        x = int(x)
    if isinstance(x, int):
        return arith.constant(_i32(), x)
    if isinstance(x, ir.Value):
        return IntVal(x).value
    raise TypeError(f"cannot use {type(x).__name__} as an i32")


def ival(x) -> IntLike:
    """Coerce an int / i32 value / IntVal to an int or IntVal (ints stay Python ints)."""
    if isinstance(x, (int, IntVal)):
        return x
    return IntVal(x)


def select(cond: ir.Value, a, b) -> IntVal:
    """``cond ? a : b`` on i32 values."""
    return IntVal(arith.select(cond, as_i32(a), as_i32(b)))
