"""kdagen.chunk_kda / kdagen.chunk_gated_delta_rule (CPU: the interpreter executor) against the
float64 reference: o, final_state and every gradient through autograd, with docs/MATH.md §3's bars
for bf16/fp16 inputs and a tight bar for fp32 inputs; FLA semantics of the flags; lazy import.
"""
import math
import subprocess
import sys
import zlib

import pytest
import torch

import kdagen
from kdagen import reference as R

# docs/MATH.md §3 (bf16 inputs, fp32 state); fp16 is held to the same bars.
BARS = {"o": 0.005, "final_state": 0.005, "q": 0.008, "k": 0.008, "v": 0.008,
        "initial_state": 0.008, "g": 0.02, "beta": 0.02, "A_log": 0.008, "dt_bias": 0.008}
FP32_BAR = 1e-4   # the interpreter computes in fp32 with no intermediate rounding: ~1e-6 measured

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_inputs(family, *, dtype, B=1, T=64, H=1, HV=None, K=64, V=64, lengths=None,
                gate="precomputed", beta_sigmoid=False, l2norm=True, h0=True, g_dtype=None,
                lower_bound=None, seed=0):
    """Random FLA-style inputs (leaves that require grad) for one call; returns (tensors, flags)."""
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H
    if lengths is not None:
        B, T = 1, sum(lengths)
    N = len(lengths) if lengths is not None else B

    def rnd(*shape, scale=1.0, shift=0.0, dt=None):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift
        return x.to(dt or dtype)

    kda = family == "kda"
    gshape = (B, T, HV, K) if kda else (B, T, HV)
    qk_scale = 1.0 if l2norm else K ** -0.5
    x = {"q": rnd(B, T, H, K, scale=qk_scale), "k": rnd(B, T, H, K, scale=qk_scale),
         "v": rnd(B, T, HV, V)}
    flags = dict(use_qk_l2norm_in_kernel=l2norm, output_final_state=True)
    gdt = g_dtype or dtype
    if gate == "precomputed":
        lo = -1.0 if lower_bound is None else lower_bound
        x["g"] = (torch.rand(*gshape, generator=gen, dtype=torch.float64) * lo).to(gdt)
        if lower_bound is not None:
            flags.update(safe_gate=True, lower_bound=lower_bound)
    else:
        x["g"] = rnd(*gshape, shift=-1.0 if gate == "softplus" else 0.0, dt=gdt)
        x["A_log"] = rnd(HV, scale=0.5, dt=torch.float32)
        x["dt_bias"] = rnd(*((HV, K) if kda else (HV,)), scale=0.5, dt=torch.float32)
        flags["use_gate_in_kernel"] = True
        if gate == "lower_bound":
            flags.update(safe_gate=True, lower_bound=-5.0 if lower_bound is None else lower_bound)
    if beta_sigmoid:
        x["beta"] = rnd(B, T, HV, dt=gdt)
        flags["use_beta_sigmoid_in_kernel"] = True
    else:
        x["beta"] = torch.sigmoid(rnd(B, T, HV, dt=torch.float64)).to(gdt)
    if h0:
        x["initial_state"] = rnd(N, HV, K, V, scale=0.5, dt=torch.float32)
    for t in x.values():
        t.requires_grad_(True)
    if lengths is not None:
        flags["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                           dtype=torch.int32)
    return x, flags


def _api(family):
    return kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule


def _ref(family):
    return R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule


def run_and_compare(family, x, flags, bar):
    o, ht = _api(family)(**x, **flags)
    # outputs: FLA's dtypes and shapes
    assert o.dtype == x["v"].dtype and o.shape == x["v"].shape
    assert ht.dtype == torch.float32
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    dht = torch.randn(ht.shape, generator=gen, dtype=torch.float64).to(ht.dtype)
    names = list(x)
    grads = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), [x[n] for n in names])
    ref = R.reference_grads(lambda **kw: _ref(family)(**kw, **flags), x, do, dht)
    errs = {"o": R.rel_err(o, ref["o"]), "final_state": R.rel_err(ht, ref["final_state"])}
    for n, gr in zip(names, grads):
        assert gr.dtype == x[n].dtype and gr.shape == x[n].shape, n
        assert torch.isfinite(gr).all(), n
        errs[n] = R.rel_err(gr, ref[n])
    print(" ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    bad = {n: e for n, e in errs.items() if not e <= bar(n)}
    assert not bad, f"errors above the bar: {bad} (all: {errs})"
    return errs


CASES = {
    # KDA, in-kernel softplus gate, beta sigmoid, GVA 2, h0, bf16 q/k/v with an fp32 gate
    "kda_softplus_gva2_bf16": dict(family="kda", dtype="bf16", T=130, H=1, HV=2, gate="softplus",
                                   beta_sigmoid=True, g_dtype=torch.float32),
    # KDA, lower-bound gate at lb = -5 (strong decay), varlen with a length-1 sequence, fp16
    "kda_lowerbound_varlen_fp16": dict(family="kda", dtype="fp16", lengths=[1, 17, 64, 48], H=1,
                                       HV=2, gate="lower_bound", beta_sigmoid=True),
    # KDA, precomputed gate (FLA's default), fp32 inputs, batch 2, no l2norm, H = 2
    "kda_precomputed_fp32_batch": dict(family="kda", dtype="fp32", B=2, T=65, H=2, HV=2,
                                       l2norm=False),
    # KDA, precomputed gate with safe_gate's promise g >= -3, bf16
    "kda_precomputed_promise_bf16": dict(family="kda", dtype="bf16", T=100, H=1, HV=1,
                                         lower_bound=-3.0),
    # GDN, FLA's chunk_gated_delta_rule: precomputed gate and beta, varlen, GVA 2, bf16
    "gdn_precomputed_varlen_bf16": dict(family="gdn", dtype="bf16", lengths=[63, 1, 66], H=1,
                                        HV=2),
    # GDN, fp32 inputs, batch 2, no h0
    "gdn_precomputed_fp32_noh0": dict(family="gdn", dtype="fp32", B=2, T=70, H=2, HV=2, h0=False),
    # GDN with kdagen's extras: in-kernel softplus gate and beta sigmoid, fp16
    "gdn_softplus_fp16": dict(family="gdn", dtype="fp16", T=90, H=1, HV=2, gate="softplus",
                              beta_sigmoid=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_api_matches_reference(name):
    spec = dict(CASES[name])
    family, dtype = spec.pop("family"), DTYPES[spec.pop("dtype")]
    x, flags = make_inputs(family, dtype=dtype, seed=zlib.crc32(name.encode()) % 1000, **spec)
    if dtype == torch.float32:
        bar = lambda n: FP32_BAR  # noqa: E731
    else:
        bar = BARS.__getitem__
    run_and_compare(family, x, flags, bar)


# ------------------------------------------------------------------------------------------
# FLA semantics of the arguments
# ------------------------------------------------------------------------------------------


def _small(family="kda", **kw):
    kw.setdefault("dtype", torch.float32)
    kw.setdefault("T", 20)
    return make_inputs(family, **kw)


def test_final_state_is_none_without_output_final_state():
    x, flags = _small()
    flags["output_final_state"] = False
    o, ht = kdagen.chunk_kda(**x, **flags)
    assert ht is None
    o.float().sum().backward()
    assert x["initial_state"].grad is not None and x["q"].grad is not None


def test_default_scale_is_inverse_sqrt_k():
    x, flags = _small()
    with torch.no_grad():
        o1, _ = kdagen.chunk_kda(**x, **flags)
        o2, _ = kdagen.chunk_kda(**x, **flags, scale=64 ** -0.5)
        o3, _ = kdagen.chunk_kda(**x, **flags, scale=0.5)
    assert torch.equal(o1, o2)
    assert not torch.allclose(o1, o3)


def test_flat_dt_bias_gives_same_result_and_grad_shape():
    x, flags = _small(gate="softplus")
    x2 = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    x2["dt_bias"] = x["dt_bias"].detach().reshape(-1).clone().requires_grad_(True)
    o1, h1 = kdagen.chunk_kda(**x, **flags)
    o2, h2 = kdagen.chunk_kda(**x2, **flags)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    (o1.sum() + h1.sum()).backward()
    (o2.sum() + h2.sum()).backward()
    assert x2["dt_bias"].grad.shape == (x["dt_bias"].numel(),)
    torch.testing.assert_close(x2["dt_bias"].grad, x["dt_bias"].grad.reshape(-1))


def test_gate_parameters_are_ignored_without_gate_in_kernel():
    x, flags = _small()
    A_log = torch.zeros(1, requires_grad=True)
    dt_bias = torch.zeros(1, 64, requires_grad=True)
    o, ht = kdagen.chunk_kda(**x, **flags, A_log=A_log, dt_bias=dt_bias)
    with torch.no_grad():
        o_ref, _ = kdagen.chunk_kda(**x, **flags)
    assert torch.equal(o.detach(), o_ref)
    (o.sum() + ht.sum()).backward()
    assert A_log.grad is None and dt_bias.grad is None


def test_allow_neg_eigval_doubles_sigmoid_beta():
    x, flags = _small(beta_sigmoid=True)
    with torch.no_grad():
        o_neg, _ = kdagen.chunk_kda(**x, **flags, allow_neg_eigval=True)
        ref, _ = R.chunk_kda(**x, **flags, allow_neg_eigval=True)
        o_pos, _ = kdagen.chunk_kda(**x, **flags)
    assert R.rel_err(o_neg, ref) < FP32_BAR
    assert R.rel_err(o_pos, ref) > 1e-2


def test_loss_on_o_only_and_expanded_cotangent():
    """o.sum() gives a stride-0 cotangent; the final state's cotangent is absent."""
    x, flags = _small("gdn")
    o, ht = kdagen.chunk_gated_delta_rule(**x, **flags)
    o.sum().backward()
    ref = R.reference_grads(lambda **kw: R.chunk_gated_delta_rule(**kw, **flags), x,
                            torch.ones(o.shape, dtype=torch.float64))
    for n in x:
        assert R.rel_err(x[n].grad, ref[n]) < FP32_BAR, n


def test_fla_tuning_kwargs_are_accepted_and_unknown_ones_rejected():
    x, flags = _small()
    with torch.no_grad():
        kdagen.chunk_kda(**x, **flags, chunk_indices=None, cu_seqlens_cpu=None, disable_recompute=True)
        with pytest.raises(TypeError, match="use_qk_l2norm"):
            kdagen.chunk_kda(**x, **flags, use_qk_l2norm=True)
        with pytest.raises(TypeError, match="bogus"):
            kdagen.chunk_gated_delta_rule(*_small("gdn")[0].values(), bogus=1)


def test_no_nan_in_strong_decay_softplus():
    """A_log = ln 16 with the softplus gate: the stabilised program stays finite in fp32."""
    x, flags = make_inputs("kda", dtype=torch.bfloat16, T=70, gate="softplus", beta_sigmoid=True,
                           seed=3)
    with torch.no_grad():
        x["A_log"].fill_(math.log(16.0))
        x["g"].add_(3.0)
    o, ht = kdagen.chunk_kda(**x, **flags)
    ref_o, ref_ht = R.chunk_kda(**x, **flags)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert R.rel_err(o, ref_o) <= BARS["o"] and R.rel_err(ht, ref_ht) <= BARS["final_state"]


# ------------------------------------------------------------------------------------------
# import cost
# ------------------------------------------------------------------------------------------


def test_import_kdagen_is_lazy():
    code = ("import sys, kdagen; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert not any(m.startswith('numba_cuda_mlir') for m in sys.modules), 'mlir imported'; "
            "f = kdagen.chunk_kda; assert callable(f) and kdagen.chunk_gated_delta_rule; "
            "assert 'torch' in sys.modules; "
            "assert not any(m.startswith('numba_cuda_mlir') for m in sys.modules), 'mlir imported by api'; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kdagen.nope  # noqa: B018
