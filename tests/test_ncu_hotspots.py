"""tools.ncu_hotspots reads Nsight Compute's SASS source page (CSV): the stall hotspots and, with
--memory, the shared-memory bank conflicts and global sectors per kernel, per opcode and per
instruction (a synthetic page of three instructions)."""
from __future__ import annotations

import csv

from tools import ncu_hotspots as N

HEAD = ["Address", "Source", N.SAMPLES, N.EXECUTED, N.WAVEFRONTS, N.WAVEFRONTS_EXCESS,
        N.CONFLICT_WAYS, N.SECTORS, N.SECTORS_EXCESS, N.SECTORS_IDEAL, "stall_barrier",
        "stall_long_sb", "stall_long_sb (Not Issued)"]
ROWS = [
    ["0x10", "LDS.128 R8, [R21+0x2b800]", "5", "100", "3200", "2800", "32", "0", "0", "0", "0",
     "5", "5"],
    ["0x20", "@!P0 LDS.64 R2, [R4]", "1", "200", "800", "400", "4", "0", "0", "0", "1", "0", "0"],
    ["0x30", "LDG.E R1, [R2.64]", "10", "50", "0", "0", "0", "500", "100", "400", "2", "8", "8"],
]


def _page(tmp_path):
    path = tmp_path / "k.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(HEAD)
        w.writerows(ROWS)
    return N.read(str(path))


def test_memory_totals_opcodes_and_top_instructions(tmp_path):
    head, data = _page(tmp_path)
    m = N.memory(head, data, top=5)
    assert m["shared"] == [4000, 3200]
    assert m["global"] == [500, 100, 400]
    assert m["by_opcode"] == {"LDS.128": [3200, 2800, 100], "LDS.64": [800, 400, 200]}
    assert m["top"] == [(0, 2800), (1, 400)]          # predicated opcodes count as theirs


def test_hotspots_rank_by_samples_with_their_reasons(tmp_path):
    head, data = _page(tmp_path)
    (first, share, why), *_ = N.hotspots(head, data, top=3)
    assert first == 2 and share == 10 / 16
    assert why == [(8.0, "long_sb"), (2.0, "barrier")]


def test_the_command_prints_both_views(tmp_path, capsys):
    path = tmp_path / "k.csv"
    _page(tmp_path)
    assert N.main([str(path), "--memory", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "excess 3,200 (80%" in out and "32-way" in out
    assert N.main([str(path), "--top", "1"]) == 0
    assert "LDG.E" in capsys.readouterr().out
