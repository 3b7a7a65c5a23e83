"""kda-fold-row-decay on the programs: GDN's backward, whose decay products have one gate
value per row, keeps no decay_matmul (each is a plain dot of tril(w ⊙ 2^(g_i - g_j)), the
exponentials built once per gate pair and the weighting once per w), and the float64 interpreter agrees before and after
the pass to rounding, moderate and strong decay; KDA's per-key decay products are left alone."""
import pytest

from kdagen import interpreter
from kdagen.ir.dialect import print_module
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.registry import parse_pipeline

BEFORE = ("kda-stable-reassociate,kda-partition,kda-share-chunk-values,kda-narrow-broadcasts,"
          "kda-narrow-reductions,kda-assign-precision")
AFTER = BEFORE + ",kda-fold-row-decay,verify"


def _compiled(program, case, pipeline):
    module = build_program(program, **case.options)
    run_pipeline(module, parse_pipeline(pipeline))
    return module


def _count(module, op: str) -> int:
    return sum(f'"{op}"' in line for line in print_module(module).splitlines())


def _backward_inputs(family, case):
    import torch
    x = dict(case.inputs)
    res = interpreter.run(build_program(f"{family}_fwd", **case.options), x)
    gen = torch.Generator().manual_seed(5)
    x["do"] = torch.randn(res["o"].shape, generator=gen, dtype=torch.float64)
    x["dht"] = torch.randn(res["final_state"].shape, generator=gen, dtype=torch.float64)
    return x


@pytest.mark.parametrize("decay", ["moderate", "strong"])
def test_gdn_backward_row_gate_products_become_dots_and_agree(decay):
    case = make_case("gdn", lengths=[64, 3, 100], H=1, HV=2, K=64, V=64, seed=11,
                     decay=decay)
    before, after = (_compiled("gdn_bwd", case, p) for p in (BEFORE, AFTER))
    assert _count(before, "kda.decay_matmul") == 4
    assert _count(after, "kda.decay_matmul") == 0
    # one weighting per distinct w (the dq kernel's one, the dk kernel's two: its two adjoints
    # of one product share theirs), each masked once
    assert _count(after, "kda.tril") - _count(before, "kda.tril") == 3
    assert _count(after, "kda.dot") - _count(before, "kda.dot") == 4
    x = _backward_inputs("gdn", case)
    ref, got = interpreter.run(before, x), interpreter.run(after, x)
    assert set(got) == set(ref)
    for key in ref:
        scale = ref[key].abs().max().clamp_min(1e-30)
        assert ((got[key] - ref[key]).abs().max() / scale) < 1e-12, key


def test_kda_per_key_decay_products_are_unchanged():
    case = make_case("kda", B=1, T=70, K=64, V=64, seed=2)
    before, after = (_compiled("kda_bwd", case, p) for p in (BEFORE, AFTER))
    assert _count(before, "kda.decay_matmul") > 0
    assert print_module(after) == print_module(before)


def test_the_option_turns_the_fold_off():
    case = make_case("gdn", B=1, T=70, K=64, V=64, seed=2)
    off = _compiled("gdn_bwd", case, BEFORE + ",kda-fold-row-decay{fold=false}")
    before = _compiled("gdn_bwd", case, BEFORE)
    assert print_module(off) == print_module(before)
