"""``kda-narrow-reductions``: sum over the channels before the row scans, not after.

A per-token gate (GDN's: one value per row, broadcast over the K channels) gets its gradient
as the row sum of a [C, K] adjoint. The derived backward builds that adjoint from row
cumsums of [C, K] tiles (the adjoints of the gate's cumsums), joined by adds, negations and
constant scalings, and only then sums over the channels. A row sum commutes with all of them
(``rowsum(cumsum(x)) = cumsum(rowsum(x))``, ``rowsum(a + b) = rowsum(a) + rowsum(b)``), so the
pass moves it below the cumsums: each of them runs on [C] instead of [C, K]. In the lowering a
[C, K] cumsum is two passes over the tile with barriers between them, a row sum one pass and
shuffles.

Only single-use chains are rewritten (the [C, K] values are then dead; a value also read
elsewhere, e.g. KDA's per-channel dg, keeps its cumsum). Operands without a cumsum below them
are summed in [C, K] first and reduced once. The sums are reassociated: results differ from
the unrewritten program in the last bits (float64 interpreter: ~1e-15 relative).
"""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from ..ir.transforms import defining_op
from .base import ModulePass, register_pass
from .narrow_broadcasts import _dims, _element, _shape, rewrite_scan_bodies
from .partition import _attributes

#: ops a row sum passes through unchanged in form (linear, acting on each element alike)
_ADDITIVE = ("kda.add", "kda.sub")


def _single_use(v: ir.Value) -> bool:
    return len(list(v.uses)) == 1


def _row_factor(v: ir.Value):
    """A [C, K] value the row sum can factor out of a product: a splat constant (-> the
    constant op) or a broadcast over dim 1 of a [C] value (-> that value); else None."""
    op = defining_op(v)
    if op is None or len(_shape(v)) != 2:
        return None
    if op.name == "kda.constant":
        return op
    if op.name == "kda.broadcast" and _dims(op) == [1]:
        return op.operands[0]
    return None


@register_pass
@dataclass
class NarrowReductionsPass(ModulePass):
    name = "kda-narrow-reductions"
    summary = "row sums over the channels move below the row cumsums they follow"

    def run(self, module: ir.Module) -> None:
        rewrite_scan_bodies(module, _narrow_block)


def _narrow_block(block) -> None:
    for op in [o.operation for o in block.operations]:
        if op.name != "kda.reduce_sum" or _dims(op) != [1]:
            continue
        x = op.operands[0]
        if len(_shape(x)) != 2 or not _on_scan_path(x, block):
            continue
        new = _Rewriter(ir.InsertionPoint(op), _shape(x)[0]).narrow(x, block)
        op.results[0].replace_all_uses_with(new)


def _on_scan_path(v: ir.Value, block) -> bool:
    """Whether ``v`` is a single-use value of ``block`` reaching a row cumsum through
    single-use adds, subs, negations and row-factor products only."""
    op = defining_op(v)
    if op is None or op.parent != block.owner or not _single_use(v):
        return False
    if op.name == "kda.cumsum":
        return True
    if op.name in _ADDITIVE:
        return any(_on_scan_path(u, block) for u in op.operands)
    if op.name == "kda.neg":
        return _on_scan_path(op.operands[0], block)
    if op.name == "kda.mul":
        a, b = op.operands
        return ((_row_factor(b) is not None and _on_scan_path(a, block))
                or (_row_factor(a) is not None and _on_scan_path(b, block)))
    return False


class _Rewriter:
    """Builds rowsum(v) on [C] at one insertion point (before the reduction it replaces);
    a leaf read twice below the same reduction is reduced once."""

    def __init__(self, ip, rows: int):
        self.ip = ip
        self.rows = rows
        self.leaves: dict = {}

    def _row_type(self, like: ir.Value) -> ir.Type:
        return ir.RankedTensorType.get([self.rows], _element(like))

    def _create(self, name: str, operands: list, like: ir.Value, attributes=None) -> ir.Value:
        return ir.Operation.create(name, results=[self._row_type(like)], operands=operands,
                                   attributes=attributes or {}, ip=self.ip).results[0]

    def leaf(self, v: ir.Value) -> ir.Value:
        """rowsum(v) of a value off the scan paths: one reduction, except that a single-use
        negation or row-factor product passes it on to its operand, so a tile read both
        plainly and negated below one reduction is reduced once."""
        if v in self.leaves:
            return self.leaves[v]
        op = defining_op(v)
        if op is not None and _single_use(v) and op.name == "kda.neg":
            new = self._create("kda.neg", [self.leaf(op.operands[0])], v)
        elif (op is not None and _single_use(v) and op.name == "kda.mul"
              and _row_factor(op.operands[1]) is not None):
            new = self._create("kda.mul", [self.leaf(op.operands[0]),
                                           self.factor(op.operands[1])], v)
        else:
            new = self._create("kda.reduce_sum", [v], v, {"dims": ir.DenseI64ArrayAttr.get([1])})
        self.leaves[v] = new
        return new

    def factor(self, v: ir.Value) -> ir.Value:
        f = _row_factor(v)
        if isinstance(f, ir.Value):
            return f
        return self._create("kda.constant", [], v, {"value": f.attributes["value"]})

    def narrow(self, v: ir.Value, block) -> ir.Value:
        if not _on_scan_path(v, block):
            return self.leaf(v)
        op = defining_op(v)
        if op.name == "kda.cumsum":
            return self._create("kda.cumsum", [self.narrow(op.operands[0], block)], v,
                                _attributes(op))
        if op.name in _ADDITIVE:
            return self._create(op.name, [self.narrow(u, block) for u in op.operands], v)
        if op.name == "kda.neg":
            return self._create("kda.neg", [self.narrow(op.operands[0], block)], v)
        a, b = op.operands                                      # kda.mul by a row factor
        if _row_factor(b) is not None and _on_scan_path(a, block):
            return self._create("kda.mul", [self.narrow(a, block), self.factor(b)], v)
        return self._create("kda.mul", [self.factor(a), self.narrow(b, block)], v)
