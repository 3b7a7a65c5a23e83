"""kda-narrow-checkpoints{dtype=fp16}: the serial kernels' per-chunk checkpoints (the state at
chunk start, v') stored with fp16's 10-bit significand where only TF32 products read them:
golden IR, which checkpoints narrow (the forward's; none of the backward's, whose dk kernel
reads them at bf16x3), semantics (exact without storage rounding, near the fp32 checkpoints
with it), and the sm_90a lowering (the register scan stages the f16 state for its TMA store;
the register-tile output kernel reads f16 ring tiles)."""
import pytest
import torch

from filecheck_util import filecheck
from kdagen import interpreter
from kdagen.ir.dialect import print_module
from kdagen.ir.testing import make_case
from kdagen.reference import rel_err

F16_CHIP = "chip+kda-narrow-checkpoints{dtype=fp16}"               # columns scaled (default)
F16_UNSCALED = "chip+kda-narrow-checkpoints{dtype=fp16,scale=none}"
F32_CHIP = "chip+kda-narrow-checkpoints{dtype=fp32}"               # the pass off

GOLDEN = r"""
// CHECK-DAG: %[[SW:.*]] = "kda.workspace"() {{.*}}name = "S_chunks"{{.*}} -> memref<?x?x128x128xf16>
// CHECK-DAG: %[[VW:.*]] = "kda.workspace"() {{.*}}name = "v_new_chunks"{{.*}} -> memref<?x?x64x128xf16>
// CHECK-DAG: "kda.workspace"() {{.*}}name = "w_ws"{{.*}} -> memref<?x?x64x128xf32>
// The serial scan converts each checkpoint to f16 as it stores it.
// CHECK: %S_final = "kda.scan"
// CHECK: %[[S16:.*]] = "kda.convert"(%{{.*}}) {{.*}}: (tensor<128x128xf32>) -> tensor<128x128xf16>
// CHECK: "kda.store_chunk"(%[[SW]], %{{.*}}, %[[S16]]) {{.*}}name = "S"
// CHECK: %[[V16:.*]] = "kda.convert"(%v_new) {{.*}}: (tensor<64x128xf32>) -> tensor<64x128xf16>
// CHECK: "kda.store_chunk"(%[[VW]], %{{.*}}, %[[V16]]) {{.*}}name = "v_new"
// CHECK: kda.kernel = "gdn_fwd_state"
// The output kernel widens them back for its TF32 products.
// CHECK: %[[L:.*]] = "kda.load_chunk"(%[[SW]], %{{.*}}) {{.*}}name = "S"{{.*}} -> tensor<128x128xf16>
// CHECK: %[[W:.*]] = "kda.convert"(%[[L]]) {{.*}}: (tensor<128x128xf16>) -> tensor<128x128xf32>
// CHECK: "kda.dot"(%{{.*}}, %[[W]]) {{.*}}kda.precision = "tf32"
// CHECK: kda.kernel = "gdn_fwd_out"
"""


def _final(program, pipeline=F16_CHIP, options=None):
    from kdagen.driver import build_module
    return build_module(program, dict(options or {}), pipeline, "sm_90a")


def _workspace_types(module) -> dict:
    from kdagen.ir.transforms import walk
    out = {}
    for op in walk(module):
        if op.name == "kda.workspace":
            out[str(op.attributes["name"]).strip('"')] = str(op.results[0].type).rsplit("x", 1)[1]
    return out


def test_golden_fp16_checkpoints_gdn_fwd():
    """The IR right after the pass, in sm_90a's pipeline."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.driver import pipeline_passes
    from kdagen.ir.programs import build_program
    from kdagen.passes.pipeline import run_pipeline
    passes = pipeline_passes(F16_UNSCALED, "sm_90a")
    upto = [p.name for p in passes].index("kda-narrow-checkpoints") + 1
    module = build_program("gdn_fwd")
    run_pipeline(module, passes[:upto])
    filecheck(print_module(module), GOLDEN)


@pytest.mark.parametrize("program,narrowed", [
    ("gdn_fwd", {"S_chunks", "v_new_chunks"}), ("kda_fwd", {"S_chunks", "v_new_chunks"}),
    ("gdn_bwd", set()), ("kda_bwd", set())])
def test_only_checkpoints_that_tf32_products_read_narrow(program, narrowed):
    """The forwards' checkpoints narrow; the backwards' keep fp32 (the dk kernel reads the
    state and dS at bf16x3), unless scope=all; off by default (dtype=fp32)."""
    pytest.importorskip("kdagen._mlir")
    types = _workspace_types(_final(program))
    assert {n for n, t in types.items() if t.startswith("f16")} == narrowed, types
    for pipeline in ("chip", F32_CHIP):
        assert not any(t.startswith("f16") for t in _workspace_types(_final(program, pipeline)).values())
    if program.endswith("_bwd"):
        every = _workspace_types(_final(program, F16_CHIP[:-1] + ",scope=all}"))
        assert {"S_chunks", "dS_chunks"} <= {n for n, t in every.items() if t.startswith("f16")}


@pytest.mark.parametrize("pipeline", [F16_CHIP, F16_UNSCALED])
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_fp16_checkpoints_change_only_the_storage_rounding(family, pipeline):
    """Without storage rounding the conversions are exact: the same numbers as the fp32
    checkpoints; with it (inputs, checkpoints and o rounded to their storage types) o's error
    against the exact result is that of the fp32 checkpoints, to 2%."""
    pytest.importorskip("kdagen._mlir")
    case = make_case(family, seed=3, lengths=[1, 70, 130], H=1, HV=2, decay="weak")
    ref = _final(f"{family}_fwd", F32_CHIP, case.options)
    f16 = _final(f"{family}_fwd", pipeline, case.options)
    exact, base = interpreter.run(f16, case.inputs), interpreter.run(ref, case.inputs)
    for key in base:
        assert rel_err(exact[key], base[key]) <= 1e-10, key
    rounded = interpreter.run(f16, case.inputs, round_storage=True)
    base_rounded = interpreter.run(ref, case.inputs, round_storage=True)
    assert not torch.equal(rounded["o"], base_rounded["o"])      # the f16 rounding shows
    e16, e32 = rel_err(rounded["o"], base["o"]), rel_err(base_rounded["o"], base["o"])
    assert e16 <= 1.02 * e32, (e16, e32)
    assert rel_err(rounded["final_state"], base_rounded["final_state"]) <= 1e-10


@pytest.mark.parametrize("pipeline", [F16_CHIP, F16_UNSCALED], ids=["column", "unscaled"])
def test_the_sm90_kernels_take_f16_checkpoints_on_their_register_paths(pipeline):
    """gdn_fwd with fp16 checkpoints, scaled by column or not: the state scan stays on the
    register scan and stores the state through its staging tile as f16 (an f16 tensor map),
    the output kernel stays on register tiles reading f16 ring tiles; nothing spills. Scaled,
    the scan sums each value column by quad shuffles (no shared memory: its shared stores are
    the staging tile's alone), stores the [V] norms, and the output kernel reads them."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen import ptxas
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    comp = Compilation("gdn_fwd", {}, "sm_90a", pipeline=pipeline, lower=DEFAULT_LOWERING,
                       ptxas=False)
    comp.run("ptx")
    kernels = comp.kernels
    assert [k.path for k in kernels] == ["sm90-register-tile", "sm90-register-scan",
                                         "sm90-register-tile"]
    maps = [{m["tensor"]: (p, m["dtype"]) for p, m in k.launch["tensor_maps"].items()}
            for k in kernels]
    assert maps[1]["S_chunks"] == ("S_chunks_tmap_st", "f16"), maps[1]
    assert maps[2]["S_chunks"][1] == maps[2]["v_new_chunks"][1] == "f16", maps[2]
    scan_ptx, out_ptx = comp.ptx[kernels[1].name], comp.ptx[kernels[2].name]
    scaled = pipeline == F16_CHIP

    def reads_param(k, ptx, name):
        i = [p.name for p in k.params].index(name)
        return f"{k.name}_param_{i}]" in ptx
    for norms in ("S_chunks_norm", "v_new_chunks_norm"):
        assert any(p.name == norms for p in kernels[1].params) == scaled, norms
        if scaled:      # written by the scan, read by the output kernel
            assert reads_param(kernels[1], scan_ptx, norms), norms
            assert reads_param(kernels[2], out_ptx, norms), norms
    shuffles = scan_ptx.count("shfl.sync.bfly")
    assert shuffles == (8 if scaled else 0), shuffles   # 2 columns x 2 steps x 2 checkpoints
    if scaled:
        assert "div.rn.f32" not in scan_ptx           # the scale is rsqrt.approx: no division
    # the output kernel loads each product's two column norms per thread before it waits for
    # the chunk's copies, not at the product
    before_wait = out_ptx[:out_ptx.index("mbarrier.try_wait")]
    assert before_wait.count("ld.global.b32") == (4 if scaled else 0)
    try:
        exe = ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not found")
    for k in kernels:
        r = ptxas.assemble(comp.ptx[k.name], "sm_90a", exe)
        assert r.ok, (k.name, r.log)
        (res,) = r.resources.values()
        assert res.spill_stores == 0 and res.spill_loads == 0, k.name


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_column_scales_keep_large_states_in_fp16_range(family):
    """v scaled by 2^17: the state's entries pass fp16's 65504. Unscaled, the checkpoints store
    infinities and o is lost; with each column scaled by its norm, o's error stays that of the
    fp32 checkpoints (interpreter, storage rounding on)."""
    pytest.importorskip("kdagen._mlir")
    case = make_case(family, seed=4, lengths=[130], H=1, HV=1, decay="weak")
    inputs = dict(case.inputs, v=case.inputs["v"] * 2.0 ** 17)
    ref = _final(f"{family}_fwd", F32_CHIP, case.options)
    exact = interpreter.run(ref, inputs)
    assert exact["final_state"].abs().max() > 65504
    errors = {}
    for name, pipeline in (("fp32", F32_CHIP), ("column", F16_CHIP), ("none", F16_UNSCALED)):
        got = interpreter.run(_final(f"{family}_fwd", pipeline, case.options), inputs,
                              round_storage=True)["o"]
        errors[name] = rel_err(got, exact["o"]) if torch.isfinite(got).all() else float("inf")
    assert errors["none"] > 10 * errors["fp32"], errors
    assert errors["column"] <= 1.02 * errors["fp32"], errors


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_column_sums_of_a_k_split_state_meet_in_shared_memory(family):
    """K = 256: the register scan splits the state's rows over two warpgroups (each 128 rows);
    the state's column sums are then partial, and the warpgroups add theirs through shared
    memory (two [2, 64] buffers by step parity, one named barrier of both); v' is whole in
    each, so its sums need none. Only the first slice stores the norms; nothing spills."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen import ptxas
    from kdagen.driver import DEFAULT_LOWERING, Compilation

    def scan_of(pipeline):
        comp = Compilation(f"{family}_fwd", {"head_k_dim": 256}, "sm_90a", pipeline=pipeline,
                           lower=DEFAULT_LOWERING, ptxas=False)
        comp.run("ptx")
        (scan,) = [k for k in comp.kernels if k.path == "sm90-register-scan"]
        return scan, comp.ptx[scan.name]
    scan, ptx = scan_of(F16_CHIP)
    plain, unscaled = scan_of(F16_UNSCALED)
    # the exchange buffers after the rest: 2 step parities x 2 slices x 64 columns, fp32
    before = plain.launch["dynamic_shared_memory"]
    assert scan.launch["dynamic_shared_memory"] == -(-before // 16) * 16 + 2 * 2 * 64 * 4
    assert scan.launch["block"][0] == 3 * 128       # two consumer warpgroups and the producer
    # the state's sums: 2 columns x 2 quad shuffles, then the exchange; v''s: 2 x 2 more
    assert ptx.count("shfl.sync.bfly") == 8
    # beside the unscaled scan: one more exchange barrier, each thread's two partials stored
    # and both slices' read back
    for text, more in (("bar.sync \t1, 256;", 1), ("st.shared.b32", 2), ("ld.shared.b32", 4)):
        assert ptx.count(text) == unscaled.count(text) + more, text
    assert scan.launch["dynamic_shared_memory"] <= 227 * 1024
    try:
        exe = ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not found")
    r = ptxas.assemble(ptx, "sm_90a", exe)
    assert r.ok, r.log
    (res,) = r.resources.values()
    assert res.spill_stores == 0 and res.spill_loads == 0
