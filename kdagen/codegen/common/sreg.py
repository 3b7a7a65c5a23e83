"""Thread/block index emitters (PTX special registers), returned as i32 values."""
from __future__ import annotations

from ..._mlir import ir, nvvm


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def thread_idx(dim: str = "x") -> ir.Value:
    return getattr(nvvm, f"read_ptx_sreg_tid_{dim}")(results=[_i32()])


def block_idx(dim: str = "x") -> ir.Value:
    return getattr(nvvm, f"read_ptx_sreg_ctaid_{dim}")(results=[_i32()])
