"""KDA gate with two per-channel parameters: g = -softplus(rate[h, :]) * sigmoid(g_raw * exp(sharpness[h, :])).

Each key channel learns its own decay rate (softplus(rate) per token at most) and how sharply
the raw gate switches it on. Declared range [-8, 0]: a decay of at most e^-8 per token, enforced
by kdagen's clamp (its gradient is zero where a channel would decay faster)::

    kdagen.chunk_kda(q, k, v, g_raw, beta, gate="kda_channel_rate",
                     gate_params={"rate": rate, "sharpness": sharpness})   # both [HV, K]
"""
import torch

from kdagen.ir.gate_math import clamp, exp, sigmoid, softplus
from kdagen.ir.gates import define_gate


@define_gate("kda_channel_rate", range=(-8.0, 0.0),
             params={"rate": "channel", "sharpness": "channel"})
def kda_channel_rate(g_raw, rate, sharpness):
    """KDA gate with a learned decay rate and sharpness per channel."""
    return -softplus(rate) * sigmoid(g_raw * exp(clamp(sharpness, -4.0, 4.0)))


def torch_reference(g_raw, rate, sharpness):
    """The same gate in torch (g_raw [..., HV, K], rate and sharpness [HV, K])."""
    return (-torch.nn.functional.softplus(rate, threshold=1e4)
            * torch.sigmoid(g_raw * torch.exp(sharpness.clamp(-4.0, 4.0))))


def sample_params(HV, K, decay, generator):
    """Weak decay (softplus(rate) ~ 1e-3) or strong (rate ~ 4 to 8 per token, some clamped)."""
    base = -6.9 if decay == "weak" else 6.0
    return {"rate": base + torch.randn(HV, K, generator=generator, dtype=torch.float64) * 0.3,
            "sharpness": torch.randn(HV, K, generator=generator, dtype=torch.float64) * 0.5}
