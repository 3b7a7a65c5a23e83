"""Chunk-ready flags on the GPU: a call with the register scans overlapped (each beside the
chunk kernel that feeds it, kdagen.codegen.lower.chunk_flags) must give the same bits as the
same kernels launched in order on one stream (KDAGEN_OVERLAP=0's path). A scan that read a
chunk before its flag ordered the chunk kernel's stores would differ. Forward and backward,
KDA and GDN, repeated, at the bundle's configs; prints one line per case and exits 1 on a
mismatch.

    KDAGEN_BUNDLE=.bundles/bench python3 bench/overlap_determinism.py [--configs B1_T8k_H16]
"""
from __future__ import annotations

import argparse
import sys


def run(family, cfg, overlap: bool, reps: int):
    import torch

    import kdagen
    from kdagen.benchmark import CONFIGS, make_inputs
    from kdagen.runtime import launch as L
    L.OVERLAP = overlap
    B, T, H, HV, lengths = CONFIGS[cfg]
    outs = []
    for _ in range(reps):
        torch.manual_seed(1)        # make_inputs draws A_log and dt_bias from the global RNG
        x, kw, _ = make_inputs(family, B, T, H, HV, lengths, "cuda", seed=1)
        x = {n: t.requires_grad_(True) for n, t in x.items()}
        fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
        o, ht = fn(**x, **kw)
        (o.float().square().mean() + ht.square().mean()).backward()
        torch.cuda.synchronize()
        outs.append({"o": o.detach(), "ht": ht.detach(),
                     **{f"d{n}": x[n].grad for n in sorted(x)}})
    return outs


def compare(ref: dict, got: dict) -> tuple[bool, str]:
    same = all(bool((ref[k] == got[k]).all()) for k in ref)
    worst = {k: float((ref[k].float() - got[k].float()).abs().max()) for k in ref}
    bad = ", ".join(f"{k} {v:.3g}" for k, v in worst.items() if v > 0)
    return same, bad or "none"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="B1_T8k_H16")
    ap.add_argument("--ops", default="kda,gdn")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args(argv)
    bad = 0
    for family in a.ops.split(","):
        for cfg in a.configs.split(","):
            ref, *again = run(family, cfg, False, 2)
            # the kernels' own run-to-run bits first: overlap can only be judged against them
            for i, got in enumerate(again):
                same, diffs = compare(ref, got)
                print(f"{family} {cfg} in-order run {i + 1}: "
                      f"{'bitwise equal' if same else 'DIFFERS'} to in-order run 0 "
                      f"(max abs diff: {diffs})")
            for i, got in enumerate(run(family, cfg, True, a.reps)):
                same, diffs = compare(ref, got)
                bad += not same
                print(f"{family} {cfg} overlapped run {i}: "
                      f"{'bitwise equal' if same else 'DIFFERS'} to in order "
                      f"(max abs diff: {diffs})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
