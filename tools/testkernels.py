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

from kdagen._mlir import arith, ir, llvm, scf
from kdagen.codegen.common import barrier
from kdagen.codegen.common.mma import acc_to_a, acc_to_bt
from kdagen.codegen.common.ints import IntVal, as_i32
from kdagen.codegen.common.kernel import GpuModuleBuilder, Param
from kdagen.codegen.common.launch import set_launch_bounds
from kdagen.codegen.common.layouts import AccLayout, SmemLayout
from kdagen.codegen.common.mma import AccFragment, SmemOperand, store_acc, warp_matmul
from kdagen.codegen.common.shuffle import acc_row_reduce
from kdagen.codegen.common.smem import (ELEM_BYTES, GlobalView, SmemAllocator, copy_global_to_shared,
                          cp_async_commit, cp_async_wait)
from kdagen.codegen.common.threads import warp_coords
from kdagen.target import DEFAULT_CHIPS, Target, chips_with


@dataclass(frozen=True)
class Arg:
    """One kernel parameter (or host-only tensor) of a test kernel, machine-readable.

    kind "tensor": a device tensor passed by pointer; "tensormap": the device address of a
    128-byte CUtensorMap describing host tensor ``of`` (encode with ``box``/``swizzle`` via
    `sm90.tma.TensorMapContract.encode_args(shape)`); "i32": a scalar (the driver passes
    ``value``); "host": an input tensor that is not a parameter itself (only a tensor map of it is).
    """
    name: str
    kind: str
    dtype: str = ""
    shape: tuple = ()
    output: bool = False
    of: str = ""
    box: tuple = ()
    swizzle: int = 0
    value: int = 0

    def describe(self) -> str:
        if self.kind == "i32":
            return f"{self.name} i32 (= {self.value})"
        if self.kind == "tensormap":
            return f"{self.name} u64: device address of the CUtensorMap of {self.of} (box {list(self.box)}, swizzle {self.swizzle}B)"
        role = " (output)" if self.output else (" (host tensor, only its tensor map is passed)" if self.kind == "host" else "")
        return f"{self.name} {self.dtype} {list(self.shape)}{role}"


def tensor(name, dtype, shape, output=False) -> Arg:
    return Arg(name, "tensor", dtype, tuple(shape), output)


def host(name, dtype, shape) -> Arg:
    return Arg(name, "host", dtype, tuple(shape))


def tensormap(name, of: Arg, contract) -> Arg:
    return Arg(name, "tensormap", of.dtype, of.shape, of=of.name, box=tuple(contract.box),
               swizzle=contract.swizzle)


def scalar(name, value) -> Arg:
    return Arg(name, "i32", value=value)


@dataclass
class LaunchContract:
    """How to launch and check one emitter test kernel.

    ``args``: the kernel parameters in order; ``host``: extra host-only input tensors;
    ``reference``: Python statements computing every output from the inputs (torch tensors of the
    arg names, f32 for float math; names ``torch``, ``bf16``, ``f16``, ``pad_rows(t, n)`` in scope);
    ``rtol``: bound on ‖out − ref‖ / ‖ref‖ per output.
    """
    kernel: str
    grid: tuple
    block: tuple
    dynamic_smem_bytes: int
    args: list
    reference: str
    chips: tuple = DEFAULT_CHIPS
    host: list = field(default_factory=list)
    rtol: float = 1e-5
    extra: dict = field(default_factory=dict)

    @property
    def params(self) -> list[str]:
        return [a.describe() for a in self.args]

    def to_json(self) -> dict:
        from dataclasses import asdict
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "dynamic_smem_bytes": self.dynamic_smem_bytes, "chips": list(self.chips),
                "args": [asdict(a) for a in self.args], "host": [asdict(a) for a in self.host],
                "reference": self.reference, "rtol": self.rtol}


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
        [tensor("A", dtype, a_shape), tensor("B", dtype, b_shape), tensor("C", "f32", (m, n), True)],
        f"C = {'A.T' if trans_a else 'A'}.float() @ {'B.T' if trans_b else 'B'}.float()")


def build_mma_chain(builder: GpuModuleBuilder, m: int = 64, k1: int = 64, n1: int = 64,
                    n2: int = 64, warps: int = 4, dtype: str = "bf16",
                    name: str | None = None) -> LaunchContract:
    """Register reuse: P = A @ B (f32 in registers), then O = P₁₆ @ V and Oᵀ-path Q = A2 @ P₁₆ᵀ,
    where P₁₆ = P rounded to ``dtype`` and used *directly* from the accumulator registers as the A
    operand (C→A) and as the Bᵀ operand (C→Bᵀ) — no shared-memory round trip.

    Warps split rows (warps_m = warps, warps_n = 1), as the register operand requires.
    Launch: grid (1, 1, 1); block (32·warps, 1, 1); dynamic smem = contract value.
    Params: A [m, k1], B [k1, n1], V [n1, n2], A2 [16, n1] (all dtype); O f32 [m, n2] and
    Q f32 [16, m] (outputs).
    Expected: P16 = (A.float() @ B.float()).to(dtype).float();
              O = P16 @ V.float();   Q = A2.float() @ P16.T
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
        [tensor("A", dtype, (m, k1)), tensor("B", dtype, (k1, n1)), tensor("V", dtype, (n1, n2)),
         tensor("A2", dtype, (16, n1)), tensor("O", "f32", (m, n2), True),
         tensor("Q", "f32", (16, m), True)],
        f"P16 = (A.float() @ B.float()).to({dtype}).float(); O = P16 @ V.float(); "
        "Q = A2.float() @ P16.T", rtol=2e-3)


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
    from kdagen.codegen.common import fastmath
    from kdagen.codegen.common.rowcol import acc_apply_rows
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
        [tensor("A", dtype, (m, k)), tensor("B", dtype, (k, n)), tensor("rowsum", "f32", (m,), True),
         tensor("rowmax", "f32", (m,), True), tensor("E", "f32", (m, n), True)],
        "S = A.float() @ B.float(); rowsum = S.sum(1); rowmax = S.amax(1); "
        "E = torch.exp2(S - rowmax[:, None])")


def build_tile_ops(builder: GpuModuleBuilder, m: int = 64, n: int = 64, warps_m: int = 2,
                   warps_n: int = 2, name: str | None = None) -> LaunchContract:
    """Accumulator-tile ops without matmul: load an f32 tile into the mma C layout, inclusive
    cumsum down the rows (shuffle scan + cross-warp combine in shared memory), per-row and
    per-column vectors broadcast over the tile, and a lower-triangular mask.

    Launch: grid (1,1,1); block (32·warps_m·warps_n,1,1); dynamic smem = contract value.
    Params: X f32 [m, n], r f32 [m], c f32 [n], Y f32 [m, n], Z f32 [m, n] (outputs Y, Z).
    Expected: Y = X.cumsum(0); Z = torch.tril(X * torch.exp2(r[:, None] - c[None, :]))
    (ex2.approx: rtol ~1e-6; cumsum order differs from torch's: rtol ~1e-5).
    """
    from kdagen.codegen.common import fastmath
    from kdagen.codegen.common.mma import load_acc
    from kdagen.codegen.common.rowcol import acc_apply_cols, acc_apply_rows, acc_mask_triangular, \
        load_col_values, load_row_values
    from kdagen.codegen.common.shuffle import acc_cumsum_rows
    name = name or f"emt_tile_ops_m{m}n{n}_w{warps_m}x{warps_n}"
    nthreads = 32 * warps_m * warps_n
    params = [Param("X", "ptr", "f32"), Param("r", "ptr", "f32"), Param("c", "ptr", "f32"),
              Param("Y", "ptr", "f32"), Param("Z", "ptr", "f32")]
    with builder.kernel(name, params, (nthreads, 1, 1)) as p:
        smem = SmemAllocator(builder)
        wc = warp_coords()
        scratch = smem.raw(warps_m * n * 4)
        layout = AccLayout(m, n, warps_m, warps_n)
        x = load_acc(layout, GlobalView(p["X"], "f32", n), wc)
        y = acc_cumsum_rows(x, wc, scratch, barrier.sync_threads)
        store_acc(y, GlobalView(p["Y"], "f32", n), wc, "f32")
        rows = load_row_values(layout, GlobalView(p["r"], "f32", 1), wc)
        cols = load_col_values(layout, GlobalView(p["c"], "f32", 1), wc)
        z = acc_apply_rows(x, rows, lambda v, rv: arith.mulf(v, fastmath.exp2(rv)))
        z = acc_apply_cols(z, cols, lambda v, cv: arith.mulf(v, fastmath.exp2(arith.negf(cv))))
        z = acc_mask_triangular(z, wc)
        store_acc(z, GlobalView(p["Z"], "f32", n), wc, "f32")
    return LaunchContract(
        name, (1, 1, 1), (nthreads, 1, 1), smem.size_bytes,
        [tensor("X", "f32", (m, n)), tensor("r", "f32", (m,)), tensor("c", "f32", (n,)),
         tensor("Y", "f32", (m, n), True), tensor("Z", "f32", (m, n), True)],
        "Y = X.cumsum(0); Z = torch.tril(X * torch.exp2(r[:, None] - c[None, :]))")


def build_bthd_chunk_matmul(builder: GpuModuleBuilder, B: int = 2, T: int = 100, H: int = 3,
                            D: int = 64, chunk: int = 64, warps_m: int = 2, warps_n: int = 2,
                            dtype: str = "bf16", name: str | None = None) -> LaunchContract:
    """The chunked [B, T, H, D] access pattern: block (chunk c, head h, batch b) loads the [C, D]
    tile X[b, cC:(c+1)C, h, :] (cp.async, rows past T zero-filled), multiplies by W [D, D] and
    stores the rows < T of the f32 result to O[b, cC:(c+1)C, h, :] (masked tail stores).

    Launch: grid (ceil(T / C), H, B); block (32·warps_m·warps_n, 1, 1); dynamic smem = contract.
    Params: X dtype [B, T, H, D], W dtype [D, D], O f32 [B, T, H, D] (output), T i32.
    Expected: O = torch.einsum('bthd,de->bthe', X.float(), W.float())
    """
    from kdagen.codegen.common.sreg import block_idx
    from kdagen.codegen.common.smem import bthd_tile
    name = name or f"emt_bthd_chunk_matmul_C{chunk}_D{D}_w{warps_m}x{warps_n}_{dtype}"
    nthreads = 32 * warps_m * warps_n
    params = [Param("X", "ptr", dtype), Param("W", "ptr", dtype), Param("O", "ptr", "f32"),
              Param("T", "i32")]
    with builder.kernel(name, params, (nthreads, 1, 1)) as p:
        smem = SmemAllocator(builder)
        wc = warp_coords()
        c, h, b = IntVal(block_idx("x")), IntVal(block_idx("y")), IntVal(block_idx("z"))
        t0 = c * chunk
        x_view = bthd_tile(p["X"], dtype, b, t0, h, p["T"], H, D)
        tx = smem.tile(SmemLayout.auto(chunk, D, ELEM_BYTES[dtype]))
        copy_global_to_shared(tx, x_view, wc.tid, nthreads, use_cp_async=True)
        tw = _load_tile(smem, wc.tid, p["W"], dtype, D, D, nthreads, "auto", True)
        cp_async_commit()
        cp_async_wait(0)
        barrier.sync_threads()
        acc = warp_matmul(AccFragment.filled(AccLayout(chunk, D, warps_m, warps_n)),
                          SmemOperand(tx), SmemOperand(tw), D, wc, dtype)
        store_acc(acc, bthd_tile(p["O"], "f32", b, t0, h, p["T"], H, D), wc, "f32")
    return LaunchContract(
        name, (-(-T // chunk), H, B), (nthreads, 1, 1), smem.size_bytes,
        [tensor("X", dtype, (B, T, H, D)), tensor("W", dtype, (D, D)),
         tensor("O", "f32", (B, T, H, D), True), scalar("T", T)],
        "O = torch.einsum('bthd,de->bthe', X.float(), W.float())")


# ------------------------------------------------------------------------------------------
# TMA, wgmma, setmaxnreg (arch-specific emitters)
# ------------------------------------------------------------------------------------------

def _if(cond):
    """Context manager: emit the body under ``scf.if cond`` (no results)."""
    from contextlib import contextmanager

    @contextmanager
    def body():
        op = scf.IfOp(cond)
        with ir.InsertionPoint(op.then_block):
            yield
            scf.yield_([])
    return body()


def _eq(x, y) -> ir.Value:
    return arith.cmpi(arith.CmpIPredicate.eq, as_i32(x), as_i32(y))


def build_tma_tile_load(builder: GpuModuleBuilder, target: Target, rows: int = 64, cols: int = 128,
                        rank: int = 4, dtype: str = "bf16", swizzle: int = 128,
                        name: str | None = None) -> LaunchContract:
    """TMA load of one [rows, cols] tile (one box per swizzle panel) completing on an mbarrier,
    then a cooperative un-swizzling copy shared → global.

    rank 4: tensor X [B, T, H, cols], tile = X[b, t0:t0+rows, h, :] (coords params c0=b, c1=t0,
    c2=h); rank 3: X [T, H, cols], tile X[t0:t0+rows, h, :] (c0=t0, c1=h); rank 2: X [T, cols],
    tile X[t0:t0+rows, :] (c0=t0). Rows past T arrive as zeros (TMA OOB fill).
    Launch: grid (1,1,1); block (128,1,1); dynamic smem = contract value.
    Params: tmap (u64: device address of the 128-byte CUtensorMap, encoded with
    ``contract.extra['tensor_map'].encode_args(X.shape)``), out dtype [rows, cols], c0.. (i32).
    Expected: out = X[tile] with out-of-range rows = 0.
    """
    from kdagen.codegen.common.smem import copy_shared_to_global
    from kdagen.codegen.sm90 import tma
    name = name or f"emt_tma_load_r{rank}_{rows}x{cols}_{dtype}_sw{swizzle}"
    coord_names = [f"c{i}" for i in range(rank - 1)]
    params = [Param("tmap", "ptr"), Param("out", "ptr", dtype)] + [Param(c, "i32") for c in coord_names]
    layout = SmemLayout(rows, cols, ELEM_BYTES[dtype], swizzle)
    row_dim = {4: 1, 3: 0, 2: 0}[rank]
    contract = tma.tile_contract(layout, dtype, rank, row_dim)
    with builder.kernel(name, params, (128, 1, 1)) as p:
        smem = SmemAllocator(builder, target.smem_per_block)
        wc = warp_coords()
        bar = smem.mbarriers(1)[0]
        tile = smem.tile(layout)
        tmap = tma.tensormap_pointer(target, p["tmap"])
        leader = _eq(wc.tid, 0)
        with _if(leader):
            tma.prefetch_tensormap(target, tmap)
            barrier.mbarrier_init(bar, 1)
            barrier.fence_mbarrier_init()
        barrier.sync_threads()
        coords = [p[c] for c in coord_names] + [0]
        with _if(leader):
            barrier.mbarrier_arrive_expect_tx(bar, layout.size_bytes)
            tma.tma_load_tile(target, tile, tmap, coords, bar)
        barrier.mbarrier_wait(bar, 0)
        copy_shared_to_global(tile, GlobalView(p["out"], dtype, cols), wc.tid, 128)
    # Host tensor and coordinates chosen so the tile runs past T (the tail is zero-filled).
    T = 100
    x_shape = {4: (2, T, 4, cols), 3: (T, 3, cols), 2: (T, cols)}[rank]
    coords = {4: (1, T - 20, 2), 3: (T - 40, 1), 2: (T - 50,)}[rank]
    x = host("X", dtype, x_shape)
    sel = {4: "X[c0, c1:c1+%d, c2, :]", 3: "X[c0:c0+%d, c1, :]", 2: "X[c0:c0+%d, :]"}[rank] % rows
    return LaunchContract(
        name, (1, 1, 1), (128, 1, 1), smem.size_bytes,
        [tensormap("tmap", x, contract), tensor("out", dtype, (rows, cols), True)]
        + [scalar(c, v) for c, v in zip(coord_names, coords)],
        f"out = pad_rows({sel}.float(), {rows})", chips=chips_with("has_tma"), host=[x], rtol=0.0,
        extra={"tensor_map": contract})


def _wgmma_tile_product(target: Target, ta, tb, n: int, k: int, dtype: str,
                        trans_a: bool = False, trans_b: bool = True) -> AccFragment:
    """acc[64, n] = op(ta) · op(tb) with wgmma from the two shared tiles (after the fence and
    barrier that publish them), waited for."""
    from kdagen.codegen.sm90 import wgmma
    acc = AccFragment.filled(wgmma.wgmma_acc_layout(n), 0.0)
    wgmma.wgmma_fence(target)
    acc = wgmma.wgmma_matmul(target, acc, SmemOperand(ta, trans_a), SmemOperand(tb, trans_b), k,
                             dtype, accumulate=False)
    wgmma.wgmma_commit(target)
    wgmma.wgmma_wait(target, 0)
    return acc


def build_wgmma_tile(builder: GpuModuleBuilder, target: Target, n: int = 64, k: int = 64,
                     trans_a: bool = False, trans_b: bool = True, dtype: str = "bf16",
                     swizzle: int = 128, name: str | None = None) -> LaunchContract:
    """One warpgroup: C[64, n] = op(A) @ op(B) with wgmma.mma_async from swizzled shared tiles
    written by cooperative vector copies (generic proxy → fence.proxy.async → barrier → wgmma).

    Launch: grid (1,1,1); block (128,1,1); dynamic smem = contract value.
    Params: A dtype [64, k] (trans_a: [k, 64]); B dtype [k, n] (trans_b: [n, k]); C f32 [64, n].
    Expected: C = op(A).float() @ op(B).float()  (op = .T when transposed).
    trans_b=True / trans_a=False are the K-major forms; the others are MN-major (transposed) wgmma.
    """
    name = name or (f"emt_wgmma_m64n{n}k{k}_{'T' if trans_a else 'N'}{'T' if trans_b else 'N'}"
                    f"_{dtype}_sw{swizzle}")
    params = [Param("A", "ptr", dtype), Param("B", "ptr", dtype), Param("C", "ptr", "f32")]
    with builder.kernel(name, params, (128, 1, 1)) as p:
        smem = SmemAllocator(builder, target.smem_per_block)
        wc = warp_coords()
        a_shape = (k, 64) if trans_a else (64, k)
        b_shape = (n, k) if trans_b else (k, n)
        ta = _load_tile(smem, wc.tid, p["A"], dtype, *a_shape, 128, str(swizzle), False)
        tb = _load_tile(smem, wc.tid, p["B"], dtype, *b_shape, 128, str(swizzle), False)
        barrier.fence_proxy_async_shared()
        barrier.sync_threads()
        acc = _wgmma_tile_product(target, ta, tb, n, k, dtype, trans_a, trans_b)
        store_acc(acc, GlobalView(p["C"], "f32", n), wc, "f32")
    return LaunchContract(
        name, (1, 1, 1), (128, 1, 1), smem.size_bytes,
        [tensor("A", dtype, a_shape), tensor("B", dtype, b_shape), tensor("C", "f32", (64, n), True)],
        f"C = {'A.T' if trans_a else 'A'}.float() @ {'B.T' if trans_b else 'B'}.float()",
        chips=chips_with("has_wgmma"))


def build_wgmma_rs_chain(builder: GpuModuleBuilder, target: Target, k1: int = 64, n1: int = 64,
                         n2: int = 64, dtype: str = "bf16") -> LaunchContract:
    """One warpgroup, two chained wgmma products: P[64, n1] = A · B1ᵀ from shared tiles, then
    C[64, n2] = P · B2ᵀ with P's accumulator registers, rounded to ``dtype`` and packed in place
    (`layouts.acc_regs_for_half_a`), as the register A operand (`wgmma.wgmma_half_rs`) — how a
    16-bit register scan feeds one product's result to the next without shared memory.

    Launch: grid (1,1,1); block (128,1,1). Params: A [64, k1], B1 [n1, k1], B2 [n2, n1] (dtype,
    K-major), C f32 [64, n2]. Expected: C = (A.float() @ B1.float().T).to(dtype).float() @
    B2.float().T."""
    from kdagen.codegen.common.convert import pack_f32x2
    from kdagen.codegen.common.layouts import acc_regs_for_half_a
    from kdagen.codegen.sm90 import wgmma
    name = f"emt_wgmma_rs_chain_m64k{k1}n{n1}n{n2}_{dtype}"
    params = [Param("A", "ptr", dtype), Param("B1", "ptr", dtype), Param("B2", "ptr", dtype),
              Param("C", "ptr", "f32")]
    with builder.kernel(name, params, (128, 1, 1)) as p:
        smem = SmemAllocator(builder, target.smem_per_block)
        wc = warp_coords()
        ta = _load_tile(smem, wc.tid, p["A"], dtype, 64, k1, 128, "128", False)
        tb1 = _load_tile(smem, wc.tid, p["B1"], dtype, n1, k1, 128, "128", False)
        tb2 = _load_tile(smem, wc.tid, p["B2"], dtype, n2, n1, 128, "128", False)
        barrier.fence_proxy_async_shared()
        barrier.sync_threads()
        acc = _wgmma_tile_product(target, ta, tb1, n1, k1, dtype)
        values = wgmma.fence_accumulators(list(acc.values))
        descs = wgmma.k_block_descriptors(tb2.layout, tb2.addr32(), n1 // 16, 16)
        out = [arith.constant(ir.F32Type.get(), 0.0) for _ in range(n2 // 2)]
        a_regs = [[pack_f32x2(values[lo], values[hi], dtype)
                   for lo, hi in (acc_regs_for_half_a(kb, j) for j in range(4))]
                  for kb in range(n1 // 16)]
        wgmma.wgmma_fence(target)
        for kb, desc in enumerate(descs):
            out = wgmma.wgmma_half_rs(target, out, a_regs[kb], desc, n2, dtype)
        wgmma.wgmma_commit(target)
        wgmma.wgmma_wait(target, 0)
        out = wgmma.fence_accumulators(out)
        store_acc(AccFragment(wgmma.wgmma_acc_layout(n2), out), GlobalView(p["C"], "f32", n2),
                  wc, "f32")
    torch_dtype = {"bf16": "torch.bfloat16", "f16": "torch.float16"}[dtype]
    return LaunchContract(
        name, (1, 1, 1), (128, 1, 1), smem.size_bytes,
        [tensor("A", dtype, (64, k1)), tensor("B1", dtype, (n1, k1)), tensor("B2", dtype, (n2, n1)),
         tensor("C", "f32", (64, n2), True)],
        f"C = (A.float() @ B1.float().T).to({torch_dtype}).float() @ B2.float().T",
        chips=chips_with("has_wgmma"))


def build_ws_tma_wgmma_pipeline(builder: GpuModuleBuilder, target: Target, n: int = 64,
                                k_total: int = 256, k_tile: int = 64, stages: int = 2,
                                dtype: str = "bf16", name: str | None = None) -> LaunchContract:
    """Warp-specialised pipeline: warpgroup 0 = producer (setmaxnreg.dec 40; one thread streams
    A/B k-tiles with TMA into a ``stages``-deep ring guarded by full/empty mbarriers), warpgroup 1 =
    consumer (setmaxnreg.inc 232; waits 'full', runs wgmma over the k-tile, arrives 'empty').
    C[64, n] = A[64, k_total] @ Bᵀ with B stored [n, k_total] (both K-major). Runtime scf.for loops
    with the accumulator carried in registers.

    Launch: grid (1,1,1); block (256,1,1); dynamic smem = contract value.
    Params: tmap_a (u64 → CUtensorMap of A dtype [64, k_total], encode with
    ``extra['tensor_map_a'].encode_args((64, k_total))``), tmap_b (B dtype [n, k_total],
    ``extra['tensor_map_b'].encode_args((n, k_total))``), C f32 [64, n].
    Expected: C = A.float() @ B.float().T
    """
    from kdagen.codegen.sm90 import regalloc, tma, wgmma
    target.require("has_wgmma", "the wgmma pipeline test kernel")
    name = name or f"emt_ws_tma_wgmma_m64n{n}k{k_total}_kt{k_tile}_s{stages}_{dtype}"
    eb = ELEM_BYTES[dtype]
    la = SmemLayout(64, k_tile, eb, 128)
    lb = SmemLayout(n, k_tile, eb, 128)
    ca = tma.tile_contract(la, dtype, 2, 0)
    cb = tma.tile_contract(lb, dtype, 2, 0)
    params = [Param("tmap_a", "ptr"), Param("tmap_b", "ptr"), Param("C", "ptr", "f32")]
    n_iter = k_total // k_tile
    with builder.kernel(name, params, (256, 1, 1)) as p:
        smem = SmemAllocator(builder, target.smem_per_block)
        tid = IntVal(warp_coords().tid)
        full = smem.mbarriers(stages)
        empty = smem.mbarriers(stages)
        a_tiles = [smem.tile(la) for _ in range(stages)]
        b_tiles = [smem.tile(lb) for _ in range(stages)]
        tmap_a = tma.tensormap_pointer(target, p["tmap_a"])
        tmap_b = tma.tensormap_pointer(target, p["tmap_b"])
        with _if(_eq(tid, 0)):
            for s in range(stages):
                barrier.mbarrier_init(full[s], 1)
                barrier.mbarrier_init(empty[s], 128)
            barrier.fence_mbarrier_init()
        barrier.sync_threads()
        warpgroup = tid // 128
        is_producer = _eq(warpgroup, 0)
        idx = ir.IndexType.get()
        c0, c1, cn = (arith.constant(idx, v) for v in (0, 1, n_iter))
        branch = scf.IfOp(is_producer, has_else=True)
        with ir.InsertionPoint(branch.then_block):
            regalloc.release_registers(target, 40)
            with _if(_eq(tid, 0)):
                loop = scf.ForOp(c0, cn, c1)
                with ir.InsertionPoint(loop.body):
                    kt = IntVal(loop.induction_variable)
                    for s in range(stages):       # static stage selection: kt % stages == s
                        with _if(_eq(kt % stages, s)):
                            barrier.mbarrier_wait(empty[s], ((kt // stages) % 2) ^ 1)
                            barrier.mbarrier_arrive_expect_tx(full[s], la.size_bytes + lb.size_bytes)
                            tma.tma_load_tile(target, a_tiles[s], tmap_a, [0, kt * k_tile], full[s])
                            tma.tma_load_tile(target, b_tiles[s], tmap_b, [0, kt * k_tile], full[s])
                    scf.yield_([])
            scf.yield_([])
        with ir.InsertionPoint(branch.else_block):
            regalloc.claim_registers(target, 232)
            wc = warp_coords(128)
            layout = wgmma.wgmma_acc_layout(n)
            zero = arith.constant(ir.F32Type.get(), 0.0)
            loop = scf.ForOp(c0, cn, c1, [zero] * layout.regs_per_lane)
            with ir.InsertionPoint(loop.body):
                kt = IntVal(loop.induction_variable)
                acc = AccFragment(layout, list(loop.inner_iter_args))
                results = []
                for s in range(stages):
                    stage_if = scf.IfOp(_eq(kt % stages, s), [ir.F32Type.get()] * layout.regs_per_lane,
                                        has_else=True)
                    with ir.InsertionPoint(stage_if.then_block):
                        barrier.mbarrier_wait(full[s], (kt // stages) % 2)
                        wgmma.wgmma_fence(target)
                        out = wgmma.wgmma_matmul(target, acc, SmemOperand(a_tiles[s]),
                                                 SmemOperand(b_tiles[s], True), k_tile, dtype)
                        wgmma.wgmma_commit(target)
                        wgmma.wgmma_wait(target, 0)
                        barrier.mbarrier_arrive(empty[s])
                        scf.yield_(out.values)
                    with ir.InsertionPoint(stage_if.else_block):
                        scf.yield_(acc.values)
                    acc = AccFragment(layout, list(stage_if.results))
                scf.yield_(acc.values)
            acc = AccFragment(layout, list(loop.results))
            store_acc(acc, GlobalView(p["C"], "f32", n), wc, "f32")
            scf.yield_([])
    # ptxas honours setmaxnreg only with a known register count at entry (.minnctapersm).
    set_launch_bounds(builder, name, min_blocks_per_sm=1)
    a, b = host("A", dtype, (64, k_total)), host("B", dtype, (n, k_total))
    return LaunchContract(
        name, (1, 1, 1), (256, 1, 1), smem.size_bytes,
        [tensormap("tmap_a", a, ca), tensormap("tmap_b", b, cb), tensor("C", "f32", (64, n), True)],
        "C = A.float() @ B.float().T", chips=chips_with("has_wgmma"), host=[a, b],
        extra={"tensor_map_a": ca, "tensor_map_b": cb})


def build_tcgen05_tile(builder: GpuModuleBuilder, target: Target, n: int = 64, k: int = 64,
                       dtype: str = "bf16", swizzle: int = 128,
                       name: str | None = None) -> LaunchContract:
    """One warpgroup, M = 128: C[128, n] = A @ Bᵀ with tcgen05.mma (A [128, k] and B [n, k] both
    K-major in swizzled shared tiles), the f32 accumulator in tensor memory, completion through
    tcgen05.commit on an mbarrier, and tcgen05.ld.32x32b back to registers.

    Launch: grid (1,1,1); block (128,1,1); dynamic smem = contract value. sm_100a only.
    Params: A dtype [128, k], B dtype [n, k], C f32 [128, n].
    Expected: C = A.float() @ B.float().T
    """
    from kdagen.codegen.sm100 import tcgen05 as tc
    name = name or f"emt_tcgen05_m128n{n}k{k}_{dtype}_sw{swizzle}"
    params = [Param("A", "ptr", dtype), Param("B", "ptr", dtype), Param("C", "ptr", "f32")]
    with builder.kernel(name, params, (128, 1, 1)) as p:
        smem = SmemAllocator(builder, target.smem_per_block)
        wc = warp_coords()
        slot = smem.raw(4, 4)
        bar = smem.mbarriers(1)[0]
        ta = _load_tile(smem, wc.tid, p["A"], dtype, 128, k, 128, str(swizzle), False)
        tb = _load_tile(smem, wc.tid, p["B"], dtype, n, k, 128, str(swizzle), False)
        ncols = tc.tmem_columns(n)
        with _if(_eq(wc.warp, 0)):
            tc.tmem_alloc(target, slot, ncols)
            tc.tmem_relinquish(target)
        with _if(_eq(wc.tid, 0)):
            barrier.mbarrier_init(bar, 1)
            barrier.fence_mbarrier_init()
        barrier.fence_proxy_async_shared()
        tc.tcgen05_fence_before(target)
        barrier.sync_threads()
        tc.tcgen05_fence_after(target)
        taddr = tc.tmem_address(slot)
        idesc = tc.instruction_descriptor_bits(128, n, dtype)
        with _if(_eq(wc.tid, 0)):
            a_base, b_base = ta.addr32(0, 0), tb.addr32(0, 0)
            for kk in range(k // 16):
                sa, lbo, sbo = tc.kmajor_operand(ta.layout, 0, 16 * kk)
                sb, lbo_b, sbo_b = tc.kmajor_operand(tb.layout, 0, 16 * kk)
                tc.tcgen05_mma(target, taddr,
                               tc.make_smem_descriptor(target, a_base + sa, lbo, sbo, swizzle),
                               tc.make_smem_descriptor(target, b_base + sb, lbo_b, sbo_b, swizzle),
                               idesc, kk > 0)
            tc.tcgen05_commit(target, bar)
        barrier.mbarrier_wait(bar, 0)
        tc.tcgen05_fence_after(target)
        row = wc.warp * 32 + wc.lane
        values = tc.tmem_load_32x32b(target, tc.tmem_offset(taddr, wc.warp * 32, 0), n)
        tc.tmem_wait_load(target)
        out = GlobalView(p["C"], "f32", n)
        for j in range(0, n, 4):
            vec_t = ir.VectorType.get([4], ir.F32Type.get())
            v = llvm.mlir_undef(vec_t)
            for i in range(4):
                v = llvm.insertelement(v, values[j + i], as_i32(i))
            llvm.store(v, out.ptr(row, j), alignment=16)
        tc.tcgen05_fence_before(target)
        barrier.sync_threads()
        with _if(_eq(wc.warp, 0)):
            tc.tcgen05_fence_after(target)
            tc.tmem_dealloc(target, taddr, ncols)
    return LaunchContract(
        name, (1, 1, 1), (128, 1, 1), smem.size_bytes,
        [tensor("A", dtype, (128, k)), tensor("B", dtype, (n, k)), tensor("C", "f32", (128, n), True)],
        "C = A.float() @ B.float().T", chips=chips_with("has_tcgen05"))


def build_tma_mma_tile(builder: GpuModuleBuilder, target: Target, m: int = 64, n: int = 64,
                       k: int = 128, warps_m: int = 2, warps_n: int = 2, dtype: str = "bf16",
                       name: str | None = None) -> LaunchContract:
    """The sm_120a-style portable path on any chip: TMA loads (128B swizzle, one box per 64-column
    panel) completing on an mbarrier, then ldmatrix straight from the TMA-swizzled tiles and
    mma.sync. C[m, n] = A @ Bᵀ, A [m, k], B [n, k].

    Launch: grid (1,1,1); block (32·warps_m·warps_n,1,1); dynamic smem = contract value.
    Params: tmap_a (u64 → CUtensorMap of A, ``extra['tensor_map_a'].encode_args((m, k))``),
    tmap_b (``extra['tensor_map_b'].encode_args((n, k))``), C f32 [m, n].
    Expected: C = A.float() @ B.float().T
    """
    from kdagen.codegen.sm90 import tma
    name = name or f"emt_tma_mma_m{m}n{n}k{k}_w{warps_m}x{warps_n}_{dtype}"
    nthreads = 32 * warps_m * warps_n
    eb = ELEM_BYTES[dtype]
    la, lb = SmemLayout(m, k, eb, 128), SmemLayout(n, k, eb, 128)
    ca, cb = tma.tile_contract(la, dtype, 2, 0), tma.tile_contract(lb, dtype, 2, 0)
    params = [Param("tmap_a", "ptr"), Param("tmap_b", "ptr"), Param("C", "ptr", "f32")]
    with builder.kernel(name, params, (nthreads, 1, 1)) as p:
        smem = SmemAllocator(builder, target.smem_per_block)
        wc = warp_coords()
        bar = smem.mbarriers(1)[0]
        ta, tb = smem.tile(la), smem.tile(lb)
        tmap_a = tma.tensormap_pointer(target, p["tmap_a"])
        tmap_b = tma.tensormap_pointer(target, p["tmap_b"])
        with _if(_eq(wc.tid, 0)):
            barrier.mbarrier_init(bar, 1)
            barrier.fence_mbarrier_init()
        barrier.sync_threads()
        with _if(_eq(wc.tid, 0)):
            barrier.mbarrier_arrive_expect_tx(bar, la.size_bytes + lb.size_bytes)
            tma.tma_load_tile(target, ta, tmap_a, [0, 0], bar)
            tma.tma_load_tile(target, tb, tmap_b, [0, 0], bar)
        barrier.mbarrier_wait(bar, 0)
        layout = AccLayout(m, n, warps_m, warps_n)
        acc = warp_matmul(AccFragment.filled(layout), SmemOperand(ta), SmemOperand(tb, True), k, wc, dtype)
        store_acc(acc, GlobalView(p["C"], "f32", n), wc, "f32")
    a, b = host("A", dtype, (m, k)), host("B", dtype, (n, k))
    return LaunchContract(
        name, (1, 1, 1), (nthreads, 1, 1), smem.size_bytes,
        [tensormap("tmap_a", a, ca), tensormap("tmap_b", b, cb), tensor("C", "f32", (m, n), True)],
        "C = A.float() @ B.float().T", chips=chips_with("has_tma"), host=[a, b],
        extra={"tensor_map_a": ca, "tensor_map_b": cb})


def build_suite(builder: GpuModuleBuilder, target: Target) -> list[LaunchContract]:
    """Every emitter test kernel valid on ``target``, in one gpu.module (the set the CPU tests
    assemble and the GPU driver runs)."""
    out = [
        build_mma_tile(builder, 16, 16, 16),
        build_mma_tile(builder, 64, 64, 64, 2, 2),
        build_mma_tile(builder, 64, 64, 64, 2, 2, trans_a=True, trans_b=True),
        build_mma_tile(builder, 64, 64, 64, 2, 2, trans_a=False, trans_b=True, use_cp_async=False,
                       swizzle="pad"),
        build_mma_tile(builder, 64, 64, 64, 2, 2, trans_a=True, trans_b=False, dtype="f16"),
        build_mma_chain(builder),
        build_row_reduce(builder),
        build_tile_ops(builder),
        build_bthd_chunk_matmul(builder),
    ]
    if target.has_tma:
        out += [build_tma_tile_load(builder, target),
                build_tma_tile_load(builder, target, rows=64, cols=64, rank=2),
                build_tma_tile_load(builder, target, rows=32, cols=64, rank=3, swizzle=64),
                build_tma_mma_tile(builder, target)]
    if target.has_wgmma:
        out += [build_wgmma_tile(builder, target),
                build_wgmma_tile(builder, target, n=128, trans_a=True, trans_b=False),
                build_wgmma_tile(builder, target, n=64, trans_a=False, trans_b=False, swizzle=64,
                                 k=32),
                build_wgmma_rs_chain(builder, target),
                build_ws_tma_wgmma_pipeline(builder, target)]
    if target.has_tcgen05:
        out += [build_tcgen05_tile(builder, target),
                build_tcgen05_tile(builder, target, n=128, k=128)]
    return out


# ------------------------------------------------------------------------------------------
# Emission for the GPU check (python -m tools.testkernels OUT_DIR [--arch ...])
# ------------------------------------------------------------------------------------------

def emit_suite(out_dir: str, chips=("sm_90a",)) -> dict:
    """Write ``<chip>.ptx`` and ``manifest.json`` for `emitter_check` (which needs only torch and
    cuda-bindings). Tensor-map arguments carry their ``cuTensorMapEncodeTiled`` arguments."""
    import json
    import os

    from kdagen.codegen.ptxas import assemble
    from kdagen.codegen.sm90.tma import TensorMapContract
    from kdagen.target import get_target
    from kdagen.codegen.to_ptx import lower_to_ptx
    os.makedirs(out_dir, exist_ok=True)
    manifest = {}
    for chip in chips:
        target = get_target(chip)
        builder = GpuModuleBuilder()
        contracts = build_suite(builder, target)
        builder.verify()
        ptx = lower_to_ptx(builder.module, target)
        with open(os.path.join(out_dir, f"{chip}.ptx"), "w") as f:
            f.write(ptx)
        try:
            resources = assemble(ptx, chip).resources
        except Exception:   # ptxas missing: the report is optional
            resources = {}
        kernels = []
        for c in contracts:
            entry = c.to_json()
            for arg in entry["args"]:
                if arg["kind"] == "tensormap":
                    tm = TensorMapContract(arg["dtype"], tuple(arg["box"]), arg["swizzle"])
                    arg["encode"] = tm.encode_args(tuple(arg["shape"]))
            r = resources.get(c.kernel)
            if r is not None:
                entry["ptxas"] = {"registers": r.registers, "spills": r.spills, "stack": r.stack_bytes}
            kernels.append(entry)
        manifest[chip] = {"ptx": f"{chip}.ptx", "kernels": kernels}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


if __name__ == "__main__":  # pragma: no cover
    import argparse
    parser = argparse.ArgumentParser(description="emit the emitter test kernels for a GPU check")
    parser.add_argument("out_dir")
    parser.add_argument("--arch", default="sm_90a", help="comma-separated chips (default sm_90a)")
    ns = parser.parse_args()
    m = emit_suite(ns.out_dir, tuple(x.strip() for x in ns.arch.split(",") if x.strip()))
    for chip, entry in m.items():
        print(f"{chip}: {len(entry['kernels'])} kernels -> {ns.out_dir}/{entry['ptx']}")
