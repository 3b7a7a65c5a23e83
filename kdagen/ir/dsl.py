"""A small Python DSL that builds kda-dialect programs.

Tiles are Python objects wrapping MLIR values; arithmetic operators, ``@`` (matmul), ``.T``
(transpose, folded into ``kda.dot`` when used there) and numpy-style broadcasting
(``beta[:, None]`` makes a per-row value broadcast over columns, a ``[K]`` vector broadcasts over
rows, rank-0 values over anything) emit kda ops at the current insertion point. Every
broadcast is an explicit ``kda.broadcast`` op in the IR, so reverse-mode differentiation turns it
into an explicit ``kda.reduce_sum``.

Programs are built with :class:`ProgramBuilder`::

    p = ProgramBuilder("kda_fwd", attrs={...})
    q = p.input("q", "token", [K], "bf16", heads="qk")
    o = p.output("o", "token", [V], "bf16")
    with p.body():
        scan = p.scan([S0], names=["S"])
        with scan as (c, S):
            ...
            scan.yield_(S_next)
    module = p.finish()

Values get readable SSA names: pass ``name=`` to an op function, call ``t.named("kd")``, or call
:func:`name_locals` with ``locals()`` at the end of a block to name every tile by its variable.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Sequence

from kdagen._mlir import func, ir
from kdagen.ir.dialect import make_context, value_part_shape, verify

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

__all__ = [
    "Tile", "Mem", "ProgramBuilder", "Scan",
    "exp2", "log2", "exp", "log", "sigmoid", "softplus", "rsqrt", "sqrt", "where", "select",
    "cumsum", "rev_cumsum", "tril", "strict_tril", "tril_inv", "tril_solve", "dot",
    "reduce_sum", "row_sum", "broadcast", "broadcast_to", "extract_row", "last_row", "embed_row",
    "constant", "zeros", "zeros_like", "convert", "assume_range", "clamp", "in_range", "l2norm",
    "transpose",
    "name_locals", "element_type", "tile_type", "LOG2E", "LN2",
]

_DTYPES = {
    "bf16": lambda: ir.BF16Type.get(),
    "fp16": lambda: ir.F16Type.get(),
    "fp32": lambda: ir.F32Type.get(),
    "f32": lambda: ir.F32Type.get(),
    "i1": lambda: ir.IntegerType.get_signless(1),
    "i32": lambda: ir.IntegerType.get_signless(32),
    "i64": lambda: ir.IntegerType.get_signless(64),
}


def element_type(dtype) -> ir.Type:
    """An MLIR element type from a name ('bf16', 'fp16', 'fp32', 'i64', ...) or a type."""
    if isinstance(dtype, ir.Type):
        return dtype
    try:
        return _DTYPES[dtype]()
    except KeyError:
        raise ValueError(f"unknown element type {dtype!r}; expected one of {sorted(_DTYPES)}") from None


def tile_type(shape: Sequence[int], dtype="fp32") -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), element_type(dtype))


# --------------------------------------------------------------------------------------
# op creation helpers
# --------------------------------------------------------------------------------------


def _loc(name):
    return ir.Location.name(name) if name else ir.Location.unknown()


def _bool(b):
    return ir.BoolAttr.get(bool(b))


def _int(i):
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(i))


def _float(x):
    return ir.FloatAttr.get(ir.F64Type.get(), float(x))


def _str(s):
    return ir.StringAttr.get(str(s))


def _dims(ds):
    return ir.DenseI64ArrayAttr.get([int(d) for d in ds])


def create(opname: str, result_types=(), operands=(), attrs=None, name=None, regions=0):
    """Create ``kda.<opname>`` (or a full op name) at the current insertion point."""
    full = opname if "." in opname else f"kda.{opname}"
    ops = [o.value if isinstance(o, (Tile, Mem)) else o for o in operands]
    return ir.Operation.create(full, results=list(result_types), operands=ops,
                               attributes=dict(attrs or {}), regions=regions, loc=_loc(name))


def _parts(value_parts: int, value_axis: int = -1) -> dict:
    """The ``value_parts`` attribute of a memory op that moves one part of the value dim: a
    program split over the value columns (the decode programs' ``value_split``) runs once per
    part, part p holding columns [p·V/P, (p+1)·V/P) of every value-indexed tile; nothing for
    an unsplit op. ``value_axis``: the memref dim that is V (-1; -2 for a state stored
    value-first, [V, K])."""
    if value_parts <= 1:
        return {}
    return {"value_parts": _int(value_parts),
            **({"value_axis": _int(value_axis)} if value_axis != -1 else {})}


def _op1(opname, result_type, operands, attrs=None, name=None) -> "Tile":
    return Tile(create(opname, [result_type], operands, attrs, name).result)


def value_name(value) -> str | None:
    """The DSL name of a value (its NameLoc), or None."""
    loc = str(value.location if isinstance(value, ir.BlockArgument) else value.owner.location)
    if loc.startswith('loc("'):
        return loc[5:loc.index('"', 5)]
    return None


def set_name(value: ir.Value, name: str) -> ir.Value:
    """Give ``value`` the SSA name ``name``; returns the (possibly new) value.

    Block arguments are renamed in place; an op result is renamed by re-creating its
    (region-free) defining op with a NameLoc and replacing all uses.
    """
    if isinstance(value, ir.BlockArgument):
        value.set_location(ir.Location.name(name))
        return value
    op = value.owner
    op = op.operation if hasattr(op, "operation") else op
    if len(op.regions):
        raise ValueError(f"cannot rename a result of {op.name} (it has regions); name it when created")
    idx = list(op.results).index(value)
    attrs = {a: op.attributes[a] for a in (na.name if hasattr(na, "name") else na for na in op.attributes)}
    new = ir.Operation.create(op.name, results=[r.type for r in op.results], operands=list(op.operands),
                              attributes=attrs, loc=ir.Location.name(name),
                              ip=ir.InsertionPoint(op))
    for old_r, new_r in zip(op.results, new.results):
        old_r.replace_all_uses_with(new_r)
    op.erase()
    return new.results[idx]


# --------------------------------------------------------------------------------------
# tiles
# --------------------------------------------------------------------------------------


class Tile:
    """A tile value (builtin ranked tensor) with operators that emit kda ops.

    ``_view`` is a numpy-style view used only for broadcasting: a tuple with, per view axis,
    the index of the real dim or None for an inserted axis (``x[:, None]``). ``_t`` marks a
    pending transpose (``x.T``), folded into ``kda.dot`` or materialised as ``kda.transpose``.
    """

    __slots__ = ("value", "_view", "_t")
    __array_priority__ = 100

    def __init__(self, value, view=None, transposed=False):
        self.value = value
        self._view = view
        self._t = transposed

    # -- type info
    @property
    def type(self) -> ir.RankedTensorType:
        return ir.RankedTensorType(self.value.type)

    @property
    def shape(self) -> tuple:
        s = tuple(self.type.shape)
        return s[::-1] if self._t else s

    @property
    def dtype(self) -> ir.Type:
        return self.type.element_type

    @property
    def name(self):
        return value_name(self.value)

    def __repr__(self):
        return f"Tile({self.name or '?'}: {self.value.type})"

    # -- materialisation
    def _plain(self) -> "Tile":
        if self._t:
            return transpose(Tile(self.value))
        return Tile(self.value) if self._view is not None else self

    def _view_shape(self):
        s = self._plain().shape if self._t else tuple(self.type.shape)
        if self._view is None:
            return s
        return tuple(1 if d is None else s[d] for d in self._view)

    def named(self, name: str) -> "Tile":
        """This tile with SSA name ``name``."""
        t = self._plain()
        return Tile(set_name(t.value, name))

    # -- views
    @property
    def T(self) -> "Tile":
        if len(self.shape) != 2:
            raise ValueError(".T needs a 2-D tile")
        return Tile(self.value, transposed=not self._t)

    def __getitem__(self, idx):
        """Only axis insertion for broadcasting: ``x[:, None]``, ``x[None, :]``, ``x[None]``."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        base = self._plain()
        rank = len(base.shape)
        view, d = [], 0
        for it in idx:
            if it is None:
                view.append(None)
            elif isinstance(it, slice) and it == slice(None):
                view.append(d)
                d += 1
            elif it is Ellipsis:
                while d < rank - sum(1 for j in idx[idx.index(it) + 1:] if j is not None):
                    view.append(d)
                    d += 1
            else:
                raise IndexError("tiles support only [:, None]-style axis insertion")
        while d < rank:
            view.append(d)
            d += 1
        return Tile(base.value, view=tuple(view))

    # -- conversions
    def f32(self) -> "Tile":
        return self.to("fp32")

    def to(self, dtype, name=None) -> "Tile":
        return convert(self, dtype, name=name)

    # -- arithmetic
    def __add__(self, o):
        return _binary("add", self, o)

    def __radd__(self, o):
        return _binary("add", o, self)

    def __sub__(self, o):
        return _binary("sub", self, o)

    def __rsub__(self, o):
        return _binary("sub", o, self)

    def __mul__(self, o):
        return _binary("mul", self, o)

    def __rmul__(self, o):
        return _binary("mul", o, self)

    def __truediv__(self, o):
        return _binary("div", self, o)

    def __rtruediv__(self, o):
        return _binary("div", o, self)

    def __neg__(self):
        t = self._plain()
        return _op1("neg", t.type, [t])

    def __pow__(self, n):
        if not isinstance(n, int) or n < 1:
            raise ValueError("tile ** n needs a positive int n (emitted as multiplications)")
        t = self._plain()
        out = t
        for _ in range(n - 1):
            out = out * t
        return out

    def __matmul__(self, o):
        return dot(self, o)

    def __rmatmul__(self, o):
        return dot(o, self)


def _as_tile(x) -> Tile:
    if isinstance(x, Tile):
        return x
    if isinstance(x, ir.Value):
        return Tile(x)
    raise TypeError(f"expected a tile, got {type(x).__name__}")


def _broadcast_shape(a, b):
    ra, rb = len(a), len(b)
    r = max(ra, rb)
    a = (1,) * (r - ra) + tuple(a)
    b = (1,) * (r - rb) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _expand(t: Tile, shape) -> Tile:
    """Broadcast tile ``t`` (with its view) to ``shape`` with an explicit kda.broadcast."""
    base = t._plain() if t._t else Tile(t.value)
    real = tuple(base.shape)
    if t._view is None and real == tuple(shape):
        return base
    view = t._view if t._view is not None else tuple(range(len(real)))
    pad = len(shape) - len(view)
    view = (None,) * pad + tuple(view)
    new_dims = []
    for i, (v, s) in enumerate(zip(view, shape)):
        if v is None:
            new_dims.append(i)
        elif real[v] != s:
            raise ValueError(f"cannot broadcast {list(real)} to {list(shape)}")
    kept = [v for v in view if v is not None]
    if kept != sorted(kept):
        raise ValueError("broadcasting may not permute dims")
    if not new_dims:
        return base
    return broadcast(base, shape, new_dims)


def _binary(opname, a, b) -> Tile:
    if not isinstance(a, Tile) and not isinstance(b, Tile):
        raise TypeError("at least one operand must be a tile")
    ta = a if isinstance(a, Tile) else None
    tb = b if isinstance(b, Tile) else None
    if ta is not None and tb is not None:
        shape = _broadcast_shape(ta._view_shape(), tb._view_shape())
        if ta.dtype != tb.dtype:
            raise TypeError(f"kda.{opname}: element types differ ({ta.dtype} vs {tb.dtype}); convert first")
        dt = ta.dtype
    else:
        t = ta if ta is not None else tb
        shape = t._view_shape()
        dt = t.dtype
    a = constant(a, shape, dt) if ta is None else _expand(ta, shape)
    b = constant(b, shape, dt) if tb is None else _expand(tb, shape)
    return _op1(opname, a.type, [a, b])


# --------------------------------------------------------------------------------------
# op functions
# --------------------------------------------------------------------------------------


def constant(value: float, shape=(), dtype="fp32", name=None) -> Tile:
    """A tile of ``shape`` filled with ``value`` (``kda.constant``)."""
    return _op1("constant", tile_type(shape, dtype), [], {"value": _float(value)}, name or "cst")


def zeros(shape, dtype="fp32", name=None) -> Tile:
    return constant(0.0, shape, dtype, name)


def zeros_like(t, name=None) -> Tile:
    t = _as_tile(t)
    return constant(0.0, t.shape, t.dtype, name)


def _unary(opname):
    def f(x, name=None) -> Tile:
        x = _as_tile(x)._plain()
        return _op1(opname, x.type, [x], None, name)
    f.__name__ = opname
    f.__doc__ = f"``kda.{opname}`` (elementwise)."
    return f


exp2 = _unary("exp2")
log2 = _unary("log2")
sigmoid = _unary("sigmoid")
softplus = _unary("softplus")
rsqrt = _unary("rsqrt")


def exp(x, name=None) -> Tile:
    """Natural exp, written as ``exp2(x * log2(e))`` (kernels compute in log2 space)."""
    return exp2(_as_tile(x) * LOG2E, name=name)


def log(x, name=None) -> Tile:
    """Natural log, written as ``log2(x) * ln(2)``."""
    return _binary("mul", log2(x), LN2) if name is None else (log2(x) * LN2).named(name)


def sqrt(x, name=None) -> Tile:
    x = _as_tile(x)
    r = x * rsqrt(x)
    return r.named(name) if name else r


def convert(x, dtype, name=None) -> Tile:
    """Element type conversion (``kda.convert``); a no-op when the type already matches."""
    x = _as_tile(x)._plain()
    et = element_type(dtype)
    if x.dtype == et:
        return x
    return _op1("convert", tile_type(x.shape, et), [x], None, name)


def where(cond, a, b, name=None) -> Tile:
    """``cond ? a : b`` (``kda.select``); cond an i1 tile, broadcast like arithmetic."""
    cond = _as_tile(cond)
    ta = a if isinstance(a, Tile) else None
    tb = b if isinstance(b, Tile) else None
    ref = ta if ta is not None else tb
    shape = cond._view_shape()
    for t in (ta, tb):
        if t is not None:
            shape = _broadcast_shape(shape, t._view_shape())
    dt = ref.dtype
    a = constant(a, shape, dt) if ta is None else _expand(ta, shape)
    b = constant(b, shape, dt) if tb is None else _expand(tb, shape)
    c = _expand(cond, shape)
    return _op1("select", a.type, [c, a, b], None, name)


select = where


def assume_range(x, lo: float, hi: float, name=None) -> Tile:
    """Identity declaring ``lo <= x <= hi`` (for the exponent-range analysis)."""
    x = _as_tile(x)._plain()
    return _op1("assume_range", x.type, [x], {"lo": _float(lo), "hi": _float(hi)}, name)


def clamp(x, lo: float, hi: float, name=None) -> Tile:
    """``min(max(x, lo), hi)`` (``kda.clamp``; NaN stays NaN). Its gradient is the identity
    inside [lo, hi] (boundaries included) and zero outside, as torch.clamp's."""
    x = _as_tile(x)._plain()
    return _op1("clamp", x.type, [x], {"lo": _float(lo), "hi": _float(hi)}, name)


def in_range(x, lo: float, hi: float, name=None) -> Tile:
    """The i1 tile ``lo <= x <= hi`` (``kda.in_range``; false for NaN)."""
    x = _as_tile(x)._plain()
    return _op1("in_range", tile_type(x.shape, "i1"), [x], {"lo": _float(lo), "hi": _float(hi)},
                name)


def broadcast(x, shape, dims, name=None) -> Tile:
    """Explicit ``kda.broadcast``: ``dims`` are the result dims that x lacks."""
    x = _as_tile(x)._plain()
    return _op1("broadcast", tile_type(shape, x.dtype), [x], {"dims": _dims(dims)}, name)


def broadcast_to(x, shape, name=None) -> Tile:
    """numpy-style broadcast of ``x`` (with its ``[:, None]`` view) to ``shape``."""
    t = _expand(_as_tile(x), tuple(shape))
    return t.named(name) if name else t


def reduce_sum(x, dims, name=None) -> Tile:
    """Sum over ``dims`` (``kda.reduce_sum``)."""
    x = _as_tile(x)._plain()
    dims = sorted(d % len(x.shape) for d in dims)
    shape = [s for i, s in enumerate(x.shape) if i not in dims]
    return _op1("reduce_sum", tile_type(shape, x.dtype), [x], {"dims": _dims(dims)}, name)


def row_sum(x, name=None) -> Tile:
    """Per-row sum of a [C, D] tile -> [C]."""
    return reduce_sum(x, [1], name=name)


def cumsum(x, reverse=False, name=None) -> Tile:
    """Inclusive cumulative sum over the rows of the chunk (``reverse``: suffix sums)."""
    x = _as_tile(x)._plain()
    return _op1("cumsum", x.type, [x], {"reverse": _bool(reverse)}, name)


def rev_cumsum(x, name=None) -> Tile:
    return cumsum(x, reverse=True, name=name)


def tril(x, diagonal=0, name=None) -> Tile:
    """Keep entries with j <= i + diagonal."""
    x = _as_tile(x)._plain()
    return _op1("tril", x.type, [x], {"diagonal": _int(diagonal)}, name)


def strict_tril(x, name=None) -> Tile:
    return tril(x, -1, name=name)


def tril_inv(x, name=None) -> Tile:
    """``(I + strict_tril(x))^-1``."""
    x = _as_tile(x)._plain()
    return _op1("tril_inv", x.type, [x], None, name)


def tril_solve(L, B, name=None) -> Tile:
    """``(I + strict_tril(L))^-1 @ B``."""
    L, B = _as_tile(L)._plain(), _as_tile(B)._plain()
    return _op1("tril_solve", B.type, [L, B], None, name)


def transpose(x, name=None) -> Tile:
    x = Tile(_as_tile(x).value)
    s = x.shape
    return _op1("transpose", tile_type((s[1], s[0]), x.dtype), [x], None, name)


def dot(a, b, name=None, transpose_a=False, transpose_b=False) -> Tile:
    """Tile matmul; ``a.T @ b`` and ``a @ b.T`` fold into the op's transpose flags."""
    a, b = _as_tile(a), _as_tile(b)
    ta, tb = a._t ^ bool(transpose_a), b._t ^ bool(transpose_b)
    A, B = Tile(a.value), Tile(b.value)
    sa, sb = A.shape, B.shape
    m, k1 = (sa[1], sa[0]) if ta else sa
    k2, n = (sb[1], sb[0]) if tb else sb
    if k1 != k2:
        raise ValueError(f"dot: inner dims differ ({k1} vs {k2})")
    if A.dtype != B.dtype:
        raise TypeError("dot: operand element types differ")
    return _op1("dot", tile_type((m, n), A.dtype), [A, B],
                {"transpose_lhs": _bool(ta), "transpose_rhs": _bool(tb)}, name)


def extract_row(x, index, name=None) -> Tile:
    x = _as_tile(x)._plain()
    return _op1("extract_row", tile_type(x.shape[1:], x.dtype), [x], {"index": _int(index)}, name)


def last_row(x, name=None) -> Tile:
    """The last row of the chunk (Γ_C from Γ)."""
    return extract_row(x, -1, name=name)


def embed_row(x, index, rows, name=None) -> Tile:
    x = _as_tile(x)._plain()
    return _op1("embed_row", tile_type((rows, *x.shape), x.dtype), [x], {"index": _int(index)}, name)


def l2norm(x, eps=1e-6, name=None) -> Tile:
    """``x / sqrt(sum(x^2) + eps)`` per row, as ``x * rsqrt(row_sum(x*x) + eps)[:, None]``."""
    x = _as_tile(x)
    inv = rsqrt(row_sum(x * x) + eps)
    r = x * inv[:, None]
    return r.named(name) if name else r


def name_locals(scope: dict, prefix: str = "") -> None:
    """Name every unnamed tile in ``scope`` (pass ``locals()``) after its variable.

    Call it last in a block: renaming re-creates ops, so tiles held elsewhere become stale.
    """
    seen = set()
    for var, t in list(scope.items()):
        if not isinstance(t, Tile) or var.startswith("_"):
            continue
        v = t.value
        if v in seen:
            continue
        seen.add(v)
        if value_name(v) is None:
            set_name(v, prefix + var)


# --------------------------------------------------------------------------------------
# programs
# --------------------------------------------------------------------------------------


class Mem:
    """A global tensor (memref program argument or workspace) with its kda metadata."""

    __slots__ = ("value", "name", "layout", "role", "heads")

    def __init__(self, value, name, layout, role, heads=None):
        self.value, self.name, self.layout, self.role, self.heads = value, name, layout, role, heads

    @property
    def type(self) -> ir.MemRefType:
        return ir.MemRefType(self.value.type)

    @property
    def dtype(self):
        return self.type.element_type

    @property
    def tail(self) -> tuple:
        return tuple(self.type.shape[_LEADING_DIMS[self.layout]:])

    def __repr__(self):
        return f"Mem({self.name}: {self.value.type})"


#: the leading (dynamic) dims of each memref layout: token [B, T, H], head [HV], state
#: [N, HV], chunk [total chunks, HV], seqlens [N + 1], pool [slots, HV] (a state pool, rows
#: chosen per sequence by a slot table), slots [N] (the slot table)
_LEADING_DIMS = {"token": 3, "head": 1, "state": 2, "chunk": 2, "seqlens": 1, "pool": 2,
                 "slots": 1}


def memref_type(layout: str, tail: Sequence[int], dtype) -> ir.MemRefType:
    dyn = ir.ShapedType.get_dynamic_size()
    return ir.MemRefType.get([dyn] * _LEADING_DIMS[layout] + list(tail), element_type(dtype))


class Scan:
    """A ``kda.scan`` under construction; use as a context manager giving (chunk, *carried)."""

    def __init__(self, inits, names=None, reverse=False, name=None):
        inits = [_as_tile(t)._plain() for t in inits]
        self.op = create("scan", [t.type for t in inits], inits, {"reverse": _bool(reverse)}, name,
                         regions=1)
        self.block = self.op.regions[0].blocks.append(ir.IndexType.get(), *[t.type for t in inits])
        args = list(self.block.arguments)
        args[0].set_location(ir.Location.name("c"))
        for a, n in zip(args[1:], names or []):
            if n:
                a.set_location(ir.Location.name(n))
        self._ip = None
        self._yielded = False

    @property
    def chunk(self):
        return self.block.arguments[0]

    @property
    def carried(self):
        return [Tile(a) for a in list(self.block.arguments)[1:]]

    def __enter__(self):
        self._ip = ir.InsertionPoint(self.block)
        self._ip.__enter__()
        return (self.chunk, *self.carried)

    def yield_(self, *values):
        vals = [_as_tile(v)._plain() for v in values]
        want = [a.type for a in list(self.block.arguments)[1:]]
        if [v.type for v in vals] != want:
            raise TypeError(f"scan yields {[str(v.type) for v in vals]}, carried types are {[str(t) for t in want]}")
        create("gpu.yield", [], vals)
        self._yielded = True

    def __exit__(self, *exc):
        self._ip.__exit__(*exc)
        if exc[0] is None and not self._yielded:
            raise RuntimeError("scan body ended without scan.yield_(...)")
        return False

    @property
    def results(self) -> list:
        return [Tile(r) for r in self.op.results]


class ProgramBuilder:
    """Builds one program: a ``func.func`` of kda ops in a fresh kda context.

    Declare arguments with :meth:`input` / :meth:`output` / :meth:`scalar_input` first, then
    build the body inside ``with p.body():``, then :meth:`finish`.
    """

    def __init__(self, name: str, attrs: dict | None = None, context: ir.Context | None = None):
        self.name = name
        self.ctx = context or make_context()
        self.attrs = dict(attrs or {})
        self._args = []  # (name, type, attrs dict)
        self.mems: dict[str, Mem] = {}
        self.module = None
        self.func = None
        self._entered = []

    # -- arguments
    def _arg(self, name, typ, attrs):
        if any(a[0] == name for a in self._args):
            raise ValueError(f"duplicate argument {name!r}")
        self._args.append((name, typ, attrs))
        return name

    def input(self, name, layout, tail, dtype, heads=None, **extra):
        """A global input tensor (``layout``: token / head / state / seqlens / pool / slots)."""
        with self.ctx, ir.Location.unknown():
            t = memref_type(layout, tail, dtype)
        self._arg(name, t, dict(role="input", layout=layout, heads=heads, **extra))
        return name

    def output(self, name, layout, tail, dtype, heads=None, **extra):
        with self.ctx, ir.Location.unknown():
            t = memref_type(layout, tail, dtype)
        self._arg(name, t, dict(role="output", layout=layout, heads=heads, **extra))
        return name

    def scalar_input(self, name, default=None):
        with self.ctx, ir.Location.unknown():
            t = ir.F32Type.get()
        self._arg(name, t, dict(role="input", layout="scalar", default=default))
        return name

    def declare(self, name, typ, attrs):
        """Declare an argument with an explicit type and raw attribute dict."""
        self._arg(name, typ, dict(attrs))

    # -- body
    @contextmanager
    def body(self):
        with self.ctx, ir.Location.unknown():
            self.module = ir.Module.create()
            with ir.InsertionPoint(self.module.body):
                ftype = ir.FunctionType.get([a[1] for a in self._args], [])
                self.func = func.FuncOp(self.name, ftype)
                block = self.func.add_entry_block()
            arg_attrs = []
            for (name, typ, attrs), barg in zip(self._args, block.arguments):
                barg.set_location(ir.Location.name(name))
                d = {"kda.name": _str(name)}
                for k, v in attrs.items():
                    if v is None:
                        continue
                    d[f"kda.{k}"] = _to_attr(v)
                arg_attrs.append(ir.DictAttr.get(d))
                if attrs.get("layout") == "scalar":
                    self.mems[name] = barg
                else:
                    self.mems[name] = Mem(barg, name, attrs.get("layout"), attrs.get("role"), attrs.get("heads"))
            self.func.arg_attrs = ir.ArrayAttr.get(arg_attrs)
            for k, v in self.attrs.items():
                if v is not None:
                    self.func.attributes[f"kda.{k}"] = _to_attr(v)
            with ir.InsertionPoint(block):
                yield self.mems
                func.ReturnOp([])

    def __getitem__(self, name) -> Mem:
        return self.mems[name]

    def finish(self, cleanup: bool = True) -> ir.Module:
        """Verify and return the module (after CSE of identical pure ops when ``cleanup``)."""
        if cleanup:
            from kdagen.ir.transforms import cse
            cse(self.func)
        verify(self.module)
        return self.module

    # -- memory ops (tiles are implicitly per (sequence, value head))
    def scan(self, inits, names=None, reverse=False, name=None) -> Scan:
        return Scan(inits, names=names, reverse=reverse, name=name)

    def load(self, mem: Mem | str, chunk, name=None, value_parts=1) -> Tile:
        """The [C, ...] tile of chunk ``chunk`` of a token tensor (GVA-mapped for q/k);
        ``value_parts`` > 1: only this CTA's part of the last (value) dim (:func:`_parts`)."""
        mem = self.mems[mem] if isinstance(mem, str) else mem
        C = self.attrs["chunk_size"]
        hm = "grouped" if mem.heads == "qk" else "direct"
        return _op1("load", tile_type((C, *value_part_shape(mem.tail, value_parts)), mem.dtype),
                    [mem, chunk], {"name": _str(mem.name), "head_map": _str(hm),
                                   **_parts(value_parts)}, name or f"{mem.name}_c")

    def store(self, mem: Mem | str, chunk, tile, name=None, value_parts=1):
        mem = self.mems[mem] if isinstance(mem, str) else mem
        create("store", [], [mem, chunk, _as_tile(tile)._plain()],
               {"name": _str(name or mem.name), **_parts(value_parts)})

    def load_head(self, mem, name=None) -> Tile:
        mem = self.mems[mem] if isinstance(mem, str) else mem
        return _op1("load_head", tile_type(mem.tail, mem.dtype), [mem], {"name": _str(mem.name)},
                    name or f"{mem.name}_h")

    def load_state(self, mem, name=None, slots=None, value_parts=1, value_axis=-1) -> Tile:
        """The state row of the (sequence, head); with ``slots`` (a ``slots``-layout input)
        ``mem`` is a state pool and the row is the sequence's slot (0 for a negative slot).
        ``value_axis``: which dim of the row is V, the one ``value_parts`` splits."""
        mem = self.mems[mem] if isinstance(mem, str) else mem
        operands = [mem] + ([self._slots(slots)] if slots is not None else [])
        return _op1("load_state",
                    tile_type(value_part_shape(mem.tail, value_parts, value_axis), mem.dtype),
                    operands, {"name": _str(mem.name), **_parts(value_parts, value_axis)},
                    name or f"{mem.name}_h")

    def slot_valid(self, slots, name=None) -> Tile:
        """tensor<i1> (rank 0): whether the sequence's slot is >= 0 (else it is skipped)."""
        return _op1("slot_valid", tile_type((), "i1"), [self._slots(slots)], None,
                    name or "slot_valid")

    def _slots(self, slots) -> Mem:
        slots = self.mems[slots] if isinstance(slots, str) else slots
        if slots.layout != "slots":
            raise ValueError(f"{slots.name}: a slot table needs layout 'slots', not "
                             f"{slots.layout!r}")
        return slots

    def store_chunk(self, mem, chunk, tile, name=None, value_parts=1):
        """Store one tile per chunk into a ``chunk``-layout buffer (row = the chunk's slot:
        sequences' chunks numbered consecutively)."""
        mem = self.mems[mem] if isinstance(mem, str) else mem
        create("store_chunk", [], [mem, chunk, _as_tile(tile)._plain()],
               {"name": _str(name or mem.name), **_parts(value_parts)})

    def store_state(self, mem, tile, name=None, slots=None, value_parts=1, value_axis=-1):
        """Store the state row of the (sequence, head); with ``slots``, into the sequence's
        slot of the pool ``mem`` (nothing for a negative slot). ``value_axis``: as
        :meth:`load_state`."""
        mem = self.mems[mem] if isinstance(mem, str) else mem
        operands = [mem, _as_tile(tile)._plain()] + ([self._slots(slots)] if slots is not None
                                                     else [])
        create("store_state", [], operands, {"name": _str(name or mem.name),
                                             **_parts(value_parts, value_axis)})

    def scalar(self, name) -> Tile:
        return _op1("scalar", tile_type((), "fp32"), [self.mems[name]], None, f"{name}_t")

    def valid_rows(self, chunk, name="valid") -> Tile:
        C = self.attrs["chunk_size"]
        return _op1("valid_rows", tile_type((C,), "i1"), [chunk], None, name)


def _to_attr(v):
    if isinstance(v, ir.Attribute):
        return v
    if isinstance(v, bool):
        return _bool(v)
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (list, tuple)):
        return ir.ArrayAttr.get([_to_attr(x) for x in v])
    if isinstance(v, dict):
        return ir.DictAttr.get({k: _to_attr(x) for k, x in v.items()})
    raise TypeError(f"cannot make an attribute from {v!r}")
