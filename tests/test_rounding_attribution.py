"""tools.rounding_attribution: which op's float32 rounding costs a gradient its digits."""
import pytest

pytest.importorskip("kdagen._mlir")


def test_gdn_steep_gate_dA_log_loses_its_digits_in_the_sums_not_the_gate_cumsum():
    """GDN's backward at the steep gate (about -20 per token), every op computed in float64:
    rounding every op's result to float32 reproduces the float32 program's dA_log error; the
    element-wise adds alone (where dG is assembled from the chunk-end gate's +sum and -terms)
    cost most of it, the gate cumsums rounded alike almost nothing (stop 45's finding)."""
    from tools.rounding_attribution import RoundingProbe
    probe = RoundingProbe("gdn", T=200, head_dim=128, g_raw_shift=1.0, chip="sm_90a")
    exact = probe.run(lambda key, node: False)["dA_log"]
    every = probe.run(lambda key, node: True)["dA_log"]
    adds = probe.run(lambda key, node: node.name == "kda.add")["dA_log"]
    cumsums = probe.run(lambda key, node: node.name == "kda.cumsum")["dA_log"]
    assert exact < 1e-9
    assert every > 1e-3
    assert adds > 0.5 * every, (adds, every)
    assert cumsums < 0.05 * every, (cumsums, every)
    assert sum(name == "kda.cumsum" for name, _ in probe.ops().values()) >= 2
