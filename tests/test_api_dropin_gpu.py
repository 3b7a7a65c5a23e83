"""GPU tests of the drop-in behaviour (skipped without CUDA): fp32 gates are not rounded, the
declared gate ranges are enforced inside the kernels, strided inputs, cu_seqlens as a list,
return_intermediate_states.

`python tests/test_api_dropin_gpu.py DIR [CHIP]` emits (on a machine without a GPU) one bundle
with every program variant these tests use; run them with KDAGEN_BUNDLE=DIR.
"""
import pytest
import torch

import kdagen
from kdagen import reference as R

from conftest import requires_gpu
from test_api import BARS, make_inputs
from test_api_dropin import prefix_states

CASES = {
    # fp32 gate and beta next to bf16 q/k/v (FLA's habit), values off the bf16 grid
    "fp32_gate": dict(family="kda", dtype=torch.bfloat16, g_dtype=torch.float32, T=130, H=1, HV=2),
    # a precomputed gate promised >= -5 that breaks the promise (-8 in places)
    "below_lower_bound": dict(family="kda", dtype=torch.bfloat16, T=200, H=1, HV=2,
                              lower_bound=-5.0),
    # raw softplus gates with +-inf and huge entries
    "raw_inf": dict(family="kda", dtype=torch.bfloat16, g_dtype=torch.float32, T=100, H=1, HV=2,
                    gate="softplus", beta_sigmoid=True),
    "gdn_raw_inf": dict(family="gdn", dtype=torch.bfloat16, g_dtype=torch.float32, T=100, H=1,
                        HV=2, gate="softplus"),
}


def case_inputs(name):
    spec = dict(CASES[name])
    family = spec.pop("family")
    x, flags = make_inputs(family, seed=len(name), **spec)
    with torch.no_grad():
        g = x["g"]
        if name == "fp32_gate":
            g.add_(torch.full_like(g, 1e-4))                # off the bf16 grid
        elif name == "below_lower_bound":
            g.view(-1)[::7] = -8.0
        else:
            flat = g.view(-1)
            flat[3], flat[50], flat[51], flat[90] = float("inf"), float("-inf"), 1e6, -1e6
    return family, x, flags


def _fns(family):
    return ((kdagen.chunk_kda, R.chunk_kda) if family == "kda"
            else (kdagen.chunk_gated_delta_rule, R.chunk_gated_delta_rule))


def _to_cuda(x, flags):
    xc = {n: t.detach().cuda().requires_grad_(True) for n, t in x.items()}
    fc = {n: (v.cuda() if isinstance(v, torch.Tensor) else v) for n, v in flags.items()}
    return xc, fc


def _fwd_bwd(fn, xc, fc, seed=1):
    o, ht = fn(**xc, **fc)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen).to(o.dtype).cuda()
    dht = torch.randn(ht.shape, generator=gen).cuda()
    names = list(xc)
    grads = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(),
                                [xc[n] for n in names])
    return o, ht, dict(zip(names, grads)), do, dht


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_gate_cases_match_the_reference(name):
    """Every output and gradient finite and within docs/MATH.md §3's bars of the float64
    reference, which defines the same clamps (kdagen.reference.clamp_gate)."""
    family, x, flags = case_inputs(name)
    fn, ref_fn = _fns(family)
    xc, fc = _to_cuda(x, flags)
    o, ht, grads, do, dht = _fwd_bwd(fn, xc, fc)
    ref = R.reference_grads(lambda **kw: ref_fn(**kw, **fc), xc, do, dht)
    errs = {"o": R.rel_err(o, ref["o"]), "final_state": R.rel_err(ht, ref["final_state"])}
    errs.update({n: R.rel_err(g, ref[n]) for n, g in grads.items()})
    print(name, " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert all(torch.isfinite(g).all() for g in grads.values())
    bad = {n: e for n, e in errs.items() if not e <= BARS[n]}
    assert not bad, f"above the bars: {bad}"
    for n, g in grads.items():
        assert g.dtype == xc[n].dtype, f"d{n} has dtype {g.dtype}, its input {xc[n].dtype}"


@requires_gpu
@pytest.mark.gpu
def test_gpu_fp32_gate_is_not_rounded():
    """The same call with the fp32 gate rounded to bf16 first gives other results: the kernels
    read the fp32 values."""
    family, x, flags = case_inputs("fp32_gate")
    fn, _ = _fns(family)
    xc, fc = _to_cuda(x, flags)
    with torch.no_grad():
        o32, ht32 = fn(**xc, **fc)
        rounded = dict(xc, g=xc["g"].bfloat16().float())
        o16, ht16 = fn(**rounded, **fc)
    assert not torch.equal(ht32, ht16)
    assert R.rel_err(ht32, ht16) > 1e-6


@requires_gpu
@pytest.mark.gpu
def test_gpu_strided_inputs_and_list_cu_seqlens():
    """q/k split from a fused projection (strided) and cu_seqlens as a list give bitwise what
    contiguous tensors and a cu_seqlens tensor give, gradients included."""
    x, flags = make_inputs("kda", dtype=torch.bfloat16, g_dtype=torch.float32,
                           lengths=[1, 63, 130], H=1, HV=2, gate="softplus", beta_sigmoid=True)
    xc, fc = _to_cuda(x, flags)
    fused = torch.cat([xc["q"].detach(), xc["k"].detach()], -1).requires_grad_(True)
    K = xc["q"].shape[-1]
    strided = dict(xc, q=fused[..., :K], k=fused[..., K:])
    listed = dict(fc, cu_seqlens=fc["cu_seqlens"].tolist())
    o1, ht1 = kdagen.chunk_kda(**strided, **listed)
    g1 = torch.autograd.grad(o1.float().sum() + ht1.sum(), [fused, xc["g"]])
    o2, ht2 = kdagen.chunk_kda(**xc, **fc)
    g2 = torch.autograd.grad(o2.float().sum() + ht2.sum(), [xc["q"], xc["k"], xc["g"]])
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)
    assert torch.equal(g1[0], torch.cat([g2[0], g2[1]], -1)) and torch.equal(g1[1], g2[2])


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_gpu_return_intermediate_states(family):
    """h[0, i] is the state entering chunk i: the final state of the same op on the tokens
    before it (bf16 storage: compared at bf16 resolution)."""
    lengths = [70, 129]
    x, flags = make_inputs(family, dtype=torch.bfloat16, lengths=lengths, H=1, HV=2)
    xc, fc = _to_cuda(x, flags)
    fn, _ = _fns(family)
    with torch.inference_mode():
        o, ht, h = fn(**xc, **fc, return_intermediate_states=True)
        o2, ht2 = fn(**xc, **fc)
        assert torch.equal(o, o2) and torch.equal(ht, ht2)
        NT = sum(-(-n // 64) for n in lengths)
        assert h.shape == (1, NT, xc["v"].shape[2], xc["q"].shape[3], xc["v"].shape[3])
        assert h.dtype == torch.bfloat16
        for row, (n, c, want) in enumerate(prefix_states(fn, xc, lengths, **fc)):
            err = R.rel_err(h[0, row].float(), want)
            assert err < 4e-3, (n, c, err)


def variants_used() -> list:
    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        for name in CASES:
            family, x, flags = case_inputs(name)
            fn, _ = _fns(family)
            o, ht = fn(**x, **flags)
            (o.float().sum() + ht.sum()).backward()
        _, x, flags = case_inputs("fp32_gate")
        kdagen.chunk_kda(**dict(x, g=x["g"].detach().bfloat16().float()), **flags)
        x, flags = make_inputs("kda", dtype=torch.bfloat16, g_dtype=torch.float32,
                               lengths=[1, 63, 130], H=1, HV=2, gate="softplus", beta_sigmoid=True)
        o, ht = kdagen.chunk_kda(**x, **flags)
        (o.float().sum() + ht.sum()).backward()
        for family in ("kda", "gdn"):
            fn, _ = _fns(family)
            x, flags = make_inputs(family, dtype=torch.bfloat16, lengths=[70, 129], H=1, HV=2)
            with torch.inference_mode():
                fn(**x, **flags, return_intermediate_states=True)
                fn(**x, **flags)
                sub = {k: (t[:, :64] if k != "initial_state" else t[:1]) for k, t in x.items()}
                fn(**sub, **dict(flags, cu_seqlens=None))
    return rec.variants()


if __name__ == "__main__":
    import sys

    from gpu_bundle import write_variants_bundle
    write_variants_bundle(variants_used(), sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sm_90a")
