"""A numpy model of the warp-collective instructions the emitters use, per the PTX ISA.

For CPU tests: a warp's register is a numpy array of 32 values (one per lane); shared memory is a
byte array. `NumpyBackend` runs a `mma.WarpMatmulPlan` exactly as `mma.MlirBackend` emits it
(same plan, same lane-address functions, same shared layouts), with ldmatrix and mma.sync modelled
from their ISA definitions. Layout bugs therefore show up as wrong products on the CPU.
"""
from __future__ import annotations

import numpy as np

from .layouts import WARP_SIZE, SmemLayout, mma_a_coord, mma_b_coord, mma_c_coord

LANES = np.arange(WARP_SIZE)


# ------------------------------------------------------------------------------------------
# 16-bit float encodings
# ------------------------------------------------------------------------------------------

def f32_to_bits16(x, dtype: str) -> np.ndarray:
    """Round f32 values to bf16/f16 (round to nearest even) and return the 16-bit patterns."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16).view(np.uint16)
    if dtype != "bf16":
        raise ValueError(dtype)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = (rounded & 0xFFFF).astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bits16_to_f32(bits, dtype: str) -> np.ndarray:
    bits = np.asarray(bits, dtype=np.uint16)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round16(x, dtype: str) -> np.ndarray:
    """f32 → dtype → f32 (the value a 16-bit store keeps)."""
    return bits16_to_f32(f32_to_bits16(x, dtype), dtype)


def pack2(lo_bits, hi_bits) -> np.ndarray:
    return (np.asarray(lo_bits, np.uint32) | (np.asarray(hi_bits, np.uint32) << 16)).astype(np.uint32)


def unpack2(reg):
    reg = np.asarray(reg, np.uint32)
    return (reg & 0xFFFF).astype(np.uint16), (reg >> 16).astype(np.uint16)


# ------------------------------------------------------------------------------------------
# Shared memory
# ------------------------------------------------------------------------------------------

class SimSmem:
    def __init__(self, nbytes: int):
        self.data = np.zeros(nbytes, dtype=np.uint8)
        self.top = 0

    def tile(self, layout: SmemLayout) -> "SimTile":
        offset = -(-self.top // layout.alignment) * layout.alignment
        self.top = offset + layout.size_bytes
        if self.top > self.data.size:
            raise ValueError("simulated shared memory too small")
        return SimTile(self, offset, layout)

    def read16(self, addr) -> np.ndarray:
        addr = np.asarray(addr)
        if np.any(addr % 2):
            raise ValueError("misaligned 16-bit shared access")
        return (self.data[addr].astype(np.uint16) | (self.data[addr + 1].astype(np.uint16) << 8))

    def write16(self, addr, bits) -> None:
        bits = np.asarray(bits, np.uint16)
        self.data[addr] = (bits & 0xFF).astype(np.uint8)
        self.data[addr + 1] = (bits >> 8).astype(np.uint8)


class SimTile:
    """The simulator's `SmemTile`: a layout at an offset of a `SimSmem`."""

    def __init__(self, smem: SimSmem, offset: int, layout: SmemLayout):
        self.smem, self.offset, self.layout = smem, offset, layout

    def byte_offset(self, row, col):
        return self.layout.byte_offset(row, col) + self.offset

    def write(self, matrix: np.ndarray, dtype: str) -> None:
        """Store a [rows, cols] matrix (rounded to dtype) element by element through the layout."""
        rows, cols = self.layout.rows, self.layout.cols
        assert matrix.shape == (rows, cols)
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        addr = self.byte_offset(r.ravel(), c.ravel())
        if len(np.unique(addr)) != addr.size:
            raise AssertionError("layout maps two elements to one address")
        self.smem.write16(addr, f32_to_bits16(matrix.ravel(), dtype))

    def read(self, dtype: str) -> np.ndarray:
        rows, cols = self.layout.rows, self.layout.cols
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return bits16_to_f32(self.smem.read16(self.byte_offset(r.ravel(), c.ravel())), dtype).reshape(rows, cols)


# ------------------------------------------------------------------------------------------
# Instructions (ISA semantics)
# ------------------------------------------------------------------------------------------

def ldmatrix(smem: SimSmem, addrs: np.ndarray, num: int, trans: bool) -> list[np.ndarray]:
    """ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16 with lane row addresses ``addrs``.

    Matrix i's row r is the 8 consecutive b16 at the address of lane 8i + r. Without .trans lane l
    receives row l/4, elements 2(l%4) and 2(l%4)+1 (low, high); with .trans it receives column l/4,
    elements of rows 2(l%4) and 2(l%4)+1.
    """
    addrs = np.broadcast_to(np.asarray(addrs), (WARP_SIZE,))
    if np.any(addrs % 16):
        raise ValueError("ldmatrix row addresses must be 16-byte aligned")
    out = []
    for i in range(num):
        rows = np.stack([smem.read16(addrs[8 * i + r] + 2 * np.arange(8)) for r in range(8)])  # [8, 8]
        g, t = LANES // 4, LANES % 4
        if trans:
            lo, hi = rows[2 * t, g], rows[2 * t + 1, g]
        else:
            lo, hi = rows[g, 2 * t], rows[g, 2 * t + 1]
        out.append(pack2(lo, hi))
    return out


def gather_a(a_regs, dtype) -> np.ndarray:
    """The 16x16 A matrix a warp's four A registers describe (mma.m16n8k16 A layout)."""
    mat = np.full((16, 16), np.nan, np.float32)
    for reg in range(4):
        halves = unpack2(a_regs[reg])
        for h in range(2):
            r, c = mma_a_coord(LANES, reg, h)
            mat[r, c] = bits16_to_f32(halves[h], dtype)
    return mat


def gather_b(b_regs, dtype) -> np.ndarray:
    mat = np.full((16, 8), np.nan, np.float32)
    for reg in range(2):
        halves = unpack2(b_regs[reg])
        for h in range(2):
            r, c = mma_b_coord(LANES, reg, h)
            mat[r, c] = bits16_to_f32(halves[h], dtype)
    return mat


def mma_m16n8k16(a_regs, b_regs, c_regs, dtype: str = "bf16") -> list[np.ndarray]:
    """D = A·B + C with A, B, C assembled from the lanes per the ISA fragment layouts."""
    a, b = gather_a(a_regs, dtype), gather_b(b_regs, dtype)
    c = np.zeros((16, 8), np.float32)
    for i in range(4):
        r, col = mma_c_coord(LANES, i)
        c[r, col] = c_regs[i]
    d = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
    return [d[mma_c_coord(LANES, i)] for i in range(4)]


class NumpyBackend:
    """`mma.run_warp_matmul` backend that simulates one warp (lane = all 32 at once)."""

    def __init__(self, smem: SimSmem, dtype: str = "bf16"):
        self.smem, self.dtype = smem, dtype

    def ldmatrix(self, tile, row, col, num, trans):
        return ldmatrix(self.smem, tile.byte_offset(row, col), num, trans)

    def mma(self, a, b, c):
        return mma_m16n8k16(a, b, c, self.dtype)

    def pack(self, lo, hi):
        return pack2(f32_to_bits16(lo, self.dtype), f32_to_bits16(hi, self.dtype))


# ------------------------------------------------------------------------------------------
# Accumulator tiles over warps
# ------------------------------------------------------------------------------------------

def zero_acc(layout) -> list[list[np.ndarray]]:
    """Per warp, per register: a [32] f32 array."""
    return [[np.zeros(WARP_SIZE, np.float32) for _ in range(layout.regs_per_lane)]
            for _ in range(layout.num_warps)]


def gather_acc(layout, warps_values) -> np.ndarray:
    """The [rows, cols] matrix held by an accumulator tile (each element must be held once)."""
    mat = np.full((layout.rows, layout.cols), np.nan, np.float32)
    seen = np.zeros(mat.shape, np.int32)
    for w, values in enumerate(warps_values):
        for reg, v in enumerate(values):
            r, c = layout.coord(w, LANES, reg)
            mat[r, c] = v
            np.add.at(seen, (r, c), 1)
    if not np.all(seen == 1):
        raise AssertionError("accumulator layout does not cover the tile exactly once")
    return mat


def scatter_acc(layout, matrix: np.ndarray) -> list[list[np.ndarray]]:
    return [[matrix[layout.coord(w, LANES, reg)].astype(np.float32)
             for reg in range(layout.regs_per_lane)] for w in range(layout.num_warps)]


class NumpyLaneOps:
    """`shuffle.cumsum_rows_warp` lane operations on [32] arrays (shfl.up keeps the own value
    for lanes below delta, as the ISA does for out-of-range sources)."""

    def shfl_up(self, x, delta):
        src = LANES - delta
        return np.where(src >= 0, x[np.maximum(src, 0)], x)

    def shfl_idx(self, x, src_lane):
        return x[np.broadcast_to(np.asarray(src_lane) % WARP_SIZE, (WARP_SIZE,))]

    def add(self, a, b):
        return (np.asarray(a, np.float32) + np.asarray(b, np.float32)).astype(np.float32)

    def add_if_ge(self, x, y, g, d):
        return np.where(np.asarray(g) >= d, self.add(x, y), x).astype(np.float32)
