"""Fast transcendental emitters built on PTX approximate instructions.

`math.*` ops would lower to libdevice calls that ptxas cannot resolve (docs/ARCHITECTURE.md §6), so every
transcendental here is an `nvvm` intrinsic (ex2.approx, lg2.approx, rcp.approx) plus arith.
Natural-log quantities are converted with the constants below.
"""
from __future__ import annotations

import math

from ..._mlir import arith, ir, nvvm
from .kernel import const_f32

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def exp2(x: ir.Value) -> ir.Value:
    return nvvm.ex2(x)


def log2(x: ir.Value) -> ir.Value:
    return nvvm.log2(x)


def exp(x: ir.Value) -> ir.Value:
    return exp2(arith.mulf(x, const_f32(LOG2E)))


def reciprocal(x: ir.Value) -> ir.Value:
    return nvvm.rcp_approx_ftz_f(x)


def sigmoid(x: ir.Value) -> ir.Value:
    """1 / (1 + 2^(-x·log2 e)); saturates cleanly to 0 or 1 for large |x|."""
    neg_scaled = arith.mulf(x, const_f32(-LOG2E))
    return reciprocal(arith.addf(const_f32(1.0), exp2(neg_scaled)))


def softplus(x: ir.Value) -> ir.Value:
    """log(1 + e^x) = max(x, 0) + ln2 · log2(1 + 2^(−|x|·log2 e)): no overflow for any x."""
    abs_x = arith.maximumf(x, arith.negf(x))
    tail = log2(arith.addf(const_f32(1.0), exp2(arith.mulf(abs_x, const_f32(-LOG2E)))))
    return arith.addf(arith.maximumf(x, const_f32(0.0)), arith.mulf(tail, const_f32(LN2)))
