"""GDN gate with a learned temperature: g = -exp(A_log[h]) * tau * softplus((g_raw + dt_bias[h]) / tau),
tau = exp(clamp(log_tau[h], -3, 3)).

A small tau makes the decay a sharp hinge at g_raw + dt_bias = 0, a large one a smooth ramp
(tau = 1 is the built-in softplus gate). log_tau is clamped, not only declared: a learned
parameter that leaves [-3, 3] keeps the kernels' exponentials provably in range, and its
gradient is zero there (torch.clamp's rule)::

    kdagen.chunk_gated_delta_rule(q, k, v, g_raw, beta, gate="gdn_temperature",
                                  gate_params={"A_log": A_log, "dt_bias": dt_bias, "log_tau": log_tau})
"""
import torch

from kdagen.ir.gate_math import clamp, exp, softplus
from kdagen.ir.gates import define_gate

LOG_TAU_MIN, LOG_TAU_MAX = -3.0, 3.0


@define_gate("gdn_temperature", family="gdn", range=(-64.0, 0.0))
def gdn_temperature(g_raw, A_log, dt_bias, log_tau):
    """GDN softplus gate with a learned per-head temperature tau = exp(log_tau)."""
    tau = exp(clamp(log_tau, LOG_TAU_MIN, LOG_TAU_MAX))
    return -exp(A_log) * tau * softplus((g_raw + dt_bias) / tau)


def torch_reference(g_raw, A_log, dt_bias, log_tau):
    """The same gate in torch (g_raw [..., HV], every parameter [HV])."""
    tau = torch.exp(log_tau.clamp(LOG_TAU_MIN, LOG_TAU_MAX))
    return -torch.exp(A_log) * tau * torch.nn.functional.softplus((g_raw + dt_bias) / tau,
                                                                   threshold=1e4)


def sample_params(HV, K, decay, generator):
    """Weak decay (|g| ~ 1e-3 per token) or strong (|g| of several units); tau from 0.3 to 3."""
    rate = -7.0 if decay == "weak" else 1.5
    return {"A_log": torch.full((HV,), rate, dtype=torch.float64),
            "dt_bias": torch.randn(HV, generator=generator, dtype=torch.float64) * 0.5,
            "log_tau": torch.linspace(-1.2, 1.1, HV, dtype=torch.float64)}
