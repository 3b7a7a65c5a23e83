"""GPU tests of intra-card context parallelism (kdagen.runtime.segments; skipped without
CUDA): the ops with each sequence run as 4 segments at once against the float64 reference
(the bars of tests/test_api.py) and against the same call unsegmented, the scans launched
as the protocol says, and a CUDA-graph capture of a segmented training step.

Emit the bundle here (no GPU): ``python tests/test_segments_gpu.py DIR``; run with
``KDAGEN_BUNDLE=DIR``.
"""
import pytest
import torch

import kdagen
from kdagen import reference as R
from kdagen.runtime import segments as seg

from conftest import requires_gpu
from gpu_bundle import kernels_or_skip
from test_api import BARS, make_inputs

pytestmark = [requires_gpu, pytest.mark.gpu]

#: short sequences cut into 4 segments of 4 chunks (the rule's minimum lowered for the test)
SEGMENTS = 4
CASES = {
    "kda_softplus_T1024_HV2": dict(family="kda", T=1024, H=1, HV=2, K=128, V=128,
                                   gate="softplus", beta_sigmoid=True),
    "kda_B2_T1024_noh0": dict(family="kda", B=2, T=1024, H=1, HV=1, K=128, V=128, h0=False),
    "gdn_T1024_gva2": dict(family="gdn", T=1024, H=1, HV=2, K=128, V=128),
    # packed sequences (KDAGEN_SEGMENTS_VARLEN=1): one shorter than a chunk, one of two chunks
    # (empty segments), one ending in a partial chunk
    "kda_varlen": dict(family="kda", lengths=[1000, 1, 100, 1024], H=1, HV=2, K=128, V=128,
                       gate="softplus", beta_sigmoid=True),
}


def _run(family, xc, fc, do, dht):
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    o, ht = fn(**xc, **fc)
    names = list(xc)
    grads = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(),
                                [xc[n] for n in names])
    return {"o": o, "final_state": ht, **dict(zip(names, grads))}


def _case(name):
    spec = dict(CASES[name])
    family = spec.pop("family")
    x, flags = make_inputs(family, dtype=torch.bfloat16, g_dtype=torch.float32,
                           seed=len(name), **spec)
    xc = {n: t.detach().cuda().requires_grad_(True) for n, t in x.items()}
    fc = {n: (v.cuda() if isinstance(v, torch.Tensor) else v) for n, v in flags.items()}
    return family, xc, fc


@pytest.mark.parametrize("setting", [str(SEGMENTS), "beside"])
@pytest.mark.parametrize("name", list(CASES))
def test_segmented_ops_match_the_reference_and_the_whole_run(name, setting, monkeypatch):
    """``setting``: 4 segments in order, or "beside" (here also 4: the chaining runs and the
    recompute scan beside the chunk kernels whose flags they wait for)."""
    from kdagen.runtime.launch import LaunchRecorder
    family, xc, fc = _case(name)
    monkeypatch.setattr(seg, "MIN_SEGMENT_CHUNKS", 4)
    monkeypatch.setenv("KDAGEN_SEGMENTS_VARLEN", "1")
    lengths = CASES[name].get("lengths")
    gen = torch.Generator().manual_seed(1)
    with kernels_or_skip():
        B, T, HV, V = xc["v"].shape
        do = torch.randn((B, T, HV, V), generator=gen).to(torch.bfloat16).cuda()
        N = len(CASES[name]["lengths"]) if "lengths" in CASES[name] else B
        dht = torch.randn((N, HV, xc["k"].shape[-1], V), generator=gen).cuda()
        monkeypatch.setenv("KDAGEN_SEGMENTS", "off")
        whole = _run(family, xc, fc, do, dht)
        monkeypatch.setenv("KDAGEN_SEGMENTS", setting)
        with LaunchRecorder() as rec:
            split = _run(family, xc, fc, do, dht)
            torch.cuda.synchronize()
    launched = [r.name.split("__")[-1] for r in rec.records]
    # forward: two chaining runs and the true run of its state scan; backward: its recompute
    # scan once (from the forward's segment states), its reverse scan three times
    assert launched.count("k1_scan1") == 3 + 1, launched
    assert launched.count("k3_scan3") == 3, launched
    grids = [r.grid for r in rec.records if r.name.endswith("k1_scan1")]
    sequences = len(lengths) if lengths else B
    # packed sequences are cut by their average length (here 531 tokens: 2 segments of >= 4
    # chunks), the others into SEGMENTS
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    expected = seg.segments_for(sequences, sum(lengths) if lengths else T, HV, xc["k"].shape[-1],
                                V, 64, sms, setting, varlen=bool(lengths))
    assert expected == (2 if lengths else SEGMENTS), expected
    assert all(g[1] == sequences * expected for g in grids), grids
    ref_fn = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    ref = R.reference_grads(lambda **kw: ref_fn(**kw, **fc), xc, do, dht)
    lines = []
    for n in split:
        e_split, e_whole = R.rel_err(split[n], ref[n]), R.rel_err(whole[n], ref[n])
        lines.append(f"{n}: segmented {e_split:.2e}, whole {e_whole:.2e}, "
                     f"apart {R.rel_err(split[n], whole[n].double()):.2e}")
        assert e_split <= BARS[n], lines[-1]
        assert e_split <= 2 * e_whole + 2e-4, lines[-1]
    print(name, setting, "\n  " + "\n  ".join(lines))


def test_segmented_training_step_in_a_cuda_graph(monkeypatch):
    """A segmented forward+backward captured in a CUDA graph (no host synchronisation in the
    chaining) and replayed on new inputs gives what eager execution gives on them."""
    monkeypatch.setattr(seg, "MIN_SEGMENT_CHUNKS", 4)
    monkeypatch.setenv("KDAGEN_SEGMENTS", str(SEGMENTS))
    family, xc, fc = _case("kda_softplus_T1024_HV2")
    names = list(xc)
    static = {n: t.detach().clone().requires_grad_(True) for n, t in xc.items()}

    def step():
        o, ht = kdagen.chunk_kda(**static, **fc)
        loss = o.float().square().mean() + ht.square().mean()
        return (o, ht) + tuple(torch.autograd.grad(loss, [static[n] for n in names]))

    with kernels_or_skip():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for n in names:
                static[n].copy_(static[n] + 0.01 * torch.randn(static[n].shape, generator=gen)
                                .to(static[n].dtype).cuda())
        graph.replay()
        replayed = [t.clone() for t in captured]
        eager = step()
    for a, b in zip(replayed, eager):
        torch.testing.assert_close(a, b)


def variants_used() -> list:
    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        for name, spec in CASES.items():
            spec = dict(spec)
            family = spec.pop("family")
            x, flags = make_inputs(family, dtype=torch.bfloat16, g_dtype=torch.float32,
                                   **dict({"T": 64} if "T" in spec else {},
                                          **{k: v for k, v in spec.items() if k != "T"}))
            fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
            o, ht = fn(**x, **flags)
            (o.float().sum() + ht.sum()).backward()
            if "initial_state" not in x:    # segmented, the call runs the variant with one
                N = len(spec["lengths"]) if "lengths" in spec else x["v"].shape[0]
                HV, K, V = x["v"].shape[2], x["k"].shape[-1], x["v"].shape[-1]
                h0 = torch.zeros(N, HV, K, V, requires_grad=True)
                o, ht = fn(**x, **flags, initial_state=h0)
                (o.float().sum() + ht.sum()).backward()
    return rec.variants()


if __name__ == "__main__":
    import sys

    from gpu_bundle import write_variants_bundle
    write_variants_bundle(variants_used(), sys.argv[1],
                          sys.argv[2] if len(sys.argv) > 2 else "sm_90a")
