"""Pass pipelines per target chip, as data: an ordered list of pass specs.

Every chip runs the same passes; the first binds the chip to the module (``kda.target``,
:mod:`kdagen.target`), and the passes after it read their budgets and per-chip defaults
(shared memory, consumer warpgroups, workspace precision) from there. The passes never branch
on the chip, and no chip's numbers are written here.
"""
from __future__ import annotations

from kdagen.target import TARGETS

from .base import ModulePass
from .registry import parse_pipeline

#: the passes every chip runs after kda-bind-target
PIPELINE = ["verify", "kda-stable-reassociate", "kda-partition", "kda-share-chunk-values",
            "kda-narrow-broadcasts", "kda-narrow-reductions", "kda-assign-precision",
            "kda-narrow-checkpoints", "kda-fold-row-decay", "kda-warp-specialize",
            "kda-assign-layouts", "verify"]

PIPELINES: dict[str, list[str]] = {
    chip: [f"kda-bind-target{{chip={chip}}}", *PIPELINE] for chip in TARGETS}


def pipeline_for(chip: str) -> list[ModulePass]:
    if chip not in PIPELINES:
        raise ValueError(f"no pipeline for chip {chip!r}; pipelines exist for {', '.join(PIPELINES)}")
    return parse_pipeline(",".join(PIPELINES[chip]))
