"""Barriers: CTA/named barriers (bar.sync / bar.arrive) and mbarriers (init, arrive, expect_tx,
try_wait.parity), plus the fences that order generic-proxy writes against async-proxy readers.

Named barriers: ids 0..15 per CTA; id 0 is what ``__syncthreads`` uses, so producer/consumer
groups should use ids >= 1 with a thread count that is a multiple of 32 (`named_barrier_sync`).

mbarrier protocol used by the TMA emitters (sm90/tma.py):
  setup (one thread):  mbarrier_init(bar, arrivals); fence_mbarrier_init(); then a CTA barrier
  producer (one thread per phase): mbarrier_arrive_expect_tx(bar, bytes); issue the bulk copies
  consumers:           mbarrier_wait(bar, phase)   # phase parity 0, 1, 0, ... per reuse
"""
from __future__ import annotations

from ..._mlir import ir, llvm, nvvm
from .ints import as_i32
from .smem import SmemRegion


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def sync_threads() -> None:
    """``bar.sync 0``: all threads of the CTA."""
    nvvm.barrier()


def named_barrier_sync(barrier_id: int, num_threads: int) -> None:
    """``bar.sync id, n``: wait until ``num_threads`` threads (multiple of 32) have arrived."""
    _check_named(barrier_id, num_threads)
    nvvm.barrier(barrier_id=as_i32(barrier_id), number_of_threads=as_i32(num_threads))


def barrier_popc(flag: ir.Value, barrier_id: int = 0, num_threads: int | None = None) -> ir.Value:
    """``bar.red.popc.u32``: a barrier (the CTA's for id 0 without a count, else the named
    group's) that returns to every thread how many of the arriving threads had ``flag`` (i32)
    nonzero."""
    if num_threads is not None:
        _check_named(barrier_id, num_threads)
    group = f"{barrier_id}" if num_threads is None else f"{barrier_id}, {num_threads}"
    asm = ("{ .reg .pred p; setp.ne.u32 p, $1, 0; "
           f"bar.red.popc.u32 $0, {group}, p; }}")
    return llvm.inline_asm(_i32(), [flag], asm, "=r,r", has_side_effects=True)


def _check_named(barrier_id: int, num_threads: int) -> None:
    if not 0 <= barrier_id < 16:
        raise ValueError(f"named barrier id must be 0..15, got {barrier_id}")
    if num_threads % 32 or num_threads <= 0:
        raise ValueError(f"named barrier thread count must be a positive multiple of 32, got {num_threads}")


def _signed32(x: int) -> int:
    return x - (1 << 32) if x >= (1 << 31) else x


# ---- mbarriers ------------------------------------------------------------------------------

def mbarrier_init(bar: SmemRegion, arrivals: int) -> None:
    """Initialise an 8-byte mbarrier expecting ``arrivals`` arrive-ons per phase (one thread)."""
    nvvm.mbarrier_init(bar.ptr(), as_i32(arrivals))


def fence_mbarrier_init() -> None:
    """Make mbarrier initialisation visible to the async proxy (before TMA uses the barrier)."""
    nvvm.fence_mbarrier_init()


def mbarrier_arrive(bar: SmemRegion) -> None:
    nvvm.mbarrier_arrive(bar.ptr(), results=[ir.IntegerType.get_signless(64)])


def mbarrier_arrive_expect_tx(bar: SmemRegion, tx_bytes) -> None:
    """Arrive and raise the phase's expected transaction count by ``tx_bytes`` (the bytes the
    bulk copies completing on this barrier will write)."""
    nvvm.mbarrier_arrive_expect_tx(bar.ptr(), as_i32(tx_bytes), results=[ir.IntegerType.get_signless(64)])


def mbarrier_expect_tx(bar: SmemRegion, tx_bytes) -> None:
    nvvm.mbarrier_expect_tx(bar.ptr(), as_i32(tx_bytes))


def mbarrier_wait(bar: SmemRegion, phase) -> None:
    """Block until the phase with parity ``phase`` (0/1, int or i32 value) has completed
    (``mbarrier.try_wait.parity`` in a retry loop)."""
    nvvm.mbarrier_try_wait_parity(bar.ptr(), as_i32(phase), as_i32(0x989680))


def fence_proxy_async_shared() -> None:
    """``fence.proxy.async.shared::cta``: order this thread's generic shared-memory writes before
    later async-proxy accesses (wgmma/tcgen05 operand reads, TMA stores)."""
    nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)
