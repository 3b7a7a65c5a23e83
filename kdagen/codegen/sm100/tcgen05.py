"""tcgen05 (sm_100a): tensor-memory allocation, MMA with a TMEM accumulator, commit, TMEM loads.

Model: an accumulator D[M, N] f32 lives in tensor memory (TMEM: 128 lanes x 512 32-bit columns
per SM); for cta_group::1 and M = 128, row i of D is TMEM lane i and column j is TMEM column
``base + j``. One thread issues `tcgen05_mma` (A and B from shared memory via descriptors, both
K-major here); `tcgen05_commit` makes an mbarrier track the MMAs; after waiting on it (and
`tcgen05_fence_after`), each warp w of the warpgroup reads its 32 lanes with `tmem_load_32x32b`
(thread = row 32·(w%4) + lane, register i = column i: `layouts.tmem_32x32b_coord`).

Allocation: one warp calls `tmem_alloc` (writes the TMEM address to a 4-byte shared slot),
then `tmem_relinquish`; all threads `tcgen05_fence_before` → barrier → `tcgen05_fence_after` →
read the slot; at the end the same warp calls `tmem_dealloc` with the same column count.

Shared-memory descriptors: the wgmma layout plus "version" bits 46-48 = 0b001 and a 3-bit swizzle
field at 61-63 (0 none, 2 128B, 4 64B, 6 32B) — `smem_descriptor_bits`.
"""
from __future__ import annotations

from ..._mlir import arith, ir, llvm, nvvm
from ..common.ints import IntVal, as_i32
from ..common.layouts import SmemLayout
from ..common.smem import SmemRegion
from ...target import Target

SWIZZLE_CODE = {0: 0, 128: 2, 64: 4, 32: 6}
TMEM_ADDRESS_SPACE = 6


def _enc(x: int) -> int:
    return (x & 0x3FFFF) >> 4


def smem_descriptor_bits(start_addr: int, lbo: int, sbo: int, swizzle: int, base_offset: int = 0) -> int:
    """tcgen05 shared-memory descriptor (PTX ISA "Shared Memory Descriptor"): start 0-13, LBO
    16-29, SBO 32-45, fixed 0b001 at 46-48, base offset 49-51, LBO mode 52 (0 = relative),
    swizzle 61-63."""
    return (_enc(start_addr) | (_enc(lbo) << 16) | (_enc(sbo) << 32) | (1 << 46)
            | ((base_offset & 7) << 49) | (SWIZZLE_CODE[swizzle] << 61))


def instruction_descriptor_bits(m: int, n: int, dtype: str = "bf16", transpose_a: bool = False,
                                transpose_b: bool = False) -> int:
    """32-bit instruction descriptor for ``.kind::f16`` with an f32 accumulator (PTX ISA
    "Instruction descriptor"): dtype F32 (bits 4-5 = 1), atype/btype (7-9, 10-12: F16 0, BF16 1),
    transpose A/B (15, 16), N >> 3 (17-22), M >> 4 (24-28); dense, no negation."""
    if m not in (64, 128):
        raise ValueError(f"cta_group::1 tcgen05.mma M is 64 or 128, got {m}")
    step = 8 if m == 64 else 16
    if n % step or not step <= n <= 256:
        raise ValueError(f"tcgen05.mma N for M={m} must be a multiple of {step} in {step}..256")
    t = {"f16": 0, "bf16": 1}[dtype]
    return ((1 << 4) | (t << 7) | (t << 10) | (int(transpose_a) << 15) | (int(transpose_b) << 16)
            | ((n >> 3) << 17) | ((m >> 4) << 24))


def _i64_const(value: int) -> ir.Value:
    if value >= 1 << 63:
        value -= 1 << 64
    return arith.constant(ir.IntegerType.get_signless(64), value)


def make_smem_descriptor(target: Target, start_addr32, lbo: int, sbo: int, swizzle: int) -> ir.Value:
    target.require("has_tcgen05", "tcgen05")
    const = smem_descriptor_bits(0, lbo, sbo, swizzle)
    field = (IntVal(start_addr32) >> 4) & 0x3FFF
    return arith.ori(arith.extui(ir.IntegerType.get_signless(64), field.value), _i64_const(const))


def kmajor_operand(layout: SmemLayout, mn0: int, k0: int) -> tuple[int, int, int]:
    """(start offset, LBO, SBO) of a K-major operand block at (mn0, k0) in a swizzled tile stored
    [MN, K]: rows of ``swizzle`` bytes, 8-row groups 8·swizzle apart, LBO unused (16)."""
    if layout.swizzle == 0:
        raise ValueError("tcgen05 operands here need a swizzled SmemLayout")
    if mn0 % 8:
        raise ValueError("operand blocks start at a multiple of 8 rows")
    pc = layout.panel_cols
    start = (k0 // pc) * layout.panel_bytes + mn0 * layout.swizzle + (k0 % pc) * layout.elem_bytes
    return start, 16, 8 * layout.swizzle


def tmem_ptr_type() -> ir.Type:
    return llvm.PointerType.get(TMEM_ADDRESS_SPACE)


def tmem_columns(n: int) -> int:
    """Columns to allocate for an N-column f32 accumulator: a power of two >= 32."""
    cols = 32
    while cols < n:
        cols *= 2
    if cols > 512:
        raise ValueError("TMEM has 512 columns")
    return cols


def tmem_alloc(target: Target, slot: SmemRegion, ncols: int) -> None:
    """``tcgen05.alloc.cta_group::1`` by one whole warp; the address lands in ``slot``."""
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_alloc(slot.ptr(), as_i32(ncols))


def tmem_relinquish(target: Target) -> None:
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_relinquish_alloc_permit()


def tmem_dealloc(target: Target, taddr: ir.Value, ncols: int) -> None:
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_dealloc(taddr, as_i32(ncols))


def tmem_address(slot: SmemRegion) -> ir.Value:
    """The TMEM address written by `tmem_alloc` (read after the fences and barrier)."""
    raw = slot.load("i32")
    return llvm.inttoptr(tmem_ptr_type(), raw)


def tmem_offset(taddr: ir.Value, lane: int | IntVal = 0, column: int | IntVal = 0) -> ir.Value:
    """TMEM address + (lane << 16) + column."""
    raw = IntVal(llvm.ptrtoint(ir.IntegerType.get_signless(32), taddr))
    addr = raw + lane * 65536 + column
    return llvm.inttoptr(tmem_ptr_type(), as_i32(addr))


def tcgen05_fence_before(target: Target) -> None:
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC)


def tcgen05_fence_after(target: Target) -> None:
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.AFTER_THREAD_SYNC)


def tcgen05_mma(target: Target, d_tmem: ir.Value, desc_a: ir.Value, desc_b: ir.Value, idesc: int,
                accumulate) -> None:
    """``tcgen05.mma.cta_group::1.kind::f16 [d], a_desc, b_desc, idesc, enable_input_d``
    (issued by one thread). ``accumulate``: bool or i1 value (False: D = A·B)."""
    target.require("has_tcgen05", "tcgen05")
    if isinstance(accumulate, bool):
        accumulate = arith.constant(ir.IntegerType.get_signless(1), int(accumulate))
    nvvm.tcgen05_mma(nvvm.Tcgen05MMAKind.F16, nvvm.CTAGroupKind.CTA_1, d_tmem, desc_a, desc_b,
                     as_i32(idesc), accumulate)


def tcgen05_commit(target: Target, bar: SmemRegion) -> None:
    """``tcgen05.commit.cta_group::1.mbarrier::arrive::one``: ``bar`` gets one arrival when all
    prior tcgen05 async operations of this thread have completed."""
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_commit(bar.ptr())


def tmem_load_32x32b(target: Target, taddr: ir.Value, num: int) -> list[ir.Value]:
    """``tcgen05.ld.sync.aligned.32x32b.x{num}.b32``: this thread's TMEM lane, ``num`` columns
    from ``taddr`` (which must point at lane 32·(warp % 4)); returns ``num`` f32 values. Follow
    with `tmem_wait_load` before using them."""
    target.require("has_tcgen05", "tcgen05")
    if num not in (1, 2, 4, 8, 16, 32, 64, 128):
        raise ValueError(f"tcgen05.ld .x{num} is not a valid repeat count")
    i32 = ir.IntegerType.get_signless(32)
    res_t = i32 if num == 1 else ir.VectorType.get([num], i32)
    vec = nvvm.tcgen05_ld(res_t, nvvm.Tcgen05LdStShape.SHAPE_32X32B, taddr)
    f32 = ir.F32Type.get()
    if num == 1:
        return [arith.bitcast(f32, vec)]
    return [arith.bitcast(f32, llvm.extractelement(vec, arith.constant(i32, i))) for i in range(num)]


def tmem_wait_load(target: Target) -> None:
    target.require("has_tcgen05", "tcgen05")
    nvvm.tcgen05_wait(nvvm.Tcgen05WaitKind.LOAD)
