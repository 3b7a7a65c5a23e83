"""f32 <-> bf16/f16 packing, and reuse of mma accumulators as operands of the next mma.

Packing: two f32 values become one 32-bit register holding two 16-bit values, low half first
(``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32``: round to nearest even). This is the register format
of every 16-bit mma/wgmma fragment.

Register reuse (FlashAttention style): an f32 accumulator tile in mma C layout, rounded to 16 bits,
*is* an A-operand fragment for the next mma (`mma.acc_to_a`), and its transpose is a B-operand fragment
(`mma.acc_to_bt`) — no trip through shared memory. The register mapping is `layouts.acc_to_a_source` /
`layouts.acc_to_bt_source`, which the CPU tests prove to be bijections onto the A/B layouts.
"""
from __future__ import annotations

from ..._mlir import arith, ir, llvm, nvvm
from .layouts import acc_to_a_source, acc_to_bt_source

HALF_TYPES = ("bf16", "f16")


def _half_type(dtype: str) -> ir.Type:
    if dtype == "bf16":
        return ir.BF16Type.get()
    if dtype == "f16":
        return ir.F16Type.get()
    raise ValueError(f"16-bit operand type must be one of {HALF_TYPES}, got {dtype!r}")


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def pack_f32x2(lo: ir.Value, hi: ir.Value, dtype: str = "bf16") -> ir.Value:
    """Round two f32 to ``dtype`` (RN) and pack them into an i32: ``lo`` in bits 0-15."""
    vec = ir.VectorType.get([2], _half_type(dtype))
    if dtype == "bf16":
        packed = nvvm.convert_f32x2_to_bf16x2(vec, hi, lo, rnd=nvvm.FPRoundingMode.RN)
    else:
        packed = nvvm.convert_f32x2_to_f16x2(vec, hi, lo, rnd=nvvm.FPRoundingMode.RN)
    return llvm.bitcast(_i32(), packed)


def to_f32(value: ir.Value) -> ir.Value:
    if isinstance(value.type, ir.F32Type):
        return value
    return arith.extf(ir.F32Type.get(), value)


def acc_to_a_frags(layout, values: list, pack) -> dict:
    """Generic form of `acc_to_a` over any ``pack(lo, hi)`` (MLIR emitter or numpy simulator)."""
    if layout.atoms_n % 2:
        raise ValueError("accumulator → A needs an even number of n8 atoms per warp (K multiple of 16)")
    out = {}
    for am in range(layout.atoms_m):
        for kk in range(layout.atoms_n // 2):
            regs = []
            for j in range(4):
                atom, lo, hi = acc_to_a_source(j)
                an = 2 * kk + atom
                regs.append(pack(values[layout.reg(am, an, lo)], values[layout.reg(am, an, hi)]))
            out[(am, kk)] = regs
    return out


def acc_to_bt_frags(layout, values: list, pack) -> dict:
    """Generic form of `acc_to_bt` over any ``pack(lo, hi)``."""
    if layout.atoms_n % 2:
        raise ValueError("accumulator → Bᵀ needs an even number of n8 atoms per warp (K multiple of 16)")
    out = {}
    for am in range(layout.atoms_m):
        for kk in range(layout.atoms_n // 2):
            for nb in range(2):
                regs = []
                for r in range(2):
                    atom, lo, hi = acc_to_bt_source(nb, r)
                    an = 2 * kk + atom
                    regs.append(pack(values[layout.reg(am, an, lo)], values[layout.reg(am, an, hi)]))
                out[(kk, 2 * am + nb)] = regs
    return out


def tf32_bits(x: ir.Value) -> ir.Value:
    """``cvt.rna.tf32.f32``: ``x`` rounded to TF32 (nearest, ties away; PERF.md §4: truncation is
    biased), as the i32 register a TF32 mma/wgmma operand takes (low 13 mantissa bits zero)."""
    return llvm.inline_asm(_i32(), [x], "cvt.rna.tf32.f32 $0, $1;", "=r,f")


#: added to an f32 bit pattern, rounds its magnitude at the TF32 mantissa's last bit, half
#: away from zero (the carry runs into the exponent where it must)
TF32_HALF_ULP_BITS = 0x1000


def tf32_operand_bits(x: ir.Value) -> ir.Value:
    """``x`` as the i32 register of a TF32 mma/wgmma operand, rounded like `tf32_bits`
    (nearest, ties away) in one integer add: the tensor core reads only the top 19 bits of a
    TF32 operand (sign, exponent, 10 mantissa bits) and drops the other 13, so adding half a
    TF32 ulp to the bit pattern first makes the dropped part round instead of truncate.
    ``cvt.rna.tf32.f32`` has no instruction of its own on sm_90: ptxas emulates it with four
    (the add, a mask, an infinity test and a select), which in the register-resident scans
    was 512 of the ~1050 instructions of a kda backward reverse step. Only for operands that
    go straight into a TF32 product: the low bits are left as they are (values stored for
    anything else take `round_tf32`), and an infinite x turns into a NaN."""
    bits = llvm.bitcast(_i32(), x)
    return arith.addi(bits, arith.constant(_i32(), TF32_HALF_ULP_BITS))


#: the bits a TF32 operand keeps (sign, exponent, 10 mantissa bits)
TF32_KEPT_BITS = -(1 << 13)        # 0xFFFFE000 as a signed i32


def tf32_split_operand_bits(x: ir.Value) -> tuple:
    """(hi, lo): ``x`` as two TF32 operand registers with hi + lo = x to ~22 bits: hi is x
    rounded to TF32 (`tf32_operand_bits`, its dropped bits cleared so it is the value the
    tensor core reads), lo the rest, rounded the same way. hi·b + lo·b recovers the product
    with x's rounding error cut from 2^-11 to ~2^-22 relative (b's own rounding stays)."""
    hi = arith.andi(tf32_operand_bits(x), arith.constant(_i32(), TF32_KEPT_BITS))
    lo = arith.subf(x, llvm.bitcast(ir.F32Type.get(), hi))
    return hi, tf32_operand_bits(lo)


def bf16_split_pack(lo_col: ir.Value, hi_col: ir.Value) -> tuple:
    """(hi, lo): two f32 values (the lower column first) as two packed bf16x2 operand
    registers of a bf16x3 product, hi = bf16(x) (round to nearest even) and lo = bf16(x − hi),
    so hi + lo = x to ~16 significant bits. hi's f32 values come back from the packed register
    by a shift and a mask (exact: a bf16 is the top half of an f32), not by two more
    conversions."""
    hi = pack_f32x2(lo_col, hi_col, "bf16")
    f32 = ir.F32Type.get()
    first = llvm.bitcast(f32, arith.shli(hi, arith.constant(_i32(), 16)))
    second = llvm.bitcast(f32, arith.andi(hi, arith.constant(_i32(), -(1 << 16))))
    lo = pack_f32x2(arith.subf(lo_col, first), arith.subf(hi_col, second), "bf16")
    return hi, lo


def round_tf32(x: ir.Value) -> ir.Value:
    """``x`` rounded to TF32 (`tf32_bits`) as an f32 value."""
    return llvm.bitcast(ir.F32Type.get(), tf32_bits(x))

