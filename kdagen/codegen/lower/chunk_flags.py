"""Chunk-ready flags: a serial scan that runs beside the chunk-parallel kernel feeding it.

A register-resident scan (register_scan.py) takes a grid of (heads x value blocks, sequences)
CTAs: at B·HV = 16 that is 32 of an H100's 132 SMs, idle while the chunk-parallel kernel before
it (the prologue that stores w, u, kr, ...) runs on all of them, and the other 100 SMs idle
while the scan runs. When the scan reads that kernel's outputs only through its TMA ring, chunk
by chunk, the two can overlap: the chunk kernel's CTA for chunk c publishes a flag once the
chunk's stores are in global memory, and the scan's TMA producer waits for the flag of chunk c
before loading it (kdagen.codegen.sm90.flags has the memory-ordering protocol). The runtime
launches the scan on a second, higher-priority stream right after the chunk kernel, so the scan's
CTAs take SMs as the first chunk CTAs finish and follow the chunk kernel through the sequence
(chunk CTAs are dispatched in blockIdx order, z = the chunk, in the scan's direction).

This module finds such pairs among a program's kernels (:func:`pair_kernels`); the emitters add
the ``chunk_flags`` parameter and the publish / wait code; the launch entries say which kernel
publishes and which waits (``launch["chunk_flags"]``), which the runtime reads.
"""
from __future__ import annotations

from kdagen.runtime.bundle import FLAGS_PARAM

from ..sm90 import flags
from . import backend as B
from .plan import LOAD_OPS, STORE_OPS
from .program import walk

__all__ = ["FLAGS_PARAM", "FLAG_FENCES", "pair_kernels", "kernel_memrefs", "publish_chunk_ready"]


#: LowerOptions.flag_fence values: who runs the gpu-scope release fence before a chunk flag
FLAG_FENCES = ("each", "one")


def publish_chunk_ready(target, base, row, value: int, tid, cost, fence: str = "one") -> None:
    """After a chunk's global stores, release the chunk's flag (kdagen.codegen.sm90.flags);
    nothing where ``base`` is null (the scan runs after this kernel, nothing to announce).
    ``fence``: "each" (every thread fences its own stores, a barrier, one thread publishes) or
    "one" (a barrier, then the publishing thread alone fences and publishes: the barrier orders
    every thread's stores before its fence, which a release is cumulative over, as in a
    cooperative-groups grid sync; the other warps skip a fence that waits for their stores to
    reach L2)."""
    if fence not in FLAG_FENCES:
        raise ValueError(f"flag_fence={fence!r}: use 'each' or 'one'")

    def release():
        if fence == "one":
            flags.release_fence(target)
        flags.publish(target, base, row, value)

    def publish():
        if fence == "each":
            flags.release_fence(target)
        B.barrier()
        B.if_then(B.icmp("eq", tid, 0), release)
        cost.event("fence.gpu")
        cost.event("flag.publish")
    B.if_then(flags.is_set(base), publish)


def kernel_memrefs(group) -> tuple[set, set, set]:
    """(memrefs the kernel reads, memrefs it writes, the read memrefs that some read reaches
    other than a producer-role ``kda.load_chunk`` / ``kda.load`` inside a scan body)."""
    reads, writes, other_reads = set(), set(), set()
    for n in group.nodes:
        in_body = set(walk(n.body)) if n.body is not None else set()
        for m in [n, *in_body]:
            if m.op in STORE_OPS:
                writes.add(m.operands[0])
                continue
            for o in m.operands:
                if o.kind != "memref":
                    continue
                reads.add(o)
                ring = (m in in_body and m.op in LOAD_OPS
                        and m.attrs.get("kda.role") == "producer")
                if not ring:
                    other_reads.add(o)
    return reads, writes, other_reads


def _reverse(group) -> bool:
    return bool(group.scans[0].attrs.get("reverse", False))


def pair_kernels(prepared: list, is_chunk_kernel, is_register_scan,
                 directions=frozenset({False, True})) -> list[tuple[int, int]]:
    """(producer index, consumer index) of consecutive prepared kernels that may overlap: a
    chunk-parallel kernel (``is_chunk_kernel(pk)``: its path can publish flags) followed by a
    register scan (``is_register_scan(pk)``) of the same direction that reads what the chunk
    kernel writes only through its TMA ring (loaded after the flag wait), and writes nothing
    the chunk kernel reads or writes. ``directions``: the scans' ``reverse`` values paired
    (LowerOptions.chunk_flags). A kernel takes part in at most one pair."""
    pairs, used = [], set()
    for i in range(len(prepared) - 1):
        prod, cons = prepared[i], prepared[i + 1]
        if i in used or not (is_chunk_kernel(prod) and is_register_scan(cons)):
            continue
        if (_reverse(prod.group) != _reverse(cons.group)
                or _reverse(cons.group) not in directions):
            continue
        p_reads, p_writes, _ = kernel_memrefs(prod.group)
        c_reads, c_writes, c_other = kernel_memrefs(cons.group)
        if not (p_writes & c_reads) or (p_writes & c_other):
            continue          # nothing to wait for, or a read the flag does not order
        if c_writes & (p_reads | p_writes):
            continue
        pairs.append((i, i + 1))
        used |= {i, i + 1}
    return pairs
