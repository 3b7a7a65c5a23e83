"""kr's exponent as suffix sums of the gate (kdagen.ir.programs.KR_SUFFIX_SUM_FAMILIES: GDN by
default): the same values, and a backward whose gate gradients keep their digits under a
steep gate."""
import pytest

pytest.importorskip("kdagen._mlir")

from kdagen.ir import programs
from tools.program_precision import errors


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_programs_with_suffix_sums_match_the_reference_in_float64(monkeypatch, family):
    """The forward and its derived backward, through the chip pipeline (the range analysis
    proves the clamped exponent <= 0), equal autograd of the float64 per-token reference."""
    monkeypatch.setattr(programs, "KR_SUFFIX_SUM_FAMILIES", (family,))
    errs = errors(family, T=70, head_dim=64, g_raw_shift=1.0, chip="sm_90a")
    assert max(errs["float64"].values()) < 1e-9, errs["float64"]
    for name in ("dq", "dk", "dv", "dbeta_raw", "dh0"):
        assert errs["float32"][name] < 1e-5, (name, errs["float32"])


def test_suffix_sums_keep_gdn_steep_gate_dA_log_digits_in_float32(monkeypatch):
    """GDN's final backward in float32 at the steep gate (T = 200, K = 128): dA_log and
    ddt_bias lose about 8x less (stop 45: 1.87e-2 -> 2.3e-3), dg_raw ~3x less."""
    monkeypatch.setattr(programs, "KR_SUFFIX_SUM_FAMILIES", ())
    before = errors("gdn", T=200, head_dim=128, g_raw_shift=1.0, chip="sm_90a")["float32"]
    monkeypatch.setattr(programs, "KR_SUFFIX_SUM_FAMILIES", ("gdn",))
    after = errors("gdn", T=200, head_dim=128, g_raw_shift=1.0, chip="sm_90a")["float32"]
    for name in ("dA_log", "ddt_bias"):
        assert after[name] < before[name] / 4, (name, before[name], after[name])
    assert after["dg_raw"] < before["dg_raw"] / 2, (before["dg_raw"], after["dg_raw"])
