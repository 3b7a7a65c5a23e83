"""One kdagen call of a benchmark config (for profilers such as ncu on the GPU machine):

    python bench/one_call.py BUNDLE [--config B1_T8k_H16] [--op kda] [--grad] [--calls 2]

Runs ``--calls`` forward (or forward + backward with ``--grad``) calls from the bundle and
synchronises; prints nothing but the config."""
from __future__ import annotations

import argparse
import os


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--config", default="B1_T8k_H16")
    ap.add_argument("--op", default="kda")
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args()
    os.environ["KDAGEN_BUNDLE"] = args.bundle
    import torch

    from kdagen import benchmark as bench
    B, T, H, HV, lengths = bench.CONFIGS[args.config]
    x, kw, _ = bench.make_inputs(args.op, B, T, H, HV, lengths, "cuda")
    fn = bench.implementations(args.op, fla=False)["kdagen"]
    for _ in range(args.calls):
        with torch.enable_grad() if args.grad else torch.no_grad():
            bench.call(fn, args.op, x, kw, grad=args.grad)
    torch.cuda.synchronize()
    print(args.op, args.config, "grad" if args.grad else "fwd")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
