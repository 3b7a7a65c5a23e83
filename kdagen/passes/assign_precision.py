"""``kda-assign-precision``: choose the operand precision of every matrix product.

Writes ``kda.precision`` (``tf32`` | ``bf16x3`` | ``tf32x3`` | ``bf16`` | ``fma``) on each
``kda.dot``, ``kda.decay_dot``, ``kda.decay_matmul`` and ``kda.tril_inv`` (the products that merge
its diagonal blocks): with ``products=auto`` (the default) TF32, except
the adjoint decay products, which keep bf16x3, or tf32x3 where their gates are one value per row
(:mod:`kdagen.ir.precision` says why); any other
value puts that precision on every product. The lowering reads the attribute (its ``dot``
option ``auto``); the same products on every chip.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._mlir import ir
from ..ir.precision import PRECISIONS, PRODUCT_OPS, auto_precision
from ..ir.transforms import walk
from .base import ModulePass, register_pass


@register_pass
@dataclass
class AssignPrecisionPass(ModulePass):
    name = "kda-assign-precision"
    summary = "choose each matrix product's operand precision (kda.precision)"
    products: str = field(default="auto", metadata={"choices": ("auto", *PRECISIONS)})

    def run(self, module: ir.Module) -> None:
        with module.context:
            for op in walk(module):
                if op.name in PRODUCT_OPS:
                    chosen = (auto_precision(op.name, op.name != "kda.dot" and has_row_gates(op))
                              if self.products == "auto" else self.products)
                    op.attributes["kda.precision"] = ir.StringAttr.get(chosen)


def has_row_gates(op) -> bool:
    """Whether decay product ``op`` reads both gates as broadcasts of a [C] value over the
    contraction's columns (``dims = [1]``): the row-gate form the lowering factors the decay
    out of (kda-narrow-broadcasts leaves GDN's gates so)."""
    operands = list(op.operands)
    if len(operands) < 4:
        return False
    for g in operands[2:4]:
        if isinstance(g, ir.BlockArgument):
            return False
        owner = g.owner.operation if hasattr(g.owner, "operation") else g.owner
        if owner.name != "kda.broadcast":
            return False
        dims = list(ir.DenseI64ArrayAttr(owner.attributes["dims"]))
        if dims != [1] or ir.RankedTensorType(owner.operands[0].type).rank != 1:
            return False
    return True
