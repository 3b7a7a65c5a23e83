"""The decode programs on a state pool (``state_pool=True``, kdagen.ir.programs.DECODE_OPTIONS):
sequence n reads its initial state from row ``state_slots[n]`` of the pool and writes its final
state back there; a negative slot skips the sequence (o = 0, no row written). In the float64
interpreter the program equals the pool reference (kdagen.decode_reference) with permuted
int32/int64 slots, a skipped sequence and the pool updated in place; the chip pipelines leave
it unchanged; the lowered kernels compute the same in the CTA simulator (untouched rows keep
their bits) and through the MLIR-free launcher on a bundle; they assemble for every chip
without spills on sm_90a; bad options name themselves."""
from __future__ import annotations

import pytest
import torch

from kdagen import interpreter
from kdagen import reference as R
from kdagen._mlir import ir
from kdagen.decode_reference import decode_pool_step
from kdagen.ir.programs import ProgramOptionError, build_program
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.pipelines import pipeline_for

F64 = torch.float64
CHIPS = ("sm_90a", "sm_100a", "sm_120a")
H, HV = 1, 2
SLOTS = 7


def _case(family, *, lengths=(1, 3, 2, 2), slots=(5, -1, 0, 3), slot_dtype=torch.int64,
          K=64, V=64, seed=0):
    """(program options, program inputs with the pool given as initial_state and final_state,
    the reference's (o, pool)). Precomputed gate, beta as given (the reference's inputs), q/k
    L2-normalised in the kernel as the reference's are here: x / sqrt(sum x^2 + 1e-6)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return torch.randn(*shape, generator=gen, dtype=F64) * s
    T = sum(lengths)
    x = {"q": rnd(1, T, H, K), "k": rnd(1, T, H, K), "v": rnd(1, T, HV, V),
         "beta": torch.rand(1, T, HV, generator=gen, dtype=F64),
         "g": -torch.rand(*((1, T, HV, K) if family == "kda" else (1, T, HV)), generator=gen,
                          dtype=F64) * 0.5,
         "cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])}
    pool = rnd(SLOTS, HV, K, V, s=0.3)
    x.update(initial_state=pool, final_state=pool,
             state_slots=torch.tensor(slots, dtype=slot_dtype))
    opts = dict(head_k_dim=K, head_v_dim=V, gva_ratio=HV // H, varlen=True,
                gate="precomputed" if family == "kda" else "gdn_precomputed",
                use_beta_sigmoid_in_kernel=False, use_qk_l2norm_in_kernel=True,
                state_pool=True, slot_dtype="i32" if slot_dtype == torch.int32 else "i64")

    def l2(t):
        return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)
    want = decode_pool_step(l2(x["q"]), l2(x["k"]), x["v"], x["g"], x["beta"], state_pool=pool,
                            ssm_state_indices=x["state_slots"], cu_seqlens=x["cu_seqlens"])
    return opts, x, want


def _untouched(slots) -> list:
    return [s for s in range(SLOTS) if s not in slots]


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_pool_program_equals_the_pool_reference(family, slot_dtype):
    opts, x, (want_o, want_pool) = _case(family, slot_dtype=slot_dtype)
    out = interpreter.run(build_program(f"{family}_decode", **opts), x, dtype=F64)
    assert R.rel_err(out["o"], want_o) < 1e-12
    assert R.rel_err(out["final_state"], want_pool) < 1e-12
    slots = x["state_slots"].tolist()
    assert torch.equal(out["final_state"][_untouched(slots)], x["initial_state"][_untouched(slots)])
    assert torch.count_nonzero(out["o"][0, 1:4]) == 0            # the skipped sequence


def test_pool_program_reads_and_writes_the_slots_it_is_given():
    """Another slot permutation moves the states accordingly: the program's result depends
    on the slots only through which rows it reads and writes."""
    opts, x, _ = _case("kda", slots=(0, 1, 2, 3))
    m = build_program("kda_decode", **opts)
    base = interpreter.run(m, x, dtype=F64)
    perm = [6, 2, 4, 0]
    pool = torch.zeros_like(x["initial_state"])
    pool[perm] = x["initial_state"][:4]
    out = interpreter.run(m, dict(x, initial_state=pool, final_state=pool,
                                  state_slots=torch.tensor(perm)), dtype=F64)
    assert torch.equal(out["o"], base["o"])
    assert torch.equal(out["final_state"][perm], base["final_state"][:4])


@pytest.mark.parametrize("chip", CHIPS)
def test_chip_pipeline_leaves_the_pool_program_unchanged(chip):
    opts, x, (want_o, want_pool) = _case("gdn")
    m = build_program("gdn_decode", **opts)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    out = interpreter.run(m, x, dtype=F64)
    assert R.rel_err(out["o"], want_o) < 1e-12
    assert R.rel_err(out["final_state"], want_pool) < 1e-12


def test_pool_options_name_themselves():
    with pytest.raises(ProgramOptionError, match="slot_dtype"):
        build_program("kda_decode", slot_dtype="i32")
    with pytest.raises(ProgramOptionError, match="slot_dtype"):
        build_program("kda_decode", state_pool=True, slot_dtype="i16")
    with pytest.raises(ProgramOptionError, match="use_initial_state"):
        build_program("kda_decode", state_pool=True, use_initial_state=False)
    with pytest.raises(ProgramOptionError, match="state_pool"):
        build_program("kda_decode", state_pool="yes")
    with pytest.raises(ProgramOptionError, match="state_pool"):
        build_program("kda_fwd", state_pool=True)     # decode programs only


def test_pool_arguments_and_ops():
    """The pool's calling convention: state_slots [N] after cu_seqlens; the states are pool
    rows; load_state / store_state take the slot table."""
    from kdagen.codegen.lower.program import read_program
    prog = read_program(build_program("kda_decode", state_pool=True, varlen=True,
                                      slot_dtype="i32"))
    args = {a.name: a for a in prog.args}
    names = [a.name for a in prog.args]
    assert names.index("state_slots") == names.index("cu_seqlens") + 1
    assert (args["state_slots"].layout, args["state_slots"].elt) == ("slots", "i32")
    assert args["initial_state"].layout == args["final_state"].layout == "pool"
    slots = prog.arg_values[names.index("state_slots")]
    assert sorted(n.op for n in prog.nodes if slots in n.operands) == \
        ["kda.load_state", "kda.slot_valid", "kda.store_state"]


def _lowered_inputs(x):
    """The kernels' storage: bf16 q, k, v, g, beta (the launcher's conversion)."""
    keep = ("initial_state", "final_state", "state_slots", "cu_seqlens")
    return {k: (v if k in keep else v.to(torch.bfloat16).to(F64)) for k, v in x.items()}


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_lowered_pool_kernel_in_the_simulator(family, slot_dtype):
    """The portable lowering (after the sm_90a pipeline) in the lockstep CTA simulator, the
    pool updated in place (one memory for initial_state and final_state): the interpreter's
    result on the same inputs, a skipped sequence's o exactly 0, untouched rows bit-exact."""
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.sim import simulate
    opts, x, _ = _case(family, slot_dtype=slot_dtype)
    m = build_program(f"{family}_decode", **opts)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for("sm_90a"))
    x = _lowered_inputs(x)
    pool = x["initial_state"].float()
    x.update(initial_state=pool, final_state=pool)
    out = simulate(m, x, options=LowerOptions(dot="fma"))
    want = interpreter.run(m, x, dtype=F64)
    assert R.rel_err(out["final_state"], want["final_state"]) < 2e-5
    assert R.rel_err(out["o"], want["o"]) < 2.5e-3          # o is stored in bf16
    slots = x["state_slots"].tolist()
    assert torch.equal(out["final_state"][_untouched(slots)], pool[_untouched(slots)])
    assert torch.count_nonzero(out["o"][0, 1:4]) == 0


@pytest.mark.parametrize("chip", CHIPS)
def test_pool_kernels_assemble(chip):
    from test_decode_program import assemble_decode
    kernels = assemble_decode(chip, "auto", gva_ratio=2, state_pool=True, slot_dtype="i32")
    assert len(kernels) == 1
    if chip == "sm_90a":
        assert kernels[0].path == "sm90-native"
    assert [p.name for p in kernels[0].params if p.name in ("state_slots", "initial_state",
                                                            "final_state")] == \
        ["initial_state", "state_slots", "final_state"]


@pytest.mark.parametrize("chip", CHIPS)
def test_pool_kernels_stored_value_first_in_bf16_assemble(chip):
    from test_decode_program import assemble_decode
    kernels = assemble_decode(chip, "auto", state_pool=True, slot_dtype="i32",
                              state_dtype="bf16", state_v_first=True, value_split=2)
    assert len(kernels) == 1


def test_pool_variant_through_the_launcher(tmp_path):
    """The bundle's calling convention on the CPU: the MLIR-free launcher runs the pool
    variant's kernels (in the simulator) with the pool passed as initial_state and as the
    final_state it writes into: updated in place, the rest of it untouched."""
    import numpy as np

    from kdagen.bundle_writer import write_bundle
    from kdagen.codegen.lower.sim import SimLibrary
    from kdagen.driver import build_module
    from kdagen.runtime.bundle import variant_name
    from kdagen.runtime.launch import LoweredProgram
    np.seterr(all="ignore")
    opts, x, (want_o, want_pool) = _case("kda", slot_dtype=torch.int32)
    item = ("kda_decode", opts)
    write_bundle(tmp_path, [item], ["sm_120a"], assemble=False)
    vname = variant_name(*item)
    prog = LoweredProgram(tmp_path, vname,
                          library=SimLibrary(tmp_path, {vname: build_module(*item)}, "sm_120a"))
    pool = x["initial_state"].float()
    before = pool.clone()
    inputs = {k: v.float() if v.is_floating_point() else v for k, v in x.items()
              if k not in ("initial_state", "final_state")}
    out = prog(chip="sm_120a", device="cpu", initial_state=pool, final_state=pool, **inputs)
    assert out["final_state"] is pool
    assert R.rel_err(pool, want_pool) < 1e-3
    assert R.rel_err(out["o"], want_o) < 3e-3
    slots = x["state_slots"].tolist()
    assert torch.equal(pool[_untouched(slots)], before[_untouched(slots)])
    with pytest.raises(ValueError, match="final_state"):
        prog(chip="sm_120a", device="cpu", initial_state=pool, **inputs)


@pytest.mark.parametrize("item", [
    ("kda_decode", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True,
                        state_pool=True, slot_dtype="i32")),
    ("gdn_decode", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound", state_pool=True)),
    ("kda_decode", dict(head_k_dim=64, head_v_dim=128, gate="softplus", state_pool=True,
                        value_split=2, state_dtype="bf16", state_v_first=True)),
])
def test_gpu_check_runs_the_pool_cases(tmp_path, item):
    """tools/gpu_check on a pool variant, end to end on the CPU (the bundle, the MLIR-free
    launcher, the kernels in the simulator): permuted slots with one sequence skipped, the
    pool updated in place on a fresh copy per run, against the float64 reference gathered
    from the slots; every case within the bars, finite and deterministic."""
    from test_decode_program import gpu_check_on_cpu

    from tools import gpu_check
    spec, cases, run = gpu_check_on_cpu(tmp_path, item)
    for case in cases[:3]:
        kern, _ = gpu_check._inputs(spec, case, torch.device("cpu"), 0)
        assert (kern["state_slots"] < 0).sum() == (1 if kern["state_slots"].numel() > 1 else 0)
        rows = run(case)
        assert set(rows) == {"o", "final_state"}
        for name, r in rows.items():
            assert r["finite"] and r["det"], (case["label"], name)
            assert r["err"] <= r["bar"], (case["label"], name, r["err"], r["bar"])


def _stored_pool_case(family, *, state_dtype="fp32", v_first=False, value_split=1):
    """_case with K = 64 / V = 128 (so a transposed row has another shape) and the pool
    stored as the options say: [slots, HV, V, K] value-first, rows in bf16 (the reference
    starts from the same rounded states)."""
    opts, x, _ = _case(family, K=64, V=128)
    for n in ("q", "k", "v", "g", "beta"):      # bf16 numbers: round_storage leaves them be
        x[n] = x[n].to(torch.bfloat16).to(F64)
    logical = x["initial_state"]
    if state_dtype == "bf16":
        logical = logical.to(torch.bfloat16).to(F64)
    want = decode_pool_step(*(_l2(x[n]) if n in "qk" else x[n] for n in ("q", "k", "v", "g")),
                            x["beta"], state_pool=logical, ssm_state_indices=x["state_slots"],
                            cu_seqlens=x["cu_seqlens"])
    pool = logical.transpose(-1, -2).contiguous() if v_first else logical.clone()
    x.update(initial_state=pool, final_state=pool)
    opts.update(state_dtype=state_dtype, state_v_first=v_first, value_split=value_split)
    return opts, x, want


def _l2(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _logical(pool, v_first):
    return pool.transpose(-1, -2) if v_first else pool


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("value_split", [1, 2])
def test_pool_stored_value_first_or_in_bf16_equals_the_reference(family, v_first, state_dtype,
                                                                 value_split):
    """A pool stored [slots, HV, V, K] (state_v_first) and/or in bf16 (state_dtype): each row
    is read as the state's transpose and/or widened to fp32, and the new state stored back the
    same way; value parts address V on its own axis. The new rows are the reference's rounded
    to bf16 once (every value a bf16 number), o is the reference's, the rest untouched."""
    opts, x, (want_o, want_pool) = _stored_pool_case(family, state_dtype=state_dtype,
                                                     v_first=v_first, value_split=value_split)
    before = x["initial_state"].clone()
    # round_storage: bf16 stores round (the inputs are bf16 numbers already)
    out = interpreter.run(build_program(f"{family}_decode", **opts), x, dtype=F64,
                          round_storage=state_dtype == "bf16")
    got = _logical(out["final_state"], v_first)
    # with round_storage, o is stored in bf16 too
    assert R.rel_err(out["o"], want_o) < (4e-3 if state_dtype == "bf16" else 1e-12)
    slots = [s for s in x["state_slots"].tolist() if s >= 0]
    if state_dtype == "bf16":
        assert torch.equal(got[slots], got[slots].to(torch.bfloat16).to(F64))
        assert R.rel_err(got, want_pool) < 4e-3
        assert R.rel_err(got, want_pool) > 0                   # it was rounded
    else:
        assert R.rel_err(got, want_pool) < 1e-12
    assert torch.equal(out["final_state"][_untouched(slots)], before[_untouched(slots)])


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_lowered_pool_kernel_stored_value_first_in_bf16_in_the_simulator(family):
    """The lowered kernels (sm_90a pipeline, value split over 2 CTAs) on a bf16 pool stored
    value-first, in place, in the CTA simulator: the interpreter's o and pool rows, the
    untouched rows bit-exact."""
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.sim import simulate
    opts, x, _ = _stored_pool_case(family, state_dtype="bf16", v_first=True, value_split=2)
    m = build_program(f"{family}_decode", **opts)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for("sm_90a"))
    x = _lowered_inputs(x)
    pool = x["initial_state"].to(torch.bfloat16).float()
    before = pool.clone()
    x.update(initial_state=pool, final_state=pool)
    out = simulate(m, x, options=LowerOptions(dot="fma"))
    want = interpreter.run(m, dict(x, initial_state=before.clone(), final_state=before.clone()),
                           dtype=F64)
    slots = x["state_slots"].tolist()
    assert R.rel_err(out["final_state"], want["final_state"]) < 8e-3    # bf16 rows
    assert R.rel_err(out["o"], want["o"]) < 2.5e-3
    assert torch.equal(out["final_state"][_untouched(slots)], before[_untouched(slots)])


def test_a_decode_bundle_serves_each_stored_pool_with_its_own_kernel(tmp_path):
    """`kdagen emit --decode` builds a pool kernel per storage (fp32/bf16 rows, [K, V] or
    value-first), and the call of each pool finds the kernel of its storage, never another's
    (a [K, V] kernel on a value-first pool would read the transpose)."""
    import kdagen
    from kdagen.bundle_writer import write_bundle
    from kdagen.emit import DECODE_POOL_STORAGE, program_variants
    from kdagen.runtime.backends import recording
    from kdagen.runtime.bundle_executor import find_variant
    items = [(p, o) for p, o in program_variants(["kda"], 64, None, decode=True,
                                                 residuals=False)
             if p == "kda_decode" and o.get("state_pool") and o["value_split"] == 4]
    assert len(items) == len(DECODE_POOL_STORAGE) == 4
    res = write_bundle(tmp_path, items, ["sm_120a"], assemble=False)
    gen = torch.Generator().manual_seed(3)
    x = {n: torch.randn(1, 1, 1, 64, generator=gen).to(torch.bfloat16)
         for n in ("q", "k", "v", "g")}
    x.update(beta=torch.rand(1, 1, 1, generator=gen).to(torch.bfloat16))
    for stored in DECODE_POOL_STORAGE:
        pool = torch.zeros(2, 1, 64, 64,
                           dtype=torch.bfloat16 if stored.get("state_dtype") else torch.float32)
        with recording("cpu") as rec:
            kdagen.fused_recurrent_kda(**x, initial_state=pool, inplace_final_state=True,
                                       state_v_first=stored.get("state_v_first", False),
                                       use_gate_in_kernel=True, A_log=torch.zeros(1),
                                       use_qk_l2norm_in_kernel=True,
                                       use_beta_sigmoid_in_kernel=True,
                                       ssm_state_indices=torch.tensor([1]))
        (program, options), = rec.calls
        name = find_variant(tmp_path, program, options, chip="sm_120a")
        attrs = res["variants"][name]["attrs"]
        assert attrs.get("state_dtype", "fp32") == stored.get("state_dtype", "fp32"), name
        assert attrs.get("state_v_first", False) == stored.get("state_v_first", False), name
