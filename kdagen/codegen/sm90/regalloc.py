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
from ...target import Target


def _check(count: int) -> None:
    if count % 8 or not 24 <= count <= 256:
        raise ValueError(f"setmaxnreg count must be a multiple of 8 in 24..256, got {count}")


def claim_registers(target: Target, count: int) -> None:
    """``setmaxnreg.inc.sync.aligned.u32 count`` (consumer warpgroups)."""
    target.require("has_setmaxnreg", "setmaxnreg")
    _check(count)
    nvvm.setmaxregister(count, nvvm.SetMaxRegisterAction.increase)


def release_registers(target: Target, count: int) -> None:
    """``setmaxnreg.dec.sync.aligned.u32 count`` (producer warpgroups)."""
    target.require("has_setmaxnreg", "setmaxnreg")
    _check(count)
    nvvm.setmaxregister(count, nvvm.SetMaxRegisterAction.decrease)
