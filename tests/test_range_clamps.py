"""Declared gate ranges are enforced inside the programs (kda.clamp), with no host sync.

A precomputed g below its promised lower bound, or a raw gate of ±inf / huge values, used to
make outputs non-finite (the exponent-range analysis assumed the declared range). Now every
gate's output is clamped to its enforced range (kdagen.ir.gate_ranges), the float64 reference
defines the same semantics, and the two agree — forward and backward, in float64 and (on the
stabilised IR) in float32, and in the lowered kernels run by the CPU simulator.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kdagen import interpreter
from kdagen import reference as R
from kdagen._mlir import ir
from kdagen.ir.gate_ranges import GATE_FLOOR, RAW_GATE_BOUND, enforced_range, softplus_range
from kdagen.ir.gates import get_gate
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.exponent_range import RangeAnalysis
from kdagen.passes.pipeline import run_pipeline
from kdagen.reference import rel_err

INF = math.inf


def _bwd_inputs(case, seed=7):
    sz = case.sizes
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(sz["B"], sz["T"], sz["HV"], sz["V"], generator=gen, dtype=torch.float64)
    dht = torch.randn(sz["N"], sz["HV"], sz["K"], sz["V"], generator=gen, dtype=torch.float64)
    return do, dht


def _check_fwd_bwd(family, case, tol=1e-9):
    """Interpreter (float64) vs reference, forward and backward; everything finite."""
    out = interpreter.run(build_program(f"{family}_fwd", **case.options), case.inputs)
    o, ht = case.reference()
    for k, ref in (("o", o), ("final_state", ht)):
        assert torch.isfinite(ref).all(), f"reference {k} not finite"
        assert torch.isfinite(out[k]).all(), f"{k} not finite"
        assert rel_err(out[k], ref) <= tol, (k, rel_err(out[k], ref))
    do, dht = _bwd_inputs(case)
    grads = interpreter.run(build_program(f"{family}_bwd", **case.options),
                            dict(case.inputs, do=do, dht=dht))
    ref = case.reference_grads(do, dht)
    for k, g in grads.items():
        assert torch.isfinite(ref[k]).all(), f"reference {k} not finite"
        assert torch.isfinite(g).all(), f"{k} not finite"
        assert rel_err(g, ref[k]) <= tol, (k, rel_err(g, ref[k]))
    return out, grads


# -- the numbers ---------------------------------------------------------------------------------

def test_enforced_ranges():
    assert enforced_range(-5.0, 0.0) == (-5.0, 0.0)
    assert enforced_range(-INF, 0.0) == (GATE_FLOOR, 0.0)
    assert enforced_range(-INF, INF) == (GATE_FLOOR, -GATE_FLOOR)
    # the floor: one token's decay 2^(g log2 e) = 2^-128, below the smallest normal fp32
    assert GATE_FLOOR / math.log(2.0) == pytest.approx(-128.0)
    assert math.exp(GATE_FLOOR) < np.finfo(np.float32).tiny
    # the raw clamp is exact in fp32 and keeps 16 * x finite there
    assert float(np.float32(RAW_GATE_BOUND)) == RAW_GATE_BOUND
    assert np.isfinite(np.float32(16.0) * np.float32(RAW_GATE_BOUND))
    assert get_gate("precomputed").enforced_range() == (GATE_FLOOR, 0.0)
    assert get_gate("precomputed").enforced_range(lower_bound=-5.0) == (-5.0, 0.0)
    assert get_gate("softplus").enforced_range() == softplus_range()


def test_programs_clamp_the_gate_and_the_analysis_sees_a_finite_range():
    text = str(build_program("kda_fwd", gate="precomputed", head_k_dim=64, head_v_dim=64))
    assert '"kda.clamp"' in text and '"kda.assume_range"' in text
    # a precomputed gate has no raw-input clamp, a raw gate has one
    assert text.count('"kda.clamp"') == 1
    raw = str(build_program("kda_fwd", gate="softplus", head_k_dim=64, head_v_dim=64))
    assert raw.count('"kda.clamp"') == 2
    module = build_program("kda_fwd", gate="precomputed", head_k_dim=64, head_v_dim=64)
    gammas = [r for r in RangeAnalysis(module).ranges.values() if r.row_increments is not None]
    assert gammas and gammas[0].row_increments == pytest.approx((-128.0, 0.0))
    bwd = str(build_program("kda_bwd", gate="precomputed", head_k_dim=64, head_v_dim=64))
    assert '"kda.in_range"' in bwd       # the clamp's gradient mask


# -- a precomputed g below its promised lower bound ------------------------------------------------

@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_precomputed_gate_below_its_lower_bound(family):
    gate = "precomputed" if family == "kda" else "gdn_precomputed"
    case = make_case(family, gate=gate, B=1, T=70, H=1, HV=2, K=64, V=64, chunk_size=16,
                     lower_bound=-5.0, seed=1)
    g = case.inputs["g"].clone()
    g[0, 3:40] = -8.0                        # below the promise, over more than a chunk
    case.inputs["g"] = g
    out, _ = _check_fwd_bwd(family, case)
    # the semantics: exactly the same as the gate clamped to the bound by hand
    clamped = dict(case.inputs, g=g.clamp(min=-5.0))
    out2 = interpreter.run(build_program(f"{family}_fwd", **case.options), clamped)
    assert rel_err(out["o"], out2["o"]) == 0.0
    # and the reference entry point (FLA's safe_gate + lower_bound) clamps as well
    fn = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    x = case.inputs
    o_ref, _ = fn(x["q"], x["k"], x["v"], g, x["beta_raw"], initial_state=x["initial_state"],
                  output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0)
    assert torch.isfinite(o_ref).all() and rel_err(out["o"], o_ref) <= 1e-9


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_precomputed_gate_of_minus_inf_uses_the_floor(family):
    gate = "precomputed" if family == "kda" else "gdn_precomputed"
    case = make_case(family, gate=gate, B=1, T=40, H=1, HV=1, K=64, V=64, chunk_size=16, seed=2)
    g = case.inputs["g"].clone()
    g[0, 5] = -INF
    g[0, 9] = -1e30
    g[0, 30] = -1000.0
    case.inputs["g"] = g
    _check_fwd_bwd(family, case)


# -- raw gates of ±inf and huge values --------------------------------------------------------------

def _poison_raw(case, family):
    g = case.inputs["g_raw"].clone()
    if family == "kda":
        g[0, 3, 0, 5] = INF
        g[0, 7, 1, :] = -INF
        g[0, 20, 0, 1] = 1e6
        g[0, 21, 1, 2] = -1e6
        g[0, 33, :, 0] = 3e38                  # beyond the raw clamp
    else:
        g[0, 3, 0] = INF
        g[0, 7, 1] = -INF
        g[0, 20, 0] = 1e6
        g[0, 21, 1] = -1e6
        g[0, 33, :] = 3e38
    case.inputs["g_raw"] = g


@pytest.mark.parametrize("family,gate", [("kda", "softplus"), ("kda", "lower_bound"),
                                         ("gdn", "gdn_softplus"), ("gdn", "gdn_lower_bound")])
def test_raw_gate_of_inf_and_huge_values(family, gate):
    case = make_case(family, gate=gate, B=1, T=45, H=1, HV=2, K=64, V=64, chunk_size=16, seed=3,
                     decay="strong" if "softplus" in gate else "moderate")
    _poison_raw(case, family)
    _, grads = _check_fwd_bwd(family, case)
    # the clamp's gradient: zero at the ±inf raw entries (torch.clamp's rule)
    if family == "kda":
        assert grads["dg_raw"][0, 3, 0, 5] == 0 and (grads["dg_raw"][0, 7, 1] == 0).all()
    else:
        assert grads["dg_raw"][0, 3, 0] == 0 and grads["dg_raw"][0, 7, 1] == 0


def test_reference_is_unchanged_inside_the_declared_ranges():
    """The clamps change nothing for inputs in range: the reference gate equals the formula."""
    gen = torch.Generator().manual_seed(4)
    g_raw = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64) * 3
    A_log = torch.tensor([math.log(16.0), 0.3], dtype=torch.float64)
    dt_bias = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    x = g_raw + dt_bias
    sp = -torch.exp(A_log).unsqueeze(-1) * torch.logaddexp(x, torch.zeros_like(x))
    assert torch.equal(R.kda_gate_softplus(g_raw, A_log, dt_bias), sp)
    # outside: a raw +inf gives the declared lower end, -inf gives 0
    inf = torch.tensor([[INF, -INF]], dtype=torch.float64)
    g = R.gdn_gate_softplus(inf, torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    assert g[0, 0].item() == pytest.approx(softplus_range()[0]) and g[0, 1].item() == 0.0


# -- float32 (the kernels' arithmetic) -------------------------------------------------------------

@pytest.mark.parametrize("family,gate", [("kda", "softplus"), ("gdn", "gdn_lower_bound"),
                                         ("kda", "precomputed")])
def test_float32_stabilised_programs_stay_finite(family, gate):
    kw = dict(lower_bound=-5.0) if gate == "precomputed" else {}
    case = make_case(family, gate=gate, B=1, T=45, H=1, HV=2, K=64, V=64, chunk_size=16, seed=5,
                     **kw)
    if gate == "precomputed":
        g = case.inputs["g"].clone()
        g[0, 2:30] = -8.0
        g[0, 31] = -INF
        case.inputs["g"] = g
    else:
        _poison_raw(case, family)
    o, ht = case.reference()
    do, dht = _bwd_inputs(case)
    ref = case.reference_grads(do, dht)
    for prog in (f"{family}_fwd", f"{family}_bwd"):
        m = build_program(prog, **case.options)
        with m.context, ir.Location.unknown():
            run_pipeline(m, parse_pipeline("kda-stable-reassociate"))
        x = dict(case.inputs, do=do, dht=dht) if prog.endswith("bwd") else case.inputs
        out = interpreter.run(m, x, dtype=torch.float32)
        want = ref if prog.endswith("bwd") else {"o": o, "final_state": ht}
        for k, v in out.items():
            assert torch.isfinite(v).all(), (prog, k)
            assert rel_err(v.double(), want[k]) <= 2e-4, (prog, k, rel_err(v.double(), want[k]))


# -- the lowered kernels (CPU simulator) ------------------------------------------------------------

@pytest.mark.parametrize("family,gate,program", [("kda", "softplus", "kda_fwd"),
                                                 ("gdn", "gdn_precomputed", "gdn_fwd"),
                                                 ("kda", "lower_bound", "kda_bwd")])
def test_lowered_kernels_clamp(family, gate, program):
    from kdagen.codegen.lower.kernel import LowerOptions
    from kdagen.codegen.lower.sim import simulate
    np.seterr(all="ignore")
    kw = dict(lower_bound=-5.0) if "precomputed" in gate else {}
    case = make_case(family, gate=gate, B=1, T=40, H=1, HV=1, K=64, V=64, chunk_size=16, seed=6,
                     **kw)
    if "precomputed" in gate:
        g = case.inputs["g"].clone()
        g[0, 2:20] = -8.0
        g[0, 25] = -INF
        case.inputs["g"] = g
    else:
        g = case.inputs["g_raw"].clone()
        g[0, 3, 0, 5] = INF
        g[0, 7, 0, :] = -INF
        g[0, 20, 0, 1] = 1e6
        case.inputs["g_raw"] = g
    inputs = dict(case.inputs)
    if program.endswith("bwd"):
        inputs["do"], inputs["dht"] = _bwd_inputs(case)
    m = build_program(program, **case.options)
    with m.context, ir.Location.unknown():
        run_pipeline(m, parse_pipeline("kda-stable-reassociate"))
    out = simulate(m, inputs, options=LowerOptions(storage="global"))
    ref = interpreter.run(m, inputs, dtype=torch.float64, round_storage=True)
    for k, v in out.items():
        assert torch.isfinite(v).all(), k
        f32 = k in ("final_state", "dA_log", "ddt_bias", "dh0")
        assert rel_err(v, ref[k]) <= (2e-5 if f32 else 2.2e-3), (k, rel_err(v, ref[k]))
