"""kda-warp-specialize: roles, ring slots, wait/release structure, smem budget, semantics."""
import pytest
import torch

from filecheck_util import filecheck
from kdagen import interpreter
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.pipeline import PassFailure, run_pipeline
from kdagen.reference import rel_err

PIPELINE = "kda-stable-reassociate,kda-partition,kda-warp-specialize"

GOLDEN = r"""
// chunk kernel: the producer loads k into ring slot 0; the consumer waits on it before first use
// CHECK: "kda.scan"() ({
// CHECK: %[[Q:.*]] = "kda.load"({{.*}}) {head_map = "{{.*}}", kda.role = "producer", kda.slot = 0 : i64, name = "k"}
// CHECK: %[[QW:.*]] = "kda.pipeline_wait"(%[[Q]]) {kda.role = "consumer", slot = 0 : i64}
// CHECK: "kda.pipeline_release"(%[[QW]]) {kda.role = "consumer", slot = 0 : i64}
// CHECK: kda.kernel = "kda_fwd_chunk", kda.pipeline = {consumer_registers = 232 : i64, consumer_warpgroups = 2 : i64, depth = 2 : i64
// state kernel: workspace tiles are produced too; the state math is consumer work
// CHECK: "kda.load_chunk"({{.*}}) {kda.role = "producer", kda.slot = {{[0-9]+}} : i64, name = "w"}
// CHECK: "kda.dot"({{.*}}) {kda.role = "consumer"
// CHECK: kda.kernel = "kda_fwd_state", kda.pipeline = {{{.*}}depth = 2 : i64
// output kernel: the checkpoints of the state scan come through the ring
// CHECK: "kda.load_chunk"({{.*}}) {kda.role = "producer", kda.slot = {{[0-9]+}} : i64, name = "S"}
// CHECK: kda.kernel = "kda_fwd_out", kda.pipeline = {{{.*}}depth = 1 : i64
"""


def test_golden_warp_specialize():
    module = build_program("kda_fwd", gate="lower_bound", lower_bound=-5.0)
    run_pipeline(module, parse_pipeline(PIPELINE))
    filecheck(str(module), GOLDEN)


def test_release_follows_last_use():
    module = build_program("gdn_fwd", head_k_dim=64, head_v_dim=64)
    run_pipeline(module, parse_pipeline(PIPELINE))
    waits = 0
    for scan in _scans(module):
        ops = [op.operation for op in scan.regions[0].blocks[0].operations]
        position = {op: i for i, op in enumerate(ops)}
        for op in ops:
            if op.name != "kda.pipeline_wait":
                continue
            waits += 1
            users = [u.owner.operation if hasattr(u.owner, "operation") else u.owner
                     for u in op.results[0].uses]
            releases = [u for u in users if u.name == "kda.pipeline_release"]
            assert len(releases) == 1
            assert position[releases[0]] == max(position[u] for u in users)
            assert position[op] < min(position[u] for u in users)
    assert waits >= 8


def _scans(module):
    func = module.body.operations[0]
    return [op.operation for op in func.regions[0].blocks[0].operations
            if op.operation.name == "kda.scan"]


def test_ring_depth_shrinks_to_the_budget_then_becomes_a_tile_ring_then_fails_clearly():
    def pipeline(options):
        module = build_program("kda_fwd")
        run_pipeline(module, parse_pipeline("kda-stable-reassociate,kda-partition,"
                                            f"kda-warp-specialize{{{options}}}"))
        return str(module)

    roomy = pipeline("depth=4,smem_budget=400000")
    assert roomy.count('mode = "chunk"') == 3 and "depth = 4 : i64" in roomy
    tight = pipeline("depth=4,smem_budget=180000")
    assert 'mode = "chunk"' in tight and "depth = 1 : i64" in tight
    tiles = pipeline("depth=2,smem_budget=101376,reserved_smem=16384")
    assert 'mode = "tile"' in tiles
    with pytest.raises(PassFailure, match=r"kernel kda_fwd_\w+ has a 32768-byte tile but only "
                                          r"20480 of the 86016-byte budget.*not even one ring slot"):
        pipeline("smem_budget=86016")


def test_warp_specialize_needs_kernels():
    module = build_program("kda_fwd")
    with pytest.raises(PassFailure, match="run kda-partition first"):
        run_pipeline(module, parse_pipeline("kda-warp-specialize"))


def test_semantics_preserved():
    case = make_case("kda", gate="softplus", lengths=[5, 64, 90], H=1, HV=2, seed=3)
    module = build_program("kda_fwd", **case.options)
    before = interpreter.run(module, case.inputs)
    run_pipeline(module, parse_pipeline(PIPELINE))
    after = interpreter.run(module, case.inputs)
    for key in before:
        assert rel_err(after[key], before[key]) <= 1e-10, key
