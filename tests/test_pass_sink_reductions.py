"""kda-sink-reductions on the programs: GDN's backward sums its per-token gate gradient over the
K channels before the reverse row cumsum (no [C, K] cumsum left), with the same outputs and
gradients in the float64 interpreter up to reassociation (varlen, GVA); KDA, whose gate
gradient stays per channel, is left as it was."""
import pytest
import torch

from kdagen import interpreter
from kdagen.ir.dialect import print_module
from kdagen.ir.testing import make_case

from test_pass_narrow_broadcasts import _compiled, _inputs

BEFORE = "kda-stable-reassociate,kda-partition,kda-share-chunk-values,kda-narrow-broadcasts"
AFTER = BEFORE + ",kda-sink-reductions,verify"


def _cumsum_shapes(module) -> list[str]:
    return [line.rsplit("-> ", 1)[1] for line in print_module(module).splitlines()
            if '"kda.cumsum"' in line]


def test_gdn_gate_gradient_is_summed_over_channels_before_its_cumsum():
    case = make_case("gdn", lengths=[64, 3, 100], H=1, HV=2, K=64, V=64, seed=7)
    before, after = (_compiled("gdn_bwd", case, p) for p in (BEFORE, AFTER))
    assert "tensor<64x64xf32>" in _cumsum_shapes(before)       # the pass has work to do
    assert all(s == "tensor<64xf32>" for s in _cumsum_shapes(after)), _cumsum_shapes(after)
    x = _inputs("gdn_bwd", case)
    ref, got = interpreter.run(before, x), interpreter.run(after, x)
    assert set(got) == set(ref)
    for key in ref:
        err = (got[key] - ref[key]).norm() / ref[key].norm().clamp_min(1e-300)
        assert err < 1e-12, (key, err.item())


@pytest.mark.parametrize("program", ["kda_bwd", "gdn_fwd"])
def test_programs_without_a_column_sum_of_a_scan_are_unchanged(program):
    family = program.split("_")[0]
    case = make_case(family, B=1, T=70, K=64, V=64, seed=2)
    before, after = (_compiled(program, case, p) for p in (BEFORE, AFTER))
    assert print_module(after) == print_module(before)
