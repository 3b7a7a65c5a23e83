"""``kda-assign-precision``: choose the operand precision of every matrix product.

Writes ``kda.precision`` (``tf32`` | ``bf16x3`` | ``tf32x3`` | ``bf16`` | ``fma``) on each
``kda.dot``, ``kda.decay_dot``, ``kda.decay_matmul`` and ``kda.tril_inv`` (the products that merge
its diagonal blocks): with ``products=auto`` (the default) TF32, except
the adjoint decay products, which keep bf16x3, or tf32x3 where their gates are one value per row
(:mod:`kdagen.ir.precision` says why), and the plain products of a kernel that sums a per-head
gradient over chunks (``gate_gradient_products``, bf16x3: see below); any other
value puts that precision on every product. The lowering reads the attribute (its ``dot``
option ``auto``); the same products on every chip.

A kernel that stores per-chunk partial sums of a per-head gradient (the gate parameters'
dA_log, ddt_bias: a workspace ``kda.sum_chunks`` reads) computes them from terms of both signs
summed over every token and key, so each product's rounding there is amplified. In the CPU
simulator of the sm_90a kernels (KDA K = V = 128), TF32 in that kernel gives dA_log 1.55e-3
(weak gate, the H200: 1.54e-3) and 1.24e-3 (correlated steep); bf16x3 gives 9.0e-4 and
8.8e-4, fp32 products 9.0e-4 and 4.5e-4, and no other kernel's products moved it. The rule
is per kernel: it was written when the sm_90a native path staged one wgmma precision per
kernel (it now stages each product at its own).

The state path of a backward with per-key gates (KDA: ``state_path_products``, bf16x3): in a
program that sums a per-head gradient and whose decay products take a gate per key (not one
value per row, as GDN's), every product of the serial kernels (kernel scans that carry a value)
and of the kernels that store products for them to load (the prologue, whose
u = (I + Akk)⁻¹ (v ⊙ β) mattered most, and the dq kernel). dA_log sums dG over every token
and key, and under a weak gate the TF32 rounding of the serial scans' products (the recomputed states and dS)
reaches it: in the CPU simulator of the sm_90a kernels with ordered sums (KDA K = 128
"B1_T1000 weak"), dA_log 1.20e-3 with TF32 there, 5.8e-5 with more precise products in the
prologue and both scans; the lower-bound gate 2.04e-3 against 2.0e-4; and no
chunk-parallel kernel's precision alone fixes it (docs/MATH.md §3).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._mlir import ir
from ..ir.precision import PRECISIONS, PRODUCT_OPS, auto_precision
from ..ir.transforms import defining_op, walk
from .base import ModulePass, register_pass


@register_pass
@dataclass
class AssignPrecisionPass(ModulePass):
    name = "kda-assign-precision"
    summary = "choose each matrix product's operand precision (kda.precision)"
    products: str = field(default="auto", metadata={"choices": ("auto", *PRECISIONS)})
    gate_gradient_products: str = field(default="bf16x3", metadata={"choices": PRECISIONS})
    # also give gate_gradient_products to the plain products of other kernels whose results
    # that kernel loads from a workspace (the backward prologue's u = (I + Akk)^-1 (v ⊙ β),
    # the dq kernel's w·S). In the CPU simulator (KDA K = 64, "B1_T65") TF32 in u alone puts
    # dA_log at 1.58e-3; bf16x3 there, 1.44e-4 (fp32 FMA everywhere: 1.2e-5); no other
    # kernel's products moved it. Static cost: the two kernels +1.7% and +3.1% (then, when
    # sm_90a staged one precision per kernel). Off: at the native kernels' thread counts it makes KDA
    # K = 128 "B1_T1000 weak" worse in the simulator (dA_log 7.2e-4 -> 1.8e-3), so it is not the
    # whole answer (docs/MATH.md §3).
    gate_gradient_inputs: bool = False
    # the state path of a backward with per-key gates (module doc); "" leaves it to the rules
    # above
    state_path_products: str = field(default="bf16x3", metadata={"choices": ("", *PRECISIONS)})
    # "kernels": every product of the serial kernels and of the kernels storing products for
    # them to load; "products": the serial kernels' products and the products stored for them
    # only. On the H100 (GPU check, native set) the largest KDA dA_log / ddt_bias was 7.9e-4
    # with "kernels", 9.8e-4 with "products" (lower-bound gate, steep), for 1% of fwd+bwd
    # time (B1_T8k_H16 4.41 vs 4.37 ms, bench/results/h100_stop48_ab_variants_b1t8k.log)
    state_path_scope: str = field(default="kernels", metadata={"choices": ("kernels",
                                                                            "products")})

    def run(self, module: ir.Module) -> None:
        with module.context:
            summing = set()
            state_path = set()
            if self.products == "auto":
                kernels = per_head_gradient_kernels(module)
                if self.state_path_products and kernels and not row_gate_program(module):
                    serial = serial_kernels(module)
                    feeding = products_loaded_by(module, serial)
                    for kernel in all_kernels(module):
                        ops = [op for op in walk(kernel) if op.name in PRODUCT_OPS]
                        if kernel in serial or (self.state_path_scope == "kernels"
                                                and any(op in feeding for op in ops)):
                            state_path.update(ops)
                    state_path.update(feeding)
                for kernel in kernels:
                    summing.update(op for op in walk(kernel) if op.name == "kda.dot")
                if self.gate_gradient_inputs:
                    # per kernel, as above: every plain product of a kernel with such a one
                    feeding = products_loaded_by(module, kernels)
                    for kernel in all_kernels(module):
                        dots = [op for op in walk(kernel) if op.name == "kda.dot"]
                        if any(op in feeding for op in dots):
                            summing.update(dots)
            for op in walk(module):
                if op.name in PRODUCT_OPS:
                    if self.products != "auto":
                        chosen = self.products
                    elif op in summing:
                        chosen = self.gate_gradient_products
                    elif op in state_path:
                        chosen = self.state_path_products
                    else:
                        chosen = auto_precision(op.name,
                                                op.name != "kda.dot" and has_row_gates(op))
                    op.attributes["kda.precision"] = ir.StringAttr.get(chosen)


def per_head_gradient_kernels(module: ir.Module) -> list:
    """The kernels (``kda.scan`` ops marked ``kda.kernel`` by kda-partition) that store into a
    workspace ``kda.sum_chunks`` reads: per-chunk partial sums of a per-head gradient."""
    summed = [op.operands[0] for op in walk(module) if op.name == "kda.sum_chunks"]
    return [k for k in all_kernels(module)
            if any(inner.name == "kda.store_chunk" and inner.operands[0] in summed
                   for inner in walk(k))]


def serial_kernels(module: ir.Module) -> list:
    """The kernels that carry a value from chunk to chunk (a kernel scan with an initial
    value)."""
    return [k for k in all_kernels(module) if len(k.operands) > 0]


def row_gate_program(module: ir.Module) -> bool:
    """Whether the module's decay products take their gates as one value per row (GDN)."""
    decays = [op for op in walk(module) if op.name in ("kda.decay_dot", "kda.decay_matmul")]
    return bool(decays) and all(has_row_gates(op) for op in decays)


def all_kernels(module: ir.Module) -> list:
    """The kernels of ``module`` (``kda.scan`` ops marked ``kda.kernel`` by kda-partition)."""
    return [op for op in walk(module) if op.name == "kda.scan" and "kda.kernel" in op.attributes]


def products_loaded_by(module: ir.Module, kernels: list) -> set:
    """The kda.dot ops of other kernels whose results are stored (kda.store_chunk, converted
    or not) into a workspace that one of ``kernels`` loads (kda.load_chunk)."""
    inside = {op for k in kernels for op in walk(k)}
    loaded = {op.operands[0] for k in kernels for op in walk(k) if op.name == "kda.load_chunk"}
    out = set()
    for op in walk(module):
        if op.name != "kda.store_chunk" or op in inside or op.operands[0] not in loaded:
            continue
        owner = defining_op(op.operands[2])
        while owner is not None and owner.name == "kda.convert":     # a bf16 workspace
            owner = defining_op(owner.operands[0])
        if owner is not None and owner.name == "kda.dot":
            out.add(owner)
    return out


def has_row_gates(op) -> bool:
    """Whether decay product ``op`` reads both gates as broadcasts of a [C] value over the
    contraction's columns (``dims = [1]``): the row-gate form the lowering factors the decay
    out of (kda-narrow-broadcasts leaves GDN's gates so)."""
    operands = list(op.operands)
    if len(operands) < 4:
        return False
    for g in operands[2:4]:
        owner = defining_op(g)
        if owner is None or owner.name != "kda.broadcast":
            return False
        dims = list(ir.DenseI64ArrayAttr(owner.attributes["dims"]))
        if dims != [1] or ir.RankedTensorType(owner.operands[0].type).rank != 1:
            return False
    return True
