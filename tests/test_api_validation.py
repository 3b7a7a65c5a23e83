"""Argument errors of kdagen.chunk_kda / chunk_gated_delta_rule and of the torch ops: a
KdagenInputError (a ValueError) whose message starts with the offending argument's name."""
import pytest
import torch

import kdagen
from kdagen.validation import KdagenInputError

from test_ops import fwd_args

B, T, H, HV, K, V = 1, 16, 1, 2, 64, 64


def valid(family="kda", **over):
    x = dict(q=torch.randn(B, T, H, K, dtype=torch.bfloat16),
             k=torch.randn(B, T, H, K, dtype=torch.bfloat16),
             v=torch.randn(B, T, HV, V, dtype=torch.bfloat16),
             g=-torch.rand(B, T, HV, K) if family == "kda" else -torch.rand(B, T, HV),
             beta=torch.rand(B, T, HV),
             initial_state=torch.zeros(B, HV, K, V))
    x.update(over)
    return x


def expect(fn, kwargs, name, *fragments):
    with pytest.raises(KdagenInputError) as info:
        fn(**kwargs)
    msg = str(info.value)
    assert msg.startswith(f"{name}:"), msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


def test_valid_call_runs():
    with torch.no_grad():
        o, ht = kdagen.chunk_kda(**valid(), output_final_state=True)
    assert o.shape == (B, T, HV, V) and ht.shape == (B, HV, K, V)


def test_dtypes():
    expect(kdagen.chunk_kda, valid(q=torch.randn(B, T, H, K, dtype=torch.float64),
                                   k=torch.randn(B, T, H, K, dtype=torch.float64),
                                   v=torch.randn(B, T, HV, V, dtype=torch.float64)),
           "q", "not supported", "torch.float64")
    expect(kdagen.chunk_kda, valid(k=torch.randn(B, T, H, K)), "k", "match q")
    expect(kdagen.chunk_kda, valid(g=torch.zeros(B, T, HV, K, dtype=torch.int32)), "g", "floating")
    expect(kdagen.chunk_kda, valid(beta=torch.rand(B, T, HV, dtype=torch.float64)), "beta", "not supported")
    expect(kdagen.chunk_kda, valid(initial_state=torch.zeros(B, HV, K, V, dtype=torch.int32)),
           "initial_state", "float32")


def test_shapes():
    expect(kdagen.chunk_kda, valid(v=torch.randn(B, T + 1, HV, V, dtype=torch.bfloat16)), "v", "[B, T, HV, V]")
    qk2 = torch.randn(B, T, 2, K, dtype=torch.bfloat16)
    expect(kdagen.chunk_kda, valid(q=qk2, k=qk2, v=torch.randn(B, T, 3, V, dtype=torch.bfloat16)),
           "v", "multiple of H")
    expect(kdagen.chunk_kda, valid(g=-torch.rand(B, T, HV)), "g", "chunk_gated_delta_rule")
    expect(kdagen.chunk_gated_delta_rule, valid("gdn", g=-torch.rand(B, T, HV, K)), "g", "chunk_kda")
    expect(kdagen.chunk_kda, valid(beta=torch.rand(B, T, HV, 1)), "beta", "[B, T, HV]")
    expect(kdagen.chunk_kda, valid(initial_state=torch.zeros(2, HV, K, V)), "initial_state", "[N, HV, K, V]")


def test_unsupported_head_dims():
    """K past the largest built size (smaller ones run zero-padded, a larger V in parts:
    tests/test_head_dims.py)."""
    expect(kdagen.chunk_kda, valid(q=torch.randn(B, T, H, 320, dtype=torch.bfloat16),
                                   k=torch.randn(B, T, H, 320, dtype=torch.bfloat16),
                                   g=-torch.rand(B, T, HV, 320), initial_state=None),
           "q", "K = 320", "up to 256", "[64, 128, 256]")
    # the decode API likewise (a larger V runs in parts there too)
    from kdagen.decode import fused_recurrent_kda
    expect(fused_recurrent_kda, valid(q=torch.randn(B, T, H, 320, dtype=torch.bfloat16),
                                      k=torch.randn(B, T, H, 320, dtype=torch.bfloat16),
                                      g=-torch.rand(B, T, HV, 320), initial_state=None),
           "q", "K = 320", "up to 256")


def test_devices():
    expect(kdagen.chunk_kda, valid(k=torch.empty(B, T, H, K, dtype=torch.bfloat16, device="meta")),
           "k", "device")
    expect(kdagen.chunk_kda, valid(initial_state=torch.zeros(B, HV, K, V, device="meta")),
           "initial_state", "device")




def test_cu_seqlens():
    x = valid(initial_state=None)
    expect(kdagen.chunk_kda, dict(x, cu_seqlens=torch.tensor([0, 9, 4, 16])), "cu_seqlens", "increasing")
    expect(kdagen.chunk_kda, dict(x, cu_seqlens=torch.tensor([0, 4, 15])), "cu_seqlens", "T = 16")
    expect(kdagen.chunk_kda, dict(x, cu_seqlens=torch.tensor([1, 4, 16])), "cu_seqlens", "cu_seqlens[0] == 0")
    expect(kdagen.chunk_kda, dict(x, cu_seqlens=torch.tensor([0.0, 16.0])), "cu_seqlens", "int32")
    x2 = {n: torch.cat([t, t]) for n, t in x.items() if t is not None}
    expect(kdagen.chunk_kda, dict(x2, cu_seqlens=torch.tensor([0, 16])), "cu_seqlens", "B == 1")
    # initial_state must have one state per sequence
    expect(kdagen.chunk_kda, dict(x, cu_seqlens=torch.tensor([0, 4, 16]),
                                  initial_state=torch.zeros(1, HV, K, V)), "initial_state", "N = ")


def test_gate_arguments():
    x = valid()
    expect(kdagen.chunk_kda, dict(x, use_gate_in_kernel=True, dt_bias=torch.zeros(HV, K)), "A_log", "required")
    expect(kdagen.chunk_kda, dict(x, use_gate_in_kernel=True, A_log=torch.zeros(HV + 1),
                                  dt_bias=torch.zeros(HV, K)), "A_log", "[HV]")
    expect(kdagen.chunk_kda, dict(x, use_gate_in_kernel=True, A_log=torch.zeros(HV),
                                  dt_bias=torch.zeros(HV, K + 1)), "dt_bias", "[HV, K]")
    expect(kdagen.chunk_kda, dict(x, use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(HV),
                                  dt_bias=torch.zeros(HV, K), lower_bound=-6.0), "lower_bound", "[-5, 0)")
    expect(kdagen.chunk_kda, dict(x, use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(HV)),
           "lower_bound", "required")


def test_scale_must_be_a_float():
    expect(kdagen.chunk_kda, dict(valid(), scale=torch.tensor(0.1)), "scale", "float")


def test_the_ops_validate_too():
    """Direct torch.ops callers get the same errors (the API is not the only gate)."""
    from test_api import make_inputs
    x, flags = make_inputs("kda", dtype=torch.bfloat16, T=8, K=64, V=64)
    args = fwd_args("kda", x, flags)
    bad = list(args)
    bad[2] = torch.randn(1, 8, 1, 128, dtype=torch.bfloat16)[..., ::2]  # non-contiguous v
    with pytest.raises(KdagenInputError, match="^v: expected a contiguous"):
        torch.ops.kdagen.kda_fwd(*bad)
    bad = list(args)
    bad[16], bad[15] = -7.0, True     # safe_gate with lower_bound outside [-5, 0)
    with pytest.raises(KdagenInputError, match="^lower_bound:"):
        torch.ops.kdagen.kda_fwd(*bad)
    do = torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(KdagenInputError, match="^do: expected shape"):
        torch.ops.kdagen.kda_bwd(do.expand(1, 8, 1, 64)[:, :4], None, *[a.detach() if isinstance(a, torch.Tensor) else a
                                                                       for a in args[:10]], *args[11:17],
                                 [])


def test_unsupported_device_type_names_the_fix():
    from kdagen.runtime.backends import get_executor
    with pytest.raises(RuntimeError, match="no executor for device type 'xla'"):
        get_executor("xla")
