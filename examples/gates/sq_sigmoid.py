"""KDA gate: a squared sigmoid, g = -exp(A_log[h]) * sigmoid(g_raw + dt_bias[h, :]) ** 2.

Squaring the sigmoid makes the decay switch on more sharply than softplus does. Parameters are
the built-in gates' (A_log per head, dt_bias per channel), so FLA's keywords work too::

    kdagen.chunk_kda(q, k, v, g_raw, beta, gate="sq_sigmoid", A_log=A_log, dt_bias=dt_bias)

Declared range (-inf, 0]: kdagen enforces it (g is clamped to [-128 ln 2, 0]) and proves every
exponential of the kernels from it (`kdagen stability kda_bwd --gates THIS_FILE --gate sq_sigmoid`).
"""
import math

import torch

from kdagen.ir.gate_math import exp, sigmoid
from kdagen.ir.gates import define_gate


@define_gate("sq_sigmoid", range=(-math.inf, 0.0))
def sq_sigmoid(g_raw, A_log, dt_bias):
    """KDA squared-sigmoid gate: g = -exp(A_log) * sigmoid(g_raw + dt_bias)^2."""
    return -exp(A_log) * sigmoid(g_raw + dt_bias) ** 2


def torch_reference(g_raw, A_log, dt_bias):
    """The same gate written directly in torch (g_raw [..., HV, K], A_log [HV], dt_bias [HV, K])."""
    return -torch.exp(A_log)[:, None] * torch.sigmoid(g_raw + dt_bias) ** 2


def sample_params(HV, K, decay, generator):
    """Parameters for a test: weak decay (|g| <= 1e-3 per token) or strong (|g| up to ~8)."""
    log_rate = math.log(1e-3) if decay == "weak" else math.log(8.0)
    return {"A_log": torch.full((HV,), log_rate, dtype=torch.float64),
            "dt_bias": torch.randn(HV, K, generator=generator, dtype=torch.float64) * 0.5}
