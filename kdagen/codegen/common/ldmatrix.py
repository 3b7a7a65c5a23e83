"""ldmatrix: warp-collective loads of 8x8 b16 matrices from shared memory into mma fragments.

``ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16``: lanes 8i..8i+7 supply the row
addresses of matrix i (`layouts.ldmatrix_address_role`), and every lane receives one 32-bit
register per matrix (`layouts.ldmatrix_element`). `load_operand` places the lanes' addresses so
that the registers come out as an mma A fragment (16x16, x4) or B atoms (k16 x n8: x2, two atoms:
x4), from natural or transposed shared tiles (`layouts.ldmatrix_operand_lane_coord`).
"""
from __future__ import annotations

from ..._mlir import ir, llvm, nvvm
from .layouts import ldmatrix_operand_lane_coord, ldmatrix_trans_flag


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def ldmatrix(ptr: ir.Value, num: int, trans: bool = False) -> list[ir.Value]:
    """Issue one ldmatrix; ``ptr`` is this lane's shared row address (llvm.ptr<3>)."""
    if num not in (1, 2, 4):
        raise ValueError(f"ldmatrix loads 1, 2 or 4 matrices, not {num}")
    layout = nvvm.MMALayout.col if trans else nvvm.MMALayout.row
    shape = ir.Attribute.parse("#nvvm.ld_st_matrix_shape<m = 8, n = 8>")
    elt = ir.Attribute.parse("#nvvm.ld_st_matrix_elt_type<b16>")
    if num == 1:
        return [nvvm.ldmatrix(ptr, 1, layout, shape, elt, results=[_i32()])]
    struct = ir.Type.parse("!llvm.struct<(" + ", ".join(["i32"] * num) + ")>")
    res = nvvm.ldmatrix(ptr, num, layout, shape, elt, results=[struct])
    return [llvm.extractvalue(_i32(), res, [i]) for i in range(num)]


def load_operand(tile, operand: str, transposed: bool, row, col, num: int, lane) -> list[ir.Value]:
    """Load an operand block whose stored-tile origin is (row, col) into fragment registers.

    ``operand``: 'a' (num = 4: a 16x16 A fragment) or 'b' (num = 2: one k16 x n8 atom, 2 regs;
    num = 4: two atoms side by side in n, regs 0-1 then 2-3). ``transposed``: the tile stores the
    operand transposed (A as [K, M], B as [N, K]). ``tile`` is anything with ``ptr(row, col)``.
    """
    lr, lc = ldmatrix_operand_lane_coord(lane, num, transposed)
    return ldmatrix(tile.ptr(row + lr, col + lc), num, ldmatrix_trans_flag(operand, transposed))
