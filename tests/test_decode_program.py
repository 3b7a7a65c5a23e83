"""The decode programs (kdagen.ir.programs: kda_decode, gdn_decode): the per-token recurrence
in the DSL, one scan step per token. In the float64 interpreter they equal the per-token
reference (the chunked op's semantics) with every gate form, GVA and varlen with 1..8 tokens
per sequence; the chip pipelines' passes leave them unchanged; the lowered kernels compute the
same in the CTA simulator and assemble for every chip."""
from __future__ import annotations

import pytest
import torch

from kdagen import interpreter
from kdagen import reference as R
from kdagen._mlir import ir
from kdagen.ir.programs import ProgramOptionError, build_program
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.pipelines import pipeline_for

F64 = torch.float64
CHIPS = ("sm_90a", "sm_100a", "sm_120a")


def _case(family, *, lengths=None, B=2, T=3, H=1, HV=2, K=64, V=64, gate="softplus",
          seed=0):
    """(program options, program inputs, reference call) of one decode step."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen, dtype=F64) * s)
    varlen = lengths is not None
    if varlen:
        B, T = 1, sum(lengths)
    N = len(lengths) if varlen else B
    x = {"q": rnd(B, T, H, K), "k": rnd(B, T, H, K), "v": rnd(B, T, HV, V),
         "initial_state": rnd(N, HV, K, V, s=0.3), "scale": K ** -0.5}
    opts = dict(head_k_dim=K, head_v_dim=V, gva_ratio=HV // H, varlen=varlen,
                use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)
    ref_kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    x["beta_raw"] = rnd(B, T, HV)
    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    if gate in ("softplus", "gdn_softplus"):
        x["g_raw"] = rnd(*gshape)
        x["A_log"] = rnd(HV, s=0.3)
        x["dt_bias"] = rnd(*((HV, K) if family == "kda" else (HV,)), s=0.3)
        opts["gate"] = gate
        ref_kw.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
        g = x["g_raw"]
    else:
        x["g"] = -torch.rand(*gshape, generator=gen, dtype=F64) * 0.5
        opts["gate"] = gate
        g = x["g"]
    if varlen:
        x["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        ref_kw["cu_seqlens"] = x["cu_seqlens"]
    fn = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    o, ht = fn(x["q"], x["k"], x["v"], g, x["beta_raw"], scale=x["scale"],
               initial_state=x["initial_state"], output_final_state=True, **ref_kw)
    return opts, x, {"o": o, "final_state": ht}


CASES = {
    "kda_softplus_T3_gva2": dict(family="kda", gate="softplus"),
    "kda_precomputed_T1": dict(family="kda", gate="precomputed", T=1),
    "kda_softplus_varlen_1_to_8": dict(family="kda", gate="softplus", lengths=[1, 8, 3, 5]),
    "gdn_softplus_T2": dict(family="gdn", gate="gdn_softplus", T=2),
    "gdn_precomputed_varlen": dict(family="gdn", gate="gdn_precomputed", lengths=[2, 1, 7]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decode_program_equals_the_per_token_reference(name):
    spec = dict(CASES[name])
    family = spec.pop("family")
    opts, x, ref = _case(family, **spec)
    out = interpreter.run(build_program(f"{family}_decode", **opts), x, dtype=F64)
    for k in ("o", "final_state"):
        assert R.rel_err(out[k], ref[k]) < 1e-12, (k, R.rel_err(out[k], ref[k]))


@pytest.mark.parametrize("chip", CHIPS)
def test_chip_pipeline_leaves_the_decode_program_unchanged(chip):
    opts, x, ref = _case("kda", gate="softplus", lengths=[1, 8, 3])
    m = build_program("kda_decode", **opts)
    before = interpreter.run(m, x, dtype=F64)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    after = interpreter.run(m, x, dtype=F64)
    for k in before:
        assert R.rel_err(after[k], before[k]) < 1e-10, k
        assert R.rel_err(after[k], ref[k]) < 1e-12, k


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("token_states", [False, True])
def test_decode_is_one_kernel_without_state_sized_temporaries(chip, token_states):
    """kda-partition keeps a per-token scan whole (one serial kernel: no launches or state
    round trips added per token), and the step reads S only in its two products and the one
    element-wise update, so the kernel's tile buffers hold S once (plus the per-token
    checkpoint with output_token_states) and nothing spills to the global scratch (sm_120a's
    99 KB keep one of the two there with output_token_states)."""
    from kdagen.codegen.lower.kernel import prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.program import read_program
    from kdagen.passes.partition import kernel_report
    from kdagen.target import get_target
    m = build_program("kda_decode", head_k_dim=128, head_v_dim=128, gate="softplus",
                      output_token_states=token_states)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    assert [(name, parallel) for name, parallel, _ in kernel_report(m)] == \
        [("kda_decode_whole", False)]
    path = "native" if chip == "sm_90a" else "portable"
    tiles = [pk for pk in prepare(read_program(m), get_target(chip), "t",
                                  LowerOptions(dot="auto", path=path))
             if pk.group.kind == "tile"]
    assert len(tiles) == 1
    state = 4 * 128 * 129                       # one padded fp32 [K, V] buffer
    assert tiles[0].plan.total_bytes < (3 if token_states else 2) * state
    if not (token_states and chip == "sm_120a"):    # 99 KB: S and its checkpoint don't both fit
        assert tiles[0].launch["scratch_bytes_per_cta"] == 0


def test_decode_rejects_a_chunk_size():
    with pytest.raises(ProgramOptionError, match="chunk_size"):
        build_program("kda_decode", chunk_size=64)
    with pytest.raises(ProgramOptionError, match="output_chunk_states"):
        build_program("gdn_decode", output_chunk_states=True)


@pytest.mark.parametrize("family,parts", [("kda", 1), ("gdn", 1), ("kda", 2), ("gdn", 4)])
def test_lowered_decode_kernels_compute_the_recurrence_in_the_simulator(family, parts):
    """The portable lowering of the decode program (after the sm_90a pipeline), run in the
    lockstep CTA simulator on bf16-rounded inputs, against the interpreter on the same (the
    sm_90a pipeline: fp32 workspaces; sm_120a keeps its workspaces in bf16). ``parts``:
    value_split, each (sequence, head) as that many CTAs over the value columns."""
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.sim import simulate
    gate = "softplus" if family == "kda" else "gdn_softplus"
    opts, x, _ = _case(family, gate=gate, lengths=[1, 4, 2])
    m = build_program(f"{family}_decode", value_split=parts, **opts)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for("sm_90a"))
    keep = ("A_log", "dt_bias", "initial_state", "cu_seqlens", "scale")
    xr = {k: (v.to(torch.bfloat16).to(F64) if isinstance(v, torch.Tensor)
              and v.is_floating_point() and k not in keep else v) for k, v in x.items()}
    out = simulate(m, xr, options=LowerOptions(dot="fma"))
    want = interpreter.run(m, xr, dtype=F64)
    assert R.rel_err(out["final_state"], want["final_state"]) < 2e-5
    assert R.rel_err(out["o"], want["o"]) < 2.2e-3          # o is stored in bf16


def assemble_decode(chip: str, dot: str, **options) -> list:
    """The kda_decode program with ``options`` through ``chip``'s pipeline and lowering (its
    native path where it has one), every kernel assembled by ptxas (no spills on sm_90a);
    returns the lowered kernels (skips without ptxas)."""
    from kdagen.codegen import ptxas
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.to_ptx import lower_to_ptx
    from kdagen.target import get_target
    try:
        exe = ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not available")
    m = build_program("kda_decode", head_k_dim=128, head_v_dim=128, gate="softplus", **options)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    path = "native" if chip == "sm_90a" else "portable"
    kernels = lower_program(m, get_target(chip), options=LowerOptions(dot=dot, path=path))
    assert kernels
    for k in kernels:
        res = ptxas.assemble(lower_to_ptx(k.module, get_target(chip)), chip, exe)
        assert res.ok, res.log
        if chip == "sm_90a":
            assert res.resources[k.name].spill_stores == 0, k.name
    return kernels


@pytest.mark.parametrize("chip", CHIPS)
def test_decode_kernels_assemble(chip):
    assemble_decode(chip, "bf16x3", varlen=True, gva_ratio=2)


def gpu_check_on_cpu(tmp_path, item):
    """tools/gpu_check on the CPU for one (program, options) variant: the bundle (sm_120a, not
    assembled), the MLIR-free launcher, the kernels in the simulator. Returns (spec, cases,
    run) with run(case) -> {tensor: gpu_check's row}."""
    import numpy as np

    from kdagen.bundle_writer import write_bundle
    from kdagen.codegen.lower.sim import SimLibrary
    from kdagen.driver import build_module
    from kdagen.runtime.bundle import variant_name
    from kdagen.runtime.launch import LoweredProgram
    from tools import gpu_check
    np.seterr(all="ignore")
    res = write_bundle(tmp_path, [item], ["sm_120a"], assemble=False)
    vname = variant_name(*item)
    spec = res["variants"][vname]
    prog = LoweredProgram(tmp_path, vname,
                          library=SimLibrary(tmp_path, {vname: build_module(*item)}, "sm_120a"))

    def on_cpu(**kw):
        return prog(chip="sm_120a", **kw)

    def run(case):
        return {r["tensor"]: r for r in gpu_check.run_case(on_cpu, spec, case,
                                                           torch.device("cpu"), 0)}
    return spec, gpu_check._cases(spec, quick=False), run


def test_gpu_check_runs_the_decode_cases(tmp_path):
    """tools/gpu_check's decode cases (1..8 tokens per sequence, strong and weak decay, varlen)
    end to end on the CPU: the bundle, the MLIR-free launcher, the kernels in the simulator,
    the float64 reference and the bars. What the GPU check runs on the decode variants."""
    item = ("kda_decode", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2,
                               varlen=True))
    _, cases, run = gpu_check_on_cpu(tmp_path, item)
    assert [c["label"] for c in cases] == ["varlen[1,8,3,5]", "varlen[1,4] strong",
                                           "varlen[8,2] weak"]
    for case in cases:
        rows = run(case)
        assert set(rows) == {"o", "final_state"}
        for name, r in rows.items():
            assert r["finite"] and r["det"], (case["label"], name)
            assert r["err"] <= r["bar"], (case["label"], name, r["err"], r["bar"])


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("name", ["kda_softplus_T3_gva2", "gdn_precomputed_varlen"])
def test_value_split_runs_each_part_of_the_value_columns_on_its_own(name, parts):
    """value_split=P: the program holds V / P value columns (state, v, o) and runs once per
    part; the columns never mix, so the outputs equal the unsplit program's (float64)."""
    spec = dict(CASES[name])
    family = spec.pop("family")
    opts, x, ref = _case(family, **spec)
    m = build_program(f"{family}_decode", value_split=parts, **opts)
    shapes = [line for line in str(m).splitlines() if '"kda.load_state"' in line]
    assert shapes and f"tensor<64x{64 // parts}xf32>" in shapes[0]
    out = interpreter.run(m, x, dtype=F64)
    for k in ("o", "final_state"):
        assert R.rel_err(out[k], ref[k]) < 1e-12, (k, R.rel_err(out[k], ref[k]))


def test_value_split_on_a_pool_in_place_with_token_states():
    """In place on a state pool (read and written through the slot table, a skipped
    sequence), with per-token states: every part reads and writes only its own columns."""
    opts, x, _ = _case("kda", gate="softplus", lengths=[2, 1, 3])
    pool = torch.randn(5, 2, 64, 64, dtype=F64, generator=torch.Generator().manual_seed(4))
    slots = torch.tensor([3, -1, 0])
    outs = []
    for parts in (1, 4):
        m = build_program("kda_decode", value_split=parts, state_pool=True,
                          output_token_states=True, **opts)
        p = pool.clone()
        xi = dict(x, initial_state=p, final_state=p, state_slots=slots)   # in place
        outs.append(interpreter.run(m, xi, dtype=F64))
    for k in ("o", "final_state", "token_states"):
        assert torch.allclose(outs[0][k], outs[1][k], rtol=0, atol=1e-13), k


def test_value_split_needs_whole_parts():
    with pytest.raises(ProgramOptionError, match="value_split"):
        build_program("kda_decode", head_k_dim=64, head_v_dim=64, value_split=3)
    with pytest.raises(ProgramOptionError, match="value_split"):
        build_program("kda_decode", head_k_dim=64, head_v_dim=64, value_split=16)


def test_decode_api_splits_few_pairs_over_4_ctas_and_many_over_2():
    from kdagen import decode
    assert decode.value_split(1, 16, 128) == 4
    assert decode.value_split(8, 16, 128) == 4          # 128 (sequence, head) pairs
    assert decode.value_split(9, 16, 128) == 2
    assert decode.value_split(256, 32, 128) == 2
    assert decode.value_split(1, 16, 16) == 2           # parts keep a multiple of 8 columns
    assert decode.value_split(1, 16, 8) == 1
    from kdagen.emit import DECODE_VALUE_SPLITS                # what `kdagen emit --decode` builds
    assert {decode.value_split(n, 16, d) for n in (1, 256) for d in (64, 128)} \
        == set(DECODE_VALUE_SPLITS)
