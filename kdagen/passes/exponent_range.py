"""Exponent-range analysis: interval bounds for every tile value of a kda program.

Bounds start from what the program declares or enforces — ``kda.assume_range`` and
``kda.clamp`` (a gate's range, enforced by the clamp before the declaration), constants, the
[0, 1] of masks — and propagate forward through elementwise math, broadcasts, reductions,
cumsums and matmuls. Values with no declared bound (loads, scan-carried
states, matrix inverses) are unbounded.

Intervals alone cannot see that ``Γ_C − Γ`` is one-signed when Γ is a cumsum of non-positive
gates (each side spans [C·lo, 0], so the difference spans ±C·|lo|). The analysis therefore
also records two relational facts:

* ``row_increments = (a, b)``: the value is a within-chunk inclusive cumsum over rows of
  increments in [a, b]; so for rows j ≤ i, ``Γ_i − Γ_j ∈ [(i−j)·a, (i−j)·b]``;
* ``last_row_of``: the value is (a broadcast of) the last row of such a cumsum, so
  ``Γ_C − Γ_i ∈ [(C−1)·min(a, 0), (C−1)·max(b, 0)]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .._mlir import ir

INF = math.inf


@dataclass(frozen=True)
class Range:
    lo: float = -INF
    hi: float = INF
    row_increments: tuple[float, float] | None = None
    rows: int = 0
    last_row_of: object = None        # the cumsum Value whose last row this is

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def magnitude(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    def plain(self) -> "Range":
        return Range(self.lo, self.hi)

    def __str__(self) -> str:
        return f"[{self.lo:.6g}, {self.hi:.6g}]"


UNBOUNDED = Range()


def hull(*ranges: Range) -> Range:
    return Range(min(r.lo for r in ranges), max(r.hi for r in ranges))


def _mul_bound(a: float, b: float) -> float:
    if a == 0.0 or b == 0.0:
        return 0.0              # 0 · ∞ in an interval endpoint means "0 times anything finite"
    return a * b


def mul(a: Range, b: Range) -> Range:
    products = [_mul_bound(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Range(min(products), max(products))


def _exp2(x: float) -> float:
    if x > 1024:
        return INF
    return 0.0 if x == -INF else 2.0 ** x


def _sigmoid(x: float) -> float:
    if x == INF:
        return 1.0
    if x == -INF:
        return 0.0
    return 0.5 * (1.0 + math.tanh(0.5 * x))


def _softplus(x: float) -> float:
    if x == INF:
        return INF
    if x == -INF:
        return 0.0
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _shape(value: ir.Value) -> tuple[int, ...]:
    t = value.type
    if isinstance(t, ir.RankedTensorType) or ir.RankedTensorType.isinstance(t):
        return tuple(ir.RankedTensorType(t).shape)
    return ()


def _attr(op, name, default=None):
    if name not in op.attributes:
        return default
    a = op.attributes[name]
    for cast in (ir.BoolAttr, ir.IntegerAttr, ir.FloatAttr):
        try:
            return cast(a).value
        except (TypeError, ValueError):
            pass
    try:
        return list(ir.DenseI64ArrayAttr(a))
    except (TypeError, ValueError):
        pass
    try:
        return ir.StringAttr(a).value
    except (TypeError, ValueError):
        return a


class RangeAnalysis:
    """Forward interval analysis over one kda module (``ranges[value] -> Range``)."""

    def __init__(self, module: ir.Module):
        self.ranges: dict[ir.Value, Range] = {}
        for op in module.body.operations:
            self._walk_op(op.operation)

    def __getitem__(self, value: ir.Value) -> Range:
        return self.ranges.get(value, UNBOUNDED)

    # ---- traversal ------------------------------------------------------------------
    def _walk_op(self, op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    self._visit(inner.operation)

    def _visit(self, op) -> None:
        if op.regions:
            self._walk_op(op)        # scan bodies: carried values stay unbounded
        if not op.name.startswith("kda.") or len(op.results) != 1:
            return
        rule = getattr(self, "_op_" + op.name[4:], None)
        result = rule(op) if rule else UNBOUNDED
        self.ranges[op.results[0]] = result

    def _in(self, op, i=0) -> Range:
        return self[op.operands[i]]

    # ---- rules ----------------------------------------------------------------------
    def _op_constant(self, op):
        v = float(_attr(op, "value"))
        return Range(v, v)

    def _op_valid_rows(self, op):
        return Range(0.0, 1.0)

    def _op_assume_range(self, op):
        x = self._in(op)
        lo, hi = float(_attr(op, "lo")), float(_attr(op, "hi"))
        return replace(x, lo=max(x.lo, lo), hi=min(x.hi, hi))

    def _op_clamp(self, op):
        x = self._in(op)
        lo, hi = float(_attr(op, "lo")), float(_attr(op, "hi"))
        return Range(min(max(x.lo, lo), hi), max(min(x.hi, hi), lo))

    def _op_in_range(self, op):
        return Range(0.0, 1.0)

    def _op_convert(self, op):
        return self._in(op)

    def _op_broadcast(self, op):
        x = self._in(op)
        dims = _attr(op, "dims") or []
        if x.row_increments is not None and 0 in dims:
            x = replace(x, row_increments=None, rows=0)   # rows are new: no longer a cumsum
        return x

    def _op_add(self, op):
        a, b = self._in(op, 0), self._in(op, 1)
        return Range(a.lo + b.lo, a.hi + b.hi)

    def _op_sub(self, op):
        a, b = self._in(op, 0), self._in(op, 1)
        if a.last_row_of is not None and a.last_row_of == op.operands[1] and b.row_increments:
            inc_lo, inc_hi = b.row_increments
            n = b.rows - 1
            return Range(n * min(inc_lo, 0.0), n * max(inc_hi, 0.0))
        return Range(a.lo - b.hi, a.hi - b.lo)

    def _op_mul(self, op):
        return mul(self._in(op, 0), self._in(op, 1))

    def _op_div(self, op):
        a, b = self._in(op, 0), self._in(op, 1)
        if b.lo > 0 or b.hi < 0:
            return mul(a, Range(min(1 / b.lo, 1 / b.hi), max(1 / b.lo, 1 / b.hi)))
        return UNBOUNDED

    def _op_neg(self, op):
        x = self._in(op)
        return Range(-x.hi, -x.lo)

    def _op_exp2(self, op):
        x = self._in(op)
        lo, hi = x.lo, x.hi
        if "clamp_min" in op.attributes:
            lo = max(lo, float(ir.FloatAttr(op.attributes["clamp_min"]).value))
        if "clamp_max" in op.attributes:
            hi = min(hi, float(ir.FloatAttr(op.attributes["clamp_max"]).value))
        return Range(_exp2(lo), _exp2(max(lo, hi)))

    def _op_log2(self, op):
        x = self._in(op)
        lo = math.log2(x.lo) if x.lo > 0 else -INF
        hi = math.log2(x.hi) if 0 < x.hi < INF else (INF if x.hi == INF else -INF)
        return Range(lo, hi)

    def _op_sigmoid(self, op):
        x = self._in(op)
        return Range(_sigmoid(x.lo), _sigmoid(x.hi))

    def _op_softplus(self, op):
        x = self._in(op)
        return Range(_softplus(x.lo), _softplus(x.hi))

    def _op_rsqrt(self, op):
        x = self._in(op)
        if x.lo > 0:
            return Range(1 / math.sqrt(x.hi) if x.hi < INF else 0.0, 1 / math.sqrt(x.lo))
        return Range(0.0, INF)

    def _op_select(self, op):
        return hull(self._in(op, 1), self._in(op, 2))

    def _op_max(self, op):
        a, b = self._in(op, 0), self._in(op, 1)
        return Range(max(a.lo, b.lo), max(a.hi, b.hi))

    def _op_reduce_sum(self, op):
        x = self._in(op)
        shape = _shape(op.operands[0])
        n = math.prod(shape[d] for d in (_attr(op, "dims") or []))
        return Range(_mul_bound(n, x.lo), _mul_bound(n, x.hi))

    def _op_cumsum(self, op):
        x = self._in(op)
        rows = _shape(op.operands[0])[0]
        out = Range(min(x.lo, _mul_bound(rows, x.lo)), max(x.hi, _mul_bound(rows, x.hi)))
        if _attr(op, "reverse", False):
            return out
        return replace(out, row_increments=(x.lo, x.hi), rows=rows)

    def _op_transpose(self, op):
        return self._in(op).plain()

    def _op_extract_row(self, op):
        x = self._in(op)
        rows = _shape(op.operands[0])[0]
        index = int(_attr(op, "index"))
        out = x.plain()
        if x.row_increments is not None and index in (-1, rows - 1):
            out = replace(out, last_row_of=op.operands[0])
        return out

    def _op_embed_row(self, op):
        return hull(self._in(op).plain(), Range(0.0, 0.0))

    def _op_tril(self, op):
        return hull(self._in(op).plain(), Range(0.0, 0.0))

    def _op_dot(self, op):
        a, b = self._in(op, 0), self._in(op, 1)
        shape = _shape(op.operands[0])
        n = shape[0] if _attr(op, "transpose_lhs", False) else shape[-1]
        bound = _mul_bound(n, _mul_bound(a.magnitude, b.magnitude))
        return Range(-bound, bound)
