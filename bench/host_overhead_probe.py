"""Where kdagen's end-to-end time goes beyond its kernels: host time per call and the effect of
importing FLA in the same process (the FLA-side columns of `kdagen bench` read 0.15-0.3 ms
above the sum of kdagen's kernels, kdagen-only runs do not).

    python bench/host_overhead_probe.py --bundle DIR [--json out.json]

Prints, per phase (before / after ``import fla.ops.kda``): do_bench median of a KDA forward
(B1_T8k_H16), the host time of one call without synchronising (enqueue only, median of 50)
and the same with ``torch.cuda.synchronize()`` after it."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--json", default="host_overhead.json")
    a = ap.parse_args()
    os.environ["KDAGEN_BUNDLE"] = a.bundle
    import torch

    import kdagen
    from kdagen.benchmark import call, host_enqueue_ms, make_inputs, measure
    x, kw, _ = make_inputs("kda", 1, 8192, 16, 16, None, "cuda")
    fn = kdagen.chunk_kda
    rows = []

    def one_call():
        call(fn, "kda", x, kw, False)

    def phase(label):
        with torch.no_grad():
            for _ in range(3):
                one_call()
            torch.cuda.synchronize()
            ms = measure(one_call)
            enqueue = host_enqueue_ms(one_call, reps=50)
            synced = []
            for _ in range(50):
                torch.cuda.synchronize()
                t = time.perf_counter()
                one_call()
                torch.cuda.synchronize()
                synced.append(time.perf_counter() - t)
        row = {"phase": label, "do_bench_ms": ms, "enqueue_ms": enqueue,
               "call_with_sync_ms": 1e3 * statistics.median(synced)}
        rows.append(row)
        print(json.dumps(row), flush=True)

    phase("kdagen only")
    import fla.ops.kda  # noqa: F401
    phase("after import fla.ops.kda")
    print("\nphase | do_bench ms | enqueue ms | call+sync ms")
    for r in rows:
        print(f"{r['phase']} | {r['do_bench_ms']:.3f} | {r['enqueue_ms']:.3f} | "
              f"{r['call_with_sync_ms']:.3f}")
    with open(a.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
