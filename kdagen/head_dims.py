"""The head dims the chunked and decode programs are built for, per chip.

K ∈ :data:`KEY_DIMS`, V ∈ :data:`VALUE_DIMS` (chosen independently). A chip takes the value
dims whose fp32 state tile [K, V] fits one ring slot of its shared memory after what
``kda-warp-specialize`` keeps back for the consumers (``Target.reserved_smem``): the output
kernel loads a chunk's state whole. At K = 256 that is V = 128 (128 KB) on sm_90a and sm_100a
and V = 64 (64 KB) on sm_120a (99 KB per block). A larger V runs in parts of the largest value
dim the chip takes (kdagen.head_pad.value_parts), any smaller size zero-padded to the next.

Imports nothing (the APIs read it where no compiler is installed; kdagen.ir.programs checks
the same sets, tests/test_head_dim_256.py holds them equal).
"""
from __future__ import annotations

__all__ = ["KEY_DIMS", "VALUE_DIMS", "value_dims_for", "variant_head_dims"]

KEY_DIMS = (64, 128, 256)
VALUE_DIMS = (64, 128)


def value_dims_for(K: int, target=None) -> tuple:
    """The value dims a program at key dim ``K`` is built with for ``target`` (a
    `kdagen.target.Target`; None: every one, as on the CPU)."""
    if target is None:
        return VALUE_DIMS
    room = target.smem_per_block - target.reserved_smem
    fits = tuple(v for v in VALUE_DIMS if K * v * 4 <= room)
    return fits or (min(VALUE_DIMS),)


def variant_head_dims(head_dim: int, target=None) -> tuple:
    """(K, V) of the programs ``kdagen emit --head-dim`` emits for ``head_dim``: K = V =
    ``head_dim``, V at most the largest value dim ``target`` takes at that K."""
    return head_dim, min(head_dim, max(value_dims_for(head_dim, target)))
