"""Path selection for consumer Blackwell (sm_120a) and the shared-memory budget rules.

sm_120a has no wgmma and no tcgen05: its tensor-core path is the portable one (`common.mma`:
ldmatrix + mma.sync), fed by TMA (`sm90.tma`, valid on sm_120a) within ~99 KB of shared memory
per block. The selection reads the `Target`'s capability flags, so the same code answers for every
chip; arch emitters enforce their chips themselves with `require_chip` (wgmma on sm_120a raises
an error that points to this portable path).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..target import Target

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
