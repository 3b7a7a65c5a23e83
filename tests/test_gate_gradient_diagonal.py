"""GDN's backward is derived from the forward with Aqk's diagonal apart (kdagen.ir.programs,
``diagonal_apart``): the same forward value, and a gate gradient that no longer carries the
diagonal's rounding into dA_log / ddt_bias under a steep gate on correlated keys."""
import pytest
import torch

pytest.importorskip("kdagen._mlir")

from kdagen import interpreter                                    # noqa: E402
from kdagen.ir.programs import _delta_rule_fwd, build_program    # noqa: E402
from kdagen.ir.testing import make_case                          # noqa: E402


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_diagonal_apart_keeps_the_forward_value(family):
    """The split form and the one-product form interpret to the same o and final state in
    float64, with h0 and a partial last chunk."""
    case = make_case(family, T=70, K=64, V=64, decay="strong", seed=3)
    gate = "softplus" if family == "kda" else "gdn_softplus"
    options = dict(case.options, gate=case.options.get("gate", gate))
    plain = build_program(f"{family}_fwd", **options)
    split = _delta_rule_fwd(family, f"{family}_fwd", options, diagonal_apart=True)
    a = interpreter.run(plain, case.inputs, dtype=torch.float64)
    b = interpreter.run(split, case.inputs, dtype=torch.float64)
    for name in ("o", "final_state"):
        scale = a[name].abs().max().item()
        assert (a[name] - b[name]).abs().max().item() <= 1e-12 * scale, name


def test_gdn_gate_parameter_gradients_at_a_correlated_steep_gate(tmp_path):
    """The GPU check's "B1_T200 correlated steep" case (positive keys, g = logsigmoid(randn)
    / 0.1) run in the CPU simulator of the sm_90a kernels at K = 64: with Aqk's diagonal inside
    the decay product dA_log was 5.3e-3 and ddt_bias 2.8e-3 (on the H200 at K = 128: dA_log
    9.5e-3, over the check's 8e-3 bar); apart, both are under the 1e-3 goal for fp32
    outputs (2.6e-4 and 3.1e-4), and every gradient stays under its bar."""
    from tools.scan_precision_probe import check_case
    options = dict(head_k_dim=64, head_v_dim=64, gate="gdn_softplus")
    rows = check_case("gdn_bwd", options, "auto", "B1_T200 correlated steep", "sm_90a",
                      out=tmp_path)
    errors = {r["tensor"]: (r["err"], r["bar"]) for r in rows}
    for name in ("dA_log", "ddt_bias"):
        assert errors[name][0] <= 1e-3, errors
    for name, (err, bar) in errors.items():
        assert err <= bar, (name, err, bar)
