"""interpreter(kda_fwd / gdn_fwd) against the float64 reference (<= 1e-10 relative error)."""
import math
import zlib

import pytest
import torch

from kdagen import interpreter
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.reference import rel_err

TOL = 1e-10

CASES = {
    # KDA, softplus gate, GVA 2, batch of 2, T not a multiple of C, h0 on
    "kda_softplus_gva2_batch": dict(family="kda", gate="softplus", B=2, T=100, H=1, HV=2),
    # KDA, softplus gate, A_log = ln 16 (strong decay), K = V = 128
    "kda_softplus_strong_k128": dict(family="kda", gate="softplus", B=1, T=70, H=1, HV=1,
                                     K=128, V=128, decay="strong"),
    # KDA, lower-bound gate at lb = -5 (strong decay), varlen with a length-1 sequence, GVA 4
    "kda_lowerbound_strong_varlen_gva4": dict(family="kda", gate="lower_bound", lower_bound=-5.0,
                                              lengths=[1, 17, 64, 129], H=1, HV=4, decay="strong"),
    # KDA, precomputed gate, no h0, no final state, no in-kernel transforms
    "kda_precomputed_noh0": dict(family="kda", gate="precomputed", B=1, T=65, H=2, HV=2,
                                 use_initial_state=False, output_final_state=False,
                                 use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False),
    # KDA, chunk 32, allow_neg_eigval, varlen
    "kda_chunk32_negeig_varlen": dict(family="kda", gate="lower_bound", lower_bound=-2.0,
                                      chunk_size=32, lengths=[33, 1, 40], H=1, HV=2,
                                      allow_neg_eigval=True),
    # GDN, softplus gate, GVA 2, varlen with a length-1 sequence
    "gdn_softplus_varlen_gva2": dict(family="gdn", gate="gdn_softplus", lengths=[1, 63, 130],
                                     H=1, HV=2),
    # GDN, lower-bound gate, strong decay, no h0, K = V = 128
    "gdn_lowerbound_strong_noh0": dict(family="gdn", gate="gdn_lower_bound", lower_bound=-5.0,
                                       B=2, T=129, H=1, HV=1, K=128, V=128, decay="strong",
                                       use_initial_state=False),
    # GDN, precomputed gate, GVA 4
    "gdn_precomputed_gva4": dict(family="gdn", gate="gdn_precomputed", B=1, T=64, H=1, HV=4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_reference(name):
    spec = dict(CASES[name])
    family = spec.pop("family")
    case = make_case(family, seed=zlib.crc32(name.encode()) % 1000, **spec)
    module = build_program(f"{family}_fwd", **case.options)
    out = interpreter.run(module, case.inputs, dtype=torch.float64)
    ref_o, ref_ht = case.reference()
    err_o = rel_err(out["o"], ref_o)
    assert err_o <= TOL, f"o: rel err {err_o:.3e}"
    if case.options["output_final_state"]:
        err_ht = rel_err(out["final_state"], ref_ht)
        assert err_ht <= TOL, f"final_state: rel err {err_ht:.3e}"
    else:
        assert "final_state" not in out


def test_strong_decay_is_really_strong():
    """The strong-decay lower-bound case reaches Γ near lb·C within a chunk (exp(-300) scale)."""
    case = make_case("kda", gate="lower_bound", lower_bound=-5.0, B=1, T=64, decay="strong")
    from kdagen.reference import kda_gate_lower_bound
    x = case.inputs
    g = kda_gate_lower_bound(x["g_raw"], x["A_log"], x["dt_bias"], -5.0)
    assert g.sum(1).min() < -300


def test_float32_mode_computes_in_float32():
    """dtype=float32 really computes in float32: the result differs from float64 by ~1e-7."""
    case = make_case("kda", gate="lower_bound", lower_bound=-1.0, B=1, T=64, seed=3)
    module = build_program("kda_fwd", **case.options)
    o64 = interpreter.run(module, case.inputs, dtype=torch.float64)["o"]
    o32 = interpreter.run(module, case.inputs, dtype=torch.float32)["o"]
    assert o32.dtype == torch.float32 and o64.dtype == torch.float64
    err = rel_err(o32, o64)
    assert 1e-9 < err < 1e-4, err


def test_scale_argument_and_gva_head_mapping():
    """An explicit scale is used, and q/k head h serves value heads h*r .. h*r+r-1."""
    case = make_case("kda", gate="lower_bound", lower_bound=-1.0, B=1, T=20, H=2, HV=4, seed=5)
    module = build_program("kda_fwd", **case.options)
    x = dict(case.inputs, scale=0.3)
    out = interpreter.run(module, x)
    ref_o, _ = case._call(**x)
    assert rel_err(out["o"], ref_o) <= TOL
    # swapping q heads must swap the outputs of the value-head groups
    x2 = dict(x, q=x["q"].flip(2), k=x["k"].flip(2))
    out2 = interpreter.run(module, x2)
    assert not torch.allclose(out["o"], out2["o"])


def test_interpreter_rejects_bad_inputs():
    case = make_case("kda", gate="softplus", B=1, T=10)
    module = build_program("kda_fwd", **case.options)
    bad = dict(case.inputs)
    bad.pop("A_log")
    with pytest.raises(interpreter.InterpreterError, match="missing input 'A_log'"):
        interpreter.run(module, bad)
    with pytest.raises(interpreter.InterpreterError, match="unknown inputs"):
        interpreter.run(module, dict(case.inputs, nope=torch.zeros(1)))
    with pytest.raises(interpreter.InterpreterError, match="shape"):
        interpreter.run(module, dict(case.inputs, v=case.inputs["v"][..., :32]))


def test_long_sequence_runs():
    # Correctness only: how long it takes belongs in a benchmark, not in a test (CI is shared).
    case = make_case("kda", gate="lower_bound", lower_bound=-5.0, B=1, T=1000, H=2, HV=4)
    module = build_program("kda_fwd", **case.options)
    out = interpreter.run(module, case.inputs)
    assert out["o"].shape == (1, 1000, 4, 64)
    assert torch.isfinite(out["o"]).all()


def test_naive_program_fails_in_float32_at_strong_decay():
    """The DSL programs are the naive factored form (exp2(±Γ)); stabilising them is the job of
    kda-stable-reassociate. In float32 at lb = -5, chunk 64, the naive form overflows."""
    case = make_case("kda", gate="lower_bound", lower_bound=-5.0, B=1, T=128, decay="strong")
    module = build_program("kda_fwd", **case.options)
    o32 = interpreter.run(module, case.inputs, dtype=torch.float32)["o"]
    ref_o, _ = case.reference()
    err = rel_err(o32, ref_o)
    assert not (err < 1e-3), f"naive float32 unexpectedly accurate ({err:.2e})"
