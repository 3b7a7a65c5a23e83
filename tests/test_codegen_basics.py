"""Codegen building blocks: targets, the ptxas report parser, arch checks, the lowering."""
import pytest

from kdagen.codegen.ptxas import parse_resource_report
from kdagen.target import TARGETS, chips_with, get_target, parse_arch_list

SAMPLE_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kern_a' for 'sm_90a'
ptxas info    : Function properties for kern_a
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 33792 bytes smem
ptxas info    : Compiling entry function 'kern_b' for 'sm_90a'
ptxas info    : Function properties for kern_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers
"""


def test_parse_resource_report():
    res = parse_resource_report(SAMPLE_LOG)
    assert set(res) == {"kern_a", "kern_b"}
    a, b = res["kern_a"], res["kern_b"]
    assert (a.registers, a.spill_stores, a.spill_loads, a.shared_bytes, a.stack_bytes) == (168, 8, 12, 33792, 16)
    assert a.spills == 20
    assert (b.registers, b.spills, b.shared_bytes) == (26, 0, 0)


def test_targets_and_arch_lists():
    assert [t.chip for t in parse_arch_list("sm_90a, sm_120a,sm_90a")] == ["sm_90a", "sm_120a"]
    assert [t.chip for t in parse_arch_list("all")] == list(TARGETS)
    assert get_target("sm_120a").smem_per_block < get_target("sm_90a").smem_per_block
    with pytest.raises(ValueError, match="unknown chip 'sm_80'"):
        get_target("sm_80")


def test_require_capability_message():
    get_target("sm_90a").require("has_wgmma", "wgmma")
    with pytest.raises(ValueError, match="wgmma is only available on sm_90a, not sm_120a.*portable"):
        get_target("sm_120a").require("has_wgmma", "wgmma")
    assert chips_with("has_tma") == tuple(TARGETS) and chips_with("has_tcgen05") == ("sm_100a",)


def test_gate_cumsum_lowers_for_every_chip():
    from kdagen.codegen.common.kernel import GpuModuleBuilder
    from kdagen.codegen.kernels.gate_cumsum import GateCumsumSpec, build_gate_cumsum
    from kdagen.codegen.to_ptx import lower_to_ptx
    builder = GpuModuleBuilder()
    spec = GateCumsumSpec(head_dim=64)
    build_gate_cumsum(builder, spec)
    builder.verify()
    for target in TARGETS.values():
        ptx = lower_to_ptx(builder.module, target)
        assert f".target {target.chip}" in ptx
        assert f".visible .entry {spec.name}(" in ptx
        assert "ex2.approx.f32" in ptx and "lg2.approx.f32" in ptx
