"""Sets of wgmma staging tiles on the sm_90a native path (LowerOptions.staging_buffers,
sm90_native.dot_wgmma): with two, a product's K slices alternate between them and each slice
costs one barrier instead of two; "auto" takes two only where the kernel's tile buffers still
fit in shared memory; a product whose consumers hold 128 or more registers does not wait at a
barrier after its last slice (the matrix op ends at one), one with fewer keeps it."""
from __future__ import annotations

import re

import pytest

from kdagen.codegen.lower.kernel import LowerOptions, prepare
from kdagen.codegen.lower.plan import LoweringError
from kdagen.codegen.lower.program import read_program
from kdagen.driver import DEFAULT_LOWERING, Compilation
from kdagen.target import get_target

K128 = dict(head_k_dim=128, head_v_dim=128)


def _native(**extra):
    lower = {k: v for k, v in DEFAULT_LOWERING.items() if k != "pipeline"}
    return LowerOptions(**lower, **extra)


def _prepared(program: str, **extra) -> dict:
    module = Compilation(program, K128, "sm_90a").run_passes().module
    return {pk.name.split("__")[-1]: pk
            for pk in prepare(read_program(module), get_target("sm_90a"), "k", _native(**extra))
            if pk.plan is not None and hasattr(pk.emitter, "layout")}


def _lowered(program: str, **extra) -> dict:
    lower = dict(DEFAULT_LOWERING, **extra)
    comp = Compilation(program, K128, "sm_90a", lower=lower).run(until="gpu")
    return {k.name.split("__")[-1]: k for k in comp.kernels}


def test_two_sets_double_the_staging_of_kernels_with_sliced_products():
    one, two = _prepared("kda_fwd", staging_buffers=1), _prepared("kda_fwd", staging_buffers=2)
    for name, pk in one.items():
        lay1, lay2 = pk.emitter.layout, two[name].emitter.layout
        assert lay1.staging_sets == 1 and lay2.staging_sets == 2, name
        assert lay2.staging_bytes == 2 * lay1.staging_bytes > 0, name
        assert lay2.staging_offset + lay2.staging_bytes <= lay2.ring_offset, name


def test_two_sets_take_one_barrier_per_slice():
    one, two = _lowered("kda_fwd", staging_buffers=1), _lowered("kda_fwd", staging_buffers=2)
    k0_1, k0_2 = one["k0_scan0"].cost["counts"], two["k0_scan0"].cost["counts"]
    assert k0_2["wgmma"] == k0_1["wgmma"]              # the same products
    # one set waits at 2 barriers per slice but the last, two sets at one per slice
    assert k0_2["bar.sync"] < k0_1["bar.sync"]
    text = str(two["k0_scan0"].module)
    # each slice after the first waits for the previous slice's wgmma before its barrier
    waits = len(re.findall(r"wgmma\.wait\.group", text))
    commits = len(re.findall(r"wgmma\.commit\.group", text))
    assert commits > 0 and waits >= commits


def test_no_barrier_after_a_products_last_slice():
    """One set: 2 barriers per slice but the last (the staging tiles are freed by the barrier
    that ends the matrix op): a product of s slices waits at 2 s - 1 of its own."""
    k0 = _lowered("kda_fwd", staging_buffers=1)["k0_scan0"]
    by_op = {row["op"]: row["counts"] for row in k0.cost["by_op"]}
    dots = [c for op, c in by_op.items() if op.startswith("dot ") and c.get("wgmma")]
    assert dots
    for c in dots:
        slices = c["fence.proxy.async"]   # one per slice, before its wgmma
        assert slices >= 2, c
        # its own and the one that ends the op (kda_fwd's chunk kernel: no element-wise
        # write waits for a barrier before its products); 2 s + 1 before
        assert c["bar.sync"] == 2 * slices, c


def test_auto_takes_two_sets_only_where_the_buffers_stay_in_shared_memory():
    for program in ("kda_fwd", "kda_bwd"):
        one = _prepared(program, staging_buffers=1)
        two = _prepared(program, staging_buffers=2)
        auto = _prepared(program, staging_buffers="auto")
        for name, pk in auto.items():
            sets = pk.emitter.layout.staging_sets
            if two[name].storage == "smem":
                assert sets == 2 or one[name].emitter.layout.staging_sets == 1 \
                    and two[name].emitter.layout.staging_sets == 1, (program, name)
            else:
                assert sets == 1 and pk.storage == one[name].storage, (program, name)
                assert pk.plan.global_bytes == one[name].plan.global_bytes, (program, name)
        # the backward's dk kernel spills either way: it keeps one set
        if program == "kda_bwd":
            assert auto["k4_scan4"].emitter.layout.staging_sets == 1


@pytest.mark.parametrize("value", [0, 3, "double"])
def test_a_bad_value_is_named(value):
    with pytest.raises(LoweringError, match="staging_buffers"):
        _prepared("kda_fwd", staging_buffers=value)


def test_products_of_low_register_consumers_keep_the_last_barrier():
    """Four consumer warpgroups hold 96 registers each: there a product keeps the barrier
    after its last slice (without it the backward's dk kernel spilled 4-8 bytes)."""
    k4 = _lowered("kda_bwd", staging_buffers=1)["k4_scan4"]
    assert k4.launch["block"][0] == 5 * 128                # 4 consumer warpgroups + producer
    by_op = {row["op"]: row["counts"] for row in k4.cost["by_op"]}
    dots = [c for op, c in by_op.items() if op.startswith("dot ") and c.get("wgmma")]
    assert dots
    for c in dots:
        slices = c["fence.proxy.async"]
        assert slices >= 2, c
        assert c["bar.sync"] >= 2 * slices, c              # 2 per slice, the last included
