"""Gates as DSL expressions: the library, declared ranges, and a user gate defined in a few lines
that gets forward and backward matching autograd with no other code."""
import math

import pytest
import torch

from kdagen import interpreter
from kdagen.ir import gates
from kdagen.ir.dialect import print_module
from kdagen.ir.dsl import exp, sigmoid
from kdagen.ir.gates import define_gate
from kdagen.ir.programs import ProgramOptionError, build_program
from kdagen.ir.testing import make_case
from kdagen.reference import rel_err


# --- a gate that is not in the library: g = -exp(A_log) * sigmoid(g_raw + dt_bias) ** 2 ---------

@define_gate("test_sq_sigmoid", range=lambda **o: (-16.0, 0.0), register=False)
def sq_sigmoid(g_raw, A_log, dt_bias):
    """Squared-sigmoid gate (test only)."""
    return -exp(A_log) * sigmoid(g_raw + dt_bias) ** 2


def sq_sigmoid_torch(g_raw, A_log, dt_bias):
    return -torch.exp(A_log)[:, None] * torch.sigmoid(g_raw + dt_bias) ** 2


@define_gate("test_gdn_tanhish", family="gdn", register=False)
def gdn_tanhish(g_raw, A_log, dt_bias, *, span=2.0):
    """GDN gate g = -span * sigmoid(g_raw * exp(A_log) + dt_bias) (test only)."""
    return -span * sigmoid(g_raw * exp(A_log) + dt_bias)


def gdn_tanhish_torch(g_raw, A_log, dt_bias):
    return -2.0 * torch.sigmoid(g_raw * torch.exp(A_log) + dt_bias)


def _fwd_bwd(family, case, seed=0):
    fwd = build_program(f"{family}_fwd", **case.options)
    bwd = build_program(f"{family}_bwd", **case.options)
    out = interpreter.run(fwd, case.inputs)
    o_ref, ht_ref = case.reference()
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(ht_ref.shape, generator=gen, dtype=torch.float64)
    grads = interpreter.run(bwd, dict(case.inputs, do=do, dht=dht))
    ref = case.reference_grads(do, dht)
    return out, (o_ref, ht_ref), grads, ref


@pytest.mark.parametrize("varlen", [False, True])
def test_user_defined_kda_gate_forward_and_backward(varlen):
    shape = dict(lengths=[1, 30, 50]) if varlen else dict(B=1, T=70)
    case = make_case("kda", gate=sq_sigmoid, gate_fn=sq_sigmoid_torch, H=1, HV=2, seed=11, **shape)
    out, (o_ref, ht_ref), grads, ref = _fwd_bwd("kda", case)
    assert rel_err(out["o"], o_ref) <= 1e-10
    assert rel_err(out["final_state"], ht_ref) <= 1e-10
    assert set(grads) == {"dq", "dk", "dv", "dg_raw", "dbeta_raw", "dA_log", "ddt_bias", "dh0"}
    for k in grads:
        assert rel_err(grads[k], ref[k]) <= 1e-9, k


def test_user_defined_gdn_gate_forward_and_backward():
    case = make_case("gdn", gate=gdn_tanhish, gate_fn=gdn_tanhish_torch, B=2, T=40, H=1, HV=2,
                     seed=12)
    out, (o_ref, _), grads, ref = _fwd_bwd("gdn", case)
    assert rel_err(out["o"], o_ref) <= 1e-10
    for k in ("dg_raw", "dA_log", "ddt_bias", "dq", "dk"):
        assert rel_err(grads[k], ref[k]) <= 1e-9, k


def test_user_gate_range_is_declared_in_the_ir():
    text = print_module(build_program("kda_fwd", gate=sq_sigmoid))
    assert '"kda.assume_range"' in text
    assert "lo = -1.600000e+01" in text and "hi = 0.000000e+00" in text
    assert 'kda.gate = "test_sq_sigmoid"' in text


def test_user_gate_registered_by_name():
    g = define_gate("test_registered_gate")(lambda g_raw, A_log, dt_bias: -exp(A_log) * sigmoid(g_raw + dt_bias))
    try:
        assert ("test_registered_gate" in dict(gates.list_gates()))
        m = build_program("kda_fwd", gate="test_registered_gate", head_k_dim=64, head_v_dim=64)
        assert m is not None and g.params == {"A_log": "scalar", "dt_bias": "channel"}
    finally:
        gates.GATES.pop("test_registered_gate", None)


# --- the library --------------------------------------------------------------------------------

def test_library_lists_every_gate():
    names = dict(gates.list_gates())
    for n in ("softplus", "lower_bound", "precomputed", "gdn_softplus", "gdn_lower_bound",
              "gdn_precomputed"):
        assert n in names and names[n]


def test_declared_ranges():
    assert gates.get_gate("lower_bound").output_range(lower_bound=-5.0) == (-5.0, 0.0)
    assert gates.get_gate("gdn_lower_bound").output_range(lower_bound=-2.0) == (-2.0, 0.0)
    lo, hi = gates.get_gate("softplus").output_range(A_log_max=math.log(16.0), gate_input_max=20.0)
    assert hi == 0.0 and lo == pytest.approx(-16.0 * math.log1p(math.exp(20.0)))
    assert gates.get_gate("precomputed").output_range() == (-math.inf, 0.0)
    assert gates.get_gate("precomputed").output_range(lower_bound=-3.0) == (-3.0, 0.0)


def test_library_gates_emit_kda_ops_and_validate_options():
    """(Their values are checked against the reference gate functions by the forward tests.)"""
    for name in ("softplus", "lower_bound"):
        text = print_module(build_program("kda_fwd", gate=name))
        assert '"kda.sigmoid"' in text or '"kda.softplus"' in text
    with pytest.raises(ProgramOptionError, match="lower_bound"):
        build_program("kda_fwd", gate="lower_bound", lower_bound=-7.0)
    with pytest.raises(ProgramOptionError, match="unknown option"):
        build_program("kda_fwd", gate="precomputed", A_log_max=1.0)
    with pytest.raises(ProgramOptionError, match="GDN gate"):
        build_program("kda_fwd", gate="gdn_softplus")


def test_declared_ranges_hold_on_real_values():
    """The interpreter checks every kda.assume_range; the library gates' declarations hold
    (strong decay included) and a wrong declaration is caught."""
    for gate, extra in (("lower_bound", dict(lower_bound=-5.0)), ("softplus", {}),
                        ("gdn_lower_bound", dict(lower_bound=-1.0)), ("gdn_softplus", {})):
        family = "gdn" if gate.startswith("gdn") else "kda"
        case = make_case(family, gate=gate, B=1, T=70, H=1, HV=2, decay="strong", **extra)
        interpreter.run(build_program(f"{family}_fwd", **case.options), case.inputs,
                        check_ranges=True)

    @define_gate("test_wrong_range", range=lambda **o: (-0.1, 0.0), register=False)
    def wrong(g_raw, A_log, dt_bias):
        return -exp(A_log) * sigmoid(g_raw + dt_bias)

    case = make_case("kda", gate=wrong, gate_fn=lambda g_raw, A_log, dt_bias: None, B=1, T=10,
                     seed=2)
    with pytest.raises(interpreter.InterpreterError, match="declared range"):
        interpreter.run(build_program("kda_fwd", **case.options), case.inputs, check_ranges=True)
