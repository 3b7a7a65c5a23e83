"""Lowering of kda programs to GPU kernels: structure, calling convention, and PTX that
assembles with ptxas for sm_90a / sm_100a / sm_120a (CPU only; numerics in
test_lowering_sim.py)."""
from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest

from kdagen._mlir import ir
from kdagen.codegen.lower.kernel import LowerOptions, lower_program
from kdagen.codegen.lower.plan import group_kernels
from kdagen.codegen.lower.storage import plan_storage
from kdagen.codegen.lower.program import read_program
from kdagen.target import get_target
from kdagen.codegen.to_ptx import lower_to_ptx
from kdagen.ir.programs import build_program
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.pipeline import run_pipeline

CHIPS = ("sm_90a", "sm_100a", "sm_120a")
REPORT: list = []


@functools.lru_cache(maxsize=None)
def _module_text(program: str, opts: tuple) -> str:
    m = build_program(program, **dict(opts))
    with m.context, ir.Location.unknown():
        run_pipeline(m, parse_pipeline("kda-stable-reassociate"))
    return str(m)


def stable_module(program: str, **opts):
    """build_program + kda-stable-reassociate (a fresh module each call, cached text)."""
    from kdagen.ir.dialect import parse_module
    return parse_module(_module_text(program, tuple(sorted(opts.items()))))


def _ptxas_or_skip():
    from kdagen.codegen import ptxas
    try:
        return ptxas.find_ptxas()
    except ptxas.PtxasNotFound:
        pytest.skip("ptxas not available")


# Each configuration covers several features at once (K/V, gate, GVA, varlen).
CONFIGS = {
    "kda_K64_softplus": ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus")),
    "kda_K128_lb_gva2_varlen": ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound",
                                                 gva_ratio=2, varlen=True)),
    "gdn_K64_lb_gva2_varlen": ("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound",
                                                gva_ratio=2, varlen=True)),
    "gdn_K128_softplus": ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")),
}


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_forward_kernels_assemble(config, chip):
    from kdagen.codegen import ptxas
    exe = _ptxas_or_skip()
    program, opts = CONFIGS[config]
    kernels = lower_program(stable_module(program, **opts), get_target(chip))
    assert [k.kind for k in kernels] == ["tile"], "a forward program is one scan kernel"
    for k in kernels:
        k.builder.verify()
        ptx = lower_to_ptx(k.module, get_target(chip))
        assert f".target {chip}" in ptx
        assert "__nv_" not in ptx, "libdevice call in the PTX"
        assert re.search(rf"\.entry {k.name}\(", ptx)
        res = ptxas.assemble(ptx, chip, exe)
        assert res.ok, res.log
        r = res.resources[k.name]
        REPORT.append((config, chip, k.name, k.storage, k.launch["tile_bytes"], r.registers,
                       r.spill_stores + r.spill_loads))
        assert r.registers <= 255
        if k.storage in ("smem", "hybrid"):
            assert k.launch["dynamic_shared_memory"] <= get_target(chip).smem_per_block - 1024


@pytest.mark.parametrize("chip", CHIPS)
def test_tensor_core_path_assembles(chip):
    from kdagen.codegen import ptxas
    exe = _ptxas_or_skip()
    m = stable_module("kda_fwd", head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2,
                      varlen=True)
    (k,) = lower_program(m, get_target(chip), options=LowerOptions(dot="bf16x3"))
    ptx = lower_to_ptx(k.module, get_target(chip))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "__nv_" not in ptx
    res = ptxas.assemble(ptx, chip, exe)
    assert res.ok, res.log
    r = res.resources[k.name]
    REPORT.append(("kda_K128_lb_gva2_varlen+mma", chip, k.name, k.storage, k.launch["tile_bytes"],
                   r.registers, r.spill_stores + r.spill_loads))


@pytest.mark.parametrize("chip", CHIPS)
def test_full_pipeline_lowers_and_assembles(chip):
    """The chip's pass pipeline (stable-reassociate, partition, warp-specialize): a
    chunk-parallel kernel (grid z over chunks) and a state kernel, both assemble."""
    from kdagen.codegen import ptxas
    from kdagen.passes.pipelines import pipeline_for
    exe = _ptxas_or_skip()
    m = build_program("kda_fwd", head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2,
                      varlen=True)
    with m.context, ir.Location.unknown():
        run_pipeline(m, pipeline_for(chip))
    kernels = lower_program(m, get_target(chip), options=LowerOptions(dot="bf16x3"))
    assert [k.launch["grid"][2] for k in kernels] == ["max_chunks", "1", "max_chunks"]
    for k in kernels:
        ptx = lower_to_ptx(k.module, get_target(chip))
        assert "__nv_" not in ptx
        res = ptxas.assemble(ptx, chip, exe)
        assert res.ok, res.log
        assert k.launch["dynamic_shared_memory"] <= get_target(chip).smem_per_block - 1024
        r = res.resources[k.name]
        REPORT.append((f"pipeline kda_K128 {k.name[-5:]}", chip, k.name, k.storage,
                       k.launch["tile_bytes"], r.registers, r.spill_stores + r.spill_loads))


def test_report_registers(capsys):
    """Print the register/spill table of the kernels assembled above (pytest -s shows it)."""
    if not REPORT:
        pytest.skip("no kernels assembled in this session")
    with capsys.disabled():
        print("\nconfig                     chip     storage  tile_bytes  regs  spill_bytes")
        for config, chip, _, storage, nbytes, regs, spills in REPORT:
            print(f"{config:26s} {chip:8s} {storage:8s} {nbytes:10d}  {regs:4d}  {spills:5d}")


def test_ptx_is_deterministic():
    opts = dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", gva_ratio=2, varlen=True)
    target = get_target("sm_90a")
    a = [lower_to_ptx(k.module, target) for k in lower_program(stable_module("kda_fwd", **opts), target)]
    b = [lower_to_ptx(k.module, target) for k in lower_program(stable_module("kda_fwd", **opts), target)]
    assert a == b


def test_calling_convention_forward_varlen():
    m = stable_module("kda_fwd", head_k_dim=64, head_v_dim=64, varlen=True, gva_ratio=2)
    (k,) = lower_program(m, get_target("sm_90a"))
    names = [(p.name, p.kind, p.elem) for p in k.params]
    assert names == [
        ("q", "ptr", "bf16"), ("k", "ptr", "bf16"), ("v", "ptr", "bf16"), ("g_raw", "ptr", "bf16"),
        ("beta_raw", "ptr", "bf16"), ("A_log", "ptr", "f32"), ("dt_bias", "ptr", "f32"),
        ("initial_state", "ptr", "f32"), ("cu_seqlens", "ptr", "i64"), ("o", "ptr", "bf16"),
        ("final_state", "ptr", "f32"), ("T", "i32", None), ("N", "i32", None), ("HV", "i32", None),
        ("scale", "f32", None)]
    assert k.launch["grid"] == ["HV", "N", "1"] and k.launch["block"] == [128, 1, 1]
    assert k.storage == "smem" and k.launch["dynamic_shared_memory"] == k.launch["tile_bytes"]


def test_storage_falls_back_to_hybrid_and_global_scratch():
    m = stable_module("kda_fwd", head_k_dim=128, head_v_dim=128)
    (k90,) = lower_program(m, get_target("sm_90a"))
    (k120,) = lower_program(m, get_target("sm_120a"))
    (kg,) = lower_program(m, get_target("sm_90a"), options=LowerOptions(storage="global"))
    for k, chip in ((k90, "sm_90a"), (k120, "sm_120a")):
        # too big for shared memory: the most-read buffers there, the rest in the scratch
        assert k.storage == "hybrid" and k.params[-1].name == "scratch"
        assert 0 < k.launch["dynamic_shared_memory"] <= get_target(chip).smem_per_block
        assert k.launch["scratch_bytes_per_cta"] > 0
    assert k120.launch["scratch_bytes_per_cta"] > k90.launch["scratch_bytes_per_cta"]
    assert kg.storage == "global" and kg.launch["dynamic_shared_memory"] == 0
    # the global pool aligns every buffer to whole 128-byte lines
    scratch = kg.launch["scratch_bytes_per_cta"]
    assert scratch % 128 == 0 and scratch >= kg.launch["tile_bytes"] - 64
    assert scratch <= kg.launch["tile_bytes"] + 128 * (kg.info["buffers"] + 1)
    with pytest.raises(ValueError, match="shared-memory"):
        lower_program(m, get_target("sm_120a"), options=LowerOptions(storage="smem"))


def test_storage_plan_is_consistent():
    """Buffers live at the same time never overlap; every materialised value has a buffer."""
    m = stable_module("kda_fwd", head_k_dim=64, head_v_dim=64, gate="lower_bound")
    p = read_program(m)
    (g,) = group_kernels(p)
    plan = plan_storage(p, g)
    bufs = list({id(b): b for b in plan.buffers.values()}.values())
    for i, a in enumerate(bufs):
        assert a.offset >= 0 and a.offset % 16 == 0
        assert a.offset + a.nbytes <= plan.total_bytes
        for b in bufs[i + 1:]:
            live = not (a.end < b.start or b.end < a.start)
            disjoint = a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
            assert not live or disjoint, (a, b)
    for v, mode in plan.modes.items():
        if mode in ("buffer", "carried"):
            assert v in plan.buffers
    # matrix-op results are buffers, element-wise chains stay lazy
    assert "lazy" in plan.modes.values() and "view" in plan.modes.values()


def test_backward_partition_and_assembly():
    from kdagen.codegen import ptxas
    exe = _ptxas_or_skip()
    opts = dict(head_k_dim=64, head_v_dim=64, gva_ratio=2, varlen=True)
    try:
        m = stable_module("kda_bwd", **opts)
    except Exception as exc:  # the backward derivation is another helper's work in progress
        pytest.skip(f"kda_bwd does not build: {exc}")
    target = get_target("sm_90a")
    kernels = lower_program(m, target)
    kinds = [(k.kind, k.name.split("__")[1]) for k in kernels]
    # recompute scan, reverse scan, then the global reductions (GVA: dq, dk; per-head params)
    assert kinds[0][0] == "tile" and kinds[1][0] == "tile"
    assert {n for kind, n in kinds if kind == "global"} >= {"k2_sum_head_groups_dq",
                                                            "k3_sum_head_groups_dk"}
    ws = {p.name for p in kernels[1].params}
    assert "S_chunks" in ws or any("chunks" in n for n in ws)
    for k in kernels:
        ptx = lower_to_ptx(k.module, target)
        assert "__nv_" not in ptx
        res = ptxas.assemble(ptx, "sm_90a", exe)
        assert res.ok, res.log
        REPORT.append(("kda_bwd_K64_gva2_varlen", "sm_90a", k.name, k.storage,
                       k.launch.get("tile_bytes", 0), res.resources[k.name].registers,
                       res.resources[k.name].spill_stores + res.resources[k.name].spill_loads))


def test_unsupported_op_is_reported():
    from kdagen.codegen.lower.plan import LoweringError
    from kdagen.codegen.lower.program import Block, Node, Program
    body = Block([], [])
    n = Node("kda.mystery", [], [], {}, body)
    body.nodes.append(n)
    p = Program("x", {"chunk_size": 64}, [], [], body, [n])
    with pytest.raises(LoweringError, match="mystery"):
        group_kernels(p)


def test_launcher_and_gpu_check_import_without_mlir():
    code = ("import sys; sys.modules['numba_cuda_mlir'] = None\n"
            "import kdagen.runtime.launch, tools.gpu_check\n"
            "from kdagen.runtime.launch import eval_rule\n"
            "assert eval_rule('ceil_div(tokens * H * 64, 256)', dict(tokens=100, H=2)) == 50\n"
            "assert eval_rule('HV', dict(HV=7)) == 7\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
