"""The static cost report of the lowering (kdagen.codegen.lower.cost, cost_model): counts of a
small hand-built kernel against a hand count, the per-chunk-step region apart from the
prologue, the report of real kernels in the driver's `cost` stage and in a bundle's manifest,
and the PTX byte-identical with and without counting. No timing."""
import json

import pytest
from click.testing import CliRunner

from kdagen.cli import main
from kdagen.codegen.common import smem as smem_mod
from kdagen.codegen.common.ints import IntVal
from kdagen.codegen.common.kernel import GpuModuleBuilder, Param
from kdagen.codegen.common.sreg import thread_idx
from kdagen.codegen.lower import backend as B
from kdagen.codegen.lower import cost_model
from kdagen.codegen.lower import tiles as T_
from kdagen.codegen.lower.cost import CHUNKS, CostCounter
from kdagen.codegen.lower.kernel import lower_program
from kdagen.codegen.lower.mlir_backend import MlirBackend
from kdagen.driver import DEFAULT_LOWERING, Compilation, build_module
from kdagen.codegen.to_ptx import lower_to_ptx
from kdagen.codegen.lower.options import LowerOptions
from kdagen.target import get_target

OPTS = dict(head_k_dim=64, head_v_dim=64)


def _toy_kernel(counter):
    """prologue: a 4-iteration loop, one global load each, then a barrier;
    chunk loop (dynamic) body: a 16-iteration loop of 3 global loads + 1 global store, a
    barrier; an element loop over 1024 elements on 128 threads (8 per thread) reading shared
    memory; a loop of unknown trip count; a barrier."""
    b = GpuModuleBuilder("toy")
    params = [Param("x", "ptr", "f32"), Param("y", "ptr", "f32"), Param("n", "i32")]
    with b.kernel("toy", params, (128, 1, 1)) as p:
        smem_mod.declare_dynamic_smem(b)
        from kdagen._mlir import llvm
        sm = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
        with B.use(MlirBackend(cost=counter)):
            tid = IntVal(thread_idx("x"))
            n = IntVal(p["n"])

            def pro(i, acc):
                return [B.add(acc, B.load(p["x"], i))]
            (acc,) = B.for_range(0, 4, 1, pro, [B.f(0.0)])
            B.store(p["y"], 0, acc)
            B.barrier()

            def step(c, *_):
                def body(i, *_):
                    s = B.add(B.add(B.load(p["x"], i), B.load(p["x"], i + 1)), B.load(p["x"], i + 2))
                    B.store(p["y"], i, s)
                    return []
                B.for_range(0, 16, 1, body)
                B.barrier()
                T_.foreach(T_.Threads(tid, 128), (1024,),
                           lambda idx: B.store(p["y"], idx[0], B.ex2(B.load(sm, idx[0]))))

                def unknown(i, *_):
                    B.store(p["y"], i, B.f(1.0))
                    return []
                B.for_range(0, n, 1, unknown)
                B.barrier()
                return []
            B.for_range(0, n, 1, step, trips=CHUNKS)
    b.verify()
    return b


def test_counts_of_a_small_kernel_match_a_hand_count():
    counter = CostCounter()
    _toy_kernel(counter)
    step = counter.get("consumer", "step")
    assert step == {
        "global_rounds": 16,            # the 16 iterations with global loads
        "shared_rounds": 8,             # the 8 element-loop iterations of thread 0
        "loop_iters": 16 + 8 + 1,       # the unknown loop counted once
        "unknown_trip_loops": 1,
        "ld.global": 3 * 16,
        "st.global": 16 + 8 + 1,
        "ld.shared": 8,
        "bar.sync": 2,
        "alu.f32": 2 * 16,
        "ex2": 8,
        "bytes.global": 4 * (3 * 16 + 16 + 8 + 1),   # fp32 loads and stores, 4 bytes each
    }
    assert len(counter.unknown) == 1 and counter.unknown[0].startswith("consumer/step")


def test_the_chunk_step_region_excludes_the_prologue():
    counter = CostCounter()
    _toy_kernel(counter)
    prologue = counter.get("consumer", "kernel")
    assert prologue == {"global_rounds": 4, "loop_iters": 4, "ld.global": 4, "st.global": 1,
                        "bar.sync": 1, "alu.f32": 4, "bytes.global": 4 * 5}
    report = cost_model.kernel_report(counter, serial=True)
    assert report["unit"] == "chunk step"
    assert report["counts"] == counter.get("consumer", "step")
    assert report["once_per_cta"] == prologue
    # a chunk-parallel kernel's unit is the CTA: prologue and its one chunk together
    cta = cost_model.kernel_report(counter, serial=False)
    assert cta["unit"] == "CTA" and cta["counts"]["ld.global"] == 4 + 48


def test_estimate_follows_the_documented_constants():
    e = cost_model.estimate({"global_rounds": 10, "shared_rounds": 100, "wgmma": 12})
    rest = 100 * cost_model.SHARED_ROUND_CYCLES + 12 * cost_model.WGMMA_CYCLES
    assert e["cycles"] == 10 * cost_model.GLOBAL_ROUND_CYCLES + rest
    assert e["us"] == round(e["cycles"] / (cost_model.CLOCK_GHZ * 1000), 2)
    assert e["us_low"] < e["us"] < e["us_high"] and e["is_estimate"] is True


def test_throughput_estimate_follows_the_documented_fit():
    counts = {"alu.f32": 900, "ld.shared": 100, "bar.sync": 10, "global_rounds": 3,
              "shared_rounds": 50, "loop_iters": 40, "st.shared.staging": 7}
    th = cost_model.throughput_estimate(counts, warps=8)
    assert th["instructions"] == 1010        # rounds, trips and the staging subset excluded
    cycles = (1010 * 8 / cost_model.SCHEDULERS * cost_model.ISSUE_CYCLES
              + 10 * cost_model.BARRIER_CYCLES + 3 * cost_model.THROUGHPUT_ROUND_CYCLES)
    assert th["us"] == pytest.approx(cycles / (cost_model.CLOCK_GHZ * 1000), abs=0.01)
    # twice the warps on one SM's four schedulers: twice the issue time
    assert cost_model.throughput_estimate(counts, warps=16)["terms_us"]["issue"] == \
        pytest.approx(2 * th["terms_us"]["issue"], abs=0.01)


def test_only_chunk_parallel_kernels_get_the_throughput_estimate():
    counter = CostCounter()
    _toy_kernel(counter)
    assert "throughput" not in cost_model.kernel_report(counter, serial=True, warps=8)
    cta = cost_model.kernel_report(counter, serial=False, warps=8)
    assert cta["throughput"]["warps"] == 8
    assert "THROUGHPUT ESTIMATE" in cost_model.format_report("k", cta)


def test_a_one_stage_ring_prices_its_refill():
    """``ring.refill_bytes`` (a register scan whose ring has one stage) is priced at
    RING_REFILL_GB_S and shown as its own term; without it the term is 0."""
    base = {"shared_rounds": 1, "wgmma": 32}
    e0 = cost_model.estimate(base)
    e1 = cost_model.estimate({**base, "ring.refill_bytes": 91_000})
    assert e0["terms_us"]["ring_refill"] == 0
    assert e1["terms_us"]["ring_refill"] == pytest.approx(91_000 / (cost_model.RING_REFILL_GB_S * 1e3))
    assert e1["us"] == pytest.approx(e0["us"] + e1["terms_us"]["ring_refill"], abs=0.011)


def test_register_scans_count_the_refill_of_a_one_stage_ring():
    """At K = V = 128 the kda backward's reverse scan reads more per step than two stages
    hold: its report carries the stage's bytes as refill; the forward-recompute scan has two
    stages and none."""
    comp = Compilation("kda_bwd", dict(head_k_dim=128, head_v_dim=128), "sm_90a",
                       lower=DEFAULT_LOWERING).run("cost")
    depths = []
    for k in comp.kernels:
        if k.path != "sm90-register-scan":
            continue
        ring = k.launch["ring"]
        refill = k.cost["counts"].get("ring.refill_bytes", 0)
        if ring["depth"] == 1:     # the stage's bytes (its tiles, without their 1 KB padding)
            slack = 1024 * len(ring["tma_loads"])
            assert ring["stage_bytes"] - slack < refill <= ring["stage_bytes"], (k.name, refill)
        else:
            assert refill == 0, (k.name, ring, refill)
        assert (k.cost["estimate"]["terms_us"]["ring_refill"] > 0) == (refill > 0)
        depths.append(ring["depth"])
    assert sorted(depths) == [1, 2]


@pytest.fixture(scope="module")
def kda_fwd_cost():
    return Compilation("kda_fwd", OPTS, "sm_90a", lower=DEFAULT_LOWERING).run("cost")


def test_kda_fwd_kernels_have_a_report(kda_fwd_cost):
    kernels = {k.name: k for k in kda_fwd_cost.kernels}
    assert len(kernels) == 3     # chunk, state (the recurrence), out
    chunk, scan = kernels["kda_fwd__k0_scan0"].cost, kernels["kda_fwd__k1_scan1"].cost
    assert chunk["unit"] == "CTA" and scan["unit"] == "chunk step"
    for rep in (chunk, scan):
        c = rep["counts"]
        assert c["wgmma"] > 0 and c["wgmma.wait"] > 0
        assert c["mbarrier.wait"] == 1                   # the ring's 'full' barrier, once
        assert rep["producer"]["tma.load"] > 0
        assert rep["estimate"]["is_estimate"] and rep["estimate"]["us"] > 0
    assert "unknown_trip_loops" not in scan
    assert chunk["counts"]["bar.sync"] > 0
    # the register-resident state scan: its step's only barriers and shared stores stage the
    # checkpoint S_c for its TMA store (two named barriers, S's K·64/128 registers per thread,
    # one copy per 32-column panel of the CTA's 64 value columns)
    K = OPTS["head_k_dim"]
    assert scan["counts"]["bar.sync"] == 2 and scan["counts"]["st.shared"] == K * 64 // 128
    assert scan["counts"]["tma.store"] == 2
    # the state scan loads the initial state and stores the final one outside the chunk loop
    assert scan["once_per_cta"]["st.global"] > 0
    text = kda_fwd_cost.output("cost")
    assert "per chunk step" in text and "ESTIMATE" in text and "not a measurement" in text


def test_show_prints_the_cost_stage():
    result = CliRunner().invoke(main, ["show", "gdn_fwd", "--stage", "cost", "--arch", "sm_90a",
                                       "--option", "head_k_dim=64", "--option", "head_v_dim=64"])
    assert result.exit_code == 0, result.output
    assert result.output.count("// ----- kernel ") == 3
    assert "global_rounds" in result.output and "per chunk step" in result.output


def test_the_report_is_in_the_manifest_of_an_emitted_bundle(tmp_path):
    from kdagen.bundle_writer import write_bundle
    from kdagen.runtime.bundle import read_manifest
    write_bundle(tmp_path, [("gdn_fwd", OPTS)], ["sm_90a"], lower_options=DEFAULT_LOWERING,
                 pipeline="chip", assemble=False)
    entries = json.loads((tmp_path / "manifest.json").read_text())["kernels"]
    assert entries
    for e in entries:
        assert e["cost"]["unit"] in ("chunk step", "CTA")
        assert e["cost"]["counts"] and e["cost"]["estimate"]["is_estimate"] is True
    assert [k.cost for k in read_manifest(tmp_path).kernels] == [e["cost"] for e in entries]


def test_counting_leaves_the_ptx_byte_identical():
    target = get_target("sm_90a")
    lower = LowerOptions(**{k: v for k, v in DEFAULT_LOWERING.items() if k != "pipeline"})
    ptx = {}
    for count in (True, False):
        module = build_module("kda_fwd", OPTS, pipeline="chip", chip="sm_90a")
        kernels = lower_program(module, target, options=lower, cost=count)
        assert all((k.cost is not None) == count for k in kernels)
        ptx[count] = [lower_to_ptx(k.module, target) for k in kernels]
    assert ptx[True] == ptx[False]


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("vector_source", [False, True])
def test_batched_element_loop_counts_one_round_per_batch(batch, vector_source):
    """materialize of a [64, 128] tile read from global memory on 128 threads: 64 elements per
    thread, taken 4 consecutive at a time (tiles.VEC: one 16-byte shared store per group),
    max(1, batch / 4) groups loaded before any is stored, so 64 / (4 * groups) iterations and
    global rounds. A source with vector reads (FnRef.vec) loads a group with one 16-byte load,
    any other element by element (the same 64 loads as before the groups)."""
    counter = CostCounter()
    b = GpuModuleBuilder("mat")
    with b.kernel("mat", [Param("x", "ptr", "f32"), Param("y", "ptr", "f32")], (128, 1, 1)) as p:
        smem_mod.declare_dynamic_smem(b)
        from kdagen._mlir import llvm
        sm = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
        with B.use(MlirBackend(cost=counter)):
            th = T_.Threads(IntVal(thread_idx("x")), 128, batch)
            vec = ((lambda idx, n: B.load_vec(p["x"], idx[0] * 128 + idx[1], n))
                   if vector_source else None)
            src = T_.FnRef((64, 128), lambda idx: B.load(p["x"], idx[0] * 128 + idx[1]),
                           vec=vec)
            dst = T_.BufRef(T_.Scratch(sm, "smem"), 0, (64, 128), (128, 1))
            T_.materialize(th, src, dst)
    b.verify()
    c = counter.get("consumer", "kernel")
    groups = max(1, batch // T_.VEC)
    assert c["ld.global"] == (16 if vector_source else 64) and c["st.shared"] == 16
    assert c["global_rounds"] == 16 // groups and c["loop_iters"] == 16 // groups


def test_the_report_breaks_the_counts_down_by_program_op(kda_fwd_cost):
    """Each chunk kernel's report names the ops its consumer instructions come from; the
    per-op counts add up to no more than the kernel's (events outside any op, such as the
    ring waits, are not attributed), and the decay product with its exact diagonal blocks
    (elementwise exponentials) is where most of the prologue's ex2 go."""
    kernels = {k.name: k for k in kda_fwd_cost.kernels}
    rep = kernels["kda_fwd__k0_scan0"].cost
    rows = rep["by_op"]
    assert rows and len(rows) <= cost_model.BY_OP_TOP
    assert [r["instructions"] for r in rows] == sorted((r["instructions"] for r in rows),
                                                       reverse=True)
    for key in ("ld.shared", "ex2", "alu.f32"):
        assert sum(r["counts"].get(key, 0) for r in rows) <= rep["counts"][key] + 1e-6
    ex2 = {r["op"]: r["counts"].get("ex2", 0) for r in rows}
    top = max(ex2, key=ex2.get)
    assert top.startswith("decay_dot"), ex2
    assert ex2[top] > rep["counts"]["ex2"] / 2
    assert "where the instructions go" in kda_fwd_cost.output("cost")
    # the global bytes by op add up to the kernel's (every global access is inside an op)
    assert sum(r["counts"].get("bytes.global", 0) for r in rep["by_op"]) <= \
        rep["counts"]["bytes.global"] + 1e-6
    assert "bytes.global" in kda_fwd_cost.output("cost").split("where the instructions go")[1]


@pytest.mark.parametrize("vec_loops,strided", [("all", 64), ("capable", 0)])
def test_grouped_element_reads_that_are_not_vector_accesses_are_reported(vec_loops, strided):
    """A loop that takes 4 elements per thread but reads a transposed operand element by
    element puts a warp's reads 16 bytes apart (bank conflicts in shared memory): the report
    counts them (``strided.smem``, 64 per thread at 128 threads for [64, 128]); under
    vector_loops="capable" the loop stays one element per thread and there are none."""
    counter = CostCounter()
    b = GpuModuleBuilder("mat")
    with b.kernel("mat", [Param("x", "ptr", "f32")], (128, 1, 1)):
        smem_mod.declare_dynamic_smem(b)
        from kdagen._mlir import llvm
        sm = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
        with B.use(MlirBackend(cost=counter)):
            th = T_.Threads(IntVal(thread_idx("x")), 128, 4, vec_loops=vec_loops)
            src = T_.transpose(T_.BufRef(T_.Scratch(sm, "smem"), 0, (128, 64), (68, 1)))
            dst = T_.BufRef(T_.Scratch(sm, "smem"), 128 * 68, (64, 128), (132, 1))
            T_.materialize(th, T_.unary("neg", src, {}), dst)
    b.verify()
    c = counter.get("consumer", "kernel")
    assert c.get("strided.smem", 0) == strided and c["ld.shared"] == 64


def test_global_bytes_count_access_widths_and_scale_to_the_cta():
    """bytes.global tallies what each global load and store moves (a vector access its whole
    width; shared accesses nothing), and a chunk-parallel kernel's report scales thread 0's
    bytes to its consumer threads: the CTA's LDG/STG traffic between L1 and L2. On the H100
    (ncu source counters, kda_bwd B1_T8k_H16) the sectors the dq and dk kernels' accesses
    ideally take were 433 and 1544 KiB per CTA, against 438 and 1586 from this count
    (bench/results/h100_stop50_ncu_source_kda_bwd_k{2,4}.csv.xz)."""
    counter = CostCounter()
    counter.load("global", 2, nbytes=16)
    counter.store("global", 1, nbytes=2)
    counter.load("shared", 3, nbytes=16)
    counts = counter.get("consumer", "kernel")
    assert counts["bytes.global"] == 2 * 16 + 2
    report = cost_model.kernel_report(counter, serial=False, warps=4)
    assert report["global_bytes_per_cta"] == (2 * 16 + 2) * 4 * 32
    # an annotation, not an instruction: the issue fit does not count it
    assert report["throughput"]["instructions"] == 2 + 1 + 3
    assert "global traffic (LDG/STG, L1<->L2)" in cost_model.format_report("k", report)


def test_cost_stage_closes_with_the_programs_hbm_bytes_per_token():
    """The cost stage sums the bytes each kernel moves per token (kda-partition's count, the
    manifest's hbm_bytes_per_token) into one line: the program's intermediate traffic, which
    bounds GDN's forward (its overlapped prologue and scan run near HBM bandwidth)."""
    import re
    comp = Compilation("gdn_fwd", {}, "sm_90a", lower=dict(DEFAULT_LOWERING)).run("cost")
    per = {k.name.rsplit("__", 1)[-1]: k.launch["hbm_bytes_per_token"] for k in comp.kernels}
    assert len(per) == 3 and all(v > 0 for v in per.values())
    last = comp.output("cost").rstrip().splitlines()[-1]
    m = re.match(r"// HBM bytes per token and value head .*: ([\d.]+) \((.*)\)$", last)
    assert m, last
    assert float(m.group(1)) == pytest.approx(sum(per.values()), abs=0.01)
    listed = dict(item.rsplit(" ", 1) for item in m.group(2).split(", "))
    assert {k: float(v) for k, v in listed.items()} == pytest.approx(per)
