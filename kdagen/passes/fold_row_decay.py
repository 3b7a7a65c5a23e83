"""``kda-fold-row-decay``: a decay_matmul with one gate per row becomes a weighted plain dot.

``decay_matmul(w, x, γ_row, γ_col)`` weights each term of its contraction by
E[i, j, d] = 2^(γ_row[i, d] - γ_col[j, d]) (masked to j <= i + diagonal). Where both gates
are a broadcast of one value per row over the d columns (GDN's, after kda-narrow-broadcasts),
E does not depend on d: it is a [C, C] matrix, and the product is a plain one,

    out = (w ⊙ E) x            (transpose: out = (w ⊙ E)ᵀ x).

The pass writes that: 2^(g_i - g_j) once per pair of gates, tril(w ⊙ 2^(g_i - g_j)) once per
w and mask (the backward's two adjoints of one decay product share it), then a ``kda.dot``
that keeps the decay product's ``kda.precision``. Each weight is the same fp32 product the lowering's
fused form computed per operand element, so the values are those of the fused form; what
changes is the work: C² exponentials per kernel instead of one per operand element read by
each warp (GDN's backward dk kernel: three row-gate decay products, 638 instructions each per
thread on sm_90a's native path), and a plain product the lowering runs on wgmma.

The exponent of a kept weight is bounded by the decay product's own proof (its
``exp_bound``); masked entries may exceed it, so the exponential saturates there
(``clamp_max``), and the tril (a select, in every lowering) zeroes them after the weighting,
so nothing they hold reaches the product. The mask comes last so that it acts on the
weighting's result (an accumulator where w is a product's): the register-tile lowering takes
a tril of an accumulator, not of a tile expression.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from ..ir.transforms import defining_op
from .base import ModulePass, register_pass
from .narrow_broadcasts import _dims, _element, _shape, rewrite_scan_bodies
from .stable_reassociate import _f64

#: decay-product attributes that say how its exponentials were bounded (kda-stable-reassociate)
_BOUND_ATTRS = ("clamp_min", "exp_bound")


@register_pass
@dataclass
class FoldRowDecayPass(ModulePass):
    name = "kda-fold-row-decay"
    summary = "row-gate decay_matmuls become plain dots of tril(w ⊙ 2^(g_i - g_j))"
    # false: leave every decay_matmul to the lowering's fused form (for A/Bs)
    fold: bool = True

    def run(self, module: ir.Module) -> None:
        if self.fold:
            rewrite_scan_bodies(module, _fold_block)


def row_gates(op) -> tuple | None:
    """The two [C] gate vectors of a decay_matmul whose gates are both broadcasts of one
    value per row over the columns, else None."""
    out = []
    for g in list(op.operands)[2:4]:
        src = defining_op(g)
        if (src is None or src.name != "kda.broadcast" or _dims(src) != [1]
                or len(_shape(src.operands[0])) != 1):
            return None
        out.append(src.operands[0])
    return tuple(out)


def _create(name: str, result_t, operands, attributes, ip, loc=None) -> ir.Value:
    return ir.Operation.create(name, results=[result_t], operands=operands,
                               attributes=attributes, ip=ip,
                               loc=loc or ir.Location.unknown()).results[0]


def _attr_key(op, name):
    return str(op.attributes[name]) if name in op.attributes else None


def _weights(g_row: ir.Value, g_col: ir.Value, op, ip) -> ir.Value:
    """E[i, j] = 2^(g_row[i] - g_col[j]), saturated at the product's bound: [C, C]."""
    C = _shape(g_row)[0]
    sq = ir.RankedTensorType.get([C, _shape(g_col)[0]], _element(g_row))
    dims = lambda d: {"dims": ir.DenseI64ArrayAttr.get([d])}  # noqa: E731
    gi = _create("kda.broadcast", sq, [g_row], dims(1), ip)      # [i, j] -> g_row[i]
    gj = _create("kda.broadcast", sq, [g_col], dims(0), ip)      # [i, j] -> g_col[j]
    arg = _create("kda.sub", sq, [gi, gj], {}, ip)
    bound = float(ir.FloatAttr(op.attributes["exp_bound"]).value)
    proof = (ir.StringAttr(op.attributes["exp_proof"]).value
             if "exp_proof" in op.attributes else "the decay product's bound")
    attrs = {"exp_bound": _f64(bound), "clamp_max": _f64(bound),
             "exp_proof": ir.StringAttr.get(
                 f"kept entries (j <= i + diagonal) as the row-gate decay product they came "
                 f"from: {proof}; masked entries saturated at +{bound:g}, then selected away "
                 f"by the tril after the weighting")}
    if "clamp_min" in op.attributes:
        attrs["clamp_min"] = op.attributes["clamp_min"]
    return _create("kda.exp2", sq, [arg], attrs, ip, loc=ir.Location.name("decay_weights"))


def _fold_block(block) -> None:
    weights: dict = {}      # (g_row, g_col, bounds) -> E
    weighted: dict = {}     # (w, E, diagonal) -> tril(w ⊙ E)
    for op in [o.operation for o in block.operations]:
        if op.name != "kda.decay_matmul" or "exp_bound" not in op.attributes:
            continue
        gates = row_gates(op)
        if gates is None:
            continue
        w, x = op.operands[0], op.operands[1]
        ip = ir.InsertionPoint(op)
        key = (gates[0], gates[1], *(_attr_key(op, a) for a in _BOUND_ATTRS))
        if key not in weights:
            weights[key] = _weights(gates[0], gates[1], op, ip)
        e = weights[key]
        wkey = (w, e, _attr_key(op, "diagonal"))
        if wkey not in weighted:
            weighted[wkey] = _create("kda.tril", w.type, [_create("kda.mul", w.type, [w, e], {}, ip)],
                                     {"diagonal": op.attributes["diagonal"]}, ip)
        transpose = "transpose" in op.attributes and ir.BoolAttr(op.attributes["transpose"]).value
        attrs = {"transpose_lhs": ir.BoolAttr.get(bool(transpose)),
                 "transpose_rhs": ir.BoolAttr.get(False)}
        if "kda.precision" in op.attributes:
            attrs["kda.precision"] = op.attributes["kda.precision"]
        dot = _create("kda.dot", op.results[0].type, [weighted[wkey], x], attrs, ip,
                      loc=op.location)
        op.results[0].replace_all_uses_with(dot)
        op.erase()
