"""Warp shuffles and reductions over the lanes that share a fragment row or column.

In the mma C layout a row of an m16n8 atom is held by the 4 lanes of a quad (same groupID,
``lane // 4``), two columns each; a column is held by the 8 lanes with the same ``lane % 4``.
So a row reduction is: combine the lane's own registers of that row, then ``shfl.bfly`` with lane
masks 1 and 2; a column reduction uses masks 4, 8, 16. Across the warps that split a tile's
columns (``warps_n > 1``) the partials meet in shared memory.
"""
from __future__ import annotations

from ..._mlir import arith, ir, nvvm, scf
from .ints import as_i32
from .layouts import lane_group, lane_in_group
from .rowcol import RowValues

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


# ------------------------------------------------------------------------------------------
# Inclusive prefix sums down the rows (cumsum over the token dimension of a chunk tile)
# ------------------------------------------------------------------------------------------

class MlirLaneOps:
    """Lane operations of the scan on MLIR values."""

    def shfl_up(self, x, delta):
        return shfl(x, delta, "up")

    def shfl_idx(self, x, src_lane):
        return shfl(x, src_lane, "idx")

    def add(self, a, b):
        return arith.addf(a, b)

    def add_if_ge(self, x, y, g, d):
        """x + (g >= d ? y : 0) with g an int-like lane quantity."""
        cond = arith.cmpi(arith.CmpIPredicate.uge, as_i32(g), as_i32(d))
        return arith.addf(x, arith.select(cond, y, arith.constant(ir.F32Type.get(), 0.0)))


def cumsum_rows_warp(layout, values: list, lane, ops) -> tuple[list, dict]:
    """Inclusive prefix sums down the rows of each warp's block, per column register.

    Per 8-row half of an m16 atom, the 8 lanes of a column (same ``lane % 4``, lanes 4 apart)
    scan with three ``shfl.up`` steps (Hillis–Steele); the half's total (lane ``28 + lane % 4``)
    is broadcast with ``shfl.idx`` and carried into the following halves and atoms. Returns the
    new registers and the warp-block column totals keyed (an, j). Generic over ``ops``
    (`MlirLaneOps`, or the numpy model in warpsim) so the CPU test runs this exact code.
    """
    g, t = lane_group(lane), lane_in_group(lane)
    out = list(values)
    totals = {}
    for an in range(layout.atoms_n):
        for j in (0, 1):
            running = None
            for am in range(layout.atoms_m):
                for hi in (0, 1):
                    r = layout.reg(am, an, 2 * hi + j)
                    x = out[r]
                    for d in (1, 2, 4):
                        x = ops.add_if_ge(x, ops.shfl_up(x, 4 * d), g, d)
                    total = ops.shfl_idx(x, 28 + t)
                    if running is not None:
                        x = ops.add(x, running)
                        running = ops.add(running, total)
                    else:
                        running = total
                    out[r] = x
            totals[(an, j)] = running
    return out, totals


def acc_cumsum_rows(acc, coords, scratch=None, sync=None):
    """Inclusive cumsum along the rows (``out[r, c] = Σ_{r' <= r} x[r', c]``) of an accumulator
    tile. With ``warps_m > 1`` the warps' block totals meet in ``scratch`` (an `SmemRegion` of at
    least ``warps_m · cols · 4`` bytes) around one ``sync()`` barrier; each warp adds the totals
    of the warps above it."""
    lay = acc.layout
    values, totals = cumsum_rows_warp(lay, acc.values, coords.lane, MlirLaneOps())
    if lay.warps_m > 1:
        if scratch is None or sync is None:
            raise ValueError("acc_cumsum_rows: a tile split over rows needs scratch and sync")
        if scratch.nbytes < lay.warps_m * lay.cols * 4:
            raise ValueError("acc_cumsum_rows: scratch too small")
        wm = coords.warp // lay.warps_n
        _, c0 = lay.warp_origin(coords.warp)
        t = lane_in_group(coords.lane)
        writer = arith.cmpi(arith.CmpIPredicate.ult, as_i32(coords.lane), as_i32(4))
        branch = scf.IfOp(writer)
        with ir.InsertionPoint(branch.then_block):
            for (an, j), tot in totals.items():
                col = c0 + 8 * an + 2 * t + j
                scratch.store(tot, (wm * lay.cols + col) * 4)
            scf.yield_([])
        sync()
        f32 = ir.F32Type.get()
        for (an, j) in totals:
            col = c0 + 8 * an + 2 * t + j
            offset = arith.constant(f32, 0.0)
            for w in range(lay.warps_m - 1):
                above = arith.cmpi(arith.CmpIPredicate.ult, as_i32(w), as_i32(wm))
                v = scratch.load("f32", (w * lay.cols + col) * 4)
                offset = arith.addf(offset, arith.select(above, v, arith.constant(f32, 0.0)))
            for am in range(lay.atoms_m):
                for hi in (0, 1):
                    r = lay.reg(am, an, 2 * hi + j)
                    values[r] = arith.addf(values[r], offset)
    return type(acc)(lay, values)
