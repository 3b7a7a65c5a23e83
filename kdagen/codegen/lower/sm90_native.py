"""The sm_90a native path of the program lowering: what ``kda-warp-specialize`` asks for.

A tile kernel of a program (kernel.py) becomes, on this path, a warp-specialised kernel of
``128 * (W + 1)`` threads, W = ``LowerOptions.chunk_warpgroups`` consumer warpgroups for a
chunk-parallel kernel (default "auto": 4 where its tile buffers spill to the global scratch, 2
where they fit in shared memory; :func:`chunk_warpgroups`), 1 otherwise:

* **the last warpgroup (threads 128·W ..) = producer**: gives registers back (``setmaxnreg.dec``), and
  one elected thread walks the same chunks as the consumers, issuing every ``kda.load`` /
  ``kda.load_chunk`` that the pass marked ``kda.role = "producer"`` as a TMA copy
  (``cp.async.bulk.tensor``) into a ring of ``depth`` shared-memory stages; the copies of a stage
  complete on its 'full' mbarrier (``expect_tx`` = the stage's bytes), and the producer waits on
  the stage's 'empty' mbarrier before refilling it;
* **warpgroups 0 .. W-1 (threads 0 .. 128·W - 1) = consumers**: take registers
  (``setmaxnreg.inc``), run the kernel body of kernel.py on all their threads (its element
  loops stride over 128·W threads: more warps per scheduler hide more latency) with its
  barriers narrowed to a named barrier of 128·W threads, read
  the loaded tiles from the ring after waiting on 'full' (rows past the sequence end masked to 0
  as on the portable path), arrives on 'empty' when the chunk is done, and computes every
  ``kda.dot`` whose shape fits as **wgmma from shared memory**: the operands (any tile
  expression) are rounded to TF32 (``tf32``: 4-byte elements, m64nNk8) or bf16 (``bf16x3``:
  hi + lo parts, three products, ~fp32 accuracy) into 128B-swizzled K-major staging tiles,
  then ``wgmma.mma_async`` (m64nNk16 for bf16) reads them through
  matrix descriptors and the fp32 accumulators are written to the result buffer; with W
  consumer warpgroups each one computes N / W of the product's columns (its rows of the
  K-major B staging tile).

Loads that TMA cannot express (a per-token scalar such as beta: a 2-byte box row) stay lazy
global loads in the consumers, as on the portable path. A decay_dot whose gates are one value
per row (GDN's) is a wgmma product too, its decay an epilogue scale (`_row_gate_decay`). Other
matrix ops (decay products with per-key gates, decay_matmul, solves) use the portable emitters
(mma.sync / FMA).

Host contract: every TMA'd tensor gets a kernel parameter ``<tensor>_tmap`` (``ptr``: the device
address of a 128-byte CUtensorMap); the manifest's ``launch["tensor_maps"][param]`` says which
tensor, how many leading dimensions are flattened into its row dimension, and the box (torch
order), which is all ``kdagen.runtime.tensormap`` needs to encode it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from kdagen._mlir import llvm, nvvm
from kdagen.runtime.tensormap import ELEM_BYTES   # the element types a tensor map can describe
from kdagen.target import Target

from ..common import barrier as bar
from ..common import smem as smem_mod
from ..common.convert import pack_f32x2, tf32_operand_bits
from ..common.ints import IntVal, ival
from ..common.kernel import Param
from ..common.launch import set_launch_bounds
from ..common.layouts import SmemLayout, wgmma_d_coord
from ..common.mma import AccFragment, SmemOperand
from ..common.smem import SmemTile, byte_gep, shared_ptr_type
from ..common.sreg import block_idx, thread_idx
from ..sm90 import regalloc, tma, wgmma
from . import backend as B
from . import tiles as T_
from .chunk_flags import FLAGS_PARAM, publish_chunk_ready
from .cost import CHUNKS, CostCounter, NullCounter
from .emitter import (STATE_LOAD_BATCH, Geometry, TileKernelEmitter, mem_info,
                      row_gate_sources)
from .mlir_backend import MlirBackend
from .options import product_precision, tensormap_param_kind
from .plan import CHUNK_LOADS, MULTI_READ, NOOP_OPS, VIEW_OPS, LoweringError
from .program import walk

PATH_NAME = "sm90-native"
WG_THREADS = 128
#: consumer warpgroups a chunk-parallel kernel may run (LowerOptions.chunk_warpgroups): every
#: product's N columns split evenly over them, so a power of two
CONSUMER_WARPGROUPS = (1, 2, 4)
PRODUCER_THREADS = 128
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232
REGISTER_FILE = 65536            # 32-bit registers per SM
MAX_CTAS_PER_SM = 4              # resident CTAs a kernel is sized for, at most


def ctas_per_sm(smem_bytes: int, target: Target) -> int:
    """CTAs per SM a kernel is sized for (launch bounds and register split): as many as its
    shared memory lets reside in the target's per-SM shared memory (1 KB of each CTA's share
    is the system's), at most MAX_CTAS_PER_SM. One for the chunk-parallel kernels (their
    tiles take ~220 KB); a decode kernel holding one state (~72 KB) gets three on sm_90a,
    whose warps hide each other's latency."""
    return max(1, min(MAX_CTAS_PER_SM, target.smem_per_sm // (smem_bytes + 1024)))


#: key head dim above which ``chunk_warpgroups="auto"`` keeps two consumer warpgroups even
#: where tile buffers spill: at four, each consumer thread has 96 registers, and K = 256's
#: wider rows made the backward's dq kernel spill 632 bytes there (ptxas, sm_90a); at two
#: (232 registers) nothing spills
WIDE_KEY_DIM = 128


def chunk_warpgroups(option, storage: str, key_dim: int = 128, ctas: int = 1) -> int:
    """Consumer warpgroups of a chunk-parallel kernel: ``option`` (LowerOptions.chunk_warpgroups)
    or, for ``"auto"``, 4 where the kernel's tile buffers spill to the global scratch (its
    element loops wait on L2/HBM round trips: more warps per scheduler hide them; H200, kda_bwd
    B1_T8k_H16: the dq kernel 3.31 -> 2.81 ms, the dk/dv/dg kernel 6.38 -> 5.23 ms) and 2
    where they all live in shared memory (4 measured no faster there: 0.81 -> 0.82 ms), or
    where the key head dim is above :data:`WIDE_KEY_DIM` (four spill registers there), or
    where the kernel is planned for ``ctas`` > 1 CTAs per SM (the other CTA's warps hide the
    latency; at 4 warpgroups x 2 CTAs a consumer thread would get 48 registers)."""
    if option == "auto":
        spills = storage in ("hybrid", "global")
        return 4 if spills and key_dim <= WIDE_KEY_DIM and ctas == 1 else 2
    if option not in CONSUMER_WARPGROUPS:
        raise LoweringError(f"chunk_warpgroups={option}: the sm_90a native path runs "
                            f"{', '.join(map(str, CONSUMER_WARPGROUPS))} or 'auto' consumer "
                            "warpgroups per chunk-parallel CTA")
    return option


#: resident CTAs per SM a chunk-parallel kernel may be planned for (LowerOptions.chunk_ctas_per_sm)
CHUNK_CTAS_PER_SM = (1, 2)


def chunk_budget(ctas: int, target: Target) -> int | None:
    """Shared-memory bytes one CTA of a chunk-parallel kernel may take so that ``ctas`` of them
    reside on an SM (:func:`ctas_per_sm` then sizes its launch bounds and registers for them):
    the SM's shared memory split ``ctas`` ways, less the 1 KB the system keeps per CTA; None
    for one CTA (the block budget applies)."""
    if ctas not in CHUNK_CTAS_PER_SM:
        raise LoweringError(f"chunk_ctas_per_sm={ctas!r}: the sm_90a native path plans a "
                            f"chunk-parallel kernel for {' or '.join(map(str, CHUNK_CTAS_PER_SM))} "
                            "CTAs per SM")
    if ctas == 1:
        return None
    return target.smem_per_sm // ctas - 1024


def entry_registers(threads: int, ctas: int) -> int:
    """Registers per thread a CTA of ``threads`` enters with at ``ctas`` CTAs per SM (what
    ptxas derives from the launch bounds: 65536 / (threads x ctas), rounded down to 8)."""
    return min(255, REGISTER_FILE // (threads * ctas)) // 8 * 8


def register_split(warpgroups: int, ctas: int = 1) -> tuple[int, int]:
    """(producer, consumer) ``setmaxnreg`` counts for ``warpgroups`` consumer warpgroups and
    ``ctas`` resident CTAs per SM.

    The CTA enters with ``.maxntid`` x the entry count ptxas derives from the launch bounds
    (65536 / (threads x ctas), rounded down to 8); ``setmaxnreg.inc`` only redistributes what
    the producer gave back, so producer + consumers must stay within that (2 warpgroups: entry
    168 x 384 = 128 x 40 + 256 x 232). With 4 warpgroups, or several CTAs per SM, the producer
    keeps the minimum, 24."""
    threads = WG_THREADS * warpgroups + PRODUCER_THREADS
    entry = entry_registers(threads, ctas)
    producer = PRODUCER_REGISTERS if warpgroups <= 2 and ctas == 1 else 24
    consumer = (entry * threads - PRODUCER_THREADS * producer) // (WG_THREADS * warpgroups) // 8 * 8
    return producer, min(CONSUMER_REGISTERS, consumer)
#: consumer registers from which a wgmma product drops the barrier after its last K slice
#: (dot_wgmma): on the H100 it saved ~1% of the backward's dk kernel (2296 -> 2266 us,
#: bench/results/h100_stop39_staging_eager_ab.json) but made it spill 4-8 bytes at 96
TRAILING_BARRIER_REGISTERS = 128
CONSUMER_BARRIER = 1            # named barrier id of the consumer warpgroup (0 = whole CTA)
WGMMA_M = 64


@dataclass
class TmaSlot:
    """One producer load of a chunk, as a TMA box in each ring stage."""
    node: object                 # the kda.load / kda.load_chunk node
    tensor: str                  # memref name (argument or workspace)
    elt: str
    kind: str                    # "token" | "chunk"
    box: tuple                   # torch order, after flattening the leading dims
    flatten: int                 # leading dims of the tensor flattened into its row dim
    offset: int = 0              # byte offset in a stage
    heads: str | None = None

    @property
    def nbytes(self) -> int:
        n = ELEM_BYTES[self.elt]
        for b in self.box:
            n *= b
        return n

    @property
    def param(self) -> str:
        return f"{self.tensor}_tmap"


@dataclass
class NativeLayout:
    """Where the native path's own shared memory goes (after the plan's buffers)."""
    slots: list = field(default_factory=list)
    depth: int = 1
    stage_bytes: int = 0
    staging_set_bytes: int = 0   # one set of wgmma operand staging tiles
    staging_sets: int = 1        # sets the K slices of a product alternate between
    base: int = 0                # byte offset of this region (1024-aligned; kernel.prepare)
    precision: str = "bf16x3"

    @property
    def staging_bytes(self) -> int:
        return self.staging_sets * self.staging_set_bytes

    @property
    def stage_bytes_tx(self) -> int:
        """Bytes the TMA copies of one stage deliver (the 'full' barrier's transaction count)."""
        return sum(s.nbytes for s in self.slots)

    @property
    def ring_bytes(self) -> int:
        return self.depth * self.stage_bytes

    @property
    def barrier_bytes(self) -> int:
        return 16 * self.depth if self.slots else 0

    @property
    def bytes(self) -> int:
        return self.staging_bytes + self.ring_bytes + self.barrier_bytes

    @property
    def staging_offset(self) -> int:
        return self.base

    @property
    def ring_offset(self) -> int:
        return self.base + self.staging_bytes

    @property
    def barrier_offset(self) -> int:
        return self.ring_offset + self.ring_bytes

    def tensor_maps(self) -> dict:
        out = {}
        for s in self.slots:
            out[s.param] = {"tensor": s.tensor, "dtype": s.elt, "flatten": s.flatten,
                            "box": list(s.box)}
        return out


#: what the path needs of a chip
CAPABILITIES = ("has_wgmma", "has_tma", "has_setmaxnreg")


def staging_order(rows: int, ks: int, along_k: bool):
    """(shape, rc) of the element loop that stages a [rows, ks] wgmma operand as ks / 2
    pairs per row: ``rc(idx)`` -> (row, pair). ``along_k``: consecutive threads take
    consecutive pairs of a row. Else a warp takes 8 rows x 4 pairs (whole 32-byte sectors of a
    row-major source) and the warps step along the pairs before the rows, so a thread's
    elements share their pair and differ by multiples of 8 rows (`tiles.strided_indices`:
    no division per element; the swizzle phase stays: `SmemLayout.byte_offset`)."""
    if along_k or rows % 8 or (ks // 2) % 4:
        return (rows, ks // 2), (lambda idx: (idx[0], idx[1]))

    def rc(idx):
        rhi, chi, clo, rlo = idx
        return rhi * 8 + rlo, chi * 4 + clo
    return (rows // 8, ks // 8, 4, 8), rc


def supports_target(target: Target | None) -> bool:
    """Whether ``target`` has what this path needs (wgmma, TMA, setmaxnreg)."""
    return target is not None and all(getattr(target, c) for c in CAPABILITIES)


def _tma_slot(n, program) -> TmaSlot | None:
    """The TMA box of a producer load, or None when TMA cannot express it."""
    mem = n.operands[0]
    name, elt, layout, heads, tail = mem_info(mem)
    if elt not in ELEM_BYTES:
        return None
    if n.op == "kda.load" and layout == "token":
        if len(tail) != 1:
            return None
        # a load of one part of the value columns (value_parts): a box of that part's width,
        # at the part's first column (producer_body)
        box, flatten = (program.chunk_size, 1, tail[0] // int(n.attrs.get("value_parts", 1))), 2
    elif n.op == "kda.load_chunk" and layout == "chunk":
        if not 1 <= len(tail) <= 3:
            return None
        box, flatten = (1, *tail), 2
    else:
        return None
    if box[-1] * ELEM_BYTES[elt] % 16 or any(not 1 <= b <= 256 for b in box):
        return None
    return TmaSlot(n, name, elt, "token" if n.op == "kda.load" else "chunk", tuple(box), flatten,
                   heads=heads)


_THROUGH = VIEW_OPS | {"kda.convert"}


def _feeds_matrix(node) -> bool:
    """Whether a load's tile is read more than once per element (through views: a matrix op,
    or several consumers) — off the ring it would need an fp32 copy."""
    stack, seen, readers = [node.results[0]], set(), set()
    while stack:
        v = stack.pop()
        for user, _ in v.uses:
            if user.op in MULTI_READ:
                return True
            if user.op in _THROUGH:
                if id(user) not in seen:
                    seen.add(id(user))
                    stack.extend(user.results)
            elif user.op not in NOOP_OPS:
                readers.add(id(user))
    return len(readers) > 1


def wgmma_dot_shape_ok(M: int, N: int, K: int) -> bool:
    return M % WGMMA_M == 0 and N % 8 == 0 and 8 <= N <= 256 and K % 16 == 0


def _k_slice(K: int) -> int:
    # 32-deep slices (64B swizzle): half the staging memory of 64-deep ones, which the tile
    # buffers need more than the wgmma batches need depth
    for ks in (32, 16):
        if K % ks == 0:
            return ks
    raise LoweringError(f"wgmma depth {K} is not a multiple of 16")


def _wgmma_dot_dims(n) -> tuple | None:
    """(M, N, K) of a kda.dot that goes to wgmma, else None."""
    if n.op != "kda.dot":
        return None
    M, N = n.results[0].shape
    lhs = n.operands[0].shape
    K = lhs[0] if n.attrs.get("transpose_lhs") else lhs[1]
    return (M, N, K) if wgmma_dot_shape_ok(M, N, K) else None


def _wgmma_product_dims(n) -> tuple | None:
    """(M, N, K) of any product that goes to wgmma: a kda.dot (`_wgmma_dot_dims`), or a
    decay_dot with row gates (`emitter.row_gate_sources`), else None. The row-gate
    decay_matmul stays on mma.sync: as one wgmma product at tf32x3 (TF32 hi and lo staged in
    16-deep slices, two barriers each, three products per slice; an experiment, not kept)
    gdn's dk kernel got slower on the H200 (1371 -> 1456 us, B1_T8k_H16) although it issued
    22% fewer instructions, while decay_dot (TF32, its decay an epilogue scale) took gdn's
    forward output kernel from 280 to 261 us (bench/results/h200_stop40_row_gate_wgmma_gdn.log)."""
    if n.op == "kda.dot":
        return _wgmma_dot_dims(n)
    if n.op != "kda.decay_dot" or row_gate_sources(n) is None:
        return None
    M, N = n.results[0].shape
    K = n.operands[0].shape[1]
    return (M, N, K) if wgmma_dot_shape_ok(M, N, K) else None


def _staging_layouts(N: int, K: int, precision: str) -> tuple:
    """(A tile layout [64, ks], B tile layout [N, ks], parts): the staging of one K slice,
    K-major; ``parts`` tiles of each (bf16: hi, bf16x3: hi and lo; tf32: one tile of 4-byte
    elements — the same bytes as bf16x3's two, one product instead of three)."""
    ks = _k_slice(K)
    eb = 4 if precision == "tf32" else 2
    return (SmemLayout(WGMMA_M, ks, eb, ks * eb), SmemLayout(N, ks, eb, ks * eb),
            2 if precision == "bf16x3" else 1)


def _product_precision(n, kernel_precision: str, dot: str) -> str:
    """The staging precision of wgmma product ``n`` in a kernel whose products take
    ``kernel_precision`` by default, under the lowering's ``dot``: each product its own
    (kda.precision) under "auto", else the kernel's; what one wgmma does not take (tf32x3,
    fp32) stages as bf16x3. The staging tiles are sized for the largest product's set, and a
    bf16x3 element (hi + lo) takes the bytes of a TF32 one, so products of one kernel may
    differ."""
    if dot != "auto":
        return kernel_precision
    p = product_precision(dot, n.op, n.attrs.get("kda.precision"))
    return p if p in WGMMA_PRECISIONS else "bf16x3"


def _staging_bytes(dims: tuple, precision: str) -> int:
    """Bytes of the staging tiles of a wgmma product of ``dims`` (M, N, K) at ``precision``."""
    la, lb, parts = _staging_layouts(dims[1], dims[2], precision)
    return parts * (la.size_bytes + lb.size_bytes)


#: row padding of the fp32 tile buffers (elements; LowerOptions.smem_row_pad): a pitch of 4 mod
#: 32 words serves the mma fragment gathers of the decay products without bank conflicts
#: (tools/smem_banks.py: 2.15 -> 1.13 wavefronts per load request in kda_fwd's chunk kernel). On
#: the H200 (B1_T8k_H16) it took kda fwd from 1.177 to 1.065 ms and fwd+bwd from 6.085 to 5.703
#: (bench/results/h200_smem_row_pad_kda.log); sm_120a's 99 KB would fit fewer [64, 128] tiles.
#: Only the buffers a product reads or writes take it (storage.FRAGMENT_READERS): padded
#: everywhere, the dk kernel spilled 8 bytes; padded so, it does not, at the same speed
#: (fwd+bwd 5.707 vs 5.695 ms, bench/results/h200_per_buffer_pad_kda.log)
SMEM_ROW_PAD = 4

#: operand precisions the wgmma staging tiles take (others stage as bf16x3, ~fp32)
WGMMA_PRECISIONS = ("bf16", "bf16x3", "tf32")


def kernel_precisions(group, dot: str) -> list:
    """The operand precisions of a kernel's kda.dot wgmma products (options.product_precision:
    each one's kda.precision under ``dot="auto"``; bf16x3 for what wgmma does not take, e.g.
    fp32 under ``dot="fma"``), sorted; the default product's where it has none."""
    chosen = set()
    for n in group.nodes:
        for m in [n, *(walk(n.body) if n.body is not None else [])]:
            if _wgmma_dot_dims(m) is not None:
                chosen.add(product_precision(dot, m.op, m.attrs.get("kda.precision")))
    return sorted({p if p in WGMMA_PRECISIONS else "bf16x3"
                   for p in chosen or {product_precision(dot, "kda.dot")}})


#: WGMMA_PRECISIONS from the least to the most precise
_BY_PRECISION = ("bf16", "tf32", "bf16x3")


def wgmma_precision(group, dot: str) -> str:
    """The kernel's default wgmma operand precision (`kernel_precisions`; where its products
    differ, the most precise: under ``dot="auto"`` each product stages its own anyway)."""
    return max(kernel_precisions(group, dot), key=_BY_PRECISION.index)


def single_read_operands(group) -> frozenset:
    """(node, operand) pairs that this path reads about once per element: a wgmma product
    stages its A operand once, and its B operand once per 64 rows of the result (M = 64: once;
    kda.dot's operands are 0 = lhs, 1 = rhs)."""
    out = set()
    for n in group.nodes:
        for m in [n, *(walk(n.body) if n.body is not None else [])]:
            dims = _wgmma_product_dims(m)
            if dims is None:
                continue
            out.add((m, 0))
            if dims[0] <= WGMMA_M:
                out.add((m, 1))
    return frozenset(out)


def tma_candidates(program, group) -> list:
    """The producer loads (marked by kda-warp-specialize) of a one-scan kernel that TMA can
    express, as slots (not yet placed)."""
    slots = []
    for scan in group.scans if len(group.scans) == 1 else []:
        for m in scan.body.nodes:
            if m.op in CHUNK_LOADS and m.attrs.get("kda.role") == "producer":
                s = _tma_slot(m, program)
                if s is not None:
                    slots.append(s)
    return slots


def plan_native(program, group, budget: int, plan_bytes: int, precision: str,
                candidates=None, max_depth: int = 2, staging_sets: int = 1,
                dot: str = "auto") -> NativeLayout:
    """Ring (TMA slots, depth) and staging for a tile kernel. ``budget``: shared-memory bytes
    available after the reduction slots; ``plan_bytes``: what the kernel's tile buffers would
    take in shared memory (they spill to the global scratch when the ring needs the room);
    ``candidates``: the load nodes that may go to the ring (default: every TMA candidate);
    ``staging_sets``: sets of staging tiles a product's K slices alternate between
    (LowerOptions.staging_buffers; one where no product has more than one slice); ``dot``:
    the lowering's option (the precision of row-gate decay products)."""
    lay = NativeLayout(precision=precision)
    sliced = False
    for n in group.nodes:
        for m in [n, *(walk(n.body) if n.body is not None else [])]:
            dims = _wgmma_product_dims(m)
            if dims is None:
                continue
            p = _product_precision(m, precision, dot)
            lay.staging_set_bytes = max(lay.staging_set_bytes, _staging_bytes(dims, p))
            sliced = sliced or dims[2] > _k_slice(dims[2])
    lay.staging_sets = staging_sets if sliced else 1
    slots = [s for s in tma_candidates(program, group)
             if candidates is None or s.node in candidates]
    room = budget - lay.staging_bytes - 1024 - 32     # alignment slack and barriers
    # A stage may take at most half of the room (the rest is for the kernel's own buffers).
    # Tiles that feed matrix ops go first (in the ring they need no fp32 copy); tiles read once
    # element-wise are as well served by lazy global loads, so they join only where the ring
    # pushes no buffer out of shared memory.
    chosen, total = [], 0
    for s in sorted(slots, key=lambda s: (not _feeds_matrix(s.node), s.nbytes)):
        if total + s.nbytes > room // 2:
            continue
        if not _feeds_matrix(s.node) and plan_bytes + total + s.nbytes > room:
            continue
        chosen.append(s)
        total += s.nbytes
    slots = sorted(chosen, key=lambda s: s.node.index)
    off = 0
    for s in slots:
        s.offset = off
        off += -(-s.nbytes // 128) * 128
    lay.slots, lay.stage_bytes = slots, off
    lay.depth = 1
    # A chunk-parallel CTA loads one chunk, so its second stage is never filled; dropping it
    # (gdn's prologue kernels 177 -> 144 KB) lets kda_fwd's K = 64 prologue kernel run 2 CTAs
    # per SM at 104 consumer registers instead of 1 at 232, which no GPU has measured yet: kept
    if slots and max_depth >= 2 and plan_bytes + 2 * off <= room:
        lay.depth = 2
    return lay


class _EpilogueOut:
    """A product's output seen through an epilogue: write(idx, v) stores fn(idx, v)."""

    def __init__(self, out, fn):
        self.out, self.fn, self.shape = out, fn, out.shape

    def write(self, idx, v):
        self.out.write(idx, self.fn(idx, v))


class _DynBarrier:
    """An mbarrier chosen at run time (stage index): what the barrier emitters need (``ptr``)."""

    def __init__(self, base, offset):
        self.base, self.offset = base, offset

    def ptr(self, byte_offset=0):
        return byte_gep(self.base, ival(byte_offset) + self.offset, shared_ptr_type())


class Sm90NativeTileEmitter(TileKernelEmitter):
    """A tile kernel on the sm_90a native path (see the module doc)."""

    path = PATH_NAME

    @property
    def state_load_batch(self) -> int:
        """Loads in flight per thread while a scan's initial state is read in (nothing else
        is live then): 64, twice the portable path's (a decode step's [128, 128] state on 128
        threads in 2 rounds instead of 4), where the kernel enters with 80 or more registers;
        32 where more CTAs per SM leave it 64 (ptxas allocates the entry count throughout: a
        value-split decode step at 4 CTAs per SM spilled 144 bytes with 64)."""
        entry = entry_registers(self.block_threads, self.ctas_per_sm)
        return 64 if entry >= 80 else STATE_LOAD_BATCH

    def __init__(self, program, group, plan, storage, opts, target: Target, layout: NativeLayout,
                 warpgroup_storage: str | None = None):
        """``warpgroup_storage``: the storage that decides ``chunk_warpgroups="auto"`` where it
        differs from the plan's (a kernel that shared buffers in place to fit in shared memory
        keeps the warpgroups of its spilling plan: with two, the backward's dq kernel spilled
        registers at the 168 its launch bounds give)."""
        for capability in CAPABILITIES:
            target.require(capability, "the native warp-specialised lowering (wgmma + TMA)")
        warpgroups = (chunk_warpgroups(opts.chunk_warpgroups, warpgroup_storage or storage,
                                       int(program.attrs.get("head_k_dim", 128)),
                                       opts.chunk_ctas_per_sm)
                      if group.parallel else 1)
        super().__init__(program, group, plan, storage,
                         replace(opts, dot=opts.dot if opts.dot == "auto" else layout.precision,
                                 nthreads=WG_THREADS * warpgroups))
        self.warpgroups = warpgroups
        self.target = target
        self.layout = layout
        self.slot_of = {s.node: s for s in layout.slots}
        #: publish a chunk-ready flag after each chunk's stores (kernel.prepare sets it for a
        #: kernel a register scan overlaps, kdagen.codegen.lower.chunk_flags)
        self.publish_flags = False
        self.flag_value = 1             # the pair's ordinal in the program (sm90.flags)

    # -- calling convention ----------------------------------------------------------------
    def params(self):
        ps = super().params()
        seen = []
        for s in self.layout.slots:
            if s.param not in seen:
                seen.append(s.param)
        ps = ps + [Param(p, tensormap_param_kind(self.opts)) for p in seen]
        if self.publish_flags:
            ps.append(Param(FLAGS_PARAM, "ptr", "i32"))
        return ps

    @property
    def consumer_threads(self) -> int:
        return WG_THREADS * self.warpgroups

    @property
    def block_threads(self) -> int:
        return self.consumer_threads + PRODUCER_THREADS

    @property
    def smem_bytes(self) -> int:
        return max(super().smem_bytes, self.layout.base + self.layout.bytes)

    # -- emission --------------------------------------------------------------------------
    def emit_mlir(self, builder, name: str, count_cost: bool = True) -> None:
        lay = self.layout
        consumers = self.consumer_threads
        cost = self.cost = CostCounter() if count_cost else NullCounter()
        with builder.kernel(name, self.params(), (self.block_threads, 1, 1)) as p:
            with B.use(MlirBackend(barrier=(CONSUMER_BARRIER, consumers), cost=cost)):
                i32 = IntVal(thread_idx("x")).value.type
                tid = IntVal(thread_idx("x"))
                coords = dict(tid=tid, hv=IntVal(block_idx("x")), n=IntVal(block_idx("y")),
                              z=IntVal(block_idx("z")),
                              grid=(IntVal(nvvm.read_ptx_sreg_nctaid_x(results=[i32])),
                                    IntVal(nvvm.read_ptx_sreg_nctaid_y(results=[i32]))))
                p = {k: (IntVal(v) if k in ("T", "N", "HV") else v) for k, v in p.items()}
                self.p_flags = p.get(FLAGS_PARAM)
                smem_mod.declare_dynamic_smem(builder)
                base = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
                self.smem_base = base
                if lay.slots:
                    def init():
                        for s in range(lay.depth):
                            bar.mbarrier_init(self._full(s), 1)
                            bar.mbarrier_init(self._empty(s), 1)
                        bar.fence_mbarrier_init()
                    B.if_then(B.icmp("eq", tid, 0), init)
                bar.sync_threads()
                cost.event("bar.sync")

                producer_regs, consumer_regs = self.register_counts

                def producer():
                    regalloc.release_registers(self.target, producer_regs)
                    if lay.slots:
                        def elected():
                            with cost.role("producer"):
                                self.producer_body(p, coords)
                        B.if_then(B.icmp("eq", tid, consumers), elected)

                def consumer():
                    regalloc.claim_registers(self.target, consumer_regs)
                    self.body(p, coords, base)

                B.if_then(B.icmp("ge", tid, consumers), producer)
                B.if_then(B.icmp("lt", tid, consumers), consumer)
        set_launch_bounds(builder, name, min_blocks_per_sm=self.ctas_per_sm)

    @property
    def ctas_per_sm(self) -> int:
        return ctas_per_sm(self.smem_bytes, self.target)

    @property
    def register_counts(self) -> tuple[int, int]:
        """(producer, consumer) registers per thread (:func:`register_split`)."""
        return register_split(self.warpgroups, self.ctas_per_sm)

    def _full(self, stage):
        return _DynBarrier(self.smem_base, self.layout.barrier_offset + 8 * stage)

    def _empty(self, stage):
        return _DynBarrier(self.smem_base, self.layout.barrier_offset + 8 * (self.layout.depth + stage))

    def _stage(self, it):
        """(ring stage, mbarrier phase parity) of chunk iteration ``it``."""
        d = self.layout.depth
        if isinstance(it, int):
            return it % d, (it // d) % 2
        if d == 1:
            return 0, it & 1
        return it % d, (it // d) & 1

    # -- producer ----------------------------------------------------------------------------
    def producer_body(self, p: dict, coords: dict) -> None:
        geo = Geometry(self.program, p, coords, need_chunk_off=any(
            s.kind == "chunk" for s in self.layout.slots))
        lay = self.layout
        maps = {}
        for s in lay.slots:
            if s.param not in maps:
                maps[s.param] = tma.tensormap_pointer(self.target, p[s.param])
        scan = self.group.scans[0]
        reverse = bool(scan.attrs.get("reverse", False))
        ratio = self.program.gva_ratio

        def issue(it, c):
            stage, phase = self._stage(it)
            bar.mbarrier_wait(self._empty(stage), phase ^ 1)
            bar.mbarrier_arrive_expect_tx(self._full(stage), lay.stage_bytes_tx)
            self.cost.event("mbarrier.wait")
            self.cost.event("mbarrier.arrive")
            for s in lay.slots:
                dst = byte_gep(self.smem_base, lay.ring_offset + stage * lay.stage_bytes + s.offset,
                               shared_ptr_type())
                if s.kind == "token":
                    grouped = s.node.attrs.get("head_map") == "grouped" and s.heads == "qk" and ratio > 1
                    head = geo.hv // ratio if grouped else geo.hv
                    row = B.narrow(geo.start + B.wide(c * geo.C))
                    col = geo.v_part * s.box[-1] if "value_parts" in s.node.attrs else 0
                    crd = [col, head, row]
                else:
                    crd = [0] * (len(s.box) - 1) + [B.narrow(geo.chunk_row(c))]
                tma.tma_load(self.target, dst, maps[s.param], crd, self._full(stage))
                self.cost.event("tma.load")

        if self.group.parallel:
            z = coords["z"]

            def one_chunk():
                with self.cost.chunk_step():
                    issue(0, (geo.nchunks - 1) - z if reverse else z)
            B.if_then(B.icmp("lt", z, geo.nchunks), one_chunk)
        else:
            def step(s, *_):
                c = (geo.nchunks - 1) - s if reverse else s
                issue(s, c)
                return []
            B.for_range(0, geo.nchunks, 1, step, trips=CHUNKS)

    # -- consumer hooks --------------------------------------------------------------------
    def step_begin(self, it) -> None:
        self._it = it
        self._waited = False

    def step_end(self, it) -> None:
        if not self.layout.slots:
            return
        if not self._waited:          # a chunk whose loads were all dead: keep the ring in step
            self._wait_full()
        B.barrier()                   # every consumer read of the stage is done
        stage, _ = self._stage(it)
        B.if_then(B.icmp("eq", self.geo.tid, 0), lambda: bar.mbarrier_arrive(self._empty(stage)))
        self.cost.event("mbarrier.arrive")

    def step_done(self, c) -> None:
        if not self.publish_flags:
            return
        publish_chunk_ready(self.target, self.p_flags, self.geo.chunk_row(c), self.flag_value,
                            self.geo.tid, self.cost, self.opts.flag_fence)

    def _wait_full(self) -> None:
        if self._waited:
            return
        stage, phase = self._stage(self._it)
        bar.mbarrier_wait(self._full(stage), phase)
        self.cost.event("mbarrier.wait")
        self._waited = True

    def expr(self, n):
        slot = self.slot_of.get(n)
        if slot is None:
            return super().expr(n)
        self._wait_full()
        stage, _ = self._stage(self._it)
        eb = ELEM_BYTES[slot.elt]
        start = (self.layout.ring_offset + slot.offset) // eb
        per_stage = self.layout.stage_bytes // eb
        elem0 = start + stage * per_stage
        shape = tuple(n.results[0].shape)
        base = self.smem_base
        # a stage's tiles are row-major and 16-byte aligned (TMA destinations): a thread's
        # consecutive elements of a row are one vector load
        aligned = ((self.layout.ring_offset + slot.offset) % 16 == 0
                   and self.layout.stage_bytes % 16 == 0)

        def vector_ok(n_):
            return aligned and shape[-1] % n_ == 0
        if slot.kind == "token":
            geo = self.geo
            c = self.env[n.operands[1]]
            D = shape[1]

            def read(idx):
                pos = c * geo.C + idx[0]
                x = B.load(base, elem0 + idx[0] * D + idx[1], slot.elt)
                return B.sel(B.icmp("lt", pos, geo.seqlen), x, B.f(0.0))

            def vec(idx, n_):
                if len(idx) < 2 or not vector_ok(n_):
                    return [read(i) for i in T_.lanes(idx, n_)]
                live = B.icmp("lt", c * geo.C + idx[0], geo.seqlen)
                xs = B.load_vec(base, elem0 + idx[0] * D + idx[1], n_, slot.elt)
                return [B.sel(live, x, B.f(0.0)) for x in xs]
            return T_.FnRef(shape, read, cheap=True, vec=vec,
                            vec_ok=len(shape) >= 2 and vector_ok(T_.VEC))
        strides = []
        acc = 1
        for d in reversed(shape):
            strides.insert(0, acc)
            acc *= d

        def at(idx):
            e = elem0
            for i, st in zip(idx, strides):
                e = e + i * st
            return e

        def read_chunk(idx):
            return B.load(base, at(idx), slot.elt)

        def vec_chunk(idx, n_):
            if not vector_ok(n_):
                return [read_chunk(i) for i in T_.lanes(idx, n_)]
            return B.load_vec(base, at(idx), n_, slot.elt)
        return T_.FnRef(shape, read_chunk, cheap=True, vec=vec_chunk,
                        vec_ok=vector_ok(T_.VEC))

    def matrix(self, n, out) -> None:
        if _wgmma_product_dims(n) is not None and n.op != "kda.dot":
            return self._row_gate_decay(n, out)
        if _wgmma_dot_dims(n) is None:
            return super().matrix(n, out)
        a = self.env[n.operands[0]]
        b = self.env[n.operands[1]]
        a_tr, b_tr = bool(n.attrs.get("transpose_lhs")), bool(n.attrs.get("transpose_rhs"))
        mode = self.opts.vector_loops

        def quads(x):          # stage along K from vector reads of x (LowerOptions.vector_loops)
            return mode in ("all", "dst") or (mode == "capable" and T_.vec_ok(x))
        a_rows = None if a_tr or not quads(a) else a      # [M, K]: its rows run along K
        b_rows = b if b_tr and quads(b) else None         # transpose_rhs: the stored [N, K]
        if a_tr:
            a = T_.transpose(a)
        if b_tr:
            b = T_.transpose(b)
        # the operands' tiles are row-major where they are stored: read A along K unless it
        # is a transposed view, B along N unless it is one (coalesced global reads)
        self.dot_wgmma(out, a, b, a_along_k=not a_tr, b_along_k=b_tr,
                       precision=_product_precision(n, self.layout.precision, self.opts.dot),
                       a_rows=a_rows, b_rows=b_rows)

    def _row_gate_decay(self, n, out) -> None:
        """A decay_dot with row gates as one wgmma product, out = E ⊙ (lhs rhsᵀ): its result
        is scaled by E[i, j] = 2^(g_row[i] - g_col[j]) (j <= i + diagonal, else 0) as it
        leaves the accumulators. Every kept exponent is <= 0 for a decaying gate (clamped
        below at ``clamp_min``); masked elements are selected away, never multiplied."""
        gl, gr = (self.env[g] for g in row_gate_sources(n))
        lhs, rhs = self.env[n.operands[0]], self.env[n.operands[1]]
        diagonal, clamp = int(n.attrs["diagonal"]), n.attrs.get("clamp_min")
        zero = B.f(0.0)

        def kept(idx, v):
            i, j = idx
            e = B.exp2_clamped(B.sub(gl.read([i]), gr.read([j])), clamp)
            return B.sel(B.icmp("le", j, T_.addk(i, diagonal)), B.mul(v, e), zero)
        self.dot_wgmma(_EpilogueOut(out, kept), lhs, T_.transpose(rhs), b_along_k=True,
                       precision=_product_precision(n, self.layout.precision, self.opts.dot))

    # -- wgmma -------------------------------------------------------------------------------
    def dot_wgmma(self, out, a, b, a_along_k: bool = True, b_along_k: bool = False,
                  precision: str | None = None, a_rows=None, b_rows=None) -> None:
        """out[M, N] = a[M, K] @ b[K, N] with wgmma on staging tiles of ``precision`` (default:
        the kernel's): bf16 hi [+ lo], or TF32.
        ``a_along_k`` / ``b_along_k``: consecutive threads stage consecutive K elements of an
        operand (its tile is contiguous along K where stored), else consecutive M / N
        elements (8 of them, then the next K pair: whole 32-byte sectors of a row-major tile
        and at most a few shared-memory bank conflicts on the K-major staging stores).
        ``a_rows`` / ``b_rows``: the operand as a Ref whose rows run along K ([M, K] for A,
        [N, K] for B), where it is read along K: a thread then stages 4 consecutive K elements
        from one vector read (:func:`tiles.read_vec`) where the staging loop splits so."""
        M, N = out.shape
        K = a.shape[1]
        precision = precision or self.layout.precision
        la, lb, parts = _staging_layouts(N, K, precision)
        tf32 = precision == "tf32"
        dtype = "tf32" if tf32 else "bf16"
        ks = la.cols
        nk = K // ks
        # two sets of staging tiles only where the product has slices to alternate
        sets = self.layout.staging_sets if nk > 1 else 1

        def tile_set(i):
            off = self.layout.staging_offset + i * self.layout.staging_set_bytes
            a_set = [SmemTile(self.smem_base, off + p * la.size_bytes, la) for p in range(parts)]
            off += parts * la.size_bytes
            return a_set, [SmemTile(self.smem_base, off + p * lb.size_bytes, lb)
                           for p in range(parts)]
        tile_sets = [tile_set(i) for i in range(sets)]
        th = self.th
        W = self.warpgroups

        def stage(tiles, rows, value, along_k=True, quad=None):
            """tiles[p][r, 2c:2c+2] = part p of (value(r, 2c), value(r, 2c + 1)). ``quad(r,
            c)``: [value(r, c + j) for j < 4] (one vector read), used along K where every
            thread then takes whole groups of 4."""
            if (along_k and quad is not None and ks % 4 == 0
                    and (rows * ks // 4) % th.count == 0):
                def read4(idx):
                    return quad(idx[0], idx[1] * 4)

                def write4(idx, vals):
                    write_pair(tiles, idx[0], idx[1] * 2, (vals[0], vals[1]))
                    write_pair(tiles, idx[0], idx[1] * 2 + 1, (vals[2], vals[3]))
                T_.foreach_batched(replace(th, batch=max(1, th.batch // 2)), (rows, ks // 4),
                                   read4, write4, straight_shared=W <= 2)
                return
            shape, rc = staging_order(rows, ks, along_k)

            def read(idx):
                r, c2 = rc(idx)
                return value(r, c2 * 2), value(r, c2 * 2 + 1)

            def write(idx, pair):
                r, c2 = rc(idx)
                write_pair(tiles, r, c2, pair)
            # shared indices where the consumers hold 232 registers; at the 96 of four
            # warpgroups they made the backward's dq and dk kernels spill (4-8 bytes)
            T_.foreach_batched(th, shape, read, write, straight_shared=W <= 2)

        def write_pair(tiles, r, c2, pair):
            """Elements 2·c2 and 2·c2 + 1 of staging row r (each part's)."""
            x0, x1 = pair
            if tf32:
                tiles[0].store(tf32_operand_bits(x0), r, c2 * 2)
                tiles[0].store(tf32_operand_bits(x1), r, c2 * 2 + 1)
                self.cost.event("cvt.tf32", 2)
                self.cost.event("st.shared.staging", 2)
                return
            tiles[0].store(pack_f32x2(x0, x1), r, c2 * 2)
            if parts == 2:
                l0 = B.sub(x0, B.round_to(x0, "bf16"))
                l1 = B.sub(x1, B.round_to(x1, "bf16"))
                tiles[1].store(pack_f32x2(l0, l1), r, c2 * 2)
            self.cost.event("cvt.bf16x2", parts)
            self.cost.event("st.shared.staging", parts)

        # each consumer warpgroup computes N / warpgroups of the columns, reading its rows of
        # the (K-major, one swizzle panel wide) B staging tile
        Nw = N // W
        if N % (8 * W):
            raise LoweringError(f"a [{M}, {N}] product cannot be split over {W} consumer "
                                f"warpgroups (each needs a multiple of 8 columns); use "
                                f"chunk_warpgroups=1")
        tid = th.tid
        wg = tid // WG_THREADS if W > 1 else 0

        def b_operands(b_tiles):
            if W == 1:
                return b_tiles
            sub = SmemLayout(Nw, ks, lb.elem_bytes, lb.swizzle)
            pitch = lb.byte_offset(Nw, 0)
            b_base = byte_gep(self.smem_base, ival(wg * pitch), shared_ptr_type())
            return [SmemTile(b_base, t.offset, sub) for t in b_tiles]
        b_ops_of = [b_operands(b) for _, b in tile_sets]
        pairs = [(0, 0)] if parts == 1 else [(0, 0), (0, 1), (1, 0)]
        # Slice s is staged into set s % sets. One set: stage, barrier, wgmma, wait, barrier
        # (the tiles are free again). Two: slice s is staged while slice s - 1's wgmma runs;
        # each thread then waits for its own wgmmas and a single barrier both publishes slice
        # s and tells every thread that slice s - 1's set is free for slice s + 1. The last
        # slice needs no barrier after it: the matrix op ends at one (TileKernelEmitter._node),
        # which the next product's staging follows. Consumers below TRAILING_BARRIER_REGISTERS
        # keep it (at 96, without it the backward's dk kernel spilled 4-8 bytes).
        slices = [(m0, kk) for m0 in range(0, M, WGMMA_M) for kk in range(nk)]
        last_barrier = self.register_counts[1] < TRAILING_BARRIER_REGISTERS
        acc = None
        for s, (m0, kk) in enumerate(slices):
            a_tiles, b_tiles = tile_sets[s % sets]
            b_ops = b_ops_of[s % sets]
            fresh = kk == 0 and self.opts.wgmma_fresh_acc
            if kk == 0:
                # fresh: the chain's first wgmma ignores its input (scale-d 0), so the input is
                # undef and no zeros are copied into the accumulators after the fence (ptxas
                # then inserts a warpgroup.arrive, C7519)
                acc = (wgmma.undef_accumulators(wgmma.wgmma_acc_layout(Nw)) if fresh
                       else AccFragment.filled(wgmma.wgmma_acc_layout(Nw), 0.0))
            k0 = kk * ks
            stage(a_tiles, WGMMA_M, lambda r, c: a.read([T_.addk(r, m0), T_.addk(c, k0)]),
                  a_along_k, None if a_rows is None else (
                      lambda r, c: T_.read_vec(a_rows, [T_.addk(r, m0), T_.addk(c, k0)], 4)))
            if nk > 1 or m0 == 0:
                stage(b_tiles, N, lambda r, c: b.read([T_.addk(c, k0), r]), b_along_k,
                      None if b_rows is None else (
                          lambda r, c: T_.read_vec(b_rows, [r, T_.addk(c, k0)], 4)))
            bar.fence_proxy_async_shared()
            self.cost.event("fence.proxy.async")
            if sets > 1 and kk > 0:
                wgmma.wgmma_wait(self.target, 0)      # slice s - 1's product (this thread's)
                self.cost.event("wgmma.wait")
            B.barrier()
            wgmma.wgmma_fence(self.target)
            for i, (pa, pb) in enumerate(pairs):
                acc = wgmma.wgmma_matmul(self.target, acc, SmemOperand(a_tiles[pa]),
                                         SmemOperand(b_ops[pb], True), ks, dtype,
                                         accumulate=not (fresh and i == 0))
                # B is K-major (transposed): one N chunk, one instruction per k step
                self.cost.event("wgmma", ks // wgmma.wgmma_k(dtype))
            wgmma.wgmma_commit(self.target)
            self.cost.event("wgmma.commit")
            if sets == 1 or kk == nk - 1:
                wgmma.wgmma_wait(self.target, 0)
                self.cost.event("wgmma.wait")
            if sets == 1 and (s < len(slices) - 1 or last_barrier):
                B.barrier()               # the staging tiles are free again
            if kk < nk - 1:
                continue
            warp, lane = (tid // 32) % 4, tid % 32
            for i, v in enumerate(acc.values):
                r, c = wgmma_d_coord(warp, lane, i)
                out.write([T_.addk(r, m0), c + wg * Nw if W > 1 else c], v)

