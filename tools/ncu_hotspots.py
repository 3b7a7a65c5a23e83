"""Where a kernel's warps stall, instruction by instruction, from an Nsight Compute source page.

On the GPU machine::

    ncu --clock-control none -k regex:k3_scan3 -c 1 --section WarpStateStats \\
        --section SourceCounters --page source --print-source sass --csv \\
        python3 bench/one_call.py BUNDLE --grad --calls 1 > k3.csv

then here: ``python -m tools.ncu_hotspots k3.csv [--top 30] [--context 4]``. Prints the SASS
instructions with the most warp-stall samples (share of all samples, the two largest stall
reasons) and, with ``--context``, the instructions before each, which usually name the wait
(an mbarrier try-wait before a branch, a wgmma wait, a load whose result is used). Counts every
warp of the CTA, the producer's too.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--context", type=int, default=0, help="instructions shown before each")
    args = ap.parse_args(argv)
    head, data = read(args.csv)
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
