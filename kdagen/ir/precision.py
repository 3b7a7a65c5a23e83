"""Operand precision of the matrix products (what ``kda-assign-precision`` writes on each
product as ``kda.precision``, and what the lowering falls back to without that pass).

- ``tf32``: operands rounded to TF32 (10-bit mantissa; PERF.md's study: the accuracy goals hold
  at ~1.04x the bf16 floor in every decay regime), one tensor-core product.
- ``bf16x3``: operands split into bf16 hi + lo, three products (~16 significant bits).
- ``tf32x3``: operands split into TF32 hi + lo, three products (~22 significant bits; mma.sync
  only: wgmma products take bf16x3 instead).
- ``bf16``: operands rounded to bf16 (an opt-in; breaks the goals under weak decay).
- ``fma``: fp32 on the CUDA cores.

``auto`` takes TF32 except for :data:`EXACT_PRODUCT_OPS`, which take bf16x3 — or tf32x3 where
their gates are the same in every column (:data:`ROW_GATE_PRECISION`).
"""
from __future__ import annotations

__all__ = ["PRODUCT_OPS", "EXACT_PRODUCT_OPS", "PRECISIONS", "ROW_GATE_PRECISION",
           "auto_precision"]

#: the matrix products whose operands a precision applies to (kda.tril_inv: the block products
#: that merge its 16 x 16 diagonal inverses, which stay fp32)
PRODUCT_OPS = ("kda.dot", "kda.decay_dot", "kda.decay_matmul", "kda.tril_inv")

PRECISIONS = ("tf32", "bf16x3", "tf32x3", "bf16", "fma")

#: products that keep bf16x3 under ``auto``. The adjoint decay products (kda.decay_matmul,
#: backward only) feed the gate gradient as differences of nearly equal terms (q·dq' - k·dk'
#: per key), which the gate-parameter gradients then sum over every token: with them in TF32
#: the H200's native backward put dA_log / ddt_bias over their 8e-3 bar under strong decay
#: (kda K = 64: 1.15e-2; gdn K = 128: 1.13e-2 strong, 5.7e-2 steep; bf16x3 everywhere:
#: 2e-4), while TF32 for every other product costs little there (CPU simulator, kda K = 64,
#: T = 200, strong decay: dA_log 3.3e-4 against 5.1e-4 with bf16x3 everywhere).
EXACT_PRODUCT_OPS = frozenset({"kda.decay_matmul"})


#: an adjoint decay product whose gates are one value per row (GDN's, after
#: kda-narrow-broadcasts) weights w by 2^(g_i - g_j) before one product, so the gate
#: gradient's dominant near-diagonal terms go through the tensor cores too: bf16x3 (~16 bits)
#: put GDN's dA_log at 4.7e-1 on the H200 under a steep gate (bar 8e-3; the CPU simulator,
#: K = 64: 3.7e-2 against 5.6e-4 before), where the factored form had summed those terms in fp32.
#: Since GDN's backward takes Aqk's diagonal apart (kdagen.ir.programs, ``diagonal_apart``) the
#: cancelling diagonal no longer reaches dG: in the CPU simulator (sm_120a's pipeline, K = 64,
#: steep gate) bf16x3 gives dA_log 1.2e-3, and all-TF32 3.9e-3 under strong decay (1.3e-2
#: before); at K = 128 on sm_90a's pipeline bf16x3 gives 1.4e-3 at the steep gate against
#: tf32x3's 3.0e-4, over the 1e-3 goal for fp32 outputs, so tf32x3 stays.
ROW_GATE_PRECISION = "tf32x3"


def auto_precision(op: str | None, row_gates: bool = False) -> str:
    """The precision ``auto`` gives product op ``op`` (an op name; None: a plain kda.dot);
    ``row_gates``: its gates are broadcasts of one value per row."""
    if op in EXACT_PRODUCT_OPS:
        return ROW_GATE_PRECISION if row_gates else "bf16x3"
    return "tf32"

