"""Global-memory element access: address arithmetic, loads with widening to f32, stores."""
from __future__ import annotations

from ..._mlir import arith, ir, llvm
from .kernel import GLOBAL_ADDRESS_SPACE, scalar_type, to_i64

# LLVM's GEP marker for "this index is a dynamic operand".
_DYNAMIC_INDEX = -2147483648


def element_ptr(base: ir.Value, index: ir.Value, elem: str) -> ir.Value:
    """Address of ``base[index]`` for elements of type ``elem`` (index widened to i64)."""
    ptr_t = llvm.PointerType.get(GLOBAL_ADDRESS_SPACE)
    return llvm.getelementptr(ptr_t, base, [to_i64(index)], [_DYNAMIC_INDEX], scalar_type(elem), 0)


def load_f32(base: ir.Value, index: ir.Value, elem: str) -> ir.Value:
    """Load one element of type ``elem`` and return it as f32 (bf16/f16 are widened)."""
    value = llvm.load(scalar_type(elem), element_ptr(base, index, elem))
    if elem == "f32":
        return value
    return arith.extf(ir.F32Type.get(), value)


def store_from_f32(value: ir.Value, base: ir.Value, index: ir.Value, elem: str) -> None:
    """Store an f32 value as ``elem`` (narrowing with round-to-nearest where needed)."""
    if elem != "f32":
        value = arith.truncf(scalar_type(elem), value)
    llvm.store(value, element_ptr(base, index, elem))
