"""kdagen's decode step against FLA's, at serving batch sizes, beside the bandwidth the states need.

    python bench/decode_bench.py --emit .bundles/decode          # here (no GPU): the bundle
    KDAGEN_BUNDLE=.bundles/decode python bench/decode_bench.py --json bench/results/NAME.json

One token per sequence (T = 1), K = V = 128, a state pool updated in place through
``ssm_state_indices`` (kdagen: ``kdagen.fused_recurrent_kda`` / ``fused_recurrent_gated_delta_rule``;
FLA: ``fused_recurrent_kda_fwd`` / ``fused_recurrent_gated_delta_rule``, as
bench/fla_decode_probe.py calls them), the same inputs in one process. Each call is captured
in a CUDA graph and replayed (servers capture decode), timed by
``triton.testing.do_bench_cudagraph``; "state GB/s" counts the states read once and written
once, "copy" a device copy of those bytes (the practical ceiling). ``--state`` picks how
kdagen's pool is stored (fp32 by default; bf16 and/or value-first [slots, HV, V, K]). Prints a
table, writes JSON.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fla_decode_probe import (_call as fla_call, _inputs, add_size_arguments,  # noqa: E402
                              state_copy, write_json)


#: --state: how the pool kdagen indexes is stored (dtype, value-first [slots, HV, V, K])
STATES = {"fp32": (torch.float32, False), "bf16": (torch.bfloat16, False),
          "fp32-vfirst": (torch.float32, True), "bf16-vfirst": (torch.bfloat16, True)}


def stored(x, state: str):
    """The inputs with the pool stored as ``state`` says (STATES)."""
    dtype, v_first = STATES[state]
    pool = x[5].transpose(-1, -2) if v_first else x[5]
    return (*x[:5], pool.to(dtype).contiguous())


def kdagen_call(op: str, x, indices, state: str = "fp32"):
    import kdagen
    q, k, v, g, beta, pool = stored(x, state)
    fn = kdagen.fused_recurrent_kda if op == "kda" else kdagen.fused_recurrent_gated_delta_rule
    return lambda: fn(q, k, v, g=g, beta=beta, initial_state=pool, ssm_state_indices=indices,
                      inplace_final_state=True, state_v_first=STATES[state][1])


def emit(out_dir: str, heads, head_dim: int, states=("fp32",)) -> None:
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
                    for state in states:
                        kdagen_call(op, x, torch.arange(N), state)()
    write_variants_bundle(rec.variants(), out_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(ap)
    ap.add_argument("--emit", default=None, metavar="DIR",
                    help="write the bundle of the variants this benchmark uses (no GPU needed)")
    ap.add_argument("--value-split", type=int, default=None,
                    help="force kdagen.decode.VALUE_SPLIT for this run (an ablation; emit the "
                         "bundle with the same value)")
    ap.add_argument("--state", default="fp32",
                    help="how kdagen's pool is stored, one or several (comma-separated) of "
                         f"{', '.join(STATES)}; FLA's pool is fp32 [K, V] for the vfirst ones "
                         "(its fused_recurrent_kda_fwd has no value-first layout) and bf16 "
                         "for bf16")
    args = ap.parse_args(argv)
    states = args.state.split(",")
    for st in states:
        if st not in STATES:
            ap.error(f"--state: {st!r} is not one of {', '.join(STATES)}")
    import kdagen.decode
    if args.value_split is not None:
        kdagen.decode.VALUE_SPLIT = args.value_split
    heads = [int(h) for h in args.heads.split(",")]
    if args.emit:
        emit(args.emit, heads, args.head_dim, states)
        return 0
    from triton.testing import do_bench_cudagraph
    dev = torch.device("cuda")
    K = args.head_dim
    rows = []
    print(f"{'op':4s} {'state':11s} {'N':>4s} {'HV':>3s} {'P':>2s}  {'kdagen us':>9s} "
          f"{'FLA us':>8s} {'copy us':>8s}  {'kdagen GB/s':>11s} {'% copy':>6s}  "
          f"{'FLA/kdagen':>10s}")
    for op, state in ((op, st) for op in ("kda", "gdn") for st in states):
        for HV in heads:
            for N in map(int, args.batches.split(",")):
                x = _inputs(op, N, HV, K, dev)
                indices = torch.arange(N, device=dev, dtype=torch.int64)
                fla_x = (*x[:5], x[5].to(STATES[state][0]))
                times = {}
                for name, fn in (("kdagen", kdagen_call(op, x, indices, state)),
                                 ("fla", fla_call(op, fla_x, indices))):
                    try:
                        fn()                           # load / compile outside the capture
                        torch.cuda.synchronize()
                        times[name] = do_bench_cudagraph(fn, rep=200) * 1e3
                    except Exception as exc:  # noqa: BLE001  (FLA may not take this pool)
                        if name == "kdagen":
                            raise
                        print(f"  fla: {type(exc).__name__}: {str(exc)[:120]}")
                        times[name] = float("nan")
                nbytes, copy_us = state_copy(stored(x, state)[5])
                r = dict(op=op, state=state, N=N, HV=HV, K=K,
                         value_split=kdagen.decode.value_split(N, HV, K),
                         kdagen_us=times["kdagen"], fla_us=times["fla"],
                         copy_us=copy_us, state_MB=nbytes / 1e6,
                         kdagen_GBps=nbytes / times["kdagen"] / 1e3,
                         kdagen_pct_of_copy=100 * copy_us / times["kdagen"],
                         ratio_fla_over_kdagen=times["fla"] / times["kdagen"])
                rows.append(r)
                print(f"{op:4s} {state:11s} {N:4d} {HV:3d} {r['value_split']:2d}  "
                      f"{r['kdagen_us']:9.2f} "
                      f"{r['fla_us']:8.2f} "
                      f"{copy_us:8.2f}  {r['kdagen_GBps']:11.0f} {r['kdagen_pct_of_copy']:6.1f}  "
                      f"{r['ratio_fla_over_kdagen']:10.3f}", flush=True)
                if args.json:                  # after each row: a cut-short run keeps its rows
                    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
