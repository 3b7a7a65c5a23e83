"""tools.sim_check: the GPU check's cases run in the CPU simulator of a program's kernels."""
import pytest

pytest.importorskip("kdagen._mlir")

from tools import sim_check  # noqa: E402


def test_lists_the_gpu_check_cases():
    from tools.scan_precision_probe import SimulatedProgram
    sim = SimulatedProgram("gdn_bwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_softplus"),
                           "auto", "sm_90a")
    assert "B1_T200 correlated steep" in sim.labels and "B2_T1" in sim.labels
    with pytest.raises(ValueError, match="not one of gdn_bwd's GPU-check cases"):
        sim.run("no such case")


def test_one_case_prints_every_gradient_against_bar_and_goal(capsys):
    assert sim_check.main(["gdn_bwd", "--head-dim", "64", "--case", "B2_T1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("B2_T1")]
    assert sorted(r[1] for r in rows) == sorted(
        ["dq", "dk", "dv", "dg_raw", "dbeta_raw", "dA_log", "ddt_bias", "dh0"])
    for r in rows:
        err, bar, floor, goal = map(float, r[2:6])
        assert 0 < err <= bar and goal in (1e-3, 2e-3), r
        # every output is ok, or over its goal but still under the GPU check's bar
        assert " ".join(r[6:]) in ("ok", "over goal"), r


def test_unknown_case_is_an_error(capsys):
    assert sim_check.main(["kda_bwd", "--head-dim", "64", "--case", "no such case"]) == 1
    assert "no case of kda_bwd matches" in capsys.readouterr().err
