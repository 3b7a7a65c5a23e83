"""kda-narrow-broadcasts on the programs: GDN's gate work runs on [C] (no [C, K] cumsum or
exponential of the gate left, the decay products read a broadcast gate), the float64
interpreter gives bitwise the same outputs and gradients before and after the pass (varlen,
GVA), and KDA, whose gate differs per channel, is left as it was. (The backward's adjoint
cumsums of the gate are narrowed by the next pass, kda-narrow-reductions:
tests/test_pass_narrow_reductions.py.)"""
import pytest
import torch

from kdagen import interpreter
from kdagen.ir.dialect import print_module
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.registry import parse_pipeline

BEFORE = "kda-stable-reassociate,kda-partition,kda-share-chunk-values"
AFTER = BEFORE + ",kda-narrow-broadcasts,verify"


def _inputs(program, case):
    x = dict(case.inputs)
    if program.endswith("_bwd"):
        res = interpreter.run(build_program(program.replace("_bwd", "_fwd"), **case.options), x)
        gen = torch.Generator().manual_seed(3)
        x["do"] = torch.randn(res["o"].shape, generator=gen, dtype=torch.float64)
        x["dht"] = torch.randn(res["final_state"].shape, generator=gen, dtype=torch.float64)
    return x


def _compiled(program, case, pipeline):
    module = build_program(program, **case.options)
    run_pipeline(module, parse_pipeline(pipeline))
    return module


@pytest.mark.parametrize("program", ["gdn_fwd", "gdn_bwd"])
def test_gdn_gate_work_runs_per_token_with_bitwise_equal_results(program):
    case = make_case("gdn", lengths=[64, 3, 100], H=1, HV=2, K=64, V=64, seed=7)
    before, after = (_compiled(program, case, p) for p in (BEFORE, AFTER))
    text = print_module(after)
    assert "kda.cumsum" in text
    for line in text.splitlines():
        if '"kda.cumsum"' in line and "%G = " in line:
            assert "tensor<64xf32>" in line, line            # the forward gate cumsum: [C]
        if '"kda.decay_dot"' in line or '"kda.decay_matmul"' in line:
            gate = line.split("(")[1].split(",")[2].strip()
            assert f'{gate} = "kda.broadcast"' in text, line  # reads the broadcast gate
    x = _inputs(program, case)
    ref, got = interpreter.run(before, x), interpreter.run(after, x)
    assert set(got) == set(ref)
    for key in ref:
        assert torch.equal(got[key], ref[key]), key


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd"])
def test_kda_per_channel_gate_is_left_alone(program):
    case = make_case("kda", B=1, T=70, K=64, V=64, seed=2)
    before, after = (_compiled(program, case, p) for p in (BEFORE, AFTER))
    assert print_module(after).count('"kda.cumsum"') == print_module(before).count('"kda.cumsum"')
    assert "-> tensor<64xf32>" not in "\n".join(
        line for line in print_module(after).splitlines() if '"kda.cumsum"' in line)
