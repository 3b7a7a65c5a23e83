"""Tests of kdagen/validation.py: every error is raised and its message is checked."""

import math

import pytest
import torch

from kdagen.validation import InputSizes, KdagenInputError, validate_inputs

B, T, H, HV, K, V = 2, 8, 2, 4, 4, 4


def base(op="kda", *, B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=torch.float32):
    """A valid argument set; tests mutate one thing."""
    return dict(
        op=op,
        q=torch.randn(B, T, H, K, dtype=dtype),
        k=torch.randn(B, T, H, K, dtype=dtype),
        v=torch.randn(B, T, HV, V, dtype=dtype),
        g=-torch.rand(B, T, HV, K) if op == "kda" else -torch.rand(B, T, HV),
        beta=torch.rand(B, T, HV),
        initial_state=torch.zeros(B, HV, K, V),
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV, K) if op == "kda" else torch.zeros(HV),
        use_gate_in_kernel=True,
    )


def call(args):
    args = dict(args)
    op = args.pop("op")
    return validate_inputs(op, args.pop("q"), args.pop("k"), args.pop("v"), args.pop("g"),
                           args.pop("beta"), **args)


def expect(args, *fragments):
    with pytest.raises(KdagenInputError) as info:
        call(args)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


def varlen(op="kda", offsets=(0, 3, 4, 16)):
    a = base(op, B=1, T=offsets[-1])
    a["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32)
    a["initial_state"] = torch.zeros(len(offsets) - 1, HV, K, V)
    return a


def noncontig(*shape):
    # same shape, transposed storage
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)


# ------------------------------------------------------------------------------------------
# valid inputs
# ------------------------------------------------------------------------------------------


def test_valid_inputs_return_sizes():
    for op in ("kda", "gdn"):
        s = call(base(op))
        assert isinstance(s, InputSizes)
        assert (s.B, s.T, s.H, s.HV, s.K, s.V, s.N, s.group) == (B, T, H, HV, K, V, B, HV // H)
        assert s["group"] == 2 and s.as_dict()["N"] == B
    s = call(varlen())
    assert (s.B, s.T, s.N) == (1, 16, 3)
    s = call(base(K=4, V=8, HV=2, H=1) | {"initial_state": None, "A_log": None, "dt_bias": None,
                                          "use_gate_in_kernel": False})
    assert (s.H, s.HV, s.K, s.V, s.group) == (1, 2, 4, 8, 2)


def test_valid_variants_accepted():
    call(base() | {"dt_bias": torch.zeros(HV * K)})                      # flattened KDA bias
    call(base() | {"initial_state": torch.zeros(B, HV, K, V, dtype=torch.float64)})
    call(base() | {"safe_gate": True, "lower_bound": -5.0})               # -5 is inside [-5, 0)
    call(base() | {"safe_gate": True, "lower_bound": torch.tensor(-1.0)})
    call(base() | {"lower_bound": 3.0})                                   # ignored without safe_gate
    call(base() | {"k": noncontig(B, T, H, K), "require_contiguous": False})
    call(base(K=64, V=64) | {"supported_head_dims": {64, 128}, "require_equal_head_dims": True})
    call(base(dtype=torch.bfloat16) | {"allowed_dtypes": {torch.bfloat16}})  # fp32 g/beta allowed
    call(base() | {"A_log": None, "dt_bias": None, "use_gate_in_kernel": False})
    call(base() | {"device": "cpu"})
    call(base(B=1) | {"cu_seqlens": torch.tensor([0, 8]), "initial_state": torch.zeros(1, HV, K, V)})


# ------------------------------------------------------------------------------------------
# errors: op, types, shapes
# ------------------------------------------------------------------------------------------


def test_bad_op_and_non_tensor():
    expect(base() | {"op": "gla"}, "op:", '"kda" or "gdn"', "'gla'")
    expect(base() | {"q": [[1.0]]}, "q:", "torch.Tensor", "list")
    expect(base() | {"beta": 0.5}, "beta:", "torch.Tensor", "float")


def test_q_shape():
    expect(base() | {"q": torch.randn(B, T, H * K)}, "q:", "4-D", "[B, T, H, K]", f"[{B}, {T}, {H * K}]")


def test_k_shape_message_format():
    msg = expect(base() | {"k": torch.randn(B, T, H, K - 1)})
    assert msg == f"k: expected shape [B, T, H, K] = [{B}, {T}, {H}, {K}] to match q, got [{B}, {T}, {H}, {K - 1}]"


def test_v_shape():
    expect(base() | {"v": torch.randn(B, T + 1, HV, V)}, "v:", "[B, T, HV, V]", f"B = {B}, T = {T}",
           f"[{B}, {T + 1}, {HV}, {V}]")
    expect(base() | {"v": torch.randn(B, T, HV * V)}, "v:", "[B, T, HV, V]")


def test_hv_not_multiple_of_h():
    a = base(HV=3) | {"initial_state": None, "A_log": None, "dt_bias": None, "use_gate_in_kernel": False}
    expect(a, "v:", "HV must be a multiple of H", "HV = 3", f"H = {H}", "h // (HV // H)")


def test_g_shape():
    expect(base() | {"g": torch.randn(B, T, HV, K + 1)}, "g:", f"[B, T, HV, K] = [{B}, {T}, {HV}, {K}]",
           f"[{B}, {T}, {HV}, {K + 1}]")
    expect(base() | {"g": torch.randn(B, T, HV)}, "g:", "[B, T, HV, K]", "chunk_gated_delta_rule")
    expect(base("gdn") | {"g": torch.randn(B, T, HV, K)}, "g:", f"[B, T, HV] = [{B}, {T}, {HV}]", "chunk_kda")
    expect(base("gdn") | {"g": torch.randn(B, T, H)}, "g:", f"got [{B}, {T}, {H}]")


def test_beta_shape():
    expect(base() | {"beta": torch.rand(B, T, H)}, "beta:", f"[B, T, HV] = [{B}, {T}, {HV}]", f"[{B}, {T}, {H}]")
    expect(base("gdn") | {"beta": torch.rand(B, T, HV, 1)}, "beta:", "[B, T, HV]")


# ------------------------------------------------------------------------------------------
# errors: dtypes, devices, layout, head dims
# ------------------------------------------------------------------------------------------


def test_dtype_mismatch():
    expect(base() | {"k": torch.randn(B, T, H, K, dtype=torch.float16)}, "k:", "torch.float32 to match q",
           "torch.float16", ".to(torch.float32)")
    expect(base() | {"v": torch.randn(B, T, HV, V, dtype=torch.bfloat16)}, "v:", "to match q", "torch.bfloat16")


def test_disallowed_dtype():
    allowed = {"allowed_dtypes": (torch.bfloat16, torch.float16)}
    expect(base() | allowed, "q:", "torch.float32 is not supported", "torch.bfloat16", "torch.float16")
    a = base(dtype=torch.bfloat16) | allowed | {"g": -torch.rand(B, T, HV, K, dtype=torch.float64)}
    expect(a, "g:", "torch.float64 is not supported", "torch.float32")
    a = base(dtype=torch.bfloat16) | allowed | {"beta": torch.rand(B, T, HV, dtype=torch.float64)}
    expect(a, "beta:", "torch.float64")


def test_non_float_dtypes():
    expect(base() | {"q": torch.ones(B, T, H, K, dtype=torch.int64)}, "q:", "floating-point", "torch.int64")
    expect(base() | {"g": torch.ones(B, T, HV, K, dtype=torch.int32)}, "g:", "floating-point", "torch.int32")
    expect(base() | {"beta": torch.ones(B, T, HV, dtype=torch.bool)}, "beta:", "floating-point")
    expect(base() | {"A_log": torch.zeros(HV, dtype=torch.int64)}, "A_log:", "floating-point")
    expect(base() | {"dt_bias": torch.zeros(HV, K, dtype=torch.int64)}, "dt_bias:", "floating-point")


@pytest.mark.parametrize("name", ["k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"])
def test_device_mismatch(name):
    a = base()
    a[name] = a[name].to("meta")
    expect(a, f"{name}:", "expected device cpu (same as q)", "got meta", ".to(q.device)")


def test_device_argument():
    expect(base() | {"device": "cuda"}, "q:", "expected a tensor on device cuda", "got cpu")
    expect(base() | {"device": "meta"}, "q:", "device meta")


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "initial_state", "dt_bias"])
def test_non_contiguous(name):
    a = base()
    a[name] = noncontig(*a[name].shape)
    assert not a[name].is_contiguous()
    expect(a, f"{name}:", "contiguous", "call .contiguous()")


def test_non_contiguous_cu_seqlens():
    a = varlen()
    a["cu_seqlens"] = torch.tensor([0, 9, 3, 9, 4, 9, 16, 9], dtype=torch.int32)[::2]
    expect(a, "cu_seqlens:", "call .contiguous()")


def test_unsupported_head_dims():
    dims = {"supported_head_dims": {64, 128}}
    expect(base() | dims, "q:", f"K = {K} is not supported", "[64, 128]")
    a = base(K=64, V=32) | dims
    expect(a, "v:", "V = 32 is not supported", "[64, 128]")
    a = base(K=64, V=128) | dims | {"require_equal_head_dims": True}
    expect(a, "v:", "V == K = 64", "V = 128")


# ------------------------------------------------------------------------------------------
# errors: cu_seqlens
# ------------------------------------------------------------------------------------------


def test_cu_seqlens_dtype():
    a = varlen()
    a["cu_seqlens"] = a["cu_seqlens"].float()
    expect(a, "cu_seqlens:", "torch.int32 or torch.int64", "torch.float32")


def test_cu_seqlens_ndim_and_length():
    a = varlen()
    a["cu_seqlens"] = a["cu_seqlens"].view(2, 2)
    expect(a, "cu_seqlens:", "1-D", "[2, 2]")
    a = varlen()
    a["cu_seqlens"] = torch.tensor([0], dtype=torch.int64)
    expect(a, "cu_seqlens:", "at least 2")


def test_cu_seqlens_start_end():
    expect(varlen(offsets=(1, 3, 4, 16)), "cu_seqlens:", "cu_seqlens[0] == 0", "got 1")
    a = varlen(offsets=(0, 3, 4, 16))
    a.update(q=a["q"][:, :15], k=a["k"][:, :15], v=a["v"][:, :15], g=a["g"][:, :15], beta=a["beta"][:, :15])
    a = {n: (x.contiguous() if isinstance(x, torch.Tensor) else x) for n, x in a.items()}
    expect(a, "cu_seqlens:", "cu_seqlens[-1] == T = 15", "got 16")


def test_cu_seqlens_not_increasing():
    a = varlen(offsets=(0, 10, 4, 16))
    expect(a, "cu_seqlens:", "strictly increasing", "cu_seqlens[2] = 4 <= cu_seqlens[1] = 10")
    a = varlen(offsets=(0, 4, 4, 16))  # an empty sequence
    expect(a, "cu_seqlens:", "strictly increasing", "length >= 1", "drop empty sequences")


def test_cu_seqlens_needs_batch_one():
    a = base(B=2, T=8)
    a["cu_seqlens"] = torch.tensor([0, 3, 8])
    expect(a, "cu_seqlens:", "B == 1", "got B = 2", "pass B == 1 with cu_seqlens")


def test_cu_seqlens_device_and_value_checks():
    a = varlen()
    a["cu_seqlens"] = a["cu_seqlens"].to("meta")
    expect(a, "cu_seqlens:", "expected device cpu", "meta")
    # values are not read when check_values=False (the runtime's no-sync mode)
    a = varlen(offsets=(0, 10, 4, 16)) | {"check_values": False}
    assert call(a).N == 3


def test_meta_inputs_skip_value_checks():
    a = varlen(offsets=(0, 10, 4, 16))
    a = {n: (x.to("meta") if isinstance(x, torch.Tensor) else x) for n, x in a.items()}
    assert call(a).N == 3


# ------------------------------------------------------------------------------------------
# errors: initial_state, gate parameters
# ------------------------------------------------------------------------------------------


def test_initial_state_shape_and_dtype():
    expect(base() | {"initial_state": torch.zeros(B + 1, HV, K, V)}, "initial_state:",
           f"[N, HV, K, V] = [{B}, {HV}, {K}, {V}]", f"N = B = {B}", f"got [{B + 1}, {HV}, {K}, {V}]")
    a = varlen()
    a["initial_state"] = torch.zeros(1, HV, K, V)
    expect(a, "initial_state:", f"[3, {HV}, {K}, {V}]", "len(cu_seqlens) - 1 = 3", "got [1,")
    expect(base() | {"initial_state": torch.zeros(B, H, K, V)}, "initial_state:", f"got [{B}, {H}, {K}, {V}]")
    expect(base() | {"initial_state": torch.zeros(B, HV, K, V, dtype=torch.bfloat16)}, "initial_state:",
           "torch.float32 or torch.float64", "torch.bfloat16", ".float()")


@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_gate_params_required(op):
    expect(base(op) | {"A_log": None}, "A_log:", "required when use_gate_in_kernel=True", "softplus",
           f"[HV] = [{HV}]")
    fix = f"torch.zeros({HV}, {K})" if op == "kda" else f"torch.zeros({HV})"
    expect(base(op) | {"dt_bias": None}, "dt_bias:", "required when use_gate_in_kernel=True", fix)
    expect(base(op) | {"dt_bias": None, "safe_gate": True, "lower_bound": -3.0}, "dt_bias:", "sigmoid")


def test_gate_param_shapes():
    expect(base() | {"A_log": torch.zeros(H)}, "A_log:", f"[HV] = [{HV}]", f"got [{H}]")
    expect(base() | {"A_log": torch.zeros(HV, 1)}, "A_log:", f"got [{HV}, 1]")
    expect(base() | {"dt_bias": torch.zeros(HV, K + 1)}, "dt_bias:", f"[HV, K] = [{HV}, {K}]",
           f"[HV * K] = [{HV * K}]", f"got [{HV}, {K + 1}]")
    expect(base("gdn") | {"dt_bias": torch.zeros(HV, K)}, "dt_bias:", f"[HV] = [{HV}]", f"got [{HV}, {K}]")
    # checked even without use_gate_in_kernel
    expect(base() | {"use_gate_in_kernel": False, "A_log": torch.zeros(3)}, "A_log:", "got [3]")


def test_lower_bound():
    expect(base() | {"safe_gate": True}, "lower_bound:", "required when safe_gate=True", "-5.0")
    expect(base() | {"safe_gate": True, "use_gate_in_kernel": False}, "lower_bound:", "required")
    for bad in (0.0, 1.0, -5.5, -math.inf, math.nan):
        expect(base() | {"safe_gate": True, "lower_bound": bad}, "lower_bound:", "[-5, 0)", f"got {float(bad)}")
    expect(base() | {"safe_gate": True, "lower_bound": "x"}, "lower_bound:", "[-5, 0)", "'x'")
    expect(base() | {"safe_gate": True, "lower_bound": torch.zeros(2)}, "lower_bound:", "Python float")


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        call(base() | {"k": torch.randn(1)})
