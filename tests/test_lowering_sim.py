"""Numerics of the lowered kernels, on the CPU: the kernels' emitter code runs in the lockstep
simulator (kdagen.codegen.lower.sim), which also checks for shared-scratch races, barriers in
divergent code and out-of-bounds accesses. Compared with the interpreter in float64 on the
same storage-rounded (bf16) inputs, fp32 outputs must agree to ~1e-6 and bf16 outputs to
their rounding."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from kdagen import interpreter
from kdagen._mlir import ir
from kdagen.codegen.lower import sim_backend
from kdagen.codegen.lower.sim import simulate
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.pipeline import run_pipeline
from kdagen.reference import rel_err

np.seterr(all="ignore")

F32_TOL = 2e-5          # fp32 outputs vs float64 on identical inputs
ROUND_TOL = 2.2e-3      # bf16 outputs: bf16 rounding (1.66e-3 on average) and a little more


@functools.lru_cache(maxsize=None)
def _text(program: str, opts: tuple) -> str:
    m = build_program(program, **dict(opts))
    with m.context, ir.Location.unknown():
        run_pipeline(m, parse_pipeline("kda-stable-reassociate"))
    return str(m)


def stable_module(program: str, **opts):
    from kdagen.ir.dialect import parse_module
    return parse_module(_text(program, tuple(sorted(opts.items()))))


def _rounded(inputs: dict, keep=("A_log", "dt_bias", "initial_state", "dht", "cu_seqlens", "scale")):
    """The inputs as the kernels see them: storage tensors rounded to bf16."""
    return {k: (v.to(torch.bfloat16).to(torch.float64)
                if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in keep else v)
            for k, v in inputs.items()}


def _check(module, inputs, storage, out_dtypes, dot="fma", f32_tol=F32_TOL, round_tol=ROUND_TOL):
    from kdagen.codegen.lower.kernel import LowerOptions
    if storage == "hybrid":   # a small shared-memory budget: buffers split over both pools
        opts = LowerOptions(storage="hybrid", smem_reserve=227 * 1024 - 24 * 1024, dot=dot)
    else:
        opts = LowerOptions(storage=storage, dot=dot)
    out = simulate(module, inputs, options=opts)
    ref = interpreter.run(module, _rounded(inputs), dtype=torch.float64)
    assert set(out) == set(ref)
    errs = {}
    for k, v in out.items():
        assert torch.isfinite(v).all(), f"{k}: NaN/Inf (unwritten or poisoned elements?)"
        errs[k] = rel_err(v, ref[k])
        tol = f32_tol if out_dtypes.get(k, "bf16") == "f32" else round_tol
        assert errs[k] < tol, (k, errs[k])
    return errs


FWD_F32 = {"final_state": "f32"}


def _with_cotangents(case, seed: int) -> dict:
    """The case's inputs plus random do [B, T, HV, V] and dht [N, HV, K, V] (float64)."""
    g = torch.Generator().manual_seed(seed)
    sz = case.sizes
    inputs = dict(case.inputs)
    inputs["do"] = torch.randn(sz["B"], sz["T"], sz["HV"], sz["V"], generator=g, dtype=torch.float64)
    inputs["dht"] = torch.randn(sz["N"], sz["HV"], sz["K"], sz["V"], generator=g, dtype=torch.float64)
    return inputs


@pytest.mark.parametrize("storage", ["smem", "global", "hybrid"])
def test_kda_forward_varlen_gva_strong_decay(storage):
    case = make_case("kda", gate="lower_bound", H=1, HV=2, K=64, V=64, chunk_size=32,
                     lengths=[1, 40], decay="strong", seed=1)
    _check(stable_module("kda_fwd", **case.options), case.inputs, storage, FWD_F32)


def test_gdn_forward_chunk64_tail():
    case = make_case("gdn", gate="gdn_softplus", B=1, T=67, H=1, K=64, V=64, seed=2)
    _check(stable_module("gdn_fwd", **case.options), case.inputs, "global", FWD_F32)


def test_kda_forward_K128_softplus_strong():
    case = make_case("kda", gate="softplus", B=1, T=20, H=1, K=128, V=128, chunk_size=16,
                     decay="strong", seed=3)
    _check(stable_module("kda_fwd", **case.options), case.inputs, "smem", FWD_F32)


def test_gdn_forward_no_initial_state_batch():
    case = make_case("gdn", gate="gdn_lower_bound", B=2, T=17, H=1, K=64, V=64, chunk_size=16,
                     use_initial_state=False, seed=4)
    _check(stable_module("gdn_fwd", **case.options), case.inputs, "smem", FWD_F32)


BWD_F32 = {"dA_log": "f32", "ddt_bias": "f32", "dh0": "f32"}


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_backward_varlen_gva(family):
    gate = "lower_bound" if family == "kda" else "gdn_softplus"
    case = make_case(family, gate=gate, H=1, HV=2, K=64, V=64, chunk_size=16,
                     lengths=[5, 20], seed=5)
    try:
        m = stable_module(f"{family}_bwd", **case.options)
    except Exception as exc:  # the backward derivation is another helper's work in progress
        pytest.skip(f"{family}_bwd does not build: {exc}")
    g = torch.Generator().manual_seed(6)
    sz = case.sizes
    inputs = dict(case.inputs)
    inputs["do"] = torch.randn(sz["B"], sz["T"], sz["HV"], sz["V"], generator=g, dtype=torch.float64)
    inputs["dht"] = torch.randn(sz["N"], sz["HV"], sz["K"], sz["V"], generator=g, dtype=torch.float64)
    _check(m, inputs, "global", BWD_F32)


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
def test_forward_tensor_cores_bf16x3(gate):
    """mma.sync with bf16 hi + lo operands: kda.dot, and decay_dot factored per 16-row block
    (the lower-bound gate gives subblock 16) — fp32-level accuracy."""
    case = make_case("kda", gate=gate, H=1, HV=2, K=64, V=64, lengths=[5, 70], decay="strong",
                     seed=9)
    _check(stable_module("kda_fwd", **case.options), case.inputs, "hybrid", FWD_F32,
           dot="bf16x3", f32_tol=5e-5)


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
def test_forward_tensor_cores_tf32(gate):
    """mma.sync m16n8k8 on TF32 operands (the default precision of the products): products,
    decay products and the inverse's block merges at TF32 accuracy, and really rounded."""
    case = make_case("kda", gate=gate, H=1, HV=2, K=64, V=64, lengths=[5, 70], decay="weak",
                     seed=9)
    errs = _check(stable_module("kda_fwd", **case.options), case.inputs, "hybrid", FWD_F32,
                  dot="tf32", f32_tol=3e-3)
    assert errs["final_state"] > 1e-6


def test_backward_tensor_cores_tf32():
    """The backward with TF32 products (softplus gate: exact-diagonal decay products)."""
    case = make_case("kda", gate="softplus", H=1, HV=2, K=64, V=64, lengths=[30, 40], seed=11,
                     decay="weak")
    m = stable_module("kda_bwd", **case.options)
    _check(m, _with_cotangents(case, 12), "global", BWD_F32, dot="tf32", f32_tol=3e-3)


def test_forward_tensor_cores_bf16():
    """Plain bf16 operands: the error of rounding every matrix operand to bf16 (FLA-like)."""
    case = make_case("gdn", gate="gdn_lower_bound", B=1, T=40, H=1, K=64, V=64, chunk_size=32,
                     seed=10)
    errs = _check(stable_module("gdn_fwd", **case.options), case.inputs, "smem", FWD_F32,
                  dot="bf16", f32_tol=5e-3, round_tol=5e-3)
    assert errs["final_state"] > 1e-5     # really rounded (not silently fp32)


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
def test_backward_tensor_cores_bf16x3(gate, monkeypatch):
    """lower_bound: decay products factored inside 16-row blocks; softplus (too steep for
    that): factored left of the diagonal blocks, diagonal blocks in relative form
    (exact_diagonal) — both at fp32-level accuracy against the float64 interpreter."""
    from kdagen.codegen.lower import tiles
    calls = {"dot": 0, "matmul": 0}
    for key, name in (("dot", "emit_decay_dot_mma_exact_diagonal"),
                      ("matmul", "emit_decay_matmul_mma_exact_diagonal")):
        real = getattr(tiles, name)

        def spy(*args, _real=real, _key=key, **kw):
            calls[_key] += 1
            return _real(*args, **kw)
        monkeypatch.setattr(tiles, name, spy)
    case = make_case("kda", gate=gate, H=1, HV=2, K=64, V=64, lengths=[30, 40], seed=11,
                     decay="strong")
    try:
        m = stable_module("kda_bwd", **case.options)
    except Exception as exc:
        pytest.skip(f"kda_bwd does not build: {exc}")
    g = torch.Generator().manual_seed(12)
    sz = case.sizes
    inputs = dict(case.inputs)
    inputs["do"] = torch.randn(sz["B"], sz["T"], sz["HV"], sz["V"], generator=g, dtype=torch.float64)
    inputs["dht"] = torch.randn(sz["N"], sz["HV"], sz["K"], sz["V"], generator=g, dtype=torch.float64)
    _check(m, inputs, "global", BWD_F32, dot="bf16x3", f32_tol=2e-4)
    if gate == "softplus":      # both exact-diagonal forms really ran (forward and adjoints)
        assert calls["dot"] > 0 and calls["matmul"] > 0, calls
    else:
        assert calls == {"dot": 0, "matmul": 0}, calls


def test_simulator_catches_a_missing_barrier(monkeypatch):
    """The race checker is live: dropping the barriers between ops must be reported."""
    case = make_case("kda", B=1, T=16, H=1, K=64, V=64, chunk_size=16, seed=7)
    m = stable_module("kda_fwd", **case.options)
    real = sim_backend.SimBackend.barrier
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] > 3:       # keep the first few, then "forget" them
            return
        real(self)

    monkeypatch.setattr(sim_backend.SimBackend, "barrier", flaky)
    with pytest.raises(sim_backend.SimError, match="race"):
        simulate(m, case.inputs, storage="smem")


def test_launcher_with_chip_pipeline_bf16_workspaces(tmp_path):
    """sm_120a's pipeline with bf16 workspaces (kda-partition{workspace_dtype=bf16}; the chip's
    own are fp32): partitioned kernels exchanging bf16 workspaces; the launcher allocates the
    workspaces with the dtypes the bundle records."""
    from tools import gpu_check
    from kdagen.bundle_writer import write_bundle
    from kdagen.driver import build_module
    from kdagen.passes.pipelines import PIPELINES
    from kdagen.runtime.launch import LoweredProgram
    from kdagen.codegen.lower.sim import SimLibrary
    opts = dict(head_k_dim=64, head_v_dim=64, chunk_size=32, gate="lower_bound")
    pipeline = ",".join(p if p != "kda-partition" else "kda-partition{workspace_dtype=bf16}"
                        for p in PIPELINES["sm_120a"])
    res = write_bundle(tmp_path, [("kda_fwd", opts, {"dot": "bf16x3"})], ["sm_120a"],
                       pipeline=pipeline)
    (vname,) = res["variants"]
    spec = res["variants"][vname]
    assert len(spec["chips"]["sm_120a"]) == 3
    assert any(w["elt"] == "bf16" for w in spec["chip_workspaces"]["sm_120a"])
    lib = SimLibrary(tmp_path, {}, "sm_120a")
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.program import read_program
    from kdagen.target import get_target
    m = build_module("kda_fwd", opts, pipeline, "sm_120a")
    for pk in prepare(read_program(m), get_target("sm_120a"), vname, LowerOptions(dot="bf16x3")):
        lib.kernels[pk.name] = pk
    prog = LoweredProgram(tmp_path, vname, library=lib)

    class OnCpu:
        def __call__(self, **kw):
            return prog(chip="sm_120a", **kw)

    rows = gpu_check.run_case(OnCpu(), spec, dict(label="b", B=1, T=40, decay="moderate"),
                              torch.device("cpu"), 0)
    by = {r["tensor"]: r for r in rows}
    assert all(r["finite"] and r["det"] for r in rows)
    assert by["o"]["err"] < 5e-3 and by["final_state"]["err"] < 5e-3   # bf16 workspaces


def test_launcher_calling_convention_end_to_end(tmp_path):
    """write_bundle -> LoweredProgram (the MLIR-free launcher: argument conversion, output /
    workspace / scratch allocation, grid rules, manifest parameter order) -> kernels run by the
    simulator in place of the CUDA driver -> gpu_check's comparison with the reference."""
    from tools import gpu_check
    from kdagen.bundle_writer import write_bundle
    from kdagen.runtime.bundle import variant_name
    from kdagen.runtime.launch import LoweredProgram
    from kdagen.codegen.lower.sim import SimLibrary
    items = [("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, chunk_size=16, gva_ratio=2,
                              varlen=True))]
    res = write_bundle(tmp_path, items, ["sm_120a"])
    vname = variant_name(*items[0])
    assert res["variants"][vname]["kernels"] and (tmp_path / "manifest.json").is_file()
    lib = SimLibrary(tmp_path, {vname: stable_module(items[0][0], **items[0][1])}, "sm_120a")
    prog = LoweredProgram(tmp_path, vname, library=lib)
    case = dict(label="varlen", B=1, lengths=[3, 20], decay="strong")

    class OnCpu:
        def __call__(self, **kw):
            return prog(chip="sm_120a", **kw)

    rows = gpu_check.run_case(OnCpu(), res["variants"][vname], case, torch.device("cpu"), 0)
    by = {r["tensor"]: r for r in rows}
    assert set(by) == {"o", "final_state"}
    assert all(r["finite"] and r["det"] for r in rows)
    assert by["final_state"]["err"] < 1e-5
    assert by["o"]["err"] < by["o"]["floor"] + 5e-4


# A partitioned program as the partition pass makes them: a chunk-parallel scan (no carried
# values) writing a per-chunk workspace, then a state scan reading it.
TOY = '''
func.func @toy(%v: memref<?x?x?x64xbf16> {kda.heads = "v", kda.layout = "token", kda.name = "v", kda.role = "input"},
               %o: memref<?x?x?x64xbf16> {kda.heads = "v", kda.layout = "token", kda.name = "o", kda.role = "output"},
               %final_state: memref<?x?x64xf32> {kda.layout = "state", kda.name = "final_state", kda.role = "output"})
    attributes {kda.chunk_size = 16 : i64, kda.program = "toy", kda.gva_ratio = 1 : i64, kda.varlen = false} {
  %ws = "kda.workspace"() {layout = "chunk", name = "colsum"} : () -> memref<?x?x64xf32>
  "kda.scan"() ({
  ^bb0(%c: index):
    %x = "kda.load"(%v, %c) {head_map = "direct", name = "v"} : (memref<?x?x?x64xbf16>, index) -> tensor<16x64xbf16>
    %xf = "kda.convert"(%x) : (tensor<16x64xbf16>) -> tensor<16x64xf32>
    %s = "kda.reduce_sum"(%xf) {dims = array<i64: 0>} : (tensor<16x64xf32>) -> tensor<64xf32>
    "kda.store_chunk"(%ws, %c, %s) {name = "colsum"} : (memref<?x?x64xf32>, index, tensor<64xf32>) -> ()
    %cs = "kda.cumsum"(%xf) {reverse = true} : (tensor<16x64xf32>) -> tensor<16x64xf32>
    %ob = "kda.convert"(%cs) : (tensor<16x64xf32>) -> tensor<16x64xbf16>
    "kda.store"(%o, %c, %ob) {name = "o"} : (memref<?x?x?x64xbf16>, index, tensor<16x64xbf16>) -> ()
    gpu.yield
  }) {reverse = false} : () -> ()
  %z = "kda.constant"() {value = 0.0 : f64} : () -> tensor<64xf32>
  %S = "kda.scan"(%z) ({
  ^bb0(%c: index, %acc: tensor<64xf32>):
    %s = "kda.load_chunk"(%ws, %c) {name = "colsum"} : (memref<?x?x64xf32>, index) -> tensor<64xf32>
    %h = "kda.constant"() {value = 0.5 : f64} : () -> tensor<64xf32>
    %d = "kda.mul"(%acc, %h) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %n = "kda.add"(%d, %s) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    gpu.yield %n : tensor<64xf32>
  }) {reverse = false} : (tensor<64xf32>) -> tensor<64xf32>
  "kda.store_state"(%final_state, %S) {name = "final_state"} : (memref<?x?x64xf32>, tensor<64xf32>) -> ()
  return
}
'''


@pytest.mark.parametrize("storage", ["smem", "global"])
def test_partitioned_program_chunk_parallel_kernel(storage):
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.target import get_target
    from kdagen.ir.dialect import parse_module
    m = parse_module(TOY)
    k0, k1 = lower_program(m, get_target("sm_90a"))
    assert k0.launch["grid"] == ["HV", "N", "max_chunks"] and k0.launch["parallel_chunks"]
    assert k1.launch["grid"] == ["HV", "N", "1"]
    assert [p.name for p in k0.params][:3] == ["v", "o", "colsum"]
    assert "colsum" in [p.name for p in k1.params]
    v = torch.randn(2, 40, 3, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    out = simulate(m, {"v": v}, storage=storage)
    ref = interpreter.run(m, {"v": v.to(torch.float64)})
    assert rel_err(out["final_state"], ref["final_state"]) < F32_TOL
    assert rel_err(out["o"], ref["o"]) < ROUND_TOL


@pytest.mark.parametrize("chip", ["sm_90a", "sm_120a"])
def test_full_pipeline_numerics(chip):
    """kda_fwd through the chip's pass pipeline (partitioned into a chunk-parallel kernel and a
    state kernel) matches the interpreter on the same IR."""
    from kdagen.codegen.lower.kernel import LowerOptions
    from kdagen.passes.pipelines import pipeline_for
    case = make_case("kda", gate="lower_bound", H=1, HV=2, K=64, V=64, lengths=[5, 65], seed=13)
    m = build_program("kda_fwd", **case.options)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    out = simulate(m, case.inputs, options=LowerOptions(dot="bf16x3"))
    ref = interpreter.run(m, _rounded(case.inputs), dtype=torch.float64, round_storage=True)
    assert rel_err(out["o"], ref["o"]) < ROUND_TOL
    assert rel_err(out["final_state"], ref["final_state"]) < 5e-5


@pytest.mark.parametrize("remat_ops", [0, 8])
def test_backward_remat_of_scratch_values(remat_ops):
    """Values whose buffers would go to the global scratch are re-evaluated where used when
    cheap (LowerOptions.remat_ops); the kernels agree with the reference either way, and
    re-evaluation leaves fewer buffers."""
    from kdagen.codegen.lower.kernel import LowerOptions, prepare
    from kdagen.codegen.lower.program import read_program
    from kdagen.target import get_target
    case = make_case("kda", gate="softplus", H=1, HV=1, K=64, V=64, chunk_size=16,
                     lengths=[20], seed=7)
    m = stable_module("kda_bwd", **case.options)
    g = torch.Generator().manual_seed(8)
    sz = case.sizes
    inputs = dict(case.inputs)
    inputs["do"] = torch.randn(sz["B"], sz["T"], sz["HV"], sz["V"], generator=g, dtype=torch.float64)
    inputs["dht"] = torch.randn(sz["N"], sz["HV"], sz["K"], sz["V"], generator=g, dtype=torch.float64)
    opts = LowerOptions(storage="global", remat_ops=remat_ops)
    out = simulate(m, inputs, options=opts)
    ref = interpreter.run(m, _rounded(inputs), dtype=torch.float64)
    for k, v in out.items():
        tol = F32_TOL if BWD_F32.get(k, "bf16") == "f32" else ROUND_TOL
        assert rel_err(v, ref[k]) < tol, (k, rel_err(v, ref[k]))
    program = read_program(m)
    counts = {o: sum(len(pk.plan.unique_buffers()) for pk in
                     prepare(program, get_target("sm_90a"), "x",
                             LowerOptions(storage="global", remat_ops=o)) if pk.plan)
              for o in (0, 8)}
    assert counts[8] < counts[0], counts
