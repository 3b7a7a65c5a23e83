"""Row and column vectors aligned with accumulator tiles, and index-based tile ops.

In `AccLayout`, a lane's registers cover a few rows (slots ``2·am + hi``: row
``warp_row0 + 16·am + 8·hi + lane // 4``) and a few columns (``2·an + j``: column
``warp_col0 + 8·an + 2·(lane % 4) + j``). `RowValues` / `ColValues` hold one value per slot, so a
per-row or per-column factor (a gate ``exp(Γ_i)``, a row max, ``β_i``) is loaded once per slot
and broadcast over the registers with `acc_apply_rows` / `acc_apply_cols`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..._mlir import arith, ir, llvm
from .ints import IntVal, as_i32
from .kernel import scalar_type
from .layouts import MMA_M, MMA_N, AccLayout, lane_group, lane_in_group


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


@dataclass
class ColValues:
    """One value per column slot ``s = 2·an + j``: column ``warp_col0 + 8·an + 2·(lane % 4) + j``."""
    layout: AccLayout
    values: list

    def col(self, slot: int, coords):
        _, c0 = self.layout.warp_origin(coords.warp)
        an, j = divmod(slot, 2)
        return c0 + MMA_N * an + 2 * lane_in_group(coords.lane) + j


def row_slots(layout: AccLayout) -> int:
    return 2 * layout.atoms_m


def col_slots(layout: AccLayout) -> int:
    return 2 * layout.atoms_n


def _load_masked(view, index, elem: str):
    """Element ``index`` of a vector view (a `smem.GlobalView` whose rows are the elements),
    zero past ``rows_valid``; returned as f32."""
    f32 = ir.F32Type.get()
    valid = view.row_in_range(index)
    safe = index if valid is None else IntVal(arith.select(valid, as_i32(index), as_i32(0)))
    x = llvm.load(scalar_type(elem), view.ptr(safe, 0))
    if elem != "f32":
        x = arith.extf(f32, x)
    if valid is not None:
        x = arith.select(valid, x, arith.constant(f32, 0.0))
    return x


def load_row_values(layout: AccLayout, view, coords) -> RowValues:
    """Load a per-row vector (``view``: element i at ``view.ptr(i, 0)``, i.e. a GlobalView with
    ``row_stride`` = the vector's element stride) into row slots."""
    rv = RowValues(layout, [None] * row_slots(layout))
    for s in range(row_slots(layout)):
        rv.values[s] = _load_masked(view, rv.row(s, coords), view.elem)
    return rv


def load_col_values(layout: AccLayout, view, coords) -> ColValues:
    cv = ColValues(layout, [None] * col_slots(layout))
    for s in range(col_slots(layout)):
        cv.values[s] = _load_masked(view, cv.col(s, coords), view.elem)
    return cv


def acc_apply_rows(acc, rows: RowValues, fn):
    """``fn(x, row_value)`` for every register, with the value of the register's row."""
    lay = acc.layout
    values = list(acc.values)
    for slot, regs in enumerate(lay.row_regs()):
        for r in regs:
            values[r] = fn(values[r], rows.values[slot])
    return type(acc)(lay, values)


def acc_apply_cols(acc, cols: ColValues, fn):
    """``fn(x, col_value)`` for every register, with the value of the register's column."""
    lay = acc.layout
    values = list(acc.values)
    for reg in range(lay.regs_per_lane):
        am, an, i = lay.reg_atom(reg)
        values[reg] = fn(values[reg], cols.values[2 * an + i % 2])
    return type(acc)(lay, values)


def acc_mask_triangular(acc, coords, keep_diagonal: bool = True, fill: float = 0.0,
                        row_offset=0, col_offset=0):
    """Keep the lower triangle (``col <= row``, or ``col < row`` without the diagonal) of a tile
    whose element (r, c) is at global position (r + row_offset, c + col_offset); the rest becomes
    ``fill``. For causal q·kᵀ tiles and the strictly lower L of the chunk solve."""
    f32 = ir.F32Type.get()
    fill_v = arith.constant(f32, float(fill))
    pred = arith.CmpIPredicate.sle if keep_diagonal else arith.CmpIPredicate.slt

    def keep(x, r, c):
        r, c = r + row_offset, c + col_offset
        if isinstance(r, int) and isinstance(c, int):
            return x if ((c <= r) if keep_diagonal else (c < r)) else fill_v
        return arith.select(arith.cmpi(pred, as_i32(c), as_i32(r)), x, fill_v)
    return acc.map_indexed(keep, coords)
