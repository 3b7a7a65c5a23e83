"""What sm_120a runs, checked for accuracy in the CPU simulator of its kernels (the GPU
check's first quick case of kda_bwd at K = 64): with bf16 workspaces dA_log was 8.9e-3 against
its bar of 8e-3; the chip's fp32 workspaces bring every output to sm_100a's error."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("chip", ["sm_120a"])
def test_kda_backward_gate_gradients_within_their_bars(chip):
    pytest.importorskip("kdagen._mlir")
    from tools.scan_precision_probe import SimulatedProgram
    sim = SimulatedProgram("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus"),
                           "auto", chip, quick=True)
    rows = {r["tensor"]: r for r in sim.run(sim.labels[0])}
    assert rows["dA_log"]["err"] < 4e-3, rows["dA_log"]          # 8.9e-3 with bf16 workspaces
    for name in ("dq", "dk", "dv", "dg_raw", "dbeta_raw"):
        r = rows[name]
        assert r["err"] <= max(2e-3, 1.1 * r["floor"]), (name, r["err"], r["floor"])
