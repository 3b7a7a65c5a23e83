"""LowerOptions.chunk_ctas_per_sm: a chunk-parallel kernel of the native sm_90a path planned for
two resident CTAs per SM. Each such kernel then fits half an SM's shared memory with a one-stage
ring, is launched for two CTAs (launch bounds, register split), takes two consumer warpgroups
for ``chunk_warpgroups="auto"``; the serial scans are untouched; the tuning table's entry
(GDN's forward output kernel) changes that kernel's plan only (the table applies before
planning); a bad value is refused
with the values allowed; the forward assembles without spills."""
from __future__ import annotations

import pytest

from kdagen.codegen.lower import sm90_native, tuning
from kdagen.codegen.lower.options import LowerOptions
from kdagen.codegen.lower.plan import LoweringError
from kdagen.target import get_target

from conftest import requires_ptxas

SM90 = get_target("sm_90a")


def _compilation(program: str, **lower):
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    comp = Compilation(program, dict(head_k_dim=128, head_v_dim=128), "sm_90a",
                       lower=dict(DEFAULT_LOWERING, **lower))
    comp.run(until="gpu")
    return comp


def _by_label(comp):
    return {k.name.split("__")[-1]: k for k in comp.kernels}


def test_the_budget_splits_the_sm_and_refuses_other_counts():
    assert sm90_native.chunk_budget(1, SM90) is None
    half = sm90_native.chunk_budget(2, SM90)
    assert half == SM90.smem_per_sm // 2 - 1024
    assert sm90_native.ctas_per_sm(half, SM90) == 2
    with pytest.raises(LoweringError, match="chunk_ctas_per_sm=3.*1 or 2"):
        sm90_native.chunk_budget(3, SM90)


def test_auto_warpgroups_are_two_at_two_ctas():
    assert sm90_native.chunk_warpgroups("auto", "hybrid", 128, ctas=1) == 4
    assert sm90_native.chunk_warpgroups("auto", "hybrid", 128, ctas=2) == 2
    assert sm90_native.chunk_warpgroups(4, "hybrid", 128, ctas=2) == 4    # explicit wins


def test_gdn_forward_chunk_kernels_fit_two_ctas_and_the_scan_is_unchanged():
    one = _by_label(_compilation("gdn_fwd", tuned=False))
    two = _by_label(_compilation("gdn_fwd", chunk_ctas_per_sm=2, tuned=False))
    assert one.keys() == two.keys()
    for label, k in two.items():
        if k.launch.get("parallel_chunks"):
            assert k.launch["dynamic_shared_memory"] <= sm90_native.chunk_budget(2, SM90), label
            assert sm90_native.ctas_per_sm(k.launch["dynamic_shared_memory"], SM90) == 2
            assert one[label].launch["dynamic_shared_memory"] > k.launch["dynamic_shared_memory"]
            assert k.launch["ring"]["depth"] == 1
            assert k.launch["block"][0] == 3 * sm90_native.WG_THREADS   # 2 consumers + producer
        else:
            assert k.launch == one[label].launch, label


def test_the_tuning_entry_plans_gdn_forward_output_kernel_for_two_ctas():
    # the table's entry (measured on the H200): only k2 of gdn_fwd, the rest at one CTA
    assert any(e.program == "gdn_fwd" and ("chunk_ctas_per_sm", 2) in e.options
               for e in tuning.TUNED)
    # on the native path (the table's register-tile entry moves it off by default)
    kernels = _by_label(_compilation("gdn_fwd", register_tiles=False))
    assert kernels["k2_scan2"].launch["tuned"] == {"chunk_ctas_per_sm": 2}
    assert kernels["k2_scan2"].launch["dynamic_shared_memory"] <= \
        sm90_native.chunk_budget(2, SM90)
    assert kernels["k0_scan0"].launch["dynamic_shared_memory"] > \
        sm90_native.chunk_budget(2, SM90)


def test_the_option_parses_from_the_command_line():
    from kdagen.codegen.lower.options import parse_lower_option
    assert parse_lower_option("chunk_ctas_per_sm=2") == ("chunk_ctas_per_sm", 2)
    assert LowerOptions().chunk_ctas_per_sm == 1


@requires_ptxas
def test_kda_forward_at_two_ctas_assembles_without_spills():
    comp = _compilation("kda_fwd", chunk_ctas_per_sm=2)
    comp.run(until="cubin")
    for name, res in comp.assembled.items():
        assert res.ok, name
        assert all(r.spills == 0 for r in res.resources.values()), name
