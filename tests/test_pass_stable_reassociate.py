"""kda-stable-reassociate and the exponent-range analysis: golden IR, semantics, the fp32 stress."""
import math

import pytest
import torch

from filecheck_util import filecheck
from kdagen import interpreter
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.exponent_range import RangeAnalysis
from kdagen.passes.pipeline import PassFailure, run_pipeline
from kdagen.reference import rel_err

LOG2E = 1.0 / math.log(2.0)


def stabilise(module):
    run_pipeline(module, parse_pipeline("kda-stable-reassociate"))
    return module


def exp_ops(module):
    text = str(module)
    return [line for line in text.splitlines() if '"kda.exp2"' in line or '"kda.decay_' in line]


def test_range_analysis_sees_the_decaying_cumsum():
    module = build_program("kda_fwd", gate="lower_bound", lower_bound=-5.0, head_k_dim=64,
                           head_v_dim=64)
    analysis = RangeAnalysis(module)
    cumsums = [r for r in analysis.ranges.values() if r.row_increments is not None]
    assert cumsums, "no cumsum with row increments found"
    gamma = cumsums[0]
    assert gamma.row_increments == pytest.approx((-5.0 * LOG2E, 0.0))
    assert gamma.rows == 64
    assert gamma.lo == pytest.approx(-5.0 * LOG2E * 64) and gamma.hi == 0.0


GOLDEN_LOWER_BOUND = r"""
// The naive q·kᵀ / k·kᵀ products with 2^Γ and 2^−Γ factors become relative-exponent decay
// products; lb = -5 gives 16-row sub-blocks (15 · 5 · log2 e = 108.2 <= 126).
// CHECK: "kda.cumsum"
// Γ_C − Γ is proven non-positive by the relational rule, then clamped below:
// CHECK: "kda.exp2"{{.*}}exp_proof = "argument in [-454.449, 0]; clamped below at -126
// CHECK: "kda.decay_dot"{{.*}}diagonal = -1{{.*}}exact_diagonal = false{{.*}}exp_bound = 1.260000e+02{{.*}}blocks of 16 rows{{.*}}|exponent| <= 108.2{{.*}}subblock = 16
// CHECK: "kda.tril_inv"
// CHECK: "kda.decay_dot"{{.*}}diagonal = 0{{.*}}subblock = 16
// CHECK-NOT: "kda.tril"(
// CHECK-NOT: "kda.neg"
"""


def test_golden_ir_lower_bound_gate():
    module = stabilise(build_program("kda_fwd", gate="lower_bound", lower_bound=-5.0,
                                     head_k_dim=64, head_v_dim=64))
    filecheck(str(module), GOLDEN_LOWER_BOUND)


GOLDEN_SOFTPLUS = r"""
// A_log = ln 16 and softplus input <= 20: one step can decay by 2^-461.7, so no two rows
// share a reference point inside a block: only the blocks left of the diagonal are factored
// (both exponents <= 0), the 16 x 16 diagonal blocks take the relative form.
// CHECK: "kda.decay_dot"{{.*}}exact_diagonal = true{{.*}}increments in [-461.7, 0]{{.*}}both exponents <= 0{{.*}}subblock = 16 :
// CHECK: "kda.decay_dot"{{.*}}exact_diagonal = true{{.*}}subblock = 16 :
"""


def test_golden_ir_softplus_gate():
    module = stabilise(build_program("kda_fwd", gate="softplus", head_k_dim=64, head_v_dim=64))
    filecheck(str(module), GOLDEN_SOFTPLUS)


@pytest.mark.parametrize("program", ["kda_fwd", "gdn_fwd"])
def test_every_exp2_is_bounded(program):
    for gate in (["softplus", "lower_bound", "precomputed"] if program == "kda_fwd"
                 else ["gdn_softplus", "gdn_lower_bound", "gdn_precomputed"]):
        module = stabilise(build_program(program, gate=gate))
        ops = exp_ops(module)
        assert ops
        for line in ops:
            bound = float(line.split("exp_bound = ")[1].split(" ")[0])
            assert bound <= 126.0, line


SEMANTIC_CASES = {
    "kda_lb_varlen_gva2": dict(family="kda", gate="lower_bound", lower_bound=-3.0,
                               lengths=[1, 40, 70], H=1, HV=2, decay="strong"),
    "kda_softplus_batch": dict(family="kda", gate="softplus", B=2, T=70, H=2, HV=2),
    "gdn_lb_strong": dict(family="gdn", gate="gdn_lower_bound", lower_bound=-5.0, B=1, T=100,
                          H=1, HV=2, decay="strong"),
    "gdn_precomputed_varlen": dict(family="gdn", gate="gdn_precomputed", lengths=[17, 64, 3],
                                   H=1, HV=1),
}


@pytest.mark.parametrize("name", list(SEMANTIC_CASES))
def test_semantics_preserved_in_float64(name):
    spec = dict(SEMANTIC_CASES[name])
    family = spec.pop("family")
    case = make_case(family, seed=7, **spec)
    module = build_program(f"{family}_fwd", **case.options)
    before = interpreter.run(module, case.inputs, dtype=torch.float64)
    after = interpreter.run(stabilise(module), case.inputs, dtype=torch.float64)
    for key in before:
        assert rel_err(after[key], before[key]) <= 1e-10, key


STRESS = {
    "lower_bound_-5": dict(gate="lower_bound", lower_bound=-5.0),
    "softplus_ln16": dict(gate="softplus"),
}


@pytest.mark.parametrize("name", list(STRESS))
def test_float32_stress_forward(name):
    """Chunk 64 at the strongest decay: the naive program breaks in fp32, the rewritten one not."""
    case = make_case("kda", B=1, T=130, H=1, HV=2, K=64, V=64, decay="strong", seed=11,
                     **STRESS[name])
    module = build_program("kda_fwd", **case.options)
    ref_o, ref_ht = case.reference()
    naive = interpreter.run(module, case.inputs, dtype=torch.float32)
    naive_err = max(rel_err(naive["o"].double(), ref_o), rel_err(naive["final_state"].double(), ref_ht))
    assert not math.isfinite(naive_err) or naive_err > 1e-2, naive_err
    stable = interpreter.run(stabilise(module), case.inputs, dtype=torch.float32)
    for key, ref in (("o", ref_o), ("final_state", ref_ht)):
        assert torch.isfinite(stable[key]).all()
        assert rel_err(stable[key].double(), ref) <= 1e-4, key


def test_unbounded_exponent_stops_with_a_diagnostic(tmp_path, monkeypatch):
    """A gate that may be positive: 2^-Γ has no sign, no bounded form, and the pass says so."""
    from kdagen.ir.gates import define_gate
    monkeypatch.setenv("KDAGEN_REPRO_DIR", str(tmp_path))
    gate = define_gate("unsigned_test_gate", params={}, register=False,
                       range=lambda **_: (-math.inf, math.inf))(lambda g_raw: g_raw)
    module = build_program("kda_fwd", gate=gate, head_k_dim=64, head_v_dim=64)
    with pytest.raises(PassFailure) as info:
        stabilise(module)
    message = str(info.value)
    # the declared (-inf, inf) is enforced as ±128 ln 2 per token (kdagen.ir.gate_ranges): Γ of
    # a 64-row chunk spans ±64·128 in log2 space
    assert "kda.exp2" in message and "argument bound [-8192, 8192] exceeds" in message
    assert "kdagen opt" in message and info.value.reproducer.exists()


@pytest.mark.parametrize("lo", [-math.inf, -16.0])
def test_researchers_gate_with_unbounded_parameter_compiles(lo):
    """The gates.py docstring gate ``-exp(A_log) * sigmoid(g_raw + dt_bias) ** 2`` declared
    (lo, 0]: exp(A_log) has no bound (A_log is a free parameter), but its value reaches only the
    clamp of the gate's enforced range, so the pass saturates it at 2^126 and says why; the
    decay products take the exact-diagonal form. Forward and backward compile, and the forward
    in float32 matches the float64 program before the pass."""
    from kdagen.ir.dsl import exp, sigmoid
    from kdagen.ir.gates import define_gate

    gate = define_gate("docstring_gate_test", register=False, range=lambda **_: (lo, 0.0))(
        lambda g_raw, A_log, dt_bias: -exp(A_log) * sigmoid(g_raw + dt_bias) ** 2)
    fwd = stabilise(build_program("kda_fwd", gate=gate, head_k_dim=64, head_v_dim=64))
    text = str(fwd)
    filecheck(text, r"""
// CHECK: "kda.exp2"{{.*}}clamp_max = 1.260000e+02{{.*}}saturated above at 126: the value reaches only kda.clamp
// CHECK: "kda.decay_dot"{{.*}}exact_diagonal = true
""")
    bwd = stabilise(build_program("kda_bwd", gate=gate, head_k_dim=64, head_v_dim=64))
    assert "clamp_max" in str(bwd)
    case = make_case("kda", gate=gate, B=1, T=70, H=1, HV=1, K=64, V=64, seed=3,
                     gate_fn=lambda g_raw, A_log, dt_bias: -torch.exp(A_log)[:, None]
                     * torch.sigmoid(g_raw + dt_bias) ** 2)
    module = build_program("kda_fwd", **case.options)
    ref = interpreter.run(module, case.inputs, dtype=torch.float64)
    got = interpreter.run(stabilise(module), case.inputs, dtype=torch.float32)
    for key in ref:
        assert rel_err(got[key].double(), ref[key]) <= 1e-4, key


def test_saturation_only_where_the_value_reaches_a_clamp():
    """Only an exponential whose value reaches nothing but the gate's clamp may be saturated:
    the gate's exp(A_log) qualifies, the 2^Γ factors of the chunk products (they feed matrix
    products) do not, so a naive product keeps its diagnostic."""
    from kdagen.passes.stable_reassociate import _feeds_only_clamps
    from kdagen.ir.transforms import walk
    module = build_program("kda_fwd", gate="softplus", head_k_dim=64, head_v_dim=64)
    exps = [op for op in walk(module) if op.name == "kda.exp2"]
    verdicts = [_feeds_only_clamps(op) for op in exps]
    assert any(verdicts) and not all(verdicts), verdicts
