"""bench/pick_kernel_options.py: per-kernel winners of a lowering-option A/B from a
``kdagen bench --kernels`` JSON, on a synthetic table: kernels matched across implementations
by program, head dims and kernel label; only gains at or above the threshold, on kernels above
the noise floor, become candidate tuning-table lines with their options and measurement."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import pick_kernel_options as pick  # noqa: E402


def _row(impl, name, us, mode="fwdbwd"):
    return dict(impl=f"kdagen_{impl}", op="kda", config="B1_T8k_H16", mode=mode, kernel=name,
                us=us)


K4 = "kda_bwd_K128V128C64_softplus_r1_a64beef2__k4_scan4"
K2 = "kda_bwd_K128V128C64_softplus_r1_a64beef2__k2_scan2"
TINY = "kda_bwd_K128V128C64_softplus_r1_a64beef2__k7_sum_seqs_dA_log"
FWD = "kda_fwd_K64V64C64_softplus_r1_0000__k2_scan2"


def test_winners_are_the_kernels_a_label_speeds_by_the_threshold(tmp_path, capsys):
    rows = [_row("base", K4, 1866.0), _row("lb2", K4, 1707.0),
            _row("base", K2, 953.0), _row("lb2", K2, 1047.0),
            _row("base", TINY, 4.0), _row("lb2", TINY, 3.0),
            _row("base", FWD, 100.0, "fwd"), _row("base", FWD, 110.0, "fwdbwd"),
            _row("lb2", FWD, 104.0, "fwd")]
    times = pick.kernel_times(rows)
    assert times[("kda_bwd", (128, 128), "k4_scan4")] == {"base": 1866.0, "lb2": 1707.0}
    assert times[("kda_fwd", (64, 64), "k2_scan2")]["base"] == 110.0      # its slowest mode
    found = pick.winners(times, "base", 3.0)
    assert [(w["program"], w["kernel"], w["label"]) for w in found] == \
        [("kda_bwd", "k4_scan4", "lb2"), ("kda_fwd", "k2_scan2", "lb2")]
    assert round(found[0]["gain_pct"], 1) == 8.5
    assert pick.winners(times, "base", 9.0) == []
    path = tmp_path / "ab.json"
    path.write_text(json.dumps({"device": "NVIDIA H100", "kernels": rows}))
    assert pick.main([str(path), "--baseline", "base", "--options",
                      "lb2=load_batch=2"]) == 0
    out = capsys.readouterr().out
    assert ("TunedKernel('sm_90a', 'sm90-native', 'kda_bwd', (128, 128), 'k4_scan4', "
            "(('load_batch', 2),), 'NVIDIA H100: 1866 -> 1707 us") in out
    assert "k7_sum_seqs_dA_log'," not in out


def test_options_parse_and_refuse_what_they_cannot_read():
    assert pick.parse_options(["lb2=load_batch=2,remat_ops=0", "s2=staging_buffers=auto"]) == \
        {"lb2": (("load_batch", 2), ("remat_ops", 0)), "s2": (("staging_buffers", "auto"),)}
    import pytest
    with pytest.raises(ValueError, match="LABEL=NAME=VALUE"):
        pick.parse_options(["lb2=load_batch"])
