"""How much of a backward's error is in the program itself, before any lowering (CPU only).

``python -m tools.program_precision [--family gdn,kda] [--T 200] [--head-dim 64]
[--g-raw-shift 1.0] [--chip sm_90a]``

Builds the final (stable) backward program of each family for ``--chip``, interprets it in
float64 and in float32 on the same unrounded float64 inputs, and prints each gradient's
relative error against autograd of the float64 per-token reference. A gradient whose float32
error stands far above float32's rounding (~1e-7) loses its digits to the formulation, not to
the lowering or to bf16 storage. The default inputs are the GPU check's "steep" case: softplus
gate with A_log = ln 16 and g_raw + 1 (about -20 per token).
"""
from __future__ import annotations

import argparse
import math

import torch

from kdagen import interpreter
from kdagen.driver import build_module
from kdagen.ir.testing import make_case
from kdagen.reference import rel_err

GATES = {"kda": "softplus", "gdn": "gdn_softplus"}
# make_case's strong decay shifts g_raw by -3; the GPU check's steep case by +1
_STRONG_SHIFT = -3.0


def steep_backward(family: str, T: int, head_dim: int, g_raw_shift: float, chip: str,
                   seed: int = 0) -> tuple:
    """(the final backward module of ``family``, its inputs -- the case's and random do, dht
    -- and {gradient: autograd of the float64 per-token reference}) at the GPU check's steep
    gate shifted to ``g_raw_shift``."""
    case = make_case(family, gate=GATES[family], B=1, T=T, H=1, HV=1, K=head_dim, V=head_dim,
                     decay="strong", seed=seed)
    case.inputs["g_raw"] = case.inputs["g_raw"] + (g_raw_shift - _STRONG_SHIFT)
    case.inputs["A_log"] = torch.full_like(case.inputs["A_log"], math.log(16.0))
    module = build_module(f"{family}_bwd", dict(case.options), "chip", chip)
    o_ref, ht_ref = case.reference()
    gen = torch.Generator().manual_seed(seed + 1)
    extra = {"do": torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)}
    dht = None
    if case.options["output_final_state"]:
        dht = torch.randn(ht_ref.shape, generator=gen, dtype=torch.float64)
        extra["dht"] = dht
    return module, dict(case.inputs, **extra), case.reference_grads(extra["do"], dht)


def errors(family: str, T: int, head_dim: int, g_raw_shift: float, chip: str,
           seed: int = 0) -> dict:
    """{dtype name: {gradient: rel_err}} for the final backward program of ``family``."""
    module, inputs, ref = steep_backward(family, T, head_dim, g_raw_shift, chip, seed)
    out = {}
    for dtype in (torch.float64, torch.float32):
        got = interpreter.run(module, inputs, dtype=dtype)
        out[str(dtype).removeprefix("torch.")] = {
            k: rel_err(got[k].double(), ref[k]) for k in ref if k in got}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="gdn,kda")
    ap.add_argument("--T", type=int, default=200)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--g-raw-shift", type=float, default=1.0)
    ap.add_argument("--chip", default="sm_90a")
    args = ap.parse_args(argv)
    for family in args.family.split(","):
        for dtype, errs in errors(family, args.T, args.head_dim, args.g_raw_shift,
                                  args.chip).items():
            cells = "  ".join(f"{k} {v:.2e}" for k, v in errs.items())
            print(f"{family}_bwd  {dtype:8s}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
