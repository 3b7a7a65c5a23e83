"""Where FLA's time goes, kernel by kernel, beside kdagen's per-kernel table (``kdagen bench
--kernels``): the same inputs (kdagen.benchmark.make_inputs), one call of FLA's chunk_kda /
chunk_gated_delta_rule forward (no grad) or forward + backward under torch.profiler, each
CUDA kernel's device time summed over ``--reps`` calls and divided by them.

    python bench/fla_kernel_profile.py [--ops kda] [--configs B1_T8k_H16,...]
        [--modes fwd,fwdbwd] [--reps 10] [--json OUT.json]

Prints one table per (op, config, mode): kernel name (shortened), launches per call, µs per
call, share of the call's kernel time; writes every row to ``--json``. Needs a GPU and
fla-core (the first call of a new shape autotunes FLA's kernels: 1-3 minutes). Timings are
device time of kernels only (no launch gaps); compare them with ``kdagen bench --kernels``
on the same machine.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict


def short_name(name: str) -> str:
    """A kernel's name without template arguments and argument lists."""
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"<.*>", "", name)
    return name[:60]


def profile_call(run, reps: int) -> list[dict]:
    """[{kernel, launches, us, share}] of ``run()``'s CUDA kernels, per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    run()                                   # warm (autotuning, allocation)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    totals, counts = defaultdict(float), defaultdict(int)
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        key = short_name(ev.name)
        totals[key] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        counts[key] += 1
    whole = sum(totals.values()) or 1.0
    rows = [{"kernel": k, "launches": counts[k] / reps, "us": totals[k] / reps,
             "share": totals[k] / whole} for k in totals]
    return sorted(rows, key=lambda r: -r["us"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="kda")
    ap.add_argument("--configs", default="B1_T8k_H16")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="fla_kernels.json")
    args = ap.parse_args(argv)

    import torch

    from kdagen import benchmark as bench
    if not torch.cuda.is_available():
        print("no GPU: nothing to profile", file=sys.stderr)
        return 1
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    for family in args.ops.split(","):
        impls = bench.implementations(family, fla=True)
        if "fla" not in impls:
            print(f"FLA unavailable for {family}", file=sys.stderr)
            return 1
        fn = impls["fla"]
        for config in args.configs.split(","):
            B, T, H, HV, lengths = bench.CONFIGS[config]
            x, kw, _ = bench.make_inputs(family, B, T, H, HV, lengths, "cuda")
            for mode in args.modes.split(","):
                grad = mode == "fwdbwd"

                def run():
                    with torch.set_grad_enabled(grad):
                        bench.call(fn, family, x, kw, grad=grad)
                rows = profile_call(run, args.reps)
                total = sum(r["us"] for r in rows)
                print(f"\nFLA {family} {config} {mode}: {total:.1f} us of kernels per call "
                      f"({out['device']})")
                print(f"{'kernel':60s} {'launches':>8s} {'us':>9s} {'share':>6s}")
                for r in rows:
                    print(f"{r['kernel']:60s} {r['launches']:8.1f} {r['us']:9.1f} "
                          f"{100 * r['share']:5.1f}%")
                    out["rows"].append({"op": family, "config": config, "mode": mode, **r})
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
