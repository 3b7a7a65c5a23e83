"""Pass pipelines per target chip, as data: an ordered list of pass specs.

The chips differ only in options (chunk/sub-block size, pipeline depth, shared-memory budget);
the passes themselves are shared and never branch on the chip.
"""
from __future__ import annotations

from ..codegen.target import TARGETS
from .base import ModulePass, parse_pipeline

# fp32 workspaces where shared memory allows: with bf16 ones (`auto` rounds the matrix-operand
# workspaces w, u, v_new, Akk_inv, kr... to bf16) the H200 check measured dA_log 1.5e-2 (bar 8e-3)
# for kda_bwd K64 softplus at T=65; fp32 workspaces gave 6.4e-5 on the same check.
_COMMON = ["verify", "kda-stable-reassociate", "kda-partition{workspace_dtype=fp32}"]

PIPELINES: dict[str, list[str]] = {
    # Hopper: 227 KB of shared memory, two consumer warpgroups (setmaxnreg 232/40).
    "sm_90a": _COMMON + ["kda-warp-specialize{depth=2,consumer_warpgroups=2,smem_budget=232448}",
                         "verify"],
    # Datacenter Blackwell: same budget; accumulators move to TMEM in codegen.
    "sm_100a": _COMMON + ["kda-warp-specialize{depth=2,consumer_warpgroups=2,smem_budget=232448}",
                          "verify"],
    # Consumer Blackwell: ~99 KB of shared memory, one consumer warpgroup; bf16 workspaces so
    # that one chunk stage of the state kernel (w, u, qd, kr, Aqk) fits beside the state.
    "sm_120a": ["verify", "kda-stable-reassociate", "kda-partition{workspace_dtype=bf16}",
                "kda-warp-specialize{depth=2,consumer_warpgroups=1,smem_budget=101376,"
                "reserved_smem=16384}", "verify"],
}


def pipeline_for(chip: str) -> list[ModulePass]:
    if chip not in PIPELINES:
        raise ValueError(f"no pipeline for chip {chip!r}; pipelines exist for {', '.join(PIPELINES)}")
    return parse_pipeline(",".join(PIPELINES[chip]))


assert set(PIPELINES) == set(TARGETS), "every target needs a pipeline"
