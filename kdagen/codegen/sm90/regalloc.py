"""setmaxnreg: per-warpgroup register reallocation for warp-specialised kernels.

A producer warpgroup (TMA issue only) gives registers back with `release_registers` and the
consumer warpgroups (MMA + epilogue) take them with `claim_registers`. The PTX rules: the count is
a multiple of 8 in 24..256, every warp of the warpgroup executes the same instruction, and the
kernel's register budget (launch bounds x threads) must cover the sum. ptxas honours it only when
it knows the register count at entry: ``.maxntid`` (the builder's block size) plus
``.minnctapersm`` — call ``common.launch.set_launch_bounds(builder, name, min_blocks_per_sm=1)``,
otherwise ptxas reports "(C7508) 'setmaxnreg' ignored". Chips: sm_90a, sm_100a, and sm_120a
(ptxas 13.0 accepts it there; the sm_120a plans do not rely on it).
"""
from __future__ import annotations

from ..._mlir import nvvm
from ..target import Target, require_chip

SETMAXNREG_CHIPS = ("sm_90a", "sm_100a", "sm_120a")   # ptxas 13.0 accepts all three


def _check(count: int) -> None:
    if count % 8 or not 24 <= count <= 256:
        raise ValueError(f"setmaxnreg count must be a multiple of 8 in 24..256, got {count}")


def claim_registers(target: Target, count: int) -> None:
    """``setmaxnreg.inc.sync.aligned.u32 count`` (consumer warpgroups)."""
    require_chip(target, SETMAXNREG_CHIPS, "setmaxnreg")
    _check(count)
    nvvm.setmaxregister(count, nvvm.SetMaxRegisterAction.increase)


def release_registers(target: Target, count: int) -> None:
    """``setmaxnreg.dec.sync.aligned.u32 count`` (producer warpgroups)."""
    require_chip(target, SETMAXNREG_CHIPS, "setmaxnreg")
    _check(count)
    nvvm.setmaxregister(count, nvvm.SetMaxRegisterAction.decrease)


def register_budget_ok(threads: int, per_thread_max: list[tuple[int, int]], file_size: int = 65536) -> bool:
    """Whether warpgroups with (threads, registers) pairs fit the 64K-register file."""
    return sum(t * r for t, r in per_thread_max) <= file_size and sum(t for t, _ in per_thread_max) == threads
