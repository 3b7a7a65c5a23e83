"""Shared-memory bank conflicts of a program's tile kernels, counted in the CPU simulator.

``python -m tools.smem_banks kda_fwd [--pad 1 --pad 4] [--threads 256] [--top 12]``

Runs the chip pipeline's kernels (sm_90a by default) for one chunk of one head in the lockstep
simulator (:func:`kdagen.codegen.lower.sim.simulate` with ``banks``) and prints, per kernel
and per op of the program, the warp-level shared-memory requests and the wavefronts they take
(a request whose lanes hit one bank with k distinct words takes k wavefronts; the shared
memory serves one wavefront a cycle). ``--pad`` compares row paddings of the tile buffers
(``LowerOptions.smem_row_pad``). The tile emitters are those of the portable path with
``--threads`` threads (256: the sm_90a chunk kernels' two consumer warpgroups); the sm_90a
path's wgmma staging and TMA ring are not modelled. What it counts is the emitted code's
access pattern, not a measurement.
"""
from __future__ import annotations

import argparse

import torch

from kdagen.codegen.lower.options import LowerOptions
from kdagen.codegen.lower.sim import simulate
from kdagen.driver import build_module
from kdagen.ir.testing import make_case


def program_inputs(program: str, K: int, seed: int = 0) -> tuple[dict, dict]:
    """(program options, bf16-representable inputs) for one chunk of one head."""
    family = program.split("_")[0]
    case = make_case(family, K=K, V=K, T=64, seed=seed)
    x = {k: (v.to(torch.bfloat16).to(torch.float64) if isinstance(v, torch.Tensor)
             and v.is_floating_point() and k not in ("A_log", "dt_bias", "initial_state")
             else v) for k, v in case.inputs.items()}
    if program.endswith("_bwd"):
        gen = torch.Generator().manual_seed(seed + 1)
        x["do"] = torch.randn(1, 64, 1, K, generator=gen, dtype=torch.float64)
        x["dht"] = torch.randn(1, 1, K, K, generator=gen, dtype=torch.float64)
    return case.options, x


def count(program: str, pad: int, threads: int, K: int = 128, chip: str = "sm_90a") -> dict:
    """{kernel: BankCounter} of one simulated run."""
    options, x = program_inputs(program, K)
    module = build_module(program, options, "chip", chip)
    banks: dict = {}
    opts = LowerOptions(nthreads=threads, dot="auto", smem_row_pad=pad)
    simulate(module, x, options=opts, banks=banks, check_races=False)
    return banks


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("program")
    ap.add_argument("--pad", type=int, action="append", help="row padding (repeatable)")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    pads = a.pad or [1]
    runs = {pad: count(a.program, pad, a.threads, a.head_dim) for pad in pads}
    kernels = sorted({k for r in runs.values() for k in r})
    for kname in kernels:
        print(f"// {kname}: shared-memory wavefronts / requests (1.00 = no conflict)")
        hdr = "".join(f"  pad={p}: ld req  ld wf  st req  st wf" for p in pads)
        print(f"  {'op':44s}{hdr}")
        base = runs[pads[0]].get(kname)
        if base is None:
            continue
        ops = sorted(base.by_op, key=lambda o: -sum(w for _, w in base.by_op[o].values()))
        rows = [("total", {p: runs[p][kname].totals() for p in pads})]
        rows += [(o, {p: runs[p][kname].by_op.get(o, {}) for p in pads}) for o in ops[:a.top]]
        for label, per in rows:
            cells = ""
            for p in pads:
                t = per[p]
                ld, st = t.get("ld", [0, 0]), t.get("st", [0, 0])
                cells += f"  {'':6s}{ld[0]:7d}{ld[1]:7d}{st[0]:8d}{st[1]:7d}"
            print(f"  {label[:44]:44s}{cells}")


if __name__ == "__main__":
    main()
