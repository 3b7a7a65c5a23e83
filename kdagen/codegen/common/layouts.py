"""Pure-Python layouts: which tile element each lane's register holds, and where tiles live in smem.

Every function here is written over "int-like" values (see `ints.py`): Python ints give tables for
the tests and the warp simulator, numpy arrays give all 32 lanes at once, and `IntVal`s emit the
index arithmetic of a kernel. No MLIR is touched unless an `IntVal` is passed in.

Conventions (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type"):
``g = lane // 4`` (groupID) and ``t = lane % 4`` (threadID_in_group). A 32-bit register of a
16-bit-element fragment holds two elements; ``half`` 0 is the low 16 bits (the lower column for A
and C, the lower k for B).

Logical operand shapes: A is [M, K], B is [K, N], C/D is [M, N]; mma.sync computes D = A·B + C on
an m16n8k16 atom. A tile in shared memory is either *natural* (stored with the logical first
dimension as its rows: A as [M, K], B as [K, N]) or *transposed* (A stored as [K, M], B as [N, K]).
"""
from __future__ import annotations

from dataclasses import dataclass

WARP_SIZE = 32

# ------------------------------------------------------------------------------------------
# mma.sync m16n8k16, 16-bit A/B (bf16 or f16), f32 C/D
# ------------------------------------------------------------------------------------------
MMA_M, MMA_N, MMA_K = 16, 8, 16
A_REGS, B_REGS, C_REGS = 4, 2, 4      # 32-bit registers per lane


def lane_group(lane):
    """groupID: the row (A, C) or column (B) a lane's registers start at."""
    return lane // 4


def lane_in_group(lane):
    """threadID_in_group: selects the column pair (A, C) or k pair (B)."""
    return lane % 4


def mma_a_coord(lane, reg: int, half: int):
    """(row m, col k) of A element ``half`` of register ``reg`` (0..3) held by ``lane``."""
    g, t = lane_group(lane), lane_in_group(lane)
    return g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)


def mma_b_coord(lane, reg: int, half: int):
    """(row k, col n) of B element ``half`` of register ``reg`` (0..1) held by ``lane``."""
    g, t = lane_group(lane), lane_in_group(lane)
    return 2 * t + half + 8 * reg, g


def mma_c_coord(lane, i: int):
    """(row m, col n) of C/D f32 register ``i`` (0..3) held by ``lane``."""
    g, t = lane_group(lane), lane_in_group(lane)
    return g + 8 * (i // 2), 2 * t + (i % 2)


# ------------------------------------------------------------------------------------------
# ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16
# ------------------------------------------------------------------------------------------

def ldmatrix_address_role(lane, num: int):
    """(matrix, row) whose 16-byte row address ``lane`` supplies for an ``.x{num}`` ldmatrix.

    Lanes 8i..8i+7 give the rows of matrix i; lanes past 8·num are ignored by the hardware, and
    here they repeat the valid pattern so their addresses stay in bounds.
    """
    return (lane // 8) % num, lane % 8


def ldmatrix_element(lane, half: int, trans: bool):
    """(row, col) inside an 8x8 matrix of the b16 element landing in ``half`` of ``lane``'s
    register for that matrix (one register per matrix, in matrix order)."""
    g, t = lane_group(lane), lane_in_group(lane)
    if trans:
        return 2 * t + half, g
    return g, 2 * t + half


def ldmatrix_trans_flag(operand: str, transposed: bool) -> bool:
    """Whether the ldmatrix feeding ``operand`` ('a' or 'b') needs ``.trans``.

    The A fragment wants (m = g, k = 2t + h): natural storage [M, K] is ldmatrix's own layout.
    The B fragment wants (k = 2t + h, n = g): natural storage [K, N] needs the transpose.
    """
    if operand == "a":
        return transposed
    if operand == "b":
        return not transposed
    raise ValueError(f"operand must be 'a' or 'b', got {operand!r}")


def ldmatrix_operand_lane_coord(lane, num: int, transposed: bool):
    """Stored-tile (row, col) offset, from the operand block's origin, of the row address that
    ``lane`` supplies when ``num`` 8x8 matrices of an A fragment (num=4) or of B atoms (num=2: one
    n8 atom, num=4: two) are loaded from a natural (``transposed=False``) or transposed tile."""
    matrix, row = ldmatrix_address_role(lane, num)
    first_block, second_block = matrix % 2, matrix // 2
    if not transposed:
        return first_block * 8 + row, second_block * 8
    return second_block * 8 + row, first_block * 8


# ------------------------------------------------------------------------------------------
# Accumulator tiles distributed over the warps of a group (mma.sync C layout, also wgmma's)
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AccLayout:
    """An f32 [rows, cols] tile in mma C layout over ``warps_m x warps_n`` warps.

    Warp ``w`` of the group (w = warp index relative to the group's first warp) owns the block
    ``(w // warps_n, w % warps_n)`` of size [rows / warps_m, cols / warps_n]; inside it, atoms of
    m16n8 in row-major order; each atom is 4 f32 registers per lane in `mma_c_coord` order.
    Register ``reg(am, an, i) = (am * atoms_n + an) * 4 + i``; for warps_m = 4, warps_n = 1,
    rows = 64 this is exactly the wgmma m64nN f32 accumulator layout of a warpgroup.
    """
    rows: int
    cols: int
    warps_m: int = 1
    warps_n: int = 1

    def __post_init__(self):
        if self.rows % (16 * self.warps_m) or self.cols % (8 * self.warps_n):
            raise ValueError(
                f"AccLayout [{self.rows}, {self.cols}] over {self.warps_m}x{self.warps_n} warps: "
                "each warp block must be a multiple of 16 rows and 8 columns")

    @property
    def num_warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def warp_rows(self) -> int:
        return self.rows // self.warps_m

    @property
    def warp_cols(self) -> int:
        return self.cols // self.warps_n

    @property
    def atoms_m(self) -> int:
        return self.warp_rows // MMA_M

    @property
    def atoms_n(self) -> int:
        return self.warp_cols // MMA_N

    @property
    def regs_per_lane(self) -> int:
        return self.atoms_m * self.atoms_n * C_REGS

    def reg(self, am: int, an: int, i: int) -> int:
        return (am * self.atoms_n + an) * C_REGS + i

    def reg_atom(self, reg: int) -> tuple[int, int, int]:
        """Inverse of `reg`: (am, an, i)."""
        atom, i = divmod(reg, C_REGS)
        am, an = divmod(atom, self.atoms_n)
        return am, an, i

    def warp_origin(self, warp):
        """(row, col) of the first element of warp ``warp``'s block."""
        return (warp // self.warps_n) * self.warp_rows, (warp % self.warps_n) * self.warp_cols

    def coord(self, warp, lane, reg: int):
        """(row, col) in the tile of register ``reg`` of ``lane`` in warp ``warp``."""
        am, an, i = self.reg_atom(reg)
        r0, c0 = self.warp_origin(warp)
        r, c = mma_c_coord(lane, i)
        return r0 + am * MMA_M + r, c0 + an * MMA_N + c

    def row_regs(self) -> list[list[int]]:
        """Registers of a lane grouped by the row they hold: one list per (am, upper/lower 8)."""
        out = []
        for am in range(self.atoms_m):
            for hi in (0, 1):
                out.append([self.reg(am, an, 2 * hi + j) for an in range(self.atoms_n) for j in (0, 1)])
        return out


def wgmma_d_coord(warp, lane, i: int):
    """(row, col) of wgmma m64nNk16 f32 accumulator register ``i`` (PTX "WGMMA .m64nNk16 register
    fragment layout for accumulator matrix D"): warp w of the warpgroup holds rows 16w..16w+15."""
    g, t = lane_group(lane), lane_in_group(lane)
    return 16 * warp + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * t + (i % 2)


def wgmma_tf32_a_coord(warp, lane, j: int):
    """(row, col) of register ``j`` (0..3) of a wgmma m64nNk8 TF32 A fragment held in registers:
    warp w holds rows 16w..16w+15; a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)."""
    g, t = lane_group(lane), lane_in_group(lane)
    return 16 * warp + g + 8 * (j % 2), t + 4 * (j // 2)


def interleave8(n):
    """The column permutation that lets a wgmma f32 accumulator be the TF32 A operand of the
    next wgmma without moving registers. An accumulator lane holds columns (2t, 2t + 1) of each
    8-column block, an A lane columns (t, t + 4): if accumulator column n holds logical index
    ``interleave8(n)`` = 8·(n//8) + (n%8)//2 + 4·(n%2), then the A fragment made of the lane's own
    registers has logical column = A column. Applied to the N rows of every B operand (a TMA view),
    it makes every accumulator of a kernel carry this column order."""
    return 8 * (n // 8) + (n % 8) // 2 + 4 * (n % 2)


def acc_reg_for_tf32_a(kb: int, j: int) -> int:
    """The wgmma accumulator register (`wgmma_d_coord` numbering) whose value is register ``j`` of
    the TF32 A fragment of k8 block ``kb``, under the `interleave8` column order: same row, and
    accumulator column 8·kb + 2t + j//2 holds logical column 8·kb + t + 4·(j//2)."""
    return 4 * kb + 2 * (j % 2) + j // 2


def acc_regs_for_half_a(kb: int, j: int) -> tuple[int, int]:
    """The two wgmma accumulator registers (`wgmma_d_coord` numbering, natural column order)
    packed into register ``j`` (0..3) of the 16-bit A fragment of k16 block ``kb``: A register j
    holds row g + 8·(j % 2), columns 16·kb + 8·(j // 2) + 2t + {0, 1} (PTX's m64nNk16 A register
    layout), which accumulator registers 8·kb + 2j and 8·kb + 2j + 1 hold (low column first)."""
    return 8 * kb + 2 * j, 8 * kb + 2 * j + 1


# ------------------------------------------------------------------------------------------
# Register reuse: an mma C fragment (rounded to 16 bits) as the A or B operand of the next mma
# ------------------------------------------------------------------------------------------

def acc_to_a_source(reg: int) -> tuple[int, int, int]:
    """For A register ``reg`` of the 16x16 k-block made from two adjacent n8 C atoms: (atom
    offset 0/1, C index of the low half, C index of the high half).

    A reg j holds (m = g + 8·(j%2), k = 8·(j//2) + 2t + h); C atom a holds (g + 8·(i//2), 2t + i%2)
    at column offset 8a — so j takes atom j//2, C registers 2·(j%2) and 2·(j%2) + 1.
    """
    return reg // 2, 2 * (reg % 2), 2 * (reg % 2) + 1


def acc_to_bt_source(n_atom: int, reg: int) -> tuple[int, int, int]:
    """For B register ``reg`` of n8 atom ``n_atom`` of Xᵀ, where X is a C fragment of 16 rows
    (→ n) by 16 columns (→ k, two C atoms): (C atom, C index of low half, C index of high half).

    B reg r of atom nb holds (k = 8r + 2t + h, n = 8·nb + g) = X[8·nb + g, 8r + 2t + h].
    """
    return reg, 2 * n_atom, 2 * n_atom + 1


# ------------------------------------------------------------------------------------------
# Shared-memory tile layouts (byte offsets from the tile base)
# ------------------------------------------------------------------------------------------

SWIZZLE_MODES = (0, 32, 64, 128)


def swizzle_bytes_offset(offset, swizzle: int):
    """Apply the TMA / wgmma swizzle of span ``swizzle`` bytes to a byte offset.

    128B: bits [4, 7) ^= bits [7, 10); 64B: bits [4, 6) ^= bits [7, 9); 32B: bit 4 ^= bit 7.
    16-byte chunks stay contiguous. The pattern is a function of address bits, with period 1024 B
    (128B), 512 B (64B) or 256 B (32B), so tiles sit at offsets aligned to that period.
    """
    if swizzle == 0:
        return offset
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(f"swizzle must be one of {SWIZZLE_MODES}, got {swizzle}")
    mask = (swizzle // 16 - 1) << 4
    return offset ^ ((offset >> 3) & mask)


@dataclass(frozen=True)
class SmemLayout:
    """A [rows, cols] tile of ``elem_bytes``-byte elements in shared memory.

    ``swizzle`` = 0: row-major with a row pitch of ``cols·elem_bytes + pad_bytes`` (padding breaks
    bank conflicts for column-wise access). ``swizzle`` in {32, 64, 128}: the TMA / wgmma layout —
    the tile is cut into column panels ``swizzle`` bytes wide, each panel is [rows, swizzle bytes]
    stored row after row, panels one after another, and the swizzle XOR is applied to the byte
    offset. This is what ``cp.async.bulk.tensor`` writes for a box of inner size ``swizzle`` bytes
    (one TMA copy per panel) and what a K-major wgmma/tcgen05 descriptor with that swizzle reads.
    """
    rows: int
    cols: int
    elem_bytes: int = 2
    swizzle: int = 0
    pad_bytes: int = 0

    def __post_init__(self):
        if self.swizzle not in SWIZZLE_MODES:
            raise ValueError(f"swizzle must be one of {SWIZZLE_MODES}, got {self.swizzle}")
        if self.swizzle:
            if self.pad_bytes:
                raise ValueError("a swizzled layout has no padding")
            if (self.cols * self.elem_bytes) % self.swizzle:
                raise ValueError(
                    f"rows of {self.cols * self.elem_bytes} bytes are not a multiple of the "
                    f"{self.swizzle}B swizzle span; choose swizzle <= the row size in bytes")
            if self.rows % 8:
                raise ValueError("swizzled tiles need a multiple of 8 rows")
        if (self.row_pitch % 16) and self.rows > 1:
            raise ValueError("row pitch must be a multiple of 16 bytes (vector and ldmatrix rows)")

    @classmethod
    def auto(cls, rows: int, cols: int, elem_bytes: int = 2) -> "SmemLayout":
        """The widest swizzle the row size allows (conflict-free ldmatrix and TMA-compatible)."""
        row_bytes = cols * elem_bytes
        for swz in (128, 64, 32):
            if row_bytes % swz == 0 and rows % 8 == 0:
                return cls(rows, cols, elem_bytes, swz)
        return cls(rows, cols, elem_bytes, 0, pad_bytes=16 if row_bytes % 128 == 0 else 0)

    @property
    def panel_cols(self) -> int:
        return self.swizzle // self.elem_bytes if self.swizzle else self.cols

    @property
    def row_pitch(self) -> int:
        """Bytes between consecutive rows of one panel."""
        return self.swizzle if self.swizzle else self.cols * self.elem_bytes + self.pad_bytes

    @property
    def panel_bytes(self) -> int:
        return self.rows * self.row_pitch

    @property
    def num_panels(self) -> int:
        return self.cols // self.panel_cols

    @property
    def size_bytes(self) -> int:
        return self.num_panels * self.panel_bytes

    @property
    def alignment(self) -> int:
        """Required alignment of the tile base (the swizzle pattern's period, or 16)."""
        return {0: 16, 32: 256, 64: 512, 128: 1024}[self.swizzle]

    def byte_offset(self, row, col):
        """Byte offset of element (row, col) from the tile base."""
        if not self.swizzle:
            return row * self.row_pitch + col * self.elem_bytes
        if hasattr(row, "split_const"):
            # the swizzle repeats every 8 rows (1024 / 512 / 256 bytes): a constant row offset
            # that is a multiple of 8 moves the element by whole periods, so it stays out of
            # the XOR and becomes an immediate of the address
            var, const = row.split_const()
            if const and const % 8 == 0:
                return self.byte_offset(var, col) + const * self.row_pitch
        pc = self.panel_cols
        if isinstance(col, int):
            panel, c = divmod(col, pc)
        else:
            panel, c = col // pc, col % pc
        plain = panel * self.panel_bytes + row * self.row_pitch + c * self.elem_bytes
        return swizzle_bytes_offset(plain, self.swizzle)


def bank_group(byte_offset):
    """The 16-byte bank group (0..7) of a shared-memory byte address (32 banks x 4 bytes)."""
    return (byte_offset // 16) % 8


# ------------------------------------------------------------------------------------------
# tcgen05.ld .32x32b: thread ↔ TMEM lane
# ------------------------------------------------------------------------------------------

def tmem_32x32b_coord(warp, lane, i: int):
    """(row, col) of register ``i`` of ``tcgen05.ld.32x32b.x{n}``: warp w (mod 4) of the warpgroup
    reads TMEM lanes 32·(w%4)..+31, lane l gets lane 32·(w%4)+l, register i is column i."""
    return 32 * (warp % 4) + lane, i
