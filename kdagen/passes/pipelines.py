"""Pass pipelines per target chip, as data: an ordered list of pass specs.

The chips differ only in options (chunk/sub-block size, pipeline depth, shared-memory budget);
the passes themselves are shared and never branch on the chip.
"""
from __future__ import annotations

from ..codegen.target import TARGETS
from .base import ModulePass, parse_pipeline

PIPELINES: dict[str, list[str]] = {
    "sm_90a": ["verify", "canonicalize", "verify"],
    "sm_100a": ["verify", "canonicalize", "verify"],
    "sm_120a": ["verify", "canonicalize", "verify"],
}


def pipeline_for(chip: str) -> list[ModulePass]:
    if chip not in PIPELINES:
        raise ValueError(f"no pipeline for chip {chip!r}; pipelines exist for {', '.join(PIPELINES)}")
    return parse_pipeline(",".join(PIPELINES[chip]))


assert set(PIPELINES) == set(TARGETS), "every target needs a pipeline"
