"""wgmma.mma_async (sm_90a): warpgroup MMAs on shared-memory operands described by descriptors.

A warpgroup (4 consecutive warps, 128 threads, starting at a multiple of 4 warps) computes
D[64, N] += A[64, 16] · B[16, N] per instruction, N a multiple of 8 up to 256, bf16/f16 → f32.
The accumulator is an `AccFragment` with ``AccLayout(64, N, warps_m=4, warps_n=1)`` — register i
of the PTX fragment is register i of that layout (`layouts.wgmma_d_coord`, checked by the tests),
so row reductions, register reuse and stores from `common` apply unchanged.

Operands come from swizzled `SmemTile`s (32/64/128-byte swizzle, e.g. written by TMA):

* K-major (A stored [M, K], B stored [N, K]; ``SmemOperand.transposed`` False for A, True for B):
  rows of ``swizzle`` bytes, 8-row groups ``8·swizzle`` bytes apart (SBO); LBO unused (1). A k16
  step advances the start address by 32 bytes inside a panel, or to the next panel.
* MN-major (A stored [K, M], B stored [K, N]): the instruction's M/N extent must fit one swizzle
  panel (64 elements at 128B for 16-bit types; `wgmma_matmul` splits N accordingly); K rows are
  ``swizzle`` bytes apart and 8-row groups ``8·swizzle`` apart. LBO and SBO are both set to that
  K-group stride, so the result does not depend on which of the two the hardware reads for the
  (single-panel) MN direction.

Protocol per batch: `wgmma_fence` → `wgmma_matmul` (one instruction per k16 step and N chunk) →
`wgmma_commit` → ... → `wgmma_wait(n)`; the accumulator registers may be read only after the wait.
If a generic-proxy write (st.shared) produced an operand, each writer thread must execute
`barrier.fence_proxy_async_shared()` before the threads synchronise.
"""
from __future__ import annotations

from ..._mlir import arith, ir, llvm, nvvm
from ..common.ints import IntVal
from ..common.layouts import AccLayout, SmemLayout
from ..common.mma import AccFragment, SmemOperand
from ...target import Target

SWIZZLE_CODE = {0: 0, 128: 1, 64: 2, 32: 3}
WGMMA_M, WGMMA_K = 64, 16


def wgmma_k(dtype: str) -> int:
    """Depth of one wgmma instruction: 32 bytes of each operand row (16 for 16-bit types,
    8 for tf32)."""
    return 8 if dtype == "tf32" else WGMMA_K


def _enc(x: int) -> int:
    return (x & 0x3FFFF) >> 4


def descriptor_bits(start_addr: int, lbo: int, sbo: int, swizzle: int, base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address
    bits 0-13, leading byte offset 16-29, stride byte offset 32-45, base offset 49-51, swizzle
    mode 62-63 (0 none, 1 128B, 2 64B, 3 32B); addresses and offsets encoded as (x & 0x3FFFF) >> 4."""
    return (_enc(start_addr) | (_enc(lbo) << 16) | (_enc(sbo) << 32)
            | ((base_offset & 7) << 49) | (SWIZZLE_CODE[swizzle] << 62))


def _i64_const(value: int) -> ir.Value:
    if value >= 1 << 63:
        value -= 1 << 64
    return arith.constant(ir.IntegerType.get_signless(64), value)


def make_descriptor(start_addr32, lbo: int, sbo: int, swizzle: int) -> ir.Value:
    """i64 descriptor for a shared address known at run time (an `IntVal` of the 32-bit shared
    address, 16-byte aligned) and constant strides."""
    const = descriptor_bits(0, lbo, sbo, swizzle)
    addr = IntVal(start_addr32) if not isinstance(start_addr32, (int, IntVal)) else start_addr32
    if isinstance(addr, int):
        return _i64_const(const | _enc(addr))
    field = (addr >> 4) & 0x3FFF
    wide = arith.extui(ir.IntegerType.get_signless(64), field.value)
    return arith.ori(wide, _i64_const(const))


def make_descriptors(start_addr32, deltas, lbo: int, sbo: int, swizzle: int) -> list:
    """The i64 descriptors of blocks ``deltas`` bytes (multiples of 16) after a run-time shared
    address, with the same strides and swizzle: the address field (address >> 4, bits 0-13) is
    computed once in 32 bits and each block adds its constant to it, instead of encoding every
    address anew (~4 uniform instructions apiece, ~100 per register-scan step of 24 products;
    a 64-bit add per block instead held the descriptors in registers and the kda backward's
    reverse step spilled). The add cannot carry out of the field: every shared address of
    sm_90 is below the 256 KB it spans (228 KB at most)."""
    if any(d % 16 for d in deltas):
        raise ValueError(f"descriptor offsets are multiples of 16 bytes, got {list(deltas)}")
    const = descriptor_bits(0, lbo, sbo, swizzle)
    addr = IntVal(start_addr32) if not isinstance(start_addr32, (int, IntVal)) else start_addr32
    if isinstance(addr, int):
        return [_i64_const(const | _enc(addr + d)) for d in deltas]
    field = (addr >> 4) & 0x3FFF
    i64 = ir.IntegerType.get_signless(64)
    return [arith.ori(arith.extui(i64, (field + (d >> 4)).value), _i64_const(const))
            for d in deltas]


def k_block_descriptors(layout: SmemLayout, start_addr32, k_blocks: int, k_step: int) -> list:
    """The descriptors of a K-major B tile's ``k_blocks`` blocks of ``k_step`` K elements from a
    run-time shared address (`make_descriptors`: one address field, a constant per block) — what
    a product with A from registers walks, one wgmma per block."""
    starts = [operand_start_and_strides(layout, "b", True, 0, kb * k_step)
              for kb in range(k_blocks)]
    _, lbo, sbo = starts[0]         # the same strides for every k block
    return make_descriptors(start_addr32, [st for st, _, _ in starts], lbo, sbo, layout.swizzle)


def operand_is_k_major(operand: str, transposed: bool) -> bool:
    """A natural ([M, K]) and B transposed ([N, K]) are K-major."""
    return (not transposed) if operand == "a" else transposed


def operand_start_and_strides(layout: SmemLayout, operand: str, transposed: bool,
                              mn0: int, k0: int) -> tuple[int, int, int]:
    """(start byte offset within the tile, LBO, SBO) of the operand block starting at logical
    (mn0, k0) — MN index mn0 (row of A / column of B), k index k0 (multiple of 16)."""
    swz, eb = layout.swizzle, layout.elem_bytes
    if swz == 0:
        raise ValueError("wgmma operands need a swizzled SmemLayout (32, 64 or 128 bytes)")
    pc = layout.panel_cols
    if operand_is_k_major(operand, transposed):
        if mn0 % 8:
            raise ValueError("K-major operand blocks start at a multiple of 8 rows")
        start = (k0 // pc) * layout.panel_bytes + mn0 * swz + (k0 % pc) * eb
        return start, 16, 8 * swz
    if mn0 % pc:
        raise ValueError(f"MN-major operand blocks start at a multiple of {pc} (one swizzle panel)")
    start = (mn0 // pc) * layout.panel_bytes + k0 * swz
    return start, 8 * swz, 8 * swz


def wgmma_fence(target: Target) -> None:
    target.require("has_wgmma", "wgmma")
    nvvm.wgmma_fence_aligned()


def wgmma_commit(target: Target) -> None:
    target.require("has_wgmma", "wgmma")
    nvvm.wgmma_commit_group_sync_aligned()


def wgmma_wait(target: Target, pending: int = 0) -> None:
    target.require("has_wgmma", "wgmma")
    nvvm.wgmma_wait_group_sync_aligned(pending)


def wgmma_async(target: Target, acc_values: list, desc_a: ir.Value, desc_b: ir.Value, n: int,
                dtype: str = "bf16", a_mn_major: bool = False, b_mn_major: bool = False,
                accumulate: bool = True) -> list:
    """One ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype}``; returns the n/2
    result registers (valid after `wgmma_wait`). ``accumulate=False`` ignores the input (scale-d 0)."""
    target.require("has_wgmma", "wgmma")
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n}")
    if len(acc_values) != n // 2:
        raise ValueError(f"m64n{n} accumulators are {n // 2} f32 registers, got {len(acc_values)}")
    f32 = ir.F32Type.get()
    struct_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (n // 2)) + ")>")
    inout = llvm.mlir_undef(struct_t)
    for i, v in enumerate(acc_values):
        inout = llvm.insertvalue(inout, v, [i])
    if dtype == "tf32" and (a_mn_major or b_mn_major):
        raise ValueError("TF32 wgmma reads both operands K-major (A stored [M, K], B [N, K]); "
                         "stage the operand transposed")
    wtype = ir.Attribute.parse(f"#nvvm.wgmma_type<{dtype}>")
    res = nvvm.wgmma_mma_async(
        struct_t, inout, desc_a, desc_b,
        ir.Attribute.parse(f"#nvvm.shape<m = 64, n = {n}, k = {wgmma_k(dtype)}>"),
        wtype, wtype, ir.Attribute.parse("#nvvm.wgmma_type<f32>"),
        ir.Attribute.parse(f"#nvvm.wgmma_scale_out<{'one' if accumulate else 'zero'}>"),
        ir.Attribute.parse("#nvvm.wgmma_scale_in<one>"), ir.Attribute.parse("#nvvm.wgmma_scale_in<one>"),
        nvvm.MMALayout.col if a_mn_major else nvvm.MMALayout.row,
        nvvm.MMALayout.row if b_mn_major else nvvm.MMALayout.col)
    return [llvm.extractvalue(f32, res, [i]) for i in range(n // 2)]


def _wgmma_rs(target: Target, acc_values: list, a_regs: list, desc_b: ir.Value, n: int,
              k: int, dtype: str, immediates: str) -> list:
    """One register-A ``wgmma.mma_async`` m64n{n}k{k} (f32 accumulators, 4 A registers, B by
    descriptor) as inline PTX (MLIR's ``nvvm.wgmma`` takes descriptors only); ``immediates``:
    what follows the scale-d predicate (scale-a, scale-b[, transpose-b])."""
    target.require("has_wgmma", "wgmma")
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n}")
    half = n // 2
    if len(acc_values) != half or len(a_regs) != 4:
        raise ValueError(f"m64n{n}k{k} {dtype} takes {half} accumulators and 4 A registers, "
                         f"got {len(acc_values)} and {len(a_regs)}")
    # operands are numbered outputs first, then inputs (the tied accumulators, A, the descriptor)
    d = ", ".join(f"${i}" for i in range(half))
    a = ", ".join(f"${2 * half + i}" for i in range(4))
    asm = ("{ .reg .pred p; setp.ne.b32 p, 1, 0; "
           f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{dtype}.{dtype} {{{d}}}, {{{a}}}, "
           f"${2 * half + 4}, p, {immediates}; }}")
    constraints = ",".join(["=f"] * half + [str(i) for i in range(half)] + ["r"] * 4 + ["l"])
    struct_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * half) + ")>")
    res = llvm.inline_asm(struct_t, [*acc_values, *a_regs, desc_b], asm, constraints,
                          has_side_effects=True)
    f32 = ir.F32Type.get()
    return [llvm.extractvalue(f32, res, [i]) for i in range(half)]


def wgmma_tf32_rs(target: Target, acc_values: list, a_regs: list, desc_b: ir.Value, n: int) -> list:
    """One ``wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32`` with A from registers
    (``a_regs``: 4 i32 holding TF32 bits, `layouts.wgmma_tf32_a_coord`) and B (K-major, from
    shared memory) by descriptor: ``acc[64, n] += A[64, 8] · B[8, n]``. Returns the n/2 result
    registers; read them only after `wgmma_wait` and `fence_accumulators` (the asm ties them
    to the inputs)."""
    return _wgmma_rs(target, acc_values, a_regs, desc_b, n, 8, "tf32", "1, 1")


def wgmma_half_rs(target: Target, acc_values: list, a_regs: list, desc_b: ir.Value, n: int,
                  dtype: str = "bf16", b_mn_major: bool = False) -> list:
    """One ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype}`` (bf16 or f16) with A
    from registers (``a_regs``: 4 i32, each two packed 16-bit values, lower column in bits
    0-15; `layouts.acc_regs_for_half_a` says which accumulator registers of a previous
    m64 product make them) and B (K-major, from shared memory, not transposed) by descriptor:
    ``acc[64, n] += A[64, 16] · B[16, n]``; read the results as `wgmma_tf32_rs`'s.
    ``b_mn_major``: B stored [K, N] (N contiguous, the descriptor's N extent one swizzle panel;
    16-bit types only), PTX's transpose-b immediate."""
    if dtype not in ("bf16", "f16"):
        raise ValueError(f"wgmma_half_rs takes bf16 or f16 operands, not {dtype!r} "
                         "(TF32: wgmma_tf32_rs)")
    return _wgmma_rs(target, acc_values, a_regs, desc_b, n, 16, dtype,
                     "1, 1, 1" if b_mn_major else "1, 1, 0")


def undef_accumulators(layout: AccLayout) -> AccFragment:
    """Accumulators with no value, for a first wgmma with ``accumulate=False`` (scale-d 0): no
    register is written for them, so nothing lands between `wgmma_fence` and the wgmma."""
    f32 = ir.F32Type.get()
    return AccFragment(layout, [llvm.mlir_undef(f32) for _ in range(layout.regs_per_lane)])


def fence_accumulators(values: list) -> list:
    """Pass accumulator registers through an empty volatile asm after `wgmma_wait`, so that no
    use of them is scheduled above the wait (the wgmma asm's outputs look ready to LLVM as soon
    as it is issued)."""
    f32 = ir.F32Type.get()
    out = []
    for v in values:
        out.append(llvm.inline_asm(f32, [v], "", "=f,0", has_side_effects=True))
    return out


def wgmma_acc_layout(n: int) -> AccLayout:
    return AccLayout(WGMMA_M, n, 4, 1)


def wgmma_matmul(target: Target, acc: AccFragment, a: SmemOperand, b: SmemOperand, k: int,
                 dtype: str = "bf16", m0: int = 0, accumulate: bool = True) -> AccFragment:
    """Issue ``acc[64, N] (+)= op(A)[m0:m0+64, :k] · op(B)[:k, :N]`` as wgmma instructions
    (k/16 of them per N chunk, k/8 for tf32; N is split into panel-wide chunks when B is
    N-major).

    ``a``/``b``: `SmemOperand` on swizzled tiles, with ``transposed`` meaning, as for mma.sync,
    A stored [K, M] / B stored [N, K]; their row0/col0 must be 0 (use separate tiles or the
    m0 argument). Call between `wgmma_fence` and `wgmma_commit`; read ``acc`` after `wgmma_wait`.
    """
    target.require("has_wgmma", "wgmma")
    lay = acc.layout
    if lay != wgmma_acc_layout(lay.cols):
        raise ValueError("wgmma accumulators use AccLayout(64, N, warps_m=4, warps_n=1)")
    step = wgmma_k(dtype)
    if k % step:
        raise ValueError(f"wgmma depth {k} is not a multiple of {step} ({dtype})")
    for op in (a, b):
        if not (isinstance(op.row0, int) and op.row0 == 0 and isinstance(op.col0, int) and op.col0 == 0):
            raise ValueError("wgmma operands start at the tile origin (row0 = col0 = 0)")
    n = lay.cols
    a_k_major = operand_is_k_major("a", a.transposed)
    if not a_k_major and a.tile.layout.panel_cols < WGMMA_M:
        raise ValueError("an M-major (transposed) wgmma A operand needs a swizzle panel of at least "
                         "64 elements (128B swizzle for 16-bit types)")
    b_k_major = operand_is_k_major("b", b.transposed)
    chunk = n if b_k_major else min(n, b.tile.layout.panel_cols)
    a_base, b_base = a.tile.addr32(0, 0), b.tile.addr32(0, 0)
    values = list(acc.values)
    for kk in range(k // step):
        start, lbo, sbo = operand_start_and_strides(a.tile.layout, "a", a.transposed, m0, kk * step)
        desc_a = make_descriptor(a_base + start, lbo, sbo, a.tile.layout.swizzle)
        for n0 in range(0, n, chunk):
            start, lbo, sbo = operand_start_and_strides(b.tile.layout, "b", b.transposed, n0, kk * step)
            desc_b = make_descriptor(b_base + start, lbo, sbo, b.tile.layout.swizzle)
            lo, hi = n0 // 2, (n0 + chunk) // 2
            values[lo:hi] = wgmma_async(target, values[lo:hi], desc_a, desc_b, chunk, dtype,
                                        a_mn_major=not a_k_major, b_mn_major=not b_k_major,
                                        accumulate=accumulate or kk > 0)
    return AccFragment(lay, values)
