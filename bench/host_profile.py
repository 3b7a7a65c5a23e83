"""Where kdagen's host time per call goes: cProfile over many calls of one benchmark case.

    python bench/host_profile.py --bundle DIR [--op kda] [--mode fwd|fwdbwd] [--calls 200]
                                 [--top 30] [--json out.json]

Runs ``--calls`` calls of ``kdagen.chunk_kda`` (or the GDN op) on the B1_T8k_H16 inputs after a
warm-up, under cProfile, with a synchronize every 10 calls (the caching allocator and the
launch queue stay in their steady state). Prints the functions with the most own time and the
most cumulative time, per call in µs, and the host enqueue time of one call without profiling
(median of 50, kdagen.benchmark.host_enqueue_ms); ``--json`` writes both lists."""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats


def _rows(stats: pstats.Stats, key: str, top: int, calls: int) -> list[dict]:
    entries = []
    for (path, line, func), (cc, nc, tt, ct, _) in stats.stats.items():
        entries.append({"function": f"{os.path.basename(path)}:{line}({func})",
                        "calls_per_call": nc / calls, "own_us": 1e6 * tt / calls,
                        "cumulative_us": 1e6 * ct / calls})
    entries.sort(key=lambda e: -e[key])
    return entries[:top]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--op", default="kda", choices=["kda", "gdn"])
    ap.add_argument("--mode", default="fwd", choices=["fwd", "fwdbwd"])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5,
                    help="unprofiled calls first (0 with --calls 1: one call, e.g. under ncu)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--head-dim", type=int, default=128,
                    help="K = V (the bundle must hold it: emit_bench_bundle.py --head-dim); at "
                         "256 the call runs in value parts")
    a = ap.parse_args(argv)
    os.environ["KDAGEN_BUNDLE"] = a.bundle
    import torch

    from kdagen.benchmark import call, host_enqueue_ms, implementations, make_inputs
    x, kw, _ = make_inputs(a.op, 1, 8192, 16, 16, None, "cuda", head_dim=a.head_dim)
    fn = implementations(a.op, fla=False)["kdagen"]
    grad = a.mode == "fwdbwd"

    def one_call():
        with torch.set_grad_enabled(grad):
            call(fn, a.op, x, kw, grad)

    for _ in range(a.warmup):
        one_call()
    torch.cuda.synchronize()
    from kdagen.runtime import tensormap
    # older trees (A/B against an earlier commit) have no counters: report zeros there
    counts = getattr(tensormap, "counts", lambda: {"encoded": 0, "copied": 0})
    before = counts()
    enqueue = host_enqueue_ms(one_call, reps=50)
    after = counts()
    made = {k: (after[k] - before[k]) / 50 for k in after}
    prof = cProfile.Profile()
    prof.enable()
    for i in range(a.calls):
        one_call()
        if i % 10 == 9:
            torch.cuda.synchronize()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    own = _rows(stats, "own_us", a.top, a.calls)
    cumulative = _rows(stats, "cumulative_us", a.top, a.calls)
    print(f"{a.op} {a.mode}: host enqueue {enqueue:.3f} ms per call (unprofiled, median of 50); "
          f"tensor maps encoded per call {made['encoded']:.2f}, copied to the device "
          f"{made['copied']:.2f}; under cProfile, per call:")
    for title, rows in (("own time", own), ("cumulative time", cumulative)):
        print(f"\n-- most {title} --\n{'own us':>9} {'cum us':>9} {'calls':>7}  function")
        for r in rows:
            print(f"{r['own_us']:9.1f} {r['cumulative_us']:9.1f} {r['calls_per_call']:7.1f}  "
                  f"{r['function']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "op": a.op, "mode": a.mode,
                       "enqueue_ms": enqueue, "tensor_maps_per_call": made, "own": own,
                       "cumulative": cumulative}, f, indent=1)


if __name__ == "__main__":
    main()
