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
    """An i32 SSA value with Python integer operators (emits ``arith`` at the insertion point)."""

    __slots__ = ("value",)

    def __init__(self, value: ir.Value):
        if isinstance(value, IntVal):
            value = value.value
        if not isinstance(value.type, ir.IntegerType) or ir.IntegerType(value.type).width != 32:
            if isinstance(value.type, ir.IndexType):
                value = arith.index_cast(_i32(), value)
            else:
                raise TypeError(f"IntVal needs an i32 or index value, got {value.type}")
        self.value = value

    # -- binary operators ------------------------------------------------------------------
    def __add__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return IntVal(arith.addi(self.value, as_i32(other)))

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        return IntVal(arith.subi(self.value, as_i32(other)))

    def __rsub__(self, other):
        return IntVal(arith.subi(as_i32(other), self.value))

    def __mul__(self, other):
        if isinstance(other, int):
            if other == 0:
                return 0
            if other == 1:
                return self
            if _is_pow2(other):
                return IntVal(arith.shli(self.value, as_i32(other.bit_length() - 1)))
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
