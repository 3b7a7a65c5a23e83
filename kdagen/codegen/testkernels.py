"""Emitter test kernels: small kernels assembled ONLY from the codegen emitter library.

These are not kdagen's attention kernels (those come from the DSL through the passes); they exist
to check each emitter on a GPU against torch with a tiny driver. Each ``build_<name>(builder, ...)``
adds one kernel to a `GpuModuleBuilder` and returns a `LaunchContract` (kernel name, grid, block,
dynamic shared memory, parameters, and the expected result in torch terms).

Conventions: all tensors are contiguous row-major; "A [M, K] bf16" means a torch tensor of that
shape and dtype. Kernels with more than 48 KB of dynamic shared memory need
``cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`` before launch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._mlir import arith, ir, llvm, scf
from .common import barrier
from .common.convert import acc_to_a, acc_to_bt
from .common.ints import IntVal, as_i32
from .common.kernel import GpuModuleBuilder, Param
from .common.layouts import AccLayout, SmemLayout
from .common.mma import AccFragment, SmemOperand, round_acc, store_acc, warp_matmul
from .common.shuffle import acc_row_reduce
from .common.smem import (ELEM_BYTES, GlobalView, SmemAllocator, copy_global_to_shared,
                          cp_async_commit, cp_async_wait)
from .common.threads import warp_coords
from .target import Target


@dataclass
class LaunchContract:
    kernel: str
    grid: tuple
    block: tuple
    dynamic_smem_bytes: int
    params: list
    expected: str
    chips: tuple = ("sm_90a", "sm_100a", "sm_120a")
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _smem_layout(rows: int, cols: int, elem_bytes: int, swizzle: str) -> SmemLayout:
    if swizzle == "auto":
        return SmemLayout.auto(rows, cols, elem_bytes)
    if swizzle == "pad":
        return SmemLayout(rows, cols, elem_bytes, 0, pad_bytes=16)
    return SmemLayout(rows, cols, elem_bytes, int(swizzle))


def _load_tile(smem, builder_tid, ptr, elem, rows, cols, nthreads, swizzle, use_cp_async):
    tile = smem.tile(_smem_layout(rows, cols, ELEM_BYTES[elem], swizzle))
    copy_global_to_shared(tile, GlobalView(ptr, elem, cols), builder_tid, nthreads,
                          use_cp_async=use_cp_async)
    return tile


def build_mma_tile(builder: GpuModuleBuilder, m: int = 16, n: int = 16, k: int = 16,
                   warps_m: int = 1, warps_n: int = 1, trans_a: bool = False,
                   trans_b: bool = False, dtype: str = "bf16", use_cp_async: bool = True,
                   swizzle: str = "auto", name: str | None = None) -> LaunchContract:
    """C = op(A) @ op(B) on one [m, n, k] tile: global → shared (cp.async or vector copies,
    swizzled or padded) → ldmatrix(.trans) → mma.sync → C in global memory.

    Launch: grid (1, 1, 1); block (32·warps_m·warps_n, 1, 1); dynamic smem = contract value.
    Params: A (dtype) stored [m, k] or, with trans_a, [k, m]; B (dtype) stored [k, n] or, with
    trans_b, [n, k]; C (f32) [m, n].
    Expected: C = (A.T if trans_a else A).float() @ (B.T if trans_b else B).float()
    (fp32 accumulation; compare with rtol ~1e-5 relative to the norm).
    """
    name = name or (f"emt_mma_tile_m{m}n{n}k{k}_w{warps_m}x{warps_n}_{'T' if trans_a else 'N'}"
                    f"{'T' if trans_b else 'N'}_{dtype}_{'cpasync' if use_cp_async else 'ld'}_{swizzle}")
    nthreads = 32 * warps_m * warps_n
    params = [Param("A", "ptr", dtype), Param("B", "ptr", dtype), Param("C", "ptr", "f32")]
    with builder.kernel(name, params, (nthreads, 1, 1)) as p:
        smem = SmemAllocator(builder)
        wc = warp_coords()
        a_shape = (k, m) if trans_a else (m, k)
        b_shape = (n, k) if trans_b else (k, n)
        ta = _load_tile(smem, wc.tid, p["A"], dtype, *a_shape, nthreads, swizzle, use_cp_async)
        tb = _load_tile(smem, wc.tid, p["B"], dtype, *b_shape, nthreads, swizzle, use_cp_async)
        if use_cp_async:
            cp_async_commit()
            cp_async_wait(0)
        barrier.sync_threads()
        layout = AccLayout(m, n, warps_m, warps_n)
        acc = AccFragment.filled(layout, 0.0)
        acc = warp_matmul(acc, SmemOperand(ta, trans_a), SmemOperand(tb, trans_b), k, wc, dtype)
        store_acc(acc, GlobalView(p["C"], "f32", n), wc, "f32")
    return LaunchContract(
        name, (1, 1, 1), (nthreads, 1, 1), smem.size_bytes,
        [f"A {dtype} [{a_shape[0]}, {a_shape[1]}]", f"B {dtype} [{b_shape[0]}, {b_shape[1]}]",
         f"C f32 [{m}, {n}] (output)"],
        f"C = {'A.T' if trans_a else 'A'}.float() @ {'B.T' if trans_b else 'B'}.float()")


def build_mma_chain(builder: GpuModuleBuilder, m: int = 64, k1: int = 64, n1: int = 64,
                    n2: int = 64, warps: int = 4, dtype: str = "bf16",
                    name: str | None = None) -> LaunchContract:
    """Register reuse: P = A @ B (f32 in registers), then O = P₁₆ @ V and Oᵀ-path Q = A2 @ P₁₆ᵀ,
    where P₁₆ = P rounded to ``dtype`` and used *directly* from the accumulator registers as the A
    operand (C→A) and as the Bᵀ operand (C→Bᵀ) — no shared-memory round trip.

    Warps split rows (warps_m = warps, warps_n = 1), as the register operand requires.
    Launch: grid (1, 1, 1); block (32·warps, 1, 1); dynamic smem = contract value.
    Params: A [m, k1], B [k1, n1], V [n1, n2], A2 [m2 = 16, n1]... see expected; O f32 [m, n2],
    Q f32 [16, m].
    Expected: P16 = (A.float() @ B.float()).to(dtype).float();
              O = P16 @ V.float();   Q = A2.float() @ P16.T   (A2 is [16, n1])
    """
    name = name or f"emt_mma_chain_m{m}k{k1}n{n1}n{n2}_w{warps}_{dtype}"
    nthreads = 32 * warps
    params = [Param("A", "ptr", dtype), Param("B", "ptr", dtype), Param("V", "ptr", dtype),
              Param("A2", "ptr", dtype), Param("O", "ptr", "f32"), Param("Q", "ptr", "f32")]
    with builder.kernel(name, params, (nthreads, 1, 1)) as p:
        smem = SmemAllocator(builder)
        wc = warp_coords()
        ta = _load_tile(smem, wc.tid, p["A"], dtype, m, k1, nthreads, "auto", True)
        tb = _load_tile(smem, wc.tid, p["B"], dtype, k1, n1, nthreads, "auto", True)
        tv = _load_tile(smem, wc.tid, p["V"], dtype, n1, n2, nthreads, "auto", True)
        ta2 = _load_tile(smem, wc.tid, p["A2"], dtype, 16, n1, nthreads, "auto", True)
        cp_async_commit()
        cp_async_wait(0)
        barrier.sync_threads()
        lp = AccLayout(m, n1, warps, 1)
        acc_p = warp_matmul(AccFragment.filled(lp), SmemOperand(ta), SmemOperand(tb), k1, wc, dtype)
        # O = P16 @ V with P from registers (C → A).
        lo = AccLayout(m, n2, warps, 1)
        acc_o = warp_matmul(AccFragment.filled(lo), acc_to_a(acc_p, dtype), SmemOperand(tv), n1, wc, dtype)
        store_acc(acc_o, GlobalView(p["O"], "f32", n2), wc, "f32")
        # Q = A2 @ P16ᵀ with Pᵀ from registers (C → Bᵀ): result [16, m], columns split over warps.
        lq = AccLayout(16, m, 1, warps)
        acc_q = warp_matmul(AccFragment.filled(lq), SmemOperand(ta2), acc_to_bt(acc_p, dtype), n1, wc, dtype)
        store_acc(acc_q, GlobalView(p["Q"], "f32", m), wc, "f32")
    return LaunchContract(
        name, (1, 1, 1), (nthreads, 1, 1), smem.size_bytes,
        [f"A {dtype} [{m}, {k1}]", f"B {dtype} [{k1}, {n1}]", f"V {dtype} [{n1}, {n2}]",
         f"A2 {dtype} [16, {n1}]", f"O f32 [{m}, {n2}] (output)", f"Q f32 [16, {m}] (output)"],
        f"P16 = (A.float() @ B.float()).to({dtype}).float(); O = P16 @ V.float(); "
        "Q = A2.float() @ P16.T")


def build_row_reduce(builder: GpuModuleBuilder, m: int = 64, n: int = 64, k: int = 32,
                     warps_m: int = 2, warps_n: int = 2, dtype: str = "bf16",
                     name: str | None = None) -> LaunchContract:
    """Row reductions of an mma accumulator: S = A @ B, then rowsum(S), rowmax(S) (quad shuffles
    plus a shared-memory combine across the ``warps_n`` warps splitting the columns), and
    E = exp2(S - rowmax) — the softmax-style "reduce then broadcast back" pattern.

    Launch: grid (1, 1, 1); block (32·warps_m·warps_n, 1, 1); dynamic smem = contract value.
    Params: A [m, k] dtype, B [k, n] dtype, rowsum f32 [m], rowmax f32 [m], E f32 [m, n].
    Expected: S = A.float() @ B.float(); rowsum = S.sum(1); rowmax = S.amax(1);
              E = torch.exp2(S - rowmax[:, None])  (ex2.approx: rtol ~1e-6)
    """
    from .common import fastmath
    from .common.shuffle import acc_apply_rows
    name = name or f"emt_row_reduce_m{m}n{n}k{k}_w{warps_m}x{warps_n}_{dtype}"
    nthreads = 32 * warps_m * warps_n
    params = [Param("A", "ptr", dtype), Param("B", "ptr", dtype), Param("rowsum", "ptr", "f32"),
              Param("rowmax", "ptr", "f32"), Param("E", "ptr", "f32")]
    with builder.kernel(name, params, (nthreads, 1, 1)) as p:
        smem = SmemAllocator(builder)
        wc = warp_coords()
        ta = _load_tile(smem, wc.tid, p["A"], dtype, m, k, nthreads, "auto", False)
        tb = _load_tile(smem, wc.tid, p["B"], dtype, k, n, nthreads, "auto", False)
        scratch_sum = smem.raw(m * warps_n * 4)
        scratch_max = smem.raw(m * warps_n * 4)
        barrier.sync_threads()
        layout = AccLayout(m, n, warps_m, warps_n)
        acc = warp_matmul(AccFragment.filled(layout), SmemOperand(ta), SmemOperand(tb), k, wc, dtype)
        sums = acc_row_reduce(acc, "sum", wc, scratch_sum, barrier.sync_threads)
        maxs = acc_row_reduce(acc, "max", wc, scratch_max, barrier.sync_threads)
        # Rows are replicated over the quad and the warps_n warps: one writer per row.
        writer = arith.andi(
            arith.cmpi(arith.CmpIPredicate.eq, as_i32(wc.lane % 4), as_i32(0)),
            arith.cmpi(arith.CmpIPredicate.eq, as_i32(wc.warp % warps_n), as_i32(0)))
        for slot in range(len(sums.values)):
            row = sums.row(slot, wc)
            branch = scf.IfOp(writer)
            with ir.InsertionPoint(branch.then_block):
                llvm.store(sums.values[slot], GlobalView(p["rowsum"], "f32", 0).ptr(0, row))
                llvm.store(maxs.values[slot], GlobalView(p["rowmax"], "f32", 0).ptr(0, row))
                scf.yield_([])
        e = acc_apply_rows(acc, maxs, lambda x, mx: fastmath.exp2(arith.subf(x, mx)))
        store_acc(e, GlobalView(p["E"], "f32", n), wc, "f32")
    return LaunchContract(
        name, (1, 1, 1), (nthreads, 1, 1), smem.size_bytes,
        [f"A {dtype} [{m}, {k}]", f"B {dtype} [{k}, {n}]", f"rowsum f32 [{m}] (output)",
         f"rowmax f32 [{m}] (output)", f"E f32 [{m}, {n}] (output)"],
        "S = A.float() @ B.float(); rowsum = S.sum(1); rowmax = S.amax(1); "
        "E = torch.exp2(S - rowmax[:, None])")
