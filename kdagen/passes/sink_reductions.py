"""``kda-sink-reductions``: sum over the columns before a row scan, not after it.

A reduction over dims other than the row dim (``reduce_sum(x, [1])``: GDN's per-token gate
gradient, the sum over the K channels of a [C, K] gradient) commutes with the ops that treat
every column alike along the rows: a row cumsum (summing over the rows, then the columns, is
summing over the columns, then the rows) and a product with a splat constant. The pass moves
such a reduction before them, ``reduce_sum(cumsum(X) * c, [1])`` becoming
``cumsum(reduce_sum(X, [1])) * c``, where the value it reduces has no other use: the scan then
runs on [C] instead of [C, K], and X is evaluated inside the reduction's loop instead of being
materialised for the scan (GDN's backward dk kernel: one [C, K] cumsum, 795 of its 6464
instructions per thread, becomes a [C] one).

Exact in real arithmetic; the fp32 sums run in another order, so results move by rounding,
not bitwise (the semantic test compares in float64).
"""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from ..ir.transforms import dce, walk
from .base import ModulePass, register_pass
from .partition import _attributes
from .stable_reassociate import _owner


def _shape(v: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _dims(op) -> list[int]:
    return [int(d) for d in ir.DenseI64ArrayAttr(op.attributes["dims"])]


def _single_use(v: ir.Value) -> bool:
    return len(list(v.uses)) == 1


def _splat(v: ir.Value) -> bool:
    op = _owner(v)
    return op is not None and op.name == "kda.constant"


@register_pass
@dataclass
class SinkReductionsPass(ModulePass):
    name = "kda-sink-reductions"
    summary = "reduce over columns before row cumsums and constant scalings, not after"

    def run(self, module: ir.Module) -> None:
        with module.context, ir.Location.unknown():
            for op in list(walk(module)):
                if op.name == "kda.reduce_sum":
                    _sink(op)
            dce(module.operation)


def _sink(red) -> None:
    """Move the column reduction ``red`` below its operand's cumsum / constant scaling, as
    long as the operand has no other use; the moved reduction is tried again."""
    while True:
        dims = _dims(red)
        x = red.operands[0]
        inner = _owner(x)
        if (0 in dims or not dims or inner is None or not _single_use(x)
                or len(_shape(red.results[0])) < 1):
            return
        ip = ir.InsertionPoint(red)
        out_t = red.results[0].type
        if inner.name == "kda.cumsum":
            src = inner.operands[0]
            scaled = None
        elif inner.name == "kda.mul" and any(_splat(o) for o in inner.operands):
            src, const = ((inner.operands[0], inner.operands[1]) if _splat(inner.operands[1])
                          else (inner.operands[1], inner.operands[0]))
            scaled = _owner(const)
        else:
            return
        # the op that now yields the reduction's value keeps its name
        reduced = ir.Operation.create("kda.reduce_sum", results=[out_t], operands=[src],
                                      attributes=_attributes(red), ip=ip)
        if scaled is None:
            new = ir.Operation.create("kda.cumsum", results=[out_t],
                                      operands=[reduced.results[0]],
                                      attributes=_attributes(inner), loc=red.location, ip=ip)
        else:
            c = ir.Operation.create("kda.constant", results=[out_t],
                                    attributes=_attributes(scaled), loc=scaled.location, ip=ip)
            new = ir.Operation.create("kda.mul", results=[out_t],
                                      operands=[reduced.results[0], c.results[0]],
                                      attributes=_attributes(inner), loc=red.location, ip=ip)
        red.results[0].replace_all_uses_with(new.results[0])
        red.erase()
        inner.erase()           # x had no other use: its operand may now have one use left
        red = reduced
