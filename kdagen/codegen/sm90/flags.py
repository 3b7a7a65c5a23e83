"""Chunk-ready flags: how a CTA of one kernel tells a CTA of a kernel running beside it (another
stream) that a chunk's outputs are in global memory.

Protocol (one 32-bit flag per (chunk row, head), zero before the producing kernel starts):

  producing CTA:   every thread that stored the chunk's outputs runs `release_fence`, the
                   threads synchronise, then one thread runs `publish` (st.release.gpu 1)
  consuming CTA:   the thread that issues the chunk's TMA loads runs `wait_published` first
                   (ld.acquire.gpu until nonzero, then a proxy fence: the loads that follow are
                   async-proxy reads of what generic-proxy stores wrote)

The consumer never waits on a flag the producer will not set, and the producer never waits, so
the pair cannot deadlock as long as the consumer's CTAs leave the producer SMs to run on (the
runtime overlaps the two only then).
"""
from __future__ import annotations

from ..._mlir import ir, llvm
from ..common.kernel import to_i64
from ..common.memory import element_ptr
from ...target import Target


def _check(target: Target) -> None:
    # fence.proxy.async (the generic -> async proxy order TMA loads need) is sm_90+
    target.require("has_tma", "chunk-ready flags (fence.proxy.async before TMA loads)")


def flag_ptr(base: ir.Value, index) -> ir.Value:
    """Address of flag ``index`` (an int-like) of the i32 array at global pointer ``base``."""
    return element_ptr(base, to_i64(index.value if hasattr(index, "value") else index), "i32")


def release_fence(target: Target) -> None:
    """``fence.acq_rel.gpu``: this thread's earlier global stores are ordered before anything
    the CTA does after its next barrier, as seen from any SM."""
    _check(target)
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "fence.acq_rel.gpu;", "",
                    has_side_effects=True)


def publish(target: Target, base: ir.Value, index) -> None:
    """``st.release.gpu.global.u32 [flag], 1`` (one thread, after `release_fence` and a
    barrier of every thread whose stores the flag announces)."""
    _check(target)
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [flag_ptr(base, index)],
                    "st.release.gpu.global.u32 [$0], 1;", "l", has_side_effects=True)


def wait_published(target: Target, base: ir.Value, index) -> None:
    """Spin until flag ``index`` is nonzero (``ld.acquire.gpu``, backing off with nanosleep),
    then ``fence.proxy.async.global`` so that the TMA loads issued next see what the
    publishing CTA stored."""
    _check(target)
    asm = ("{\n .reg .pred p;\n .reg .u32 f;\n"
           "KDA_FLAG_WAIT_${:uid}:\n"
           " ld.acquire.gpu.global.u32 f, [$0];\n"
           " setp.eq.u32 p, f, 0;\n"
           " @p nanosleep.u32 64;\n"
           " @p bra KDA_FLAG_WAIT_${:uid};\n"
           " fence.proxy.async.global;\n}")
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [flag_ptr(base, index)], asm, "l",
                    has_side_effects=True)
