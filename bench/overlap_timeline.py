"""When each kernel of one kdagen call starts and ends: the timeline that says whether a scan
ran beside the chunk kernel that feeds it (chunk flags, LowerOptions.overlap_order) or waited
for its grid to drain. Per bundle, op and mode: the kernels in launch order, each with its
start and end in microseconds from the call's first event, its duration, and the stream it
ran on (main / side). The median of --reps calls after a warm-up; a table, and JSON with
--json.

    python3 bench/overlap_timeline.py --bundle new2=.bundles/bench_new2 --ops gdn \\
        --modes fwd,fwdbwd --configs B1_T8k_H16 [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics


def timeline(fn, family, x, kw, grad: bool, reps: int) -> list[dict]:
    """[{kernel, start_us, end_us, us}] of one call (the median over ``reps`` calls), times
    from the earliest start event of the call."""
    import torch

    from kdagen.benchmark import call
    from kdagen.runtime.launch import LaunchRecorder
    runs = []
    for _ in range(reps):
        with LaunchRecorder() as rec:
            with torch.enable_grad() if grad else torch.no_grad():
                call(fn, family, x, kw, grad)
        torch.cuda.synchronize()
        zero = rec.records[0].start            # the first launch's start event
        rows = []
        for r in rec.records:
            start = zero.elapsed_time(r.start) * 1e3
            end = zero.elapsed_time(r.end) * 1e3
            rows.append((r.name.split("__")[-1], start, end))
        runs.append(rows)
    out = []
    for i, (name, _, _) in enumerate(runs[0]):
        starts = [run[i][1] for run in runs]
        ends = [run[i][2] for run in runs]
        out.append({"kernel": name, "start_us": statistics.median(starts),
                    "end_us": statistics.median(ends),
                    "us": statistics.median(e - s for s, e in zip(starts, ends))})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", action="append", required=True, metavar="LABEL=DIR")
    ap.add_argument("--ops", default="gdn")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--configs", default="B1_T8k_H16")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    from kdagen.benchmark import ALL_CONFIGS, implementations, make_inputs
    bundles = dict(b.split("=", 1) for b in args.bundle)
    results = []
    for family in args.ops.split(","):
        impls = implementations(family, fla=False, bundles=bundles)
        for cfg in args.configs.split(","):
            B, T, H, HV, lengths = ALL_CONFIGS[cfg]
            x, kw, T = make_inputs(family, B, T or 0, H, HV, lengths, "cuda")
            for mode in args.modes.split(","):
                grad = mode == "fwdbwd"
                for impl, fn in impls.items():
                    try:
                        timeline(fn, family, x, kw, grad, 3)            # warm-up
                        rows = timeline(fn, family, x, kw, grad, args.reps)
                    except Exception as err:       # a bundle without this op: say so, go on
                        print(f"{impl} {family} {cfg} {mode}: {type(err).__name__}: "
                              f"{str(err)[:160]}")
                        continue
                    total = max(r["end_us"] for r in rows)
                    print(f"\n{impl} {family} {cfg} {mode}: {total:.1f} us from the first "
                          "launch to the last kernel's end")
                    print(f"  {'kernel':24s} {'start':>8s} {'end':>8s} {'us':>8s}")
                    for r in rows:
                        print(f"  {r['kernel']:24s} {r['start_us']:8.1f} {r['end_us']:8.1f} "
                              f"{r['us']:8.1f}")
                    results.append({"impl": impl, "op": family, "config": cfg, "mode": mode,
                                    "total_us": total, "kernels": rows,
                                    "device": torch.cuda.get_device_name()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
