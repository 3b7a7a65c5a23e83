"""A sketch of pipeline planning per chip: the tensor-core path and the deepest multi-buffered
pipeline that fits a target's shared memory (sm_120a: the portable mma.sync path fed by TMA
within ~99 KB per block).

Moved out of the product package (it was ``kdagen/codegen/sm120/plan.py``): no lowering path
uses it; the program lowering sizes its storage and the native ring itself
(``kdagen.codegen.lower.kernel``), and the chip facts it reads are ``kdagen.target``'s.
"""
from __future__ import annotations

from dataclasses import dataclass

from kdagen.target import Target

PORTABLE = "mma.sync"
WGMMA = "wgmma"
TCGEN05 = "tcgen05"


def tensor_core_path(target: Target, prefer_native: bool = True) -> str:
    """The matmul instruction family for ``target``: tcgen05 (sm_100a), wgmma (sm_90a) or the
    portable mma.sync (sm_120a, or any chip with ``prefer_native=False``)."""
    if prefer_native and target.has_tcgen05:
        return TCGEN05
    if prefer_native and target.has_wgmma:
        return WGMMA
    return PORTABLE


def bulk_copy_path(target: Target) -> str:
    """'tma' where cp.async.bulk.tensor exists (all three chips), else 'cp.async'."""
    return "tma" if target.has_tma else "cp.async"


@dataclass(frozen=True)
class PipelinePlan:
    stages: int
    smem_bytes: int
    path: str
    copies: str


def plan_pipeline(target: Target, stage_bytes: int, fixed_bytes: int = 0, max_stages: int = 4,
                  min_stages: int = 1, prefer_native: bool = True) -> PipelinePlan:
    """The deepest multi-buffered pipeline (stages x ``stage_bytes`` + ``fixed_bytes``, each
    stage 1024-byte aligned for swizzled tiles) that fits the target's shared memory per block."""
    aligned = -(-stage_bytes // 1024) * 1024
    fixed = -(-fixed_bytes // 1024) * 1024
    for stages in range(max_stages, min_stages - 1, -1):
        total = fixed + stages * aligned
        if total <= target.smem_per_block:
            return PipelinePlan(stages, total, tensor_core_path(target, prefer_native), bulk_copy_path(target))
    raise ValueError(
        f"{min_stages} stage(s) of {stage_bytes} B plus {fixed_bytes} B exceed the "
        f"{target.smem_per_block} B of shared memory per block on {target.chip}; "
        "use smaller tiles (e.g. split the value dimension) for this chip")
