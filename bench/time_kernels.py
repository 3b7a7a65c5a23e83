"""Time each kernel of one kdagen KDA forward call from a bundle, on the GPU (torch.profiler,
CUPTI kernel records), and the state-scan kernels per chunk step.

    KDAGEN_BUNDLE=DIR python bench/time_kernels.py [--config B1_T8k_H16] [--reps 5]

Inputs are those of the benchmark (kdagen.benchmark.make_inputs: K = V = 128, bf16). Prints one
line per kernel: mean µs per call over ``--reps`` calls after a warm-up call, and, for a
kernel whose manifest entry launches one CTA per (head, sequence) (grid z = 1: a state scan),
µs / number of chunks. Compare with the static estimate in the manifest's ``cost`` entry.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="B1_T8k_H16")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kdagen
    from kdagen import benchmark as bf
    bundle = Path(os.environ["KDAGEN_BUNDLE"])
    manifest = {k["name"]: k for k in json.loads((bundle / "manifest.json").read_text())["kernels"]}
    B, T, H, HV, lengths = bf.CONFIGS[args.config]
    x, kw, T = bf.make_inputs("kda", B, T, H, HV, lengths, "cuda")
    chunks = math.ceil(T / bf.CHUNK)
    with torch.no_grad():
        bf.call(kdagen.chunk_kda, "kda", x, kw, False)          # load the module, warm up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.reps):
                bf.call(kdagen.chunk_kda, "kda", x, kw, False)
            torch.cuda.synchronize()
    print(f"device {torch.cuda.get_device_name()}, config {args.config}, {chunks} chunks per "
          f"sequence, {args.reps} calls")
    for evt in prof.key_averages():
        if evt.device_type.name != "CUDA" or evt.count == 0:
            continue
        us = evt.device_time_total / evt.count
        entry = manifest.get(evt.key)
        line = f"{evt.key}: {us:.1f} us per call ({evt.count} calls)"
        if entry is not None:
            serial = entry["launch"]["grid"][2] in ("1", 1)
            est = (entry.get("cost") or {}).get("estimate", {}).get("us")
            if serial:
                line += f"; {us / chunks:.2f} us per chunk step"
            if est is not None:
                line += f"; static estimate {est} us per {entry['cost']['unit']}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
