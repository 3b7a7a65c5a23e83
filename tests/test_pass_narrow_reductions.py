"""kda-narrow-reductions on the programs: GDN's backward sums its gate adjoint over the channels
before the cumsums, so no [C, K] cumsum is left in it; the float64 interpreter agrees before
and after the pass to rounding (the sums are reassociated); KDA, whose per-channel dg is an
output, keeps its cumsums."""
import pytest
import torch

from kdagen import interpreter
from kdagen.ir.dialect import print_module
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.registry import parse_pipeline

BEFORE = ("kda-stable-reassociate,kda-partition,kda-share-chunk-values,kda-narrow-broadcasts")
AFTER = BEFORE + ",kda-narrow-reductions,verify"


def _compiled(program, case, pipeline):
    module = build_program(program, **case.options)
    run_pipeline(module, parse_pipeline(pipeline))
    return module


def _cumsum_shapes(module) -> list[str]:
    return [line.rsplit("-> ", 1)[1] for line in print_module(module).splitlines()
            if '"kda.cumsum"' in line]


def _inputs(case):
    x = dict(case.inputs)
    res = interpreter.run(build_program("gdn_fwd", **case.options), x)
    gen = torch.Generator().manual_seed(3)
    x["do"] = torch.randn(res["o"].shape, generator=gen, dtype=torch.float64)
    x["dht"] = torch.randn(res["final_state"].shape, generator=gen, dtype=torch.float64)
    return x


def test_gdn_backward_gate_cumsums_run_per_token_and_agree_to_rounding():
    case = make_case("gdn", lengths=[64, 3, 100], H=1, HV=2, K=64, V=64, seed=7)
    before, after = (_compiled("gdn_bwd", case, p) for p in (BEFORE, AFTER))
    assert "tensor<64x64xf32>" in _cumsum_shapes(before)     # the adjoint cumsums, [C, K]
    assert _cumsum_shapes(after) and set(_cumsum_shapes(after)) == {"tensor<64xf32>"}
    x = _inputs(case)
    ref, got = interpreter.run(before, x), interpreter.run(after, x)
    assert set(got) == set(ref)
    for key in ref:
        scale = ref[key].abs().max().clamp_min(1e-30)
        assert ((got[key] - ref[key]).abs().max() / scale) < 1e-12, key


@pytest.mark.parametrize("program", ["kda_bwd", "gdn_fwd"])
def test_programs_without_a_narrowable_sum_are_unchanged(program):
    family = program.split("_")[0]
    case = make_case(family, B=1, T=70, K=64, V=64, seed=2)
    before, after = (_compiled(program, case, p) for p in (BEFORE, AFTER))
    assert print_module(after) == print_module(before)
