"""Where a kernel's warps stall, instruction by instruction, from an Nsight Compute source page.

On the GPU machine::

    ncu --clock-control none -k regex:k3_scan3 -c 1 --section WarpStateStats \\
        --section SourceCounters --page source --print-source sass --csv \\
        python3 bench/one_call.py BUNDLE --grad --calls 1 > k3.csv

then here: ``python -m tools.ncu_hotspots k3.csv [--top 30] [--context 4] [--memory]``. Prints the SASS
instructions with the most warp-stall samples (share of all samples, the two largest stall
reasons) and, with ``--context``, the instructions before each, which usually name the wait
(an mbarrier try-wait before a branch, a wgmma wait, a load whose result is used). Counts every
warp of the CTA, the producer's too. ``--memory``: instead, the kernel's shared-memory wavefronts
and global sectors (each with what ncu counts as excess: bank conflicts, uncoalesced sectors), the
same per opcode (LDS.64, STS, ...), and the instructions with the most excess shared wavefronts
(their N-way conflict and executions); the ideal global sectors, times 32 bytes over the CTAs,
are what the cost report's "global traffic" predicts.
"""
from __future__ import annotations

import argparse
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read(path: str) -> tuple[list, list]:
    """(header, rows) of the SASS table in an ncu ``--page source --csv`` file."""
    rows = list(csv.reader(open(path, newline="")))
    at = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if at is None:
        raise SystemExit(f"{path}: no 'Address' header; was it written with --page source --csv?")
    head = rows[at]
    return head, [r for r in rows[at + 1:] if len(r) == len(head)]


def hotspots(head: list, data: list, top: int) -> list:
    """[(index, share of samples, [(count, reason)...])] of the ``top`` most sampled lines."""
    col = head.index(SAMPLES)
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(float(r[col] or 0) for r in data) or 1.0
    order = sorted(range(len(data)), key=lambda i: -float(data[i][col] or 0))[:top]
    out = []
    for i in order:
        why = sorted(((float(data[i][head.index(x)] or 0), x[len("stall_"):]) for x in reasons),
                     reverse=True)
        out.append((i, float(data[i][col] or 0) / total, [w for w in why[:2] if w[0] > 0]))
    return out


WAVEFRONTS, WAVEFRONTS_EXCESS = "L1 Wavefronts Shared", "L1 Wavefronts Shared Excessive"
SECTORS, SECTORS_EXCESS, SECTORS_IDEAL = ("L2 Theoretical Sectors Global",
                                          "L2 Theoretical Sectors Global Excessive",
                                          "L2 Theoretical Sectors Global Ideal")
CONFLICT_WAYS = "L1 Conflicts Shared N-Way"


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def memory(head: list, data: list, top: int) -> dict:
    """Shared wavefronts and global sectors of the kernel ({"shared": [all, excess], "global":
    [all, excess, ideal]}), per opcode ({"by_opcode": {op: [wavefronts, excess, executed]}})
    and the ``top`` instructions by excess wavefronts ({"top": [(index, excess)]})."""
    col = {name: head.index(name) for name in (WAVEFRONTS, WAVEFRONTS_EXCESS, SECTORS,
                                               SECTORS_EXCESS, SECTORS_IDEAL, EXECUTED)}
    src = head.index("Source")
    out = {"shared": [0.0, 0.0], "global": [0.0, 0.0, 0.0], "by_opcode": {}}
    for r in data:
        wf, wx = _num(r[col[WAVEFRONTS]]), _num(r[col[WAVEFRONTS_EXCESS]])
        out["shared"][0] += wf
        out["shared"][1] += wx
        for k, name in enumerate((SECTORS, SECTORS_EXCESS, SECTORS_IDEAL)):
            out["global"][k] += _num(r[col[name]])
        words = r[src].split()
        words = words[1:] if words and words[0].startswith("@") else words
        if words and (wf or wx):
            tally = out["by_opcode"].setdefault(words[0], [0.0, 0.0, 0.0])
            tally[0] += wf
            tally[1] += wx
            tally[2] += _num(r[col[EXECUTED]])
    order = sorted(range(len(data)), key=lambda i: -_num(data[i][col[WAVEFRONTS_EXCESS]]))
    out["top"] = [(i, _num(data[i][col[WAVEFRONTS_EXCESS]])) for i in order[:top]
                  if _num(data[i][col[WAVEFRONTS_EXCESS]]) > 0]
    return out


def _print_memory(head: list, data: list, top: int) -> None:
    m = memory(head, data, top)
    (wf, wx), (gs, gx, gi) = m["shared"], m["global"]
    print(f"shared wavefronts {wf:,.0f}, excess {wx:,.0f} ({100 * wx / max(wf, 1):.0f}%: bank "
          f"conflicts); global sectors {gs:,.0f}, excess {gx:,.0f}, ideal {gi:,.0f} "
          f"({gi * 32 / 1024:,.0f} KiB; over the CTAs: the cost report's global traffic)")
    print("per opcode: wavefronts, excess, executed")
    for op, (w, x, n) in sorted(m["by_opcode"].items(), key=lambda kv: -kv[1][1]):
        print(f"  {op:14s} {w:14,.0f} {x:14,.0f} {n:12,.0f}")
    src, ways, executed = head.index("Source"), head.index(CONFLICT_WAYS), head.index(EXECUTED)
    print(f"top {len(m['top'])} instructions by excess shared wavefronts:")
    for i, x in m["top"]:
        print(f"  {x:12,.0f} {data[i][ways]:>4s}-way x{data[i][executed]:<9s} {data[i][src][:70]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--context", type=int, default=0, help="instructions shown before each")
    ap.add_argument("--memory", action="store_true",
                    help="shared-memory bank conflicts and global sectors instead of stalls")
    args = ap.parse_args(argv)
    head, data = read(args.csv)
    if args.memory:
        _print_memory(head, data, args.top)
        return 0
    src, executed = head.index("Source"), head.index(EXECUTED)
    print(f"{len(data)} SASS instructions; share of warp-stall samples, top {args.top}:")
    for i, share, why in hotspots(head, data, args.top):
        for j in range(max(0, i - args.context), i):
            print(f"{'':8s} {'':6s} {data[j][src][:76]}")
        reasons = " ".join(f"{name}={int(n)}" for n, name in why)
        print(f"{data[i][0][-6:]:>8s} {share * 100:5.1f}% {data[i][src][:76]:76s} "
              f"x{data[i][executed]} {reasons}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
