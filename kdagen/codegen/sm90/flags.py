"""Chunk-ready flags: how a CTA of one kernel tells a CTA of a kernel running beside it (another
stream) that a chunk's outputs are in global memory.

Protocol (one 32-bit flag per (chunk row, head), zero at the start of a program call; the
k-th pair of kernels of the call, k = 1, 2, ..., uses the value k, so a later pair never takes
an earlier pair's flags for its own):

  producing CTA:   the threads that stored the chunk's outputs synchronise, then one thread
                   runs `release_fence` and `publish` (st.release.gpu k): the barrier orders
                   every thread's stores before that fence, and a release is cumulative over
                   them (LowerOptions.flag_fence="each": every thread fences before the barrier)
  consuming CTA:   the thread that issues the chunk's TMA loads runs `wait_published` first
                   (ld.acquire.gpu until the flag is k or more, then a proxy fence: the loads
                   that follow are async-proxy reads of what generic-proxy stores wrote)

A null flag pointer (the kernels run in order on one stream: every chunk is out before the
consumer starts) skips both sides.

The consumer never waits on a flag the producer will not set, and the producer never waits, so
the pair cannot deadlock as long as the consumer's CTAs leave the producer SMs to run on (the
runtime overlaps the two only then).
"""
from __future__ import annotations

from ..._mlir import arith, ir, llvm
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


def _check_value(value: int) -> None:
    if not 1 <= value < 2 ** 31:
        raise ValueError(f"a chunk-ready flag value is a pair's ordinal, 1 or more; got {value}")


def publish(target: Target, base: ir.Value, index, value: int = 1) -> None:
    """``st.release.gpu.global.u32 [flag], value`` (one thread, after `release_fence` and a
    barrier of every thread whose stores the flag announces)."""
    _check(target)
    _check_value(value)
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [flag_ptr(base, index)],
                    f"st.release.gpu.global.u32 [$0], {value};", "l", has_side_effects=True)


def wait_published(target: Target, base: ir.Value, index, value: int = 1) -> None:
    """Spin until flag ``index`` is ``value`` or more (``ld.acquire.gpu``, backing off with
    nanosleep), then ``fence.proxy.async.global`` so that the TMA loads issued next see what
    the publishing CTA stored."""
    _check(target)
    _check_value(value)
    asm = ("{\n .reg .pred p;\n .reg .u32 f;\n"
           "KDA_FLAG_WAIT_${:uid}:\n"
           " ld.acquire.gpu.global.u32 f, [$0];\n"
           f" setp.lt.u32 p, f, {value};\n"
           " @p nanosleep.u32 64;\n"
           " @p bra KDA_FLAG_WAIT_${:uid};\n"
           " fence.proxy.async.global;\n}")
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [flag_ptr(base, index)], asm, "l",
                    has_side_effects=True)


def is_set(base: ir.Value, negate: bool = False) -> ir.Value:
    """i1: whether the flag array pointer is not null (the runtime passes null when the two
    kernels run in order); ``negate``: whether it is null."""
    i64 = ir.IntegerType.get_signless(64)
    addr = llvm.ptrtoint(i64, base)
    pred = arith.CmpIPredicate.eq if negate else arith.CmpIPredicate.ne
    return arith.cmpi(pred, addr, arith.constant(i64, 0))
