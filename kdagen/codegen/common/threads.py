"""Thread coordinates inside a warp group: thread id, lane, warp (group-relative), as `IntVal`s."""
from __future__ import annotations

from dataclasses import dataclass

from .ints import IntVal
from .layouts import WARP_SIZE
from .sreg import thread_idx


@dataclass
class WarpCoords:
    """``tid`` relative to the group's first thread, ``lane`` = tid % 32, ``warp`` = tid // 32.

    A group is a contiguous range of warps (a warpgroup of 4, or the whole block) that together
    own a register tile; layouts index warps relative to the group.
    """
    tid: IntVal
    lane: IntVal
    warp: IntVal


def warp_coords(first_thread: int | IntVal = 0) -> WarpCoords:
    """Coordinates of the calling thread in the group starting at thread ``first_thread``."""
    tid = IntVal(thread_idx("x")) - first_thread
    return WarpCoords(tid, tid % WARP_SIZE, tid // WARP_SIZE)
