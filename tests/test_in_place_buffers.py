"""Element-wise results that share the buffer of an operand they read last, at the same index
(kdagen.codegen.lower.storage._share_in_place, LowerOptions.in_place): only such pairs share,
the lowering takes it only where it brings a kernel's tile buffers into shared memory with
nothing new re-evaluated, and the results are bitwise those of separate buffers (CPU
simulator, whose race checker sees every thread's reads and writes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kdagen.codegen.lower.kernel import LowerOptions, prepare
from kdagen.codegen.lower.plan import EXPR_OPS, group_kernels
from kdagen.codegen.lower.program import read_program
from kdagen.codegen.lower.sim import simulate
from kdagen.codegen.lower.storage import plan_storage, same_index_reads
from kdagen.driver import Compilation
from kdagen.ir.testing import make_case
from kdagen.target import get_target

np.seterr(all="ignore")

# a 56 KB tile budget: the K = 64 forward's first kernel spills to the global scratch with a
# buffer per value and fits in shared memory with results sharing their operands' buffers
BUDGET = dict(smem_reserve=227 * 1024 - 56 * 1024, dot="tf32")


def _read_paths(v, target, buffers) -> set:
    """How materialising ``v`` reaches buffer ``target``: True for a path through element-wise
    ops only (the same index), False for one through anything else (a broadcast, ...)."""
    from kdagen.ir.dialect import ops_with
    same_index = ops_with(kind="elementwise") | {"kda.assume_range", "kda.pipeline_wait"}
    out = set()

    def walk(x, identity):
        if x is target:
            out.add(identity)
            return
        if x in buffers or x.owner is None or x.kind != "tile":
            return
        for o in x.owner.operands:
            walk(o, identity and x.owner.op in same_index)
    for o in v.owner.operands:
        walk(o, True)
    return out


def _module(program, K=64, chip="sm_90a", **opts):
    return Compilation(program, dict(head_k_dim=K, head_v_dim=K, **opts), chip).run_passes().module


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd", "gdn_bwd"])
def test_only_same_index_last_reads_share_and_live_buffers_stay_disjoint(program):
    p = read_program(_module(program))
    shared = 0
    for g in group_kernels(p):
        if g.kind != "tile":
            continue
        plan = plan_storage(p, g, in_place=True)
        by_buffer = {}
        for v, b in plan.buffers.items():
            if v.carried is None:
                by_buffer.setdefault(id(b), []).append(v)
        for values in by_buffer.values():
            if len(values) < 2:
                continue
            shared += len(values) - 1
            values.sort(key=lambda v: plan.positions[v.owner])
            for first, later in zip(values, values[1:]):
                assert later.owner.op in EXPR_OPS
                assert _read_paths(later, first, plan.buffers) == {True}
                assert first in same_index_reads(later, plan.buffers)
                # the earlier value is read by no op after the one that overwrites it
                last = max(plan.positions[u] for u, _ in first.uses if u in plan.positions)
                assert last <= plan.positions[later.owner]
        bufs = list({id(b): b for b in plan.buffers.values()}.values())
        for i, a in enumerate(bufs):
            for b in bufs[i + 1:]:
                live = not (a.end < b.start or b.end < a.start)
                disjoint = a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
                assert not live or disjoint, (a, b)
    assert shared > 0
    # and without the option nothing shares
    for g in group_kernels(p):
        if g.kind == "tile":
            plan = plan_storage(p, g, in_place=False)
            assert len({id(b) for b in plan.buffers.values()}) == len(
                {v for v in plan.buffers if v.carried is None}) + len(plan.carried)


def test_taken_where_it_brings_a_kernel_into_shared_memory():
    module = _module("kda_fwd")
    storage = {}
    for in_place in (False, True):
        o = LowerOptions(in_place=in_place, **BUDGET)
        storage[in_place] = {pk.name: pk.storage for pk in prepare(read_program(module), None,
                                                                   "k", o) if pk.plan}
    assert storage[False]["k__k0_scan0"] == "hybrid"
    assert storage[True]["k__k0_scan0"] == "smem"
    assert all(storage[True][k] == s for k, s in storage[False].items() if k != "k__k0_scan0")


def test_results_are_bitwise_those_of_separate_buffers():
    case = make_case("kda", gate="softplus", H=1, HV=1, K=64, V=64, lengths=[70], seed=5,
                     decay="weak")
    module = Compilation("kda_fwd", case.options, "sm_90a").run_passes().module
    out = {ip: simulate(module, case.inputs, options=LowerOptions(in_place=ip, **BUDGET))
           for ip in (False, True)}
    for name, ref in out[False].items():
        assert torch.isfinite(ref).all(), name
        assert torch.equal(ref, out[True][name]), name


def test_the_gdn_dq_kernel_fits_shared_memory_on_sm90a():
    """GDN's backward with Aqk's diagonal apart keeps one more [64, 128] tile live in its dq
    kernel (137 KB of buffers against a 124 KB budget); sharing brings it back."""
    module = _module("gdn_bwd", K=128)
    target = get_target("sm_90a")
    storage = {}
    for in_place in (False, True):
        o = LowerOptions(path="native", dot="auto", in_place=in_place)
        storage[in_place] = {pk.name.split("__")[-1]: pk.storage
                             for pk in prepare(read_program(module), target, "k", o) if pk.plan}
    assert storage[False]["k2_scan2"] == "hybrid"
    assert storage[True]["k2_scan2"] == "smem"
