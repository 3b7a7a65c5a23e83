"""Per-input storage types: ``gate_dtype`` (g / g_raw and dg / dg_raw) and ``beta_dtype`` (beta /
beta_raw and its gradient), default ``dtype``. FLA keeps gates fp32 next to bf16 q/k/v: with
``gate_dtype="fp32"`` the program arguments, the derived backward, the passes, the interpreter
(``round_storage=True`` rounds inputs to their declared storage as the launcher does), the
lowering of every chip and the bundle's ``lowered.json`` carry f32, so nothing rounds the gate."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kdagen import interpreter
from kdagen._mlir import ir
from kdagen.ir.accessors import arg_specs, program_func
from kdagen.ir.programs import ProgramOptionError, build_program, program_options
from kdagen.ir.testing import make_case
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.pipeline import run_pipeline
from kdagen.reference import rel_err

BF16 = torch.bfloat16
SMALL = dict(head_k_dim=64, head_v_dim=64)


def _elts(module) -> dict:
    return {s.name: s.elt for s in arg_specs(program_func(module))}


# -- options -------------------------------------------------------------------------------------

def test_options_and_defaults():
    opts = program_options("kda_fwd")
    assert opts["gate_dtype"][0] is None and opts["beta_dtype"][0] is None
    for bad in (dict(gate_dtype="fp64"), dict(beta_dtype="int8"), dict(gate_dtype="f32")):
        with pytest.raises(ProgramOptionError, match=next(iter(bad))):
            build_program("kda_fwd", **bad)
    # default: the storage type of q/k/v
    e = _elts(build_program("kda_fwd", dtype="fp16", **SMALL))
    assert e["g_raw"] == e["beta_raw"] == e["q"] == e["o"] == "f16"
    m = build_program("kda_fwd", gate_dtype="fp32", **SMALL)
    e = _elts(m)
    assert e["g_raw"] == "f32" and e["beta_raw"] == "bf16" and e["q"] == e["o"] == "bf16"
    attrs = program_func(m).attributes
    assert ir.StringAttr(attrs["kda.gate_dtype"]).value == "fp32"
    assert ir.StringAttr(attrs["kda.beta_dtype"]).value == "bf16"


@pytest.mark.parametrize("program,gate,extra", [
    ("kda_bwd", "softplus", {}),
    ("gdn_bwd", "gdn_precomputed", dict(use_beta_sigmoid_in_kernel=False)),
])
def test_gradients_have_their_inputs_dtype(program, gate, extra):
    e = _elts(build_program(program, gate=gate, gate_dtype="fp32", beta_dtype="fp16", **SMALL,
                            **extra))
    g, beta = ("g_raw", "beta_raw") if gate == "softplus" else ("g", "beta")
    assert e[g] == e["d" + g] == "f32"
    assert e[beta] == e["d" + beta] == "f16"
    assert e["q"] == e["dq"] == e["do"] == "bf16"


# -- the interpreter: an fp32 gate is not rounded --------------------------------------------------

def _rounded_case(family, gate, **kw):
    """A case whose bf16 inputs are bf16-representable and whose gate is not."""
    case = make_case(family, gate=gate, B=1, T=100, H=1, HV=2, K=64, V=64, chunk_size=32, seed=21,
                     **kw)
    gname = "g_raw" if "g_raw" in case.inputs else "g"
    for k in ("q", "k", "v", "beta_raw", "beta"):
        if k in case.inputs:
            case.inputs[k] = case.inputs[k].to(BF16).double()
    for k in ("A_log", "dt_bias", "initial_state"):              # fp32 storage
        if k in case.inputs:
            case.inputs[k] = case.inputs[k].float().double()
    g = case.inputs[gname]
    assert (g.to(BF16).double() != g).float().mean() > 0.9     # not representable in bf16
    return case, gname


@pytest.mark.parametrize("family,gate", [("kda", "softplus"), ("gdn", "gdn_precomputed")])
def test_interpreter_does_not_round_an_fp32_gate(family, gate):
    case, gname = _rounded_case(family, gate)
    g = case.inputs[gname]
    g32, g16 = g.float().double(), g.to(BF16).double()
    outs = {}
    for dt in ("fp32", "bf16"):
        m = build_program(f"{family}_fwd", **dict(case.options, gate_dtype=dt))
        outs[dt] = interpreter.run(m, case.inputs, round_storage=True)   # rounds g to dt
    ref = {}
    for name, gv in (("fp32", g32), ("bf16", g16)):
        case.inputs[gname] = gv
        ref[name] = case.reference()[1]                                 # final state (fp32 out)
    # fp32 gate: the reference on the fp32 gate; bf16 gate: the reference on the rounded gate
    assert rel_err(outs["fp32"]["final_state"], ref["fp32"]) <= 1e-9
    assert rel_err(outs["bf16"]["final_state"], ref["bf16"]) <= 1e-9
    # and the two differ by far more than that: the fp32 gate was not rounded to bf16
    assert rel_err(outs["bf16"]["final_state"], ref["fp32"]) > 1e-4
    assert rel_err(outs["fp32"]["o"], outs["bf16"]["o"]) > 1e-4


def test_backward_gate_gradient_is_fp32():
    case, gname = _rounded_case("kda", "softplus")
    case.inputs[gname] = case.inputs[gname].float().double()
    gen = torch.Generator().manual_seed(22)
    sz = case.sizes
    do = torch.randn(1, sz["T"], sz["HV"], sz["V"], generator=gen, dtype=torch.float64).to(BF16).double()
    dht = torch.randn(1, sz["HV"], sz["K"], sz["V"], generator=gen, dtype=torch.float64).float().double()
    ref = case.reference_grads(do, dht)
    m = build_program("kda_bwd", **dict(case.options, gate_dtype="fp32", beta_dtype="fp32"))
    out = interpreter.run(m, dict(case.inputs, do=do, dht=dht), round_storage=True)
    # the fp32 gate and beta gradients are stored unrounded
    for k in ("dg_raw", "dbeta_raw", "dA_log", "ddt_bias", "dh0"):
        assert rel_err(out[k], ref[k]) <= 1e-9, (k, rel_err(out[k], ref[k]))
    m16 = build_program("kda_bwd", **case.options)
    out16 = interpreter.run(m16, dict(case.inputs, do=do, dht=dht), round_storage=True)
    assert rel_err(out16["dg_raw"], ref["dg_raw"]) > 1e-4


# -- the passes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("chip", ["sm_90a", "sm_120a"])
def test_chip_pipeline_keeps_the_fp32_gate(chip):
    from kdagen.passes.pipelines import pipeline_for
    case, gname = _rounded_case("kda", "softplus")
    opts = dict(case.options, gate_dtype="fp32", beta_dtype="fp32")
    gen = torch.Generator().manual_seed(23)
    sz = case.sizes
    x = dict(case.inputs,
             do=torch.randn(1, sz["T"], sz["HV"], sz["V"], generator=gen, dtype=torch.float64),
             dht=torch.randn(1, sz["HV"], sz["K"], sz["V"], generator=gen, dtype=torch.float64))
    plain = interpreter.run(build_program("kda_bwd", **opts), x)
    m = build_program("kda_bwd", **opts)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    e = _elts(m)
    assert e["g_raw"] == e["dg_raw"] == e["beta_raw"] == e["dbeta_raw"] == "f32"
    loads = [l for l in str(m).splitlines() if '"kda.load"' in l and 'name = "g_raw"' in l]
    assert loads and all("-> tensor<32x64xf32>" in l for l in loads)   # loaded as f32
    out = interpreter.run(m, x)
    for k in plain:
        assert rel_err(out[k], plain[k]) <= 1e-9, k


# -- the lowering -----------------------------------------------------------------------------------

def test_lowered_kernels_simulate_with_an_fp32_gate():
    """The lowered kernels (CPU simulator, the chip pipeline's partitioned program) read the
    fp32 gate unrounded: they match the interpreter on the same storage types."""
    from kdagen.codegen.lower.kernel import LowerOptions
    from kdagen.codegen.lower.sim import simulate
    from kdagen.passes.pipelines import pipeline_for
    np.seterr(all="ignore")
    case, gname = _rounded_case("kda", "softplus", lengths=[5, 70])
    opts = dict(case.options, gate_dtype="fp32", beta_dtype="fp32")
    for program in ("kda_fwd", "kda_bwd"):
        x = dict(case.inputs)
        if program == "kda_bwd":
            gen = torch.Generator().manual_seed(24)
            sz = case.sizes
            x["do"] = torch.randn(1, sz["T"], sz["HV"], sz["V"], generator=gen, dtype=torch.float64)
            x["dht"] = torch.randn(sz["N"], sz["HV"], sz["K"], sz["V"], generator=gen,
                                   dtype=torch.float64)
        m = build_program(program, **opts)
        with m.context, ir.Location.unknown():
            run_pipeline(m, pipeline_for("sm_90a"))
        out = simulate(m, x, options=LowerOptions(dot="bf16x3"))
        ref = interpreter.run(m, x, round_storage=True)
        ref16 = interpreter.run(m, dict(x, **{gname: x[gname].to(BF16).double()}),
                                round_storage=True)
        for k, v in out.items():
            assert torch.isfinite(v).all(), (program, k)
            err = rel_err(v, ref[k])
            assert err <= (2.2e-3 if k in ("o", "dq", "dk", "dv") else 5e-5), (program, k, err)
        # fp32 results: the simulated kernels are much closer to the fp32 gate than to it rounded
        key = "final_state" if program == "kda_fwd" else "dg_raw"
        assert rel_err(out[key], ref[key]) * 10 < rel_err(out[key], ref16[key]), program


def _ptxas_or_skip():
    from kdagen.codegen import ptxas
    try:
        return ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not available")


def test_bundle_declares_f32_gate_and_assembles(tmp_path):
    """kda_fwd / kda_bwd with fp32 gate and beta for the three chips (the emit lowering: chip
    pipeline, bf16x3, the sm_90a native path with an f32 TMA box for g_raw), and a GDN variant
    with a precomputed fp32 gate on sm_90a: every kernel assembles with ptxas, and the
    arguments in lowered.json (what the launcher converts inputs to) are f32."""
    from kdagen.bundle_writer import DEFAULT_LOWERING, write_bundle
    _ptxas_or_skip()
    fp32 = dict(gate_dtype="fp32", beta_dtype="fp32")
    kda = dict(SMALL, gate="softplus", **fp32)
    gdn = dict(SMALL, gate="gdn_precomputed", use_beta_sigmoid_in_kernel=False, **fp32)
    write_bundle(tmp_path, [("kda_fwd", kda), ("kda_bwd", kda)], ["sm_90a", "sm_100a", "sm_120a"],
                 lower_options=DEFAULT_LOWERING)
    write_bundle(tmp_path, [("gdn_fwd", gdn)], ["sm_90a"], lower_options=DEFAULT_LOWERING)
    variants = json.loads((tmp_path / "lowered.json").read_text())["variants"]
    assert len(variants) == 3
    want = {"g_raw": "f32", "beta_raw": "f32", "dg_raw": "f32", "dbeta_raw": "f32", "g": "f32",
            "beta": "f32", "dg": "f32", "dbeta": "f32", "q": "bf16", "v": "bf16", "o": "bf16",
            "dq": "bf16"}
    for spec in variants.values():
        for a in spec["args"]:
            if a["name"] in want:
                assert a["dtype"] == want[a["name"]], (spec["program"], a)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    chips = {k["chip"] for k in manifest["kernels"]}
    assert chips == {"sm_90a", "sm_100a", "sm_120a"}
    assert all(k.get("cubin_file") for k in manifest["kernels"]), "every kernel assembled"
    gate_maps = [m for k in manifest["kernels"] if k["chip"] == "sm_90a"
                 for m in (k["launch"].get("tensor_maps") or {}).values() if m["tensor"] == "g_raw"]
    assert gate_maps, "the sm_90a native path streams the fp32 gate with TMA"
    for m in gate_maps:
        assert m["dtype"] == "f32" and m["box"] == [64, 1, 64]   # 256-byte rows: 16B multiple


def test_launcher_end_to_end_fp32_gate_out_of_range(tmp_path):
    """write_bundle -> the MLIR-free launcher (converts each input to its lowered.json dtype:
    the fp32 gate stays fp32) -> kernels run by the CPU simulator -> gpu_check's comparison with
    the float64 reference, on gpu_check's out-of-range case (raw gates of +-inf and 1e6)."""
    from tools import gpu_check
    from kdagen.bundle_writer import write_bundle
    from kdagen.driver import build_module
    from kdagen.runtime.bundle import variant_name
    from kdagen.runtime.launch import LoweredProgram
    from kdagen.codegen.lower.sim import SimLibrary
    np.seterr(all="ignore")
    item = ("kda_fwd", dict(SMALL, chunk_size=16, gate="softplus", gate_dtype="fp32"))
    res = write_bundle(tmp_path, [item], ["sm_120a"], assemble=False)
    vname = variant_name(*item)
    spec = res["variants"][vname]
    assert {a["name"]: a["dtype"] for a in spec["args"]}["g_raw"] == "f32"
    lib = SimLibrary(tmp_path, {vname: build_module(*item)}, "sm_120a")
    prog = LoweredProgram(tmp_path, vname, library=lib)

    class OnCpu:
        def __call__(self, **kw):
            return prog(chip="sm_120a", **kw)

    case = dict(label="out-of-range", B=1, T=40, decay="extreme")
    kern, _ = gpu_check._inputs(spec, case, torch.device("cpu"), 0)
    assert kern["g_raw"].dtype == torch.float32 and torch.isinf(kern["g_raw"]).any()
    rows = gpu_check.run_case(OnCpu(), spec, case, torch.device("cpu"), 0)
    by = {r["tensor"]: r for r in rows}
    assert all(r["finite"] and r["det"] for r in rows)
    assert by["final_state"]["err"] < 1e-5
    assert by["o"]["err"] < by["o"]["floor"] + 5e-4
