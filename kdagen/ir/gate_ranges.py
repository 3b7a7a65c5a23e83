"""The numbers behind the gates' declared and enforced ranges (no MLIR, no torch: the float64
reference imports this too, so kernels and reference share one definition).

Every gate's output g is clamped to its *enforced range* inside the programs
(:meth:`kdagen.ir.gates.Gate.__call__`), so the exponent-range analysis' proof holds for any
input, and a raw gate of ±inf (or a precomputed g below its promised lower bound) cannot make
the outputs non-finite:

- the enforced range is the declared range ``[lo, hi]``, with an infinite end replaced by
  :data:`GATE_FLOOR` (resp. ``-GATE_FLOOR``): ``g >= -128·ln 2`` means ``g·log2(e) >= -128``;
  the decay factor of a token at the floor, ``2^-128``, is already below the smallest normal
  fp32 number, and ``kda-stable-reassociate`` clamps every non-positive exp2 argument at -126
  anyway, so no fp32 kernel result can see a gate below the floor (in float64 the change is a
  factor <= 2^-128 on the contributions that cross such a token). The floor keeps the
  within-chunk cumsum Γ finite and small, so Γ_i − Γ_j never becomes inf − inf;
- a raw gate input (``g_raw``) is first clamped to ``[-RAW_GATE_BOUND, RAW_GATE_BOUND]``
  (2^100 ≈ 1.3e30): every library gate is saturated far below that, and it keeps
  ``exp(A_log)·x`` finite in fp32 (for exp(A_log) < 2^28), so the backward never forms
  0 · inf (= NaN) from the zero gradient of a clamped gate times an infinite intermediate.

The clamp's gradient is zero outside the range and the identity inside it, boundaries included
(``torch.clamp``'s rule).
"""
from __future__ import annotations

import math

__all__ = ["GATE_FLOOR", "RAW_GATE_BOUND", "A_LOG_MAX", "GATE_INPUT_MAX", "softplus_range",
           "enforced_range"]

GATE_FLOOR = -128.0 * math.log(2.0)       # ≈ -88.72: g·log2(e) >= -128
RAW_GATE_BOUND = 2.0 ** 100               # |g_raw| clamp (exact in fp32 and fp64)
A_LOG_MAX = math.log(16.0)                # default declared upper bound of A_log
GATE_INPUT_MAX = 20.0                     # default declared bound of the softplus input


def softplus_range(A_log_max: float = A_LOG_MAX, gate_input_max: float = GATE_INPUT_MAX):
    """Declared range of ``-exp(A_log)·softplus(x)`` for A_log <= A_log_max, x <= gate_input_max."""
    return (-math.exp(A_log_max) * math.log1p(math.exp(gate_input_max)), 0.0)


def enforced_range(lo: float, hi: float) -> tuple[float, float]:
    """The clamp of a gate with declared range [lo, hi]: infinite ends become the floor."""
    lo = float(lo) if math.isfinite(lo) else GATE_FLOOR
    hi = float(hi) if math.isfinite(hi) else -GATE_FLOOR
    return lo, hi
