"""``kda-narrow-broadcasts``: compute on the narrow operand of a broadcast, broadcast after.

A value that is a broadcast of a smaller one (GDN's per-token gate broadcast over the K
channels, ``[C] -> [C, K]``) keeps being a broadcast through the ops that act on each element
alike: an element-wise op all of whose operands are broadcasts along common dims (or splat
constants), a row cumsum of a value broadcast along other dims, a row extracted from or
embedded into one. The pass moves each such op before the broadcast — ``cumsum(broadcast(g))``
becomes ``broadcast(cumsum(g))``, ``exp2(broadcast(G))`` becomes ``broadcast(exp2(G))`` — and
merges broadcasts of broadcasts, so the work runs on the narrow shape ([C] instead of [C, K])
and consumers see the broadcast: the decay products of a gate broadcast over their
contraction dim then factor it out of the contraction (the lowering's scalar-gate decay
products). Every rewrite computes the same values in the same order (a cumsum of a broadcast
adds the same numbers per column), so results are bitwise unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from ..ir.dialect import ops_with
from ..ir.transforms import dce, defining_op, walk
from .base import ModulePass, register_pass
from .partition import _attributes

#: element-wise ops that act on each element alike (no position-dependent attribute)
ELEMENTWISE = ops_with(kind="elementwise") - {"kda.tril"}
#: row ops a broadcast passes through: the row cumsum, and taking or placing one row
ROW_OPS = ("kda.cumsum", "kda.extract_row", "kda.embed_row")


def _shape(v: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(v.type).shape)


def _element(v: ir.Value) -> ir.Type:
    return ir.RankedTensorType(v.type).element_type


def _dims(op) -> list[int]:
    return [int(d) for d in ir.DenseI64ArrayAttr(op.attributes["dims"])]


@register_pass
@dataclass
class NarrowBroadcastsPass(ModulePass):
    name = "kda-narrow-broadcasts"
    summary = "run element-wise ops, cumsums and row ops on the narrow side of broadcasts"

    def run(self, module: ir.Module) -> None:
        rewrite_scan_bodies(module, _narrow_block)


def rewrite_scan_bodies(module: ir.Module, rewrite_block) -> None:
    """``rewrite_block(block)`` on the body of every kda.scan, then dead ops removed."""
    with module.context, ir.Location.unknown():
        for op in walk(module):
            if op.name == "kda.scan":
                rewrite_block(op.regions[0].blocks[0])
        dce(module.operation)


class _Narrow:
    """The broadcast facts of one block: value -> (narrow value, broadcast dims)."""

    def __init__(self):
        self.facts: dict = {}

    def of(self, v: ir.Value):
        """(x, dims) with v = broadcast(x, dims), or None; a splat constant is ("splat", all
        dims) and narrows to any shape."""
        if v in self.facts:
            return self.facts[v]
        op = defining_op(v)
        if op is not None and op.name == "kda.constant":
            return ("splat", list(range(len(_shape(v)))))
        return None

    def narrow(self, v: ir.Value, dims: list[int], ip) -> ir.Value:
        """v without its broadcast dims ``dims`` (a subset of v's)."""
        x, have = self.of(v)
        shape = [s for i, s in enumerate(_shape(v)) if i not in dims]
        if x == "splat":
            const = defining_op(v)
            return ir.Operation.create(
                "kda.constant", results=[ir.RankedTensorType.get(shape, _element(v))],
                attributes={"value": const.attributes["value"]}, ip=ip).results[0]
        if list(have) == list(dims):
            return x
        kept = [i for i in range(len(_shape(v))) if i not in dims]
        rest = [kept.index(d) for d in have if d not in dims]
        return ir.Operation.create(
            "kda.broadcast", results=[ir.RankedTensorType.get(shape, _element(v))],
            operands=[x], attributes={"dims": ir.DenseI64ArrayAttr.get(rest)}, ip=ip).results[0]


def _broadcast(x: ir.Value, dims: list[int], like: ir.Value, ip) -> ir.Value:
    return ir.Operation.create("kda.broadcast", results=[like.type], operands=[x],
                               attributes={"dims": ir.DenseI64ArrayAttr.get(sorted(dims))},
                               ip=ip).results[0]


def _clone_on(op, operands: list, result_shape: list[int], ip) -> ir.Value:
    res_t = ir.RankedTensorType.get(result_shape, _element(op.results[0]))
    return ir.Operation.create(op.name, results=[res_t], operands=operands,
                               attributes=_attributes(op), loc=op.location, ip=ip).results[0]


def _narrow_block(block) -> None:
    facts = _Narrow()
    for op in [o.operation for o in block.operations]:
        if len(op.results) != 1 or not isinstance(op.results[0].type, ir.RankedTensorType):
            continue
        res = op.results[0]
        rank = len(_shape(res))
        ip = ir.InsertionPoint(op)
        if op.name == "kda.broadcast":
            inner = facts.of(op.operands[0])
            dims = _dims(op)
            if inner is None or inner[0] == "splat":
                facts.facts[res] = (op.operands[0], dims)
                continue
            # broadcast(broadcast(x, e), d) = broadcast(x, d + e placed among the kept dims)
            kept = [i for i in range(rank) if i not in dims]
            merged = sorted(dims + [kept[e] for e in inner[1]])
            new = _broadcast(inner[0], merged, res, ip)
            res.replace_all_uses_with(new)
            facts.facts[new] = (inner[0], merged)
            continue
        new_x, dims = None, None
        if op.name in ELEMENTWISE and all(isinstance(o.type, ir.RankedTensorType)
                                          for o in op.operands):
            known = [facts.of(o) for o in op.operands]
            if any(k is None for k in known) or all(k[0] == "splat" for k in known):
                continue
            if any(len(_shape(o)) != rank for o in op.operands):
                continue
            dims = sorted(set.intersection(*(set(k[1]) for k in known)))
            if not dims:
                continue
            operands = [facts.narrow(o, dims, ip) for o in op.operands]
            shape = [s for i, s in enumerate(_shape(res)) if i not in dims]
            new_x = _clone_on(op, operands, shape, ip)
        elif op.name in ROW_OPS:
            k = facts.of(op.operands[0])
            if k is None or k[0] == "splat":
                continue
            x, have = k
            if op.name == "kda.cumsum":            # over dim 0: along the kept dims only
                if 0 in have:
                    continue
                dims = list(have)
            elif op.name == "kda.embed_row":
                dims = [d + 1 for d in have]
            else:                                  # extract_row
                dims = [d - 1 for d in have if d != 0]
                if 0 in have:                      # every row is x: the row is x
                    if not dims:
                        res.replace_all_uses_with(x)
                        continue
                    new_x = x
            if new_x is None:
                shape = [s for i, s in enumerate(_shape(res)) if i not in dims]
                new_x = _clone_on(op, [x], shape, ip)
        else:
            continue
        new = _broadcast(new_x, dims, res, ip)
        res.replace_all_uses_with(new)
        facts.facts[new] = (new_x, dims)
