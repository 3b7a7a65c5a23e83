"""K = 256 (issue 16): programs at K = 256 with V = 128 (a larger V runs as value parts), the
sm_90a lowering's defaults that keep them free of register spills (the register scans split
their 256 state rows over two warpgroups, chunk-parallel kernels keep two consumer
warpgroups, the backward's dk/dv/dg kernel loads two elements ahead: the tuning table), the
other chips assembling them, and the APIs running K = 256 on the CPU against the float64
reference."""
import pytest
import torch

import kdagen
from kdagen import head_pad, ops, reference as R
from kdagen.validation import KdagenInputError

from test_api import make_inputs


def test_the_built_key_and_value_dims_per_chip():
    """A chip takes the value dims whose fp32 [K, V] state fits a ring slot of its shared
    memory: at K = 256, V = 128 on sm_90a / sm_100a, V = 64 on sm_120a (99 KB)."""
    from kdagen.head_dims import value_dims_for, variant_head_dims
    from kdagen.target import get_target
    assert ops.SUPPORTED_KEY_DIMS == (64, 128, 256) and ops.SUPPORTED_VALUE_DIMS == (64, 128)
    for chip in ("sm_90a", "sm_100a", "sm_120a"):
        assert value_dims_for(128, get_target(chip)) == (64, 128)
    assert value_dims_for(256, get_target("sm_90a")) == (64, 128)
    assert value_dims_for(256, get_target("sm_120a")) == (64,)
    assert variant_head_dims(256) == (256, 128) and variant_head_dims(64) == (64, 64)
    assert variant_head_dims(256, get_target("sm_120a")) == (256, 64)
    assert ops.value_dims(200, "cpu") == (64, 128)
    pytest.importorskip("kdagen._mlir")
    from kdagen.emit import program_variants
    from kdagen.ir import programs
    assert programs._KEY_DIMS == ops.SUPPORTED_KEY_DIMS
    assert programs._VALUE_DIMS == ops.SUPPORTED_VALUE_DIMS
    dims = {(o["head_k_dim"], o["head_v_dim"])
            for _, o in program_variants(["gdn"], 256, None, target=get_target("sm_120a"))}
    assert dims == {(256, 64)}


def test_a_value_dim_past_the_built_ones_is_a_clear_program_error():
    pytest.importorskip("kdagen._mlir")
    from kdagen.ir.programs import ProgramOptionError, build_program
    with pytest.raises(ProgramOptionError, match=r"head_v_dim: 256 is not one of \[64, 128\]"):
        build_program("kda_fwd", head_k_dim=256, head_v_dim=256)


def test_padding_plans_for_key_dims_up_to_256():
    pad = head_pad.plan(200, 100, ops.SUPPORTED_KEY_DIMS, ops.SUPPORTED_VALUE_DIMS)
    assert (pad.Kp, pad.Vp) == (256, 128)
    assert head_pad.value_parts(256, ops.SUPPORTED_VALUE_DIMS) == [(0, 128), (128, 256)]
    with pytest.raises(KdagenInputError, match=r"^v: head dim V = 100 .* V up to 64"):
        head_pad.plan(64, 100, (64,), (64,))


def test_lowering_defaults_at_k256():
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen.lower.register_scan import k_split_for
    from kdagen.codegen.lower.sm90_native import chunk_warpgroups
    from kdagen.codegen.lower.tuning import tuned_options
    from kdagen.codegen.lower.options import LowerOptions
    assert [k_split_for("auto", K) for K in (64, 128, 256)] == [1, 1, 2]
    assert k_split_for(3, 256) == 3
    assert chunk_warpgroups("auto", "hybrid", 128) == 4
    assert chunk_warpgroups("auto", "hybrid", 256) == 2
    assert chunk_warpgroups("auto", "smem", 256) == 2
    opts, applied = tuned_options(LowerOptions(), "sm_90a", "sm90-native", "kda_bwd", (256, 128),
                                  "k4_scan4")
    assert applied == {"chunk_warpgroups": 4, "load_batch": 2}
    assert (opts.chunk_warpgroups, opts.load_batch) == (4, 2)
    _, applied = tuned_options(LowerOptions(), "sm_90a", "sm90-native", "gdn_bwd", (256, 128),
                               "k4_scan4")
    assert applied == {"chunk_warpgroups": 4, "load_batch": 2}
    _, applied = tuned_options(LowerOptions(), "sm_90a", "sm90-native", "gdn_bwd", (256, 128),
                               "k2_scan2")
    assert applied == {}


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd"])
def test_k256_kernels_assemble_on_sm90a_without_spills(program):
    """Every kernel at K = 256, V = 128 under the default lowering: the register scans take the
    K split (2 x 128 consumer threads per 64 value columns), the chunk kernels two consumer
    warpgroups, and ptxas spills nothing -- except the one kernel the tuning table gives four
    warpgroups (kda_bwd's dk kernel, measured 33% faster with its small spill), whose spill
    stays within the 172 bytes the table's evidence records."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen import ptxas
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    try:
        ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not found")
    c = Compilation(program, dict(head_k_dim=256, head_v_dim=128), "sm_90a",
                    lower=DEFAULT_LOWERING).run("ptx")
    scans = [k for k in c.kernels if k.launch.get("path") == "sm90-register-scan"]
    chunks = [k for k in c.kernels if k.launch.get("parallel_chunks")]
    tuned = {k.name for k in chunks if k.launch.get("tuned", {}).get("chunk_warpgroups") == 4}
    assert tuned == ({"kda_bwd__k4_scan4"} if program == "kda_bwd" else set()), tuned
    # two consumer warpgroups + the producer, in the scans (K split) and the chunk kernels;
    # four + the producer in the tuned one
    assert scans and chunks and all(
        k.launch["block"] == ([640, 1, 1] if k.name in tuned else [384, 1, 1])
        for k in scans + chunks), [(k.name, k.launch["block"]) for k in c.kernels]
    for k in c.kernels:
        res = ptxas.assemble(c.ptx[k.name], "sm_90a")
        assert res.ok, res.log
        (r,) = [v for name, v in res.resources.items() if name == k.name]
        assert r.spill_stores <= (172 if k.name in tuned else 0), (k.name, res.log)
        assert k.name in tuned or r.spills == 0, (k.name, res.log)


@pytest.mark.parametrize("chip", ["sm_100a", "sm_120a"])
def test_k256_forward_assembles_on_the_other_chips(chip):
    """At the value dim each chip takes at K = 256 (kdagen.head_dims)."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen import ptxas
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    from kdagen.head_dims import variant_head_dims
    from kdagen.target import get_target
    try:
        ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not found")
    K, V = variant_head_dims(256, get_target(chip))
    c = Compilation("gdn_fwd", dict(head_k_dim=K, head_v_dim=V), chip,
                    lower=DEFAULT_LOWERING).run("ptx")
    for k in c.kernels:
        res = ptxas.assemble(c.ptx[k.name], chip)
        assert res.ok, (k.name, res.log)


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_k256_v256_on_the_cpu_matches_the_reference(family):
    """K = V = 256 through the API (V in two parts of 128) on the CPU executor, forward and
    backward, against the float64 reference."""
    pytest.importorskip("kdagen._mlir")
    x, flags = make_inputs(family, dtype=torch.float32, g_dtype=torch.float32, T=70, H=1, HV=1,
                           K=256, V=256, seed=3)
    x = {n: t.detach().requires_grad_(True) for n, t in x.items()}
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    ref_fn = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    o, ht = fn(**x, **flags)
    assert o.shape[-1] == 256 and ht.shape[-2:] == (256, 256)
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=gen)
    dht = torch.randn(ht.shape, generator=gen)
    names = list(x)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), [x[n] for n in names])
    ref = R.reference_grads(lambda **kw: ref_fn(**kw, **flags), x, do, dht)
    errs = {"o": R.rel_err(o, ref["o"]), "final_state": R.rel_err(ht, ref["final_state"])}
    errs.update({n: R.rel_err(g, ref[n]) for n, g in zip(names, grads)})
    assert max(errs.values()) < 1e-4, errs


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_k256_decode_on_the_cpu_matches_the_chunked_reference(family):
    """The decode ops at K = V = 256 (V in two parts of 128) on the CPU executor."""
    pytest.importorskip("kdagen._mlir")
    from test_decode_api import _inputs
    B, T, H, HV, K, V = 2, 3, 1, 2, 256, 256
    x = _inputs(family, B, T, H=H, HV=HV, seed=5, K=K, V=V)
    h0 = torch.randn(B, HV, K, V, generator=torch.Generator().manual_seed(6)) * 0.3
    fn = kdagen.fused_recurrent_kda if family == "kda" else kdagen.fused_recurrent_gated_delta_rule
    o, ht = fn(**x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    o_ref, ht_ref = ref(*(x[n].double() for n in ("q", "k", "v", "g", "beta")),
                        initial_state=h0.double(), output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
    assert o.shape == (B, T, HV, V) and ht.shape == (B, HV, K, V)
    assert R.rel_err(o, o_ref) < 1e-5 and R.rel_err(ht, ht_ref) < 1e-5


def test_value_dims_up_to_k128_ask_no_device():
    """Every chip takes V = 64 and 128 up to K = 128, so those calls read no device (a
    torch.compile'd call traces them as constants; the device lookup of K = 256 once broke
    fullgraph compilation on the H100): a CUDA device that does not exist here is never
    touched."""
    assert ops._EVERY_CHIP_UP_TO == 128
    for K in (32, 64, 100, 128):
        assert ops.value_dims(K, "cuda:7") == (64, 128)
    assert ops.value_dims(256, "cpu") == (64, 128)

    def step(q, v):
        return q * max(ops.value_dims_of(q, v))
    out = torch.compile(step, fullgraph=True)(torch.ones(1, 2, 1, 256), torch.ones(1, 2, 1, 64))
    assert torch.equal(out, torch.full((1, 2, 1, 256), 128.0))


def test_emit_gives_each_chip_its_k256_variants(monkeypatch):
    """``kdagen emit --head-dim 256`` for sm_90a and sm_120a: one write_bundle pass per set of
    head dims, the first replacing the folder's bundle and the next extending it; sm_90a's
    programs at V = 128, sm_120a's at V = 64. (write_bundle is spied: nothing compiles.)"""
    pytest.importorskip("kdagen._mlir")
    from kdagen import emit
    from kdagen.target import get_target
    calls = []

    def spy(out_dir, variants, targets, **kw):
        calls.append(([t.chip for t in targets], {(o["head_k_dim"], o["head_v_dim"])
                                                  for _, o in variants}, kw["replace"]))
        return {"report": [{"kernel": "k", "chip": targets[0].chip}], "timing": {"total": 1.0}}
    monkeypatch.setattr(emit, "write_bundle", spy)
    timing = {}
    rows = emit.emit_programs("unused", [get_target("sm_90a"), get_target("sm_120a")], ["kda"],
                              head_dim="128,256", timing=timing)
    assert calls == [(["sm_90a"], {(128, 128), (256, 128)}, True),
                     (["sm_120a"], {(128, 128), (256, 64)}, False)]
    assert [r["chip"] for r in rows] == ["sm_90a", "sm_120a"] and timing["total"] == 2.0
