"""tools.rounding_attribution: which op's float32 rounding costs a gradient its digits."""
import pytest

pytest.importorskip("kdagen._mlir")


def test_gdn_steep_gate_dA_log_loses_its_digits_in_the_sums_not_the_gate_cumsum(monkeypatch):
    """GDN's backward at the steep gate (about -20 per token), every op computed in float64,
    with kr's exponent as the difference Γ_C − Γ (the formulation before stop 46): rounding
    every op's result to float32 reproduces the float32 program's dA_log error; the
    element-wise adds alone (where dG is assembled from the chunk-end gate's +sum and -terms)
    cost most of it, the gate cumsums rounded alike almost nothing (stop 45's finding; the
    pipeline as it was then, without kda-narrow-reductions)."""
    from kdagen.ir import programs
    from kdagen.passes import pipelines
    from tools.rounding_attribution import RoundingProbe
    monkeypatch.setattr(programs, "KR_SUFFIX_SUM_FAMILIES", ())
    monkeypatch.setitem(pipelines.PIPELINES, "sm_90a", [
        p for p in pipelines.PIPELINES["sm_90a"] if p != "kda-narrow-reductions"])
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


def test_gdn_default_formulation_keeps_the_adds_digits():
    """With GDN's default formulation (kr from suffix sums, the adjoint cumsums narrowed to
    [C] by kda-narrow-reductions) the adds no longer cost dA_log its digits, and every op
    rounded costs several times less than the difference form's 1.9e-2."""
    from tools.rounding_attribution import RoundingProbe
    probe = RoundingProbe("gdn", T=200, head_dim=128, g_raw_shift=1.0, chip="sm_90a")
    every = probe.run(lambda key, node: True)["dA_log"]
    adds = probe.run(lambda key, node: node.name == "kda.add")["dA_log"]
    assert every < 5e-3, every
    assert adds < 1e-4, adds
