"""kdagen's decode step against FLA's, at serving batch sizes, beside the bandwidth the states need.

    python bench/decode_bench.py --emit .bundles/decode          # here (no GPU): the bundle
    KDAGEN_BUNDLE=.bundles/decode python bench/decode_bench.py --json bench/results/NAME.json

One token per sequence (T = 1), K = V = 128, an fp32 state pool updated in place through
``ssm_state_indices`` (kdagen: ``kdagen.fused_recurrent_kda`` / ``fused_recurrent_gated_delta_rule``;
FLA: ``fused_recurrent_kda_fwd`` / ``fused_recurrent_gated_delta_rule``, as
bench/fla_decode_probe.py calls them), the same inputs in one process. Each call is captured
in a CUDA graph and replayed (servers capture decode), timed by
``triton.testing.do_bench_cudagraph``; "state GB/s" counts the states read once and written
once, "copy" a device copy of those bytes (the practical ceiling). Prints a table, writes JSON.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fla_decode_probe import (_call as fla_call, _inputs, add_size_arguments,  # noqa: E402
                              state_copy, write_json)


def kdagen_call(op: str, x, indices):
    import kdagen
    q, k, v, g, beta, state = x
    fn = kdagen.fused_recurrent_kda if op == "kda" else kdagen.fused_recurrent_gated_delta_rule
    return lambda: fn(q, k, v, g=g, beta=beta, initial_state=state, ssm_state_indices=indices,
                      inplace_final_state=True)


def emit(out_dir: str, heads, head_dim: int) -> None:
    """The decode variants the benchmark calls, recorded on the CPU and written as a bundle."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from gpu_bundle import write_variants_bundle

    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        for op in ("kda", "gdn"):
            for HV in heads:
                # a small and a large batch: kdagen.decode.value_split differs between them
                for N in (2, 64):
                    x = _inputs(op, N, HV, head_dim, torch.device("cpu"))
                    kdagen_call(op, x, torch.arange(N))()
    write_variants_bundle(rec.variants(), out_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(ap)
    ap.add_argument("--emit", default=None, metavar="DIR",
                    help="write the bundle of the variants this benchmark uses (no GPU needed)")
    ap.add_argument("--value-split", type=int, default=None,
                    help="force kdagen.decode.VALUE_SPLIT for this run (an ablation; emit the "
                         "bundle with the same value)")
    args = ap.parse_args(argv)
    import kdagen.decode
    if args.value_split is not None:
        kdagen.decode.VALUE_SPLIT = args.value_split
    heads = [int(h) for h in args.heads.split(",")]
    if args.emit:
        emit(args.emit, heads, args.head_dim)
        return 0
    from triton.testing import do_bench_cudagraph
    dev = torch.device("cuda")
    K = args.head_dim
    rows = []
    print(f"{'op':4s} {'N':>4s} {'HV':>3s} {'P':>2s}  {'kdagen us':>9s} {'FLA us':>8s} "
          f"{'copy us':>8s}  {'kdagen GB/s':>11s} {'% copy':>6s}  {'FLA/kdagen':>10s}")
    for op in ("kda", "gdn"):
        for HV in heads:
            for N in map(int, args.batches.split(",")):
                x = _inputs(op, N, HV, K, dev)
                indices = torch.arange(N, device=dev, dtype=torch.int64)
                times = {}
                for name, make in (("kdagen", kdagen_call), ("fla", fla_call)):
                    fn = make(op, x, indices)
                    fn()                               # load / compile outside the capture
                    torch.cuda.synchronize()
                    times[name] = do_bench_cudagraph(fn, rep=200) * 1e3
                nbytes, copy_us = state_copy(x[5])
                r = dict(op=op, N=N, HV=HV, K=K, value_split=kdagen.decode.value_split(N, HV, K),
                         kdagen_us=times["kdagen"], fla_us=times["fla"],
                         copy_us=copy_us, state_MB=nbytes / 1e6,
                         kdagen_GBps=nbytes / times["kdagen"] / 1e3,
                         kdagen_pct_of_copy=100 * copy_us / times["kdagen"],
                         ratio_fla_over_kdagen=times["fla"] / times["kdagen"])
                rows.append(r)
                print(f"{op:4s} {N:4d} {HV:3d} {r['value_split']:2d}  {r['kdagen_us']:9.2f} "
                      f"{r['fla_us']:8.2f} "
                      f"{copy_us:8.2f}  {r['kdagen_GBps']:11.0f} {r['kdagen_pct_of_copy']:6.1f}  "
                      f"{r['ratio_fla_over_kdagen']:10.3f}", flush=True)
                if args.json:                  # after each row: a cut-short run keeps its rows
                    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
