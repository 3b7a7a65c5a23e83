"""Warp shuffles and reductions over the lanes that share a fragment row or column.

In the mma C layout a row of an m16n8 atom is held by the 4 lanes of a quad (same groupID,
``lane // 4``), two columns each; a column is held by the 8 lanes with the same ``lane % 4``.
So a row reduction is: combine the lane's own registers of that row, then ``shfl.bfly`` with lane
masks 1 and 2; a column reduction uses masks 4, 8, 16. Across the warps that split a tile's
columns (``warps_n > 1``) the partials meet in shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..._mlir import arith, ir, llvm, nvvm
from .ints import as_i32
from .layouts import AccLayout, MMA_M, lane_group

FULL_MASK = -1  # 0xFFFFFFFF as a signed i32


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def shfl(value: ir.Value, offset, kind: str = "bfly", clamp: int = 0x1F) -> ir.Value:
    """``shfl.sync.{bfly,idx,up,down}.b32`` on an f32 or i32 value (all lanes participate)."""
    kinds = {"bfly": nvvm.ShflKind.bfly, "idx": nvvm.ShflKind.idx,
             "up": nvvm.ShflKind.up, "down": nvvm.ShflKind.down}
    if kind == "up":
        clamp = 0
    return nvvm.shfl_sync(as_i32(FULL_MASK), value, as_i32(offset), as_i32(clamp), kinds[kind],
                          results=[value.type])


def shfl_xor(value: ir.Value, lane_mask: int) -> ir.Value:
    return shfl(value, lane_mask, "bfly")


def shfl_idx(value: ir.Value, src_lane) -> ir.Value:
    return shfl(value, src_lane, "idx")


COMBINE = {
    "sum": arith.addf,
    "max": arith.maximumf,
    "min": arith.minimumf,
}


def _combine(op: str):
    try:
        return COMBINE[op]
    except KeyError:
        raise ValueError(f"reduction must be one of {', '.join(COMBINE)}, got {op!r}") from None


def butterfly_reduce(value: ir.Value, op: str, lane_masks=(16, 8, 4, 2, 1)) -> ir.Value:
    """All-reduce over the lanes that differ only in ``lane_masks`` bits; every such lane ends with
    the result. Default: the whole warp."""
    f = _combine(op)
    for m in lane_masks:
        value = f(value, shfl_xor(value, m))
    return value


ROW_LANE_MASKS = (1, 2)        # lanes of a quad: one row of a C atom
COL_LANE_MASKS = (4, 8, 16)    # lanes with equal lane % 4: one column pair of a C atom


@dataclass
class RowValues:
    """One value per row slot of an `AccLayout` (replicated over the quad and over ``warps_n``):
    slot ``s = 2·am + hi`` of warp w covers row ``warp_row0 + 16·am + 8·hi + lane // 4``."""
    layout: AccLayout
    values: list

    def row(self, slot: int, coords):
        r0, _ = self.layout.warp_origin(coords.warp)
        am, hi = divmod(slot, 2)
        return r0 + MMA_M * am + 8 * hi + lane_group(coords.lane)


def acc_row_reduce(acc, op: str, coords=None, scratch=None, sync=None) -> RowValues:
    """Reduce each row of an accumulator tile (``op`` in sum/max/min).

    Within a warp: the lane's registers of the row, then shuffles over the quad. When the tile's
    columns are split over ``warps_n > 1`` warps, ``scratch`` (an `SmemRegion` of at least
    ``rows · warps_n · 4`` bytes) and ``sync`` (a callable emitting the group's barrier, e.g.
    `barrier.sync_threads`) combine the warps; the result is then identical in all of them. The
    caller must separate two uses of the same scratch by a barrier.
    """
    lay = acc.layout
    f = _combine(op)
    partial = []
    for regs in lay.row_regs():
        v = acc.values[regs[0]]
        for r in regs[1:]:
            v = f(v, acc.values[r])
        partial.append(butterfly_reduce(v, op, ROW_LANE_MASKS))
    if lay.warps_n == 1:
        return RowValues(lay, partial)
    if scratch is None or sync is None or coords is None:
        raise ValueError("acc_row_reduce: a tile split over columns needs coords, scratch and sync")
    if scratch.nbytes < lay.rows * lay.warps_n * 4:
        raise ValueError("acc_row_reduce: scratch too small")
    rows = RowValues(lay, partial)
    wn = coords.warp % lay.warps_n
    is_writer = arith.cmpi(arith.CmpIPredicate.eq, as_i32(coords.lane % 4), as_i32(0))
    from ..._mlir import scf
    for slot, v in enumerate(partial):
        row = rows.row(slot, coords)
        branch = scf.IfOp(is_writer)
        with ir.InsertionPoint(branch.then_block):
            scratch.store(v, (row * lay.warps_n + wn) * 4)
            scf.yield_([])
    sync()
    out = []
    for slot in range(len(partial)):
        row = rows.row(slot, coords)
        v = scratch.load("f32", (row * lay.warps_n) * 4)
        for j in range(1, lay.warps_n):
            v = f(v, scratch.load("f32", (row * lay.warps_n + j) * 4))
        out.append(v)
    return RowValues(lay, out)


def acc_apply_rows(acc, rows: RowValues, fn):
    """``fn(x, row_value)`` for every register, with the value of the register's row."""
    lay = acc.layout
    values = list(acc.values)
    for slot, regs in enumerate(lay.row_regs()):
        for r in regs:
            values[r] = fn(values[r], rows.values[slot])
    return type(acc)(lay, values)


def acc_col_reduce_warp(acc, op: str) -> list:
    """Per register column (an, i % 2): reduce over the warp's rows (registers of every am and
    both 8-row halves, then lanes with equal lane % 4). Returns ``atoms_n · 2`` values, index
    ``2·an + j`` for column ``warp_col0 + 8·an + 2·(lane % 4) + j``; combining over ``warps_m``
    is left to the caller (it needs shared memory)."""
    lay = acc.layout
    f = _combine(op)
    out = []
    for an in range(lay.atoms_n):
        for j in (0, 1):
            regs = [lay.reg(am, an, 2 * hi + j) for am in range(lay.atoms_m) for hi in (0, 1)]
            v = acc.values[regs[0]]
            for r in regs[1:]:
                v = f(v, acc.values[r])
            out.append(butterfly_reduce(v, op, COL_LANE_MASKS))
    return out
