"""Compile time of a new gate: from its file to assembled forward + backward kernels.

    python bench/gate_compile_time.py [GATE_FILE] [--arch sm_90a,sm_100a,sm_120a] [--json OUT]

Cold, all chips: a fresh copy of the gate file under a new name (so no in-process memo or
on-disk cache holds its kernels) is emitted, forward + backward for every chip of ``--arch``, as
``kdagen emit --gates`` does (one pooled backend for all kernels); the seconds of each stage
(passes, lowering to gpu/nvvm, LLVM and ptxas summed over kernels, the pooled backend's wall
time) are printed. Cold, on demand: a second fresh copy through the runtime's compile-on-demand
path for one chip (``--demand-chip``: what a CUDA call with the gate does on first use, into an
empty cache folder). Warm: a new executor (no in-process state) finds those kernels in the
cache. Writes JSON (default bench/results/gate_compile_time.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gate_file", nargs="?", default=str(ROOT / "examples/gates/sq_sigmoid.py"))
    ap.add_argument("--arch", default="sm_90a,sm_100a,sm_120a")
    ap.add_argument("--demand-chip", default="sm_90a")
    ap.add_argument("--json", default=str(ROOT / "bench/results/gate_compile_time.json"))
    args = ap.parse_args(argv)

    from kdagen import compiler_hooks  # noqa: F401  (registers compile-on-demand)
    from kdagen import bundle_writer
    from kdagen.ir.gates import load_gate_file
    from kdagen.runtime.bundle_executor import BundleExecutor

    work = Path(tempfile.mkdtemp(prefix="kdagen-gate-time-"))
    src = Path(args.gate_file).read_text()
    (gate0,) = load_gate_file(args.gate_file)

    def fresh_gate():
        name = f"{gate0.name}_{uuid.uuid4().hex[:8]}"
        path = work / f"{name}.py"
        path.write_text(src.replace(f'"{gate0.name}"', f'"{name}"'))
        t = time.perf_counter()
        (gate,) = load_gate_file(path)
        return gate, time.perf_counter() - t

    from kdagen.emit import emit_programs
    from kdagen.target import get_target
    gate, load_s = fresh_gate()
    timing: dict = {}
    t = time.perf_counter()
    # the gate's fwd + bwd pair, as recorded before emit built the residual pair by default
    emit_programs(work / "emit", [get_target(c) for c in args.arch.split(",")], [gate.family],
                  gate=gate.name, timing=timing, residuals=False)
    cold_all = load_s + time.perf_counter() - t

    # compile on demand (one chip), then warm hits from the cache
    timings = []
    real_write = bundle_writer.write_bundle

    def timed_write(*a, **kw):
        result = real_write(*a, **kw)
        timings.append(result["timing"])
        return result

    bundle_writer.write_bundle = timed_write
    gate2, _ = fresh_gate()
    options = dict(chunk_size=64, head_k_dim=128, head_v_dim=128, gate=gate2.name,
                   gate_digest=gate2.digest)
    cache = work / "cache"
    os.environ.pop("KDAGEN_BUNDLE", None)
    executor = BundleExecutor(cache_dir=cache)
    demand = []
    for program in (f"{gate2.family}_fwd", f"{gate2.family}_bwd"):
        t = time.perf_counter()
        executor.bundle_dir(program, options, args.demand_chip, args.demand_chip)
        demand.append(dict(program=program, cold_s=time.perf_counter() - t,
                           **(timings[-1] if timings else {})))
    bundle_writer.write_bundle = real_write
    warm = BundleExecutor(cache_dir=cache)
    t = time.perf_counter()
    for d in demand:
        warm.bundle_dir(d["program"], options, args.demand_chip, args.demand_chip)
    warm_s = time.perf_counter() - t

    fmt = lambda tm: (f"passes {tm['passes']:.1f} s, lowering {tm['lowering']:.1f} s, LLVM "   # noqa: E731
                      f"{tm['llvm']:.1f} s + ptxas {tm['ptxas']:.1f} s of work in "
                      f"{tm['workers']} workers: {tm['backend_wall']:.1f} s wall")
    print(f"gate {gate0.name} ({args.gate_file}), {os.cpu_count()} CPUs")
    print(f"cold, gate file -> assembled fwd + bwd for {args.arch}: {cold_all:.1f} s "
          f"(load {load_s:.2f} s; {fmt(timing)})")
    for d in demand:
        print(f"cold on demand, {d['program']} for {args.demand_chip}: {d['cold_s']:.1f} s ({fmt(d)})")
    print(f"warm cache hits ({len(demand)} bundles, a new executor): {warm_s:.3f} s")
    out = dict(gate_file=args.gate_file, arch=args.arch, cpus=os.cpu_count(),
               cold_all_chips_s=cold_all, cold_all_chips_stages=timing, on_demand=demand,
               demand_chip=args.demand_chip, warm_hits_s=warm_s)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
