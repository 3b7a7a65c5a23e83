"""GPU tests of kdagen.chunk_kda / chunk_gated_delta_rule (skipped without CUDA).

The API on CUDA tensors (the bundle executor: $KDAGEN_BUNDLE, the kernel cache, or compile on
first use) against the float64 reference with docs/MATH.md §3's bars; no host synchronisation in
forward or backward; torch.compile. While the GPU launcher (kdagen.runtime.launch) does
not exist, the bundle executor raises KernelLaunchNotImplemented and these tests xfail saying so.
"""
import pytest
import torch

import kdagen
from kdagen import reference as R

from conftest import requires_gpu
from gpu_bundle import kernels_or_skip
from test_api import BARS, make_inputs

pytestmark = [requires_gpu, pytest.mark.gpu]


def to_cuda(x, flags):
    xc = {n: t.detach().cuda().requires_grad_(True) for n, t in x.items()}
    fc = {n: (v.cuda() if isinstance(v, torch.Tensor) else v) for n, v in flags.items()}
    return xc, fc


GPU_CASES = {
    "kda_softplus_T1": dict(family="kda", T=1, H=1, HV=1, K=128, V=128, gate="softplus", beta_sigmoid=True),
    "kda_softplus_T63_gva2": dict(family="kda", T=63, H=2, HV=4, gate="softplus", beta_sigmoid=True),
    "kda_lowerbound_T65": dict(family="kda", T=65, H=1, HV=1, K=128, V=128, gate="lower_bound"),
    "kda_lowerbound_T1000_gva4": dict(family="kda", B=2, T=1000, H=2, HV=8, gate="lower_bound"),
    "kda_varlen": dict(family="kda", lengths=[1, 17, 64, 129, 1000, 2500], H=1, HV=2, K=128, V=128,
                       gate="softplus", beta_sigmoid=True),
    "kda_precomputed_noh0": dict(family="kda", T=4096, H=2, HV=2, h0=False),
    "gdn_T64": dict(family="gdn", T=64, H=1, HV=1),
    "gdn_varlen_gva2": dict(family="gdn", lengths=[1, 63, 65, 1000], H=2, HV=4, K=128, V=128),
    # head dims (issue 16): zero-padded to the built ones, V past 128 in value parts, K = 256
    "dims_kda_K60_V100": dict(family="kda", T=130, H=1, HV=2, K=60, V=100, gate="softplus",
                              beta_sigmoid=True),
    "dims_kda_K256_V256_varlen": dict(family="kda", lengths=[1, 65, 300], H=1, HV=1, K=256,
                                      V=256, gate="softplus", beta_sigmoid=True),
    "dims_gdn_K100": dict(family="gdn", T=200, H=1, HV=1, K=100, V=100),
    "dims_gdn_K128_V256_gva2": dict(family="gdn", T=129, H=1, HV=2, K=128, V=256),
    "dims_gdn_K256": dict(family="gdn", T=300, H=2, HV=2, K=256, V=128),
    "dims_kda_K32": dict(family="kda", T=100, H=1, HV=1, K=32, V=32, gate="softplus",
                         beta_sigmoid=True),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_matches_reference(name, dtype):
    spec = dict(GPU_CASES[name])
    family = spec.pop("family")
    x, flags = make_inputs(family, dtype=dtype, g_dtype=torch.float32, seed=len(name), **spec)
    xc, fc = to_cuda(x, flags)
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    ref_fn = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    with kernels_or_skip():
        o, ht = fn(**xc, **fc)
        gen = torch.Generator().manual_seed(1)
        do = torch.randn(o.shape, generator=gen).to(o.dtype).cuda()
        dht = torch.randn(ht.shape, generator=gen).cuda()
        names = list(xc)
        grads = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(),
                                    [xc[n] for n in names])
    ref = R.reference_grads(lambda **kw: ref_fn(**kw, **fc), xc, do, dht)
    errs = {"o": R.rel_err(o, ref["o"]), "final_state": R.rel_err(ht, ref["final_state"])}
    errs.update({n: R.rel_err(gr, ref[n]) for n, gr in zip(names, grads)})
    print(name, dtype, " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    bad = {n: e for n, e in errs.items() if not e <= BARS[n]}
    assert not bad, f"above the bars: {bad}"


def test_gpu_no_host_sync_in_forward_and_backward():
    x, flags = make_inputs("kda", dtype=torch.bfloat16, lengths=[10, 100, 30], H=1, HV=2,
                           gate="softplus", beta_sigmoid=True)
    xc, fc = to_cuda(x, flags)
    with kernels_or_skip():
        o, ht = kdagen.chunk_kda(**xc, **fc)           # warm-up: bundle lookup, module load
        (o.float().sum() + ht.sum()).backward()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            o, ht = kdagen.chunk_kda(**xc, **fc)
            (o.float().sum() + ht.sum()).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(o).all()


def test_gpu_compile_matches_eager():
    x, flags = make_inputs("gdn", dtype=torch.bfloat16, T=200, H=1, HV=2)
    xc, fc = to_cuda(x, flags)
    names = list(xc)

    def step(*ts):
        o, ht = kdagen.chunk_gated_delta_rule(**dict(zip(names, ts)), **fc)
        return (o.float() ** 2).mean() + ht.square().mean()

    with kernels_or_skip():
        ge = torch.autograd.grad(step(*xc.values()), list(xc.values()))
        compiled = torch.compile(step, fullgraph=True)
        gc = torch.autograd.grad(compiled(*xc.values()), list(xc.values()))
    for n, a, b in zip(names, gc, ge):
        torch.testing.assert_close(a, b, msg=lambda m, n=n: f"{n}: {m}")


# ------------------------------------------------------------------------------------------
# `python tests/test_api_gpu.py DIR [CHIP]`: emit, on a machine without a GPU, one bundle with
# every program variant these tests use; then run them with KDAGEN_BUNDLE=DIR.
# ------------------------------------------------------------------------------------------


def variants_used(only: str | None = None) -> list:
    """Every variant these tests use; with ``only``, those of the GPU_CASES whose name contains
    it (nothing else)."""
    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        for name, spec in GPU_CASES.items():
            if only is not None and only not in name:
                continue
            for dtype in (torch.bfloat16, torch.float16):
                spec2 = dict(spec)
                family = spec2.pop("family")
                x, flags = make_inputs(family, dtype=dtype, g_dtype=torch.float32, **spec2)
                fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
                o, ht = fn(**x, **flags)
                (o.float().sum() + ht.sum()).backward()
        if only is not None:
            return rec.variants()
        x, flags = make_inputs("kda", dtype=torch.bfloat16, lengths=[10, 100, 30], H=1, HV=2,
                               gate="softplus", beta_sigmoid=True)
        o, ht = kdagen.chunk_kda(**x, **flags)
        (o.float().sum() + ht.sum()).backward()
        x, flags = make_inputs("gdn", dtype=torch.bfloat16, T=200, H=1, HV=2)
        o, ht = kdagen.chunk_gated_delta_rule(**x, **flags)
        (o.float().sum() + ht.sum()).backward()
    return rec.variants()


if __name__ == "__main__":
    import sys

    from gpu_bundle import write_variants_bundle
    # python tests/test_api_gpu.py DIR [CHIP [NAME_PART]]: NAME_PART keeps the cases naming it
    write_variants_bundle(variants_used(sys.argv[3] if len(sys.argv) > 3 else None), sys.argv[1],
                          sys.argv[2] if len(sys.argv) > 2 else "sm_90a")


def _training_step(static, names, flags):
    o, ht = kdagen.chunk_kda(**static, **flags)
    loss = o.float().square().mean() + ht.square().mean()
    return (o, ht) + tuple(torch.autograd.grad(loss, [static[n] for n in names]))


def _varlen_case(seed):
    return make_inputs("kda", dtype=torch.bfloat16, lengths=[10, 100, 30], H=1, HV=2,
                       gate="softplus", beta_sigmoid=True, seed=seed)


def test_gpu_cuda_graph_capture_and_replay_match_eager():
    """A forward+backward step captured in a CUDA graph, replayed on new inputs, gives exactly
    what eager execution gives on those inputs."""
    x, flags = _varlen_case(seed=3)
    xc, fc = to_cuda(x, flags)
    names = list(xc)
    static = {n: t.detach().clone().requires_grad_(True) for n, t in xc.items()}
    with kernels_or_skip():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                      # warm-up: lookup, module loads
            for _ in range(2):
                _training_step(static, names, fc)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _training_step(static, names, fc)
        x2, _ = _varlen_case(seed=11)
        with torch.no_grad():
            for n in names:
                static[n].copy_(x2[n].to(static[n].dtype).cuda())
        graph.replay()
        torch.cuda.synchronize()
        eager = _training_step(static, names, fc)
    assert all(torch.isfinite(t).all() for t in eager)
    for i, (a, b) in enumerate(zip(captured, eager)):
        assert torch.equal(a, b), f"output {i} differs between graph replay and eager"


def test_gpu_two_runs_are_bitwise_identical():
    x, flags = _varlen_case(seed=5)
    xc, fc = to_cuda(x, flags)
    names = list(xc)
    with kernels_or_skip():
        first = _training_step(xc, names, fc)
        second = _training_step(xc, names, fc)
    for i, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), f"output {i} differs between two runs"
