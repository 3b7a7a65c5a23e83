"""mma.sync m16n8k16 (bf16/f16 → f32): the instruction, accumulator tiles, warp-tile matmuls.

Layers, each reusable on its own:

* `mma_m16n8k16` — one ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`` on register lists.
* `AccFragment` — an f32 [rows, cols] tile in registers over the warps of a group (`AccLayout`):
  elementwise maps with each register's (row, col), loads/stores to global or shared memory.
* `warp_matmul_plan` — the static schedule of a warp-tile matmul (which ldmatrix feeds which mma),
  pure data; `run_warp_matmul` executes a plan on a *backend*: `MlirBackend` emits ldmatrix/mma
  ops, `warpsim.NumpyBackend` simulates the same plan on the CPU, so the CPU test exercises the
  very schedule and addresses a kernel emits.
* `warp_matmul` — ``acc += op(A) · op(B)`` with A, B from shared tiles (natural or transposed) or
  from registers (`acc_to_a` / `acc_to_bt` below).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..._mlir import arith, ir, llvm, nvvm, scf
from .convert import acc_to_a_frags, acc_to_bt_frags, pack_f32x2, to_f32
from .ints import IntVal, as_i32
from .layouts import (C_REGS, MMA_K, MMA_M, MMA_N, AccLayout, ldmatrix_operand_lane_coord,
                      ldmatrix_trans_flag)
from .ldmatrix import ldmatrix


def _f32() -> ir.Type:
    return ir.F32Type.get()


# ------------------------------------------------------------------------------------------
# The instruction
# ------------------------------------------------------------------------------------------

def mma_m16n8k16(a: list[ir.Value], b: list[ir.Value], c: list[ir.Value],
                 dtype: str = "bf16") -> list[ir.Value]:
    """D = A·B + C for one m16n8k16 atom: 4 packed A regs, 2 packed B regs, 4 f32 → 4 f32."""
    if len(a) != 4 or len(b) != 2 or len(c) != 4:
        raise ValueError("mma m16n8k16 takes 4 A registers, 2 B registers and 4 f32 accumulators")
    if dtype not in ("bf16", "f16"):
        raise ValueError(f"mma operand type must be bf16 or f16, got {dtype!r}")
    ptx_type = ir.Attribute.parse(f"#nvvm.mma_type<{dtype}>")
    res_t = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")
    if dtype == "f16":
        # f16 fragments are typed vector<2xf16> in the NVVM op.
        vec = ir.VectorType.get([2], ir.F16Type.get())
        a = [llvm.bitcast(vec, x) for x in a]
        b = [llvm.bitcast(vec, x) for x in b]
    res = nvvm.mma_sync(res_t, ir.Attribute.parse("#nvvm.shape<m = 16, n = 8, k = 16>"),
                        nvvm.MMALayout.row, nvvm.MMALayout.col, a, b, c,
                        multiplicand_a_ptx_type=ptx_type, multiplicand_b_ptx_type=ptx_type)
    return [llvm.extractvalue(_f32(), res, [i]) for i in range(4)]


def mma_m16n8k8_tf32(a: list[ir.Value], b: list[ir.Value], c: list[ir.Value]) -> list[ir.Value]:
    """D = A·B + C for one m16n8k8 TF32 atom (``mma.sync...row.col.f32.tf32.tf32``): 4 A and 2
    B i32 registers holding TF32 bits (the tensor core reads the top 19), 4 f32 → 4 f32.
    Fragments (g = lane / 4, t = lane % 4): A reg r = A[g + 8(r % 2), t + 4(r / 2)],
    B reg r = B[t + 4r, g], C/D reg i = C[g + 8(i / 2), 2t + i % 2]."""
    if len(a) != 4 or len(b) != 2 or len(c) != 4:
        raise ValueError("mma m16n8k8 (tf32) takes 4 A registers, 2 B registers and 4 f32 "
                         "accumulators")
    ptx_type = ir.Attribute.parse("#nvvm.mma_type<tf32>")
    res_t = ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>")
    res = nvvm.mma_sync(res_t, ir.Attribute.parse("#nvvm.shape<m = 16, n = 8, k = 8>"),
                        nvvm.MMALayout.row, nvvm.MMALayout.col, a, b, c,
                        multiplicand_a_ptx_type=ptx_type, multiplicand_b_ptx_type=ptx_type)
    return [llvm.extractvalue(_f32(), res, [i]) for i in range(4)]


# ------------------------------------------------------------------------------------------
# Accumulator tiles in registers
# ------------------------------------------------------------------------------------------

@dataclass
class AccFragment:
    """Register tile in `AccLayout`: ``values[reg]`` is this lane's f32 register ``reg``."""
    layout: AccLayout
    values: list

    @classmethod
    def filled(cls, layout: AccLayout, value: float = 0.0) -> "AccFragment":
        v = arith.constant(_f32(), float(value))
        return cls(layout, [v] * layout.regs_per_lane)

    def coords(self, coords) -> list[tuple]:
        """(row, col) int-likes of every register for the thread at ``coords`` (WarpCoords)."""
        return [self.layout.coord(coords.warp, coords.lane, r) for r in range(self.layout.regs_per_lane)]

    def map(self, fn, *others: "AccFragment") -> "AccFragment":
        """Elementwise: ``fn(x, *ys)`` per register (all fragments must share the layout)."""
        for o in others:
            if o.layout != self.layout:
                raise ValueError("elementwise op on fragments of different layouts")
        return AccFragment(self.layout, [fn(*vals) for vals in zip(self.values, *(o.values for o in others))])

    def map_indexed(self, fn, coords) -> "AccFragment":
        """``fn(x, row, col)`` per register, row/col int-likes (for masks, gates, causal tiles)."""
        return AccFragment(self.layout, [fn(x, r, c) for x, (r, c) in zip(self.values, self.coords(coords))])


def _pair_type(dtype: str) -> tuple[ir.Type, int]:
    if dtype == "f32":
        return ir.VectorType.get([2], _f32()), 8
    return ir.IntegerType.get_signless(32), 4


def _pair_value(x0, x1, dtype):
    if dtype == "f32":
        vec_t = ir.VectorType.get([2], _f32())
        v = llvm.mlir_undef(vec_t)
        v = llvm.insertelement(v, x0, arith.constant(ir.IntegerType.get_signless(32), 0))
        return llvm.insertelement(v, x1, arith.constant(ir.IntegerType.get_signless(32), 1))
    return pack_f32x2(x0, x1, dtype)


def store_acc(acc: AccFragment, target, coords, dtype: str = "f32") -> None:
    """Store an accumulator tile to a `GlobalView` or `SmemTile` as ``dtype`` (f32, bf16, f16).

    Each lane writes its column pairs (2t, 2t+1) as one 8-byte (f32) or 4-byte (16-bit) store.
    For a GlobalView with ``rows_valid`` the out-of-range rows are skipped.
    """
    lay = acc.layout
    from .smem import GlobalView  # local: smem imports nothing from here
    is_global = isinstance(target, GlobalView)
    pair_t, nbytes = _pair_type(dtype)
    for am in range(lay.atoms_m):
        for an in range(lay.atoms_n):
            for hi in (0, 1):
                r0 = lay.reg(am, an, 2 * hi)
                row, col = lay.coord(coords.warp, coords.lane, r0)
                value = _pair_value(acc.values[r0], acc.values[r0 + 1], dtype)
                if not is_global:
                    llvm.store(value, target.ptr(row, col), alignment=nbytes)
                    continue
                valid = target.row_in_range(row)
                if valid is None:
                    llvm.store(value, target.ptr(row, col), alignment=nbytes)
                else:
                    branch = scf.IfOp(valid)
                    with ir.InsertionPoint(branch.then_block):
                        llvm.store(value, target.ptr(row, col), alignment=nbytes)
                        scf.yield_([])


def load_acc(layout: AccLayout, source, coords, dtype: str = "f32") -> AccFragment:
    """Load a tile stored as ``dtype`` from a `GlobalView` or `SmemTile` into accumulator layout
    (f32 in registers). Global rows past ``rows_valid`` read as zero."""
    from .smem import GlobalView
    is_global = isinstance(source, GlobalView)
    elem_t = {"f32": _f32(), "bf16": ir.BF16Type.get(), "f16": ir.F16Type.get()}[dtype]
    values = [None] * layout.regs_per_lane
    for reg in range(layout.regs_per_lane):
        row, col = layout.coord(coords.warp, coords.lane, reg)
        if is_global and source.rows_valid is not None:
            valid = source.row_in_range(row)
            safe_row = IntVal(arith.select(valid, as_i32(row), as_i32(0)))
            x = to_f32(llvm.load(elem_t, source.ptr(safe_row, col)))
            values[reg] = arith.select(valid, x, arith.constant(_f32(), 0.0))
        else:
            values[reg] = to_f32(llvm.load(elem_t, source.ptr(row, col)))
    return AccFragment(layout, values)


# ------------------------------------------------------------------------------------------
# Warp-tile matmul: operands, plan, executor
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SmemOperand:
    """An operand in a shared tile. ``transposed``: the tile stores A as [K, M] / B as [N, K].
    (row0, col0): stored-tile coordinates of the operand's logical element (0, 0)."""
    tile: object
    transposed: bool = False
    row0: object = 0
    col0: object = 0


@dataclass(frozen=True)
class RegOperand:
    """An operand already in registers: A fragments keyed (am, kk) → 4 regs, or B fragments keyed
    (kk, an) → 2 regs; ``source`` is the AccLayout it was converted from (for checks)."""
    frags: dict
    source: AccLayout | None = None


def acc_to_a(acc, dtype: str = "bf16"):
    """A-operand fragments of an accumulator tile, as a `mma.RegOperand`.

    Each warp's block [warp_rows, warp_cols] becomes the A operand [M = warp_rows, K = warp_cols]
    of the next warp_matmul: key (am, kk) → 4 packed registers, kk the 16-wide k block.
    """
    frags = acc_to_a_frags(acc.layout, acc.values, lambda lo, hi: pack_f32x2(lo, hi, dtype))
    return RegOperand(frags, acc.layout)


def acc_to_bt(acc, dtype: str = "bf16"):
    """B-operand fragments of the *transpose* of an accumulator tile X, as a `mma.RegOperand`.

    Each warp's X block [rows → n, cols → k] gives key (kk, an) → 2 packed registers for n8 atom
    ``an`` of Xᵀ (an = 2·am + {0, 1}).
    """
    frags = acc_to_bt_frags(acc.layout, acc.values, lambda lo, hi: pack_f32x2(lo, hi, dtype))
    return RegOperand(frags, acc.layout)


@dataclass(frozen=True)
class LoadStep:
    operand: str                 # 'a' or 'b'
    first: int                   # logical block origin (A: m, B: k), warp-relative for A
    second: int                  # (A: k, B: n), warp-relative for B
    num: int                     # ldmatrix .x count
    targets: tuple               # fragment keys filled: A (am, kk); B (kk, an) per 2 regs


@dataclass(frozen=True)
class MmaStep:
    am: int
    an: int
    kk: int


@dataclass(frozen=True)
class WarpMatmulPlan:
    layout: AccLayout
    k: int
    steps: tuple = field(repr=False)

    @property
    def num_mma(self) -> int:
        return sum(isinstance(s, MmaStep) for s in self.steps)

    @property
    def num_ldmatrix(self) -> int:
        return sum(isinstance(s, LoadStep) for s in self.steps)


def warp_matmul_plan(layout: AccLayout, k: int, a_in_regs: bool = False,
                     b_in_regs: bool = False) -> WarpMatmulPlan:
    """Schedule of ``acc[warp block] += A[warp rows, :k] · B[:k, warp cols]`` per k16 step:
    A fragments (ldmatrix.x4 per m16), B atoms (x4 per n16 pair, x2 for an odd last n8), mmas."""
    if k % MMA_K:
        raise ValueError(f"matmul depth {k} is not a multiple of {MMA_K}")
    steps = []
    for kk in range(k // MMA_K):
        if not a_in_regs:
            for am in range(layout.atoms_m):
                steps.append(LoadStep("a", am * MMA_M, kk * MMA_K, 4, ((am, kk),)))
        if not b_in_regs:
            for p in range(layout.atoms_n // 2):
                steps.append(LoadStep("b", kk * MMA_K, 2 * p * MMA_N, 4, ((kk, 2 * p), (kk, 2 * p + 1))))
            if layout.atoms_n % 2:
                an = layout.atoms_n - 1
                steps.append(LoadStep("b", kk * MMA_K, an * MMA_N, 2, ((kk, an),)))
        for am in range(layout.atoms_m):
            for an in range(layout.atoms_n):
                steps.append(MmaStep(am, an, kk))
    return WarpMatmulPlan(layout, k, tuple(steps))


def operand_lane_address(step: LoadStep, src: SmemOperand, warp_origin, lane):
    """Stored-tile (row, col) of the row address ``lane`` supplies for ``step``."""
    wr0, wc0 = warp_origin
    if step.operand == "a":
        lf, ls = wr0 + step.first, step.second
    else:
        lf, ls = step.first, wc0 + step.second
    lr, lc = ldmatrix_operand_lane_coord(lane, step.num, src.transposed)
    if not src.transposed:
        return src.row0 + lf + lr, src.col0 + ls + lc
    return src.row0 + ls + lr, src.col0 + lf + lc


def run_warp_matmul(plan: WarpMatmulPlan, backend, acc_values: list, a, b, warp, lane) -> list:
    """Execute ``plan`` on ``backend`` (``ldmatrix(tile, row, col, num, trans)``,
    ``mma(a4, b2, c4)``); returns the new accumulator register list."""
    lay = plan.layout
    origin = lay.warp_origin(warp)
    a_frag = dict(a.frags) if isinstance(a, RegOperand) else {}
    b_frag = dict(b.frags) if isinstance(b, RegOperand) else {}
    acc = list(acc_values)
    for step in plan.steps:
        if isinstance(step, LoadStep):
            src = a if step.operand == "a" else b
            row, col = operand_lane_address(step, src, origin, lane)
            regs = backend.ldmatrix(src.tile, row, col, step.num,
                                    ldmatrix_trans_flag(step.operand, src.transposed))
            if step.operand == "a":
                a_frag[step.targets[0]] = regs
            else:
                for i, key in enumerate(step.targets):
                    b_frag[key] = regs[2 * i:2 * i + 2]
        else:
            base = lay.reg(step.am, step.an, 0)
            acc[base:base + C_REGS] = backend.mma(a_frag[(step.am, step.kk)],
                                                  b_frag[(step.kk, step.an)], acc[base:base + C_REGS])
    return acc


class MlirBackend:
    """Emits the plan: ldmatrix at ``tile.ptr(row, col)`` and mma.sync."""

    def __init__(self, dtype: str = "bf16"):
        self.dtype = dtype

    def ldmatrix(self, tile, row, col, num, trans):
        return ldmatrix(tile.ptr(row, col), num, trans)

    def mma(self, a, b, c):
        return mma_m16n8k16(a, b, c, self.dtype)


def check_register_operands(layout: AccLayout, a, b) -> None:
    """Register operands only work when each warp already holds the rows/cols it needs."""
    if isinstance(a, RegOperand) and a.source is not None:
        s = a.source
        if not (s.warps_n == 1 and layout.warps_n == 1 and s.warps_m == layout.warps_m
                and s.rows == layout.rows):
            raise ValueError(
                "register A operand: the producing tile must be split over warps by rows only, "
                "with the same row split as the result (warps_n = 1 on both sides)")
    if isinstance(b, RegOperand) and b.source is not None:
        s = b.source
        if not (s.warps_n == 1 and layout.warps_m == 1 and s.warps_m == layout.warps_n
                and s.rows == layout.cols):
            raise ValueError(
                "register B operand (transpose of a tile X): X must be split over warps by rows "
                "only, matching the result's column split (result warps_m = 1)")


def warp_matmul(acc: AccFragment, a, b, k: int, coords, dtype: str = "bf16") -> AccFragment:
    """``acc += op(A)[:, :k] · op(B)[:k, :]`` for every warp of ``acc``'s group.

    ``a`` / ``b``: `SmemOperand` (natural or transposed shared tiles; any row/col origin) or
    `RegOperand` (from `convert.acc_to_a` / `acc_to_bt`). Shared operands must be complete and
    visible (barrier) before the call.
    """
    check_register_operands(acc.layout, a, b)
    plan = warp_matmul_plan(acc.layout, k, isinstance(a, RegOperand), isinstance(b, RegOperand))
    values = run_warp_matmul(plan, MlirBackend(dtype), acc.values, a, b, coords.warp, coords.lane)
    return AccFragment(acc.layout, values)
