"""Emitter test kernels lower to PTX and assemble on every chip they are valid on.

Checks, per chip: ptxas accepts the module, the intended instructions are in the PTX, no
libdevice (``__nv_``) calls, zero spills (and no ignored setmaxnreg); arch emitters refuse the
wrong chip with the actionable message of `Target.require`.
"""
import re

import pytest

from conftest import requires_ptxas
from tools import testkernels as tk
from kdagen.codegen.common.kernel import GpuModuleBuilder
from kdagen.target import TARGETS, get_target
from kdagen.codegen.to_ptx import lower_to_ptx

CHIPS = list(TARGETS)

COMMON = ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
          "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
          "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
          "cp.async.cg.shared.global", "cp.async.wait_group", "shfl.sync.bfly.b32", "shfl.sync.up.b32",
          "shfl.sync.idx.b32",
          "cvt.rn.bf16x2.f32", "bar.sync", "ex2.approx",
          "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes",
          "cp.async.bulk.tensor.3d", "cp.async.bulk.tensor.4d", "mbarrier.try_wait.parity",
          "mbarrier.arrive.expect_tx", "mbarrier.init", "prefetch.tensormap"]
NATIVE = {
    "sm_90a": ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "wgmma.fence.sync.aligned",
               "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
               "setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32",
               "fence.proxy.async.shared::cta", "mbarrier.arrive.shared"],
    "sm_100a": ["tcgen05.alloc", "tcgen05.mma.cta_group::1.kind::f16", "tcgen05.commit",
                "tcgen05.ld.sync.aligned.32x32b.x64.b32", "tcgen05.wait::ld", "tcgen05.dealloc",
                "tcgen05.relinquish_alloc_permit"],
    "sm_120a": [],
}


@pytest.fixture(scope="module")
def suites():
    from kdagen.codegen.ptxas import assemble
    out = {}
    for chip in CHIPS:
        target = get_target(chip)
        builder = GpuModuleBuilder()
        contracts = tk.build_suite(builder, target)
        builder.verify()
        ptx = lower_to_ptx(builder.module, target)
        out[chip] = (contracts, ptx, assemble(ptx, chip))
    return out


@requires_ptxas
@pytest.mark.parametrize("chip", CHIPS)
def test_suite_assembles_without_spills(suites, chip):
    contracts, ptx, result = suites[chip]
    assert result.ok, result.log[-3000:]
    assert set(result.resources) == {c.kernel for c in contracts}
    for name, res in result.resources.items():
        assert res.spills == 0 and res.stack_bytes == 0, f"{name} spills on {chip}: {res}"
        assert res.registers <= 255
    assert "C7508" not in result.log, "ptxas ignored a setmaxnreg"
    assert "__nv_" not in ptx, "libdevice call in the PTX"
    for c in contracts:
        assert chip in c.chips
        assert c.dynamic_smem_bytes <= get_target(chip).smem_per_block


def test_wgmma_takes_a_16_bit_a_operand_from_registers(suites):
    """The chained test kernel's second product reads A from four packed registers (the first
    product's accumulators, rounded to bf16), B by descriptor: the form a bf16 register scan
    needs (kdagen.codegen.sm90.wgmma.wgmma_half_rs)."""
    _, ptx, _ = suites["sm_90a"]
    rs = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 "
                    r"\{[^}]*\}, \{(%r\d+), (%r\d+), (%r\d+), (%r\d+)\}, %rd\d+, p, 1, 1, 0;",
                    ptx)
    assert len(rs) == 4, rs          # one per k16 block of the 64-deep second product
    assert "cvt.rn.bf16x2.f32" in ptx


@pytest.mark.parametrize("chip", CHIPS)
def test_intended_instructions_present(suites, chip):
    _, ptx, _ = suites[chip]
    for instr in COMMON + NATIVE[chip]:
        assert instr in ptx, f"{instr} missing from the {chip} PTX"
    if chip != "sm_90a":
        assert "wgmma" not in ptx
    if chip != "sm_100a":
        assert "tcgen05" not in ptx


def test_kernel_pieces_are_where_expected(suites):
    _, ptx, _ = suites["sm_90a"]
    bodies = dict(re.findall(r"\.entry (\w+)\((.*?)\n}\n", ptx, re.S))
    chain = next(v for k, v in bodies.items() if k.startswith("emt_mma_chain"))
    # C→A / C→Bᵀ reuse: packs in registers, no shared-memory store between the two matmuls
    assert "cvt.rn.bf16x2.f32" in chain and "st.shared" not in chain
    pipe = next(v for k, v in bodies.items() if k.startswith("emt_ws_tma_wgmma"))
    assert pipe.index("setmaxnreg.dec") < pipe.index("cp.async.bulk.tensor")
    assert "mbarrier.try_wait.parity" in pipe and "wgmma.mma_async" in pipe
    rr = next(v for k, v in bodies.items() if k.startswith("emt_row_reduce"))
    assert rr.count("shfl.sync.bfly") >= 8


def test_contracts_describe_launches(suites):
    contracts, _, _ = suites["sm_90a"]
    names = [c.kernel for c in contracts]
    assert len(names) == len(set(names))
    tma = next(c for c in contracts if c.kernel.startswith("emt_tma_load_r4"))
    args = tma.extra["tensor_map"].encode_args((2, 100, 4, 128))
    assert args["globalDim"] == [128, 4, 100, 2]
    assert args["globalStrides"] == [256, 1024, 102400]
    assert args["boxDim"] == [64, 1, 64, 1]
    assert args["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_128B"
    assert tma.dynamic_smem_bytes >= 64 * 128 * 2


# ---- arch emitters refuse the wrong chip -------------------------------------------------------

@pytest.mark.parametrize("builder_fn,chip,what", [
    (lambda b, t: tk.build_wgmma_tile(b, t), "sm_120a", "wgmma is only available on sm_90a, not sm_120a"),
    (lambda b, t: tk.build_wgmma_tile(b, t), "sm_100a", "wgmma is only available on sm_90a, not sm_100a"),
    (lambda b, t: tk.build_tcgen05_tile(b, t), "sm_90a", "tcgen05 is only available on sm_100a, not sm_90a"),
    (lambda b, t: tk.build_tcgen05_tile(b, t), "sm_120a", "tcgen05 is only available on sm_100a, not sm_120a"),
    (lambda b, t: tk.build_ws_tma_wgmma_pipeline(b, t), "sm_120a", "only available on sm_90a"),
])
def test_arch_emitters_reject_wrong_chip(builder_fn, chip, what):
    with pytest.raises(ValueError, match=re.escape(what) + ".*portable path"):
        builder_fn(GpuModuleBuilder(), get_target(chip))


def test_unknown_chip_for_setmaxnreg_and_bad_counts():
    from dataclasses import replace
    from kdagen.codegen.sm90 import regalloc
    builder = GpuModuleBuilder()
    with builder.kernel("k", [], (128, 1, 1)):
        with pytest.raises(ValueError, match="multiple of 8"):
            regalloc.claim_registers(get_target("sm_90a"), 100)
        fake = replace(get_target("sm_90a"), chip="sm_89", has_setmaxnreg=False)
        with pytest.raises(ValueError, match="setmaxnreg is only available"):
            regalloc.release_registers(fake, 40)


def test_sm120_plans_the_portable_path():
    from tools.pipeline_plan import plan_pipeline, tensor_core_path
    assert tensor_core_path(get_target("sm_120a")) == "mma.sync"
    assert tensor_core_path(get_target("sm_90a")) == "wgmma"
    assert tensor_core_path(get_target("sm_100a")) == "tcgen05"
    stage = 2 * 64 * 128 * 2            # a [64,128] bf16 k and v tile per stage
    p120 = plan_pipeline(get_target("sm_120a"), stage, fixed_bytes=16 * 1024)
    p90 = plan_pipeline(get_target("sm_90a"), stage, fixed_bytes=16 * 1024)
    assert p120.stages < p90.stages and p120.smem_bytes <= 99 * 1024
    assert (p120.path, p120.copies) == ("mma.sync", "tma")
    with pytest.raises(ValueError, match="split the value dimension"):
        plan_pipeline(get_target("sm_120a"), 120 * 1024)


def test_smem_allocator_enforces_the_chip_budget():
    from kdagen.codegen.common.layouts import SmemLayout
    from kdagen.codegen.common.smem import SmemAllocator
    builder = GpuModuleBuilder()
    with builder.kernel("k", [], (128, 1, 1)):
        smem = SmemAllocator(builder, get_target("sm_120a").smem_per_block)
        smem.tile(SmemLayout(128, 128, 2, 128))      # 32 KB
        smem.tile(SmemLayout(128, 128, 2, 128))      # 64 KB
        smem.tile(SmemLayout(64, 128, 2, 128))       # 80 KB
        with pytest.raises(ValueError, match="exceed the target"):
            smem.tile(SmemLayout(128, 128, 2, 128))


def test_gpu_manifest_references_run_on_cpu(tmp_path):
    """The manifest the GPU check consumes: every reference statement runs (on CPU tensors) and
    yields each output with its declared shape; tensor-map args carry encode arguments."""
    import json
    from tools.emitter_check import compare, make_tensors, reference
    manifest = tk.emit_suite(str(tmp_path), ("sm_90a",))
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert (tmp_path / "sm_90a.ptx").exists() and on_disk == json.loads(json.dumps(manifest))
    for entry in manifest["sm_90a"]["kernels"]:
        tensors, outputs = make_tensors(entry, device="cpu")
        ref = reference(entry, tensors, outputs)
        assert outputs and set(ref) == set(outputs)
        for name in outputs:
            assert tuple(ref[name].shape) == tuple(tensors[name].shape), (entry["kernel"], name)
        assert compare(entry, ref, ref) == {o: 0.0 for o in outputs}
        assert all(e == float("inf") for e in compare(entry, {o: tensors[o] for o in outputs}, ref).values())
        for arg in entry["args"]:
            if arg["kind"] == "tensormap":
                assert arg["encode"]["boxDim"] == list(reversed(arg["box"]))
        assert entry["ptxas"]["spills"] == 0


def test_ptx_memo_returns_the_lowering_of_the_same_module(monkeypatch):
    """lower_to_ptx memoises by (pipeline, module text): a second lowering of an equal module
    is the memo's PTX without running the pipeline, the same text as a real lowering
    (KDAGEN_PTX_MEMO=0); another target is another entry."""
    from kdagen.codegen import to_ptx
    runs = []
    real = to_ptx.passmanager.PassManager.parse

    def counting(text):
        runs.append(text)
        return real(text)
    monkeypatch.setattr(to_ptx.passmanager.PassManager, "parse", staticmethod(counting))
    to_ptx._MEMO.clear()
    target = get_target("sm_120a")
    builder = GpuModuleBuilder()
    tk.build_suite(builder, target)
    first = lower_to_ptx(builder.module, target)
    again = lower_to_ptx(builder.module, target)
    assert again == first and len(runs) == 1
    monkeypatch.setenv("KDAGEN_PTX_MEMO", "0")
    assert lower_to_ptx(builder.module, target) == first and len(runs) == 2
    monkeypatch.delenv("KDAGEN_PTX_MEMO")
    other = get_target("sm_100a")
    builder2 = GpuModuleBuilder()
    tk.build_suite(builder2, other)
    lower_to_ptx(builder2.module, other)
    assert len(runs) == 3 and len(to_ptx._MEMO) == 2
