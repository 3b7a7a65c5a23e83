"""The emitters of one kernel: a tile kernel per scan group (:class:`TileKernelEmitter`,
written with the primitives of backend.py over the tile references of tiles.py, following
the storage plan of plan.py) and a kernel per global op (:class:`GlobalKernelEmitter`).

Calling convention (what the runtime relies on; also written into every bundle manifest):

Tile kernels (``kind = "tile"``): grid = ``(HV, N, 1)`` (blockIdx.x = value head hv,
blockIdx.y = sequence n), block = ``(nthreads, 1, 1)`` (128 by default), dynamic shared memory
as in the manifest. A kernel whose only scan carries nothing (a chunk-parallel scan, as the
partition pass makes) gets grid ``(HV, N, max_chunks)`` instead: blockIdx.z = chunk c (CTAs
with c >= the sequence's chunk count exit), ``max_chunks = max_n ceil(len_n / C)``.
Parameters, in this order:

1. one ``ptr`` per program memref argument the kernel reads or writes, in the program's
   argument order (q, k, v, g_raw/g, beta_raw/beta, A_log, dt_bias, initial_state, cu_seqlens,
   state_slots, do, dht, o, final_state, dq, ... as the program declares them); element type
   as in the program (bf16/f16/f32 storage; cu_seqlens int64, always passed with varlen;
   state_slots int32 or int64). A state of layout ``pool`` ``[slots, HV, *tail]`` is
   addressed by the sequence's slot ``state_slots[n]`` instead of n: the kernel reads the
   slot once, reads its initial state from that row (zeros, and o = 0, for a negative slot)
   and stores its final state there (nothing for a negative slot); ``initial_state`` and
   ``final_state`` may be one tensor (in place: each CTA reads its row before writing it,
   and live slots must be distinct);
2. one ``ptr`` per workspace the kernel uses (``kda.workspace``, by name), in program order;
   layouts ``chunk`` ``[total_chunks, HV, *tail]`` (the chunks of sequence n at rows
   ``sum_{m<n} ceil(len_m / C) + c``), ``token`` ``[B, T, HV, *tail]``, ``state``
   ``[N, HV, *tail]``;
3. ``T`` (i32: tokens per sequence, or total tokens with varlen), ``N`` (i32: sequences = the
   batch size without varlen), ``HV`` (i32: value heads);
4. every f32 scalar argument of the program (``scale``), in argument order;
5. ``scratch`` (``ptr`` f32) when the kernel's storage is ``global`` or ``hybrid`` (tile
   buffers that do not fit the shared-memory budget live there, the most-read ones in shared
   memory):
   ``scratch_bytes_per_cta`` times the number of CTAs of the grid, uninitialised, private to
   the launch (CTA (x, y, z) uses slice ``(z * gridDim.y + y) * gridDim.x + x``).

Kernels of the sm_90a native path (``path = "sm90-native"``) take block ``(384, 1, 1)`` when
chunk-parallel (two consumer warpgroups and a producer; ``(256, 1, 1)`` with
``chunk_warpgroups=1`` and for serial scans) and, after the parameters above, one ``ptr`` per TMA'd tensor
(``<tensor>_tmap``: the device address of its CUtensorMap, described by
``launch["tensor_maps"]``; see kdagen.codegen.lower.sm90_native and kdagen.runtime.tensormap).

Global kernels (``kind = "global"``: kda.sum_head_groups, kda.sum_seqs): block 256, grid rule
and parameters (src, dst, T, N, HV) in the manifest.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kdagen.codegen.common.kernel import GpuModuleBuilder, Param

from . import backend as B
from . import tiles as T_
from .cost import CHUNKS, CostCounter, NullCounter
from .mlir_backend import MlirBackend, W64
from .options import LowerOptions, product_precision
from .plan import MATRIX_OPS, STORE_OPS, KernelGroup, LoweringError
from .program import Program, Value, walk
from .storage import GLOBAL_ALIGN, StoragePlan, buffer_strides, expression_reads

__all__ = ["TileKernelEmitter", "GlobalKernelEmitter", "Geometry", "MemRef", "mem_info",
           "workspace_specs", "REDUCE_SLOTS_BYTES"]

# cross-warp partial sums (one f32 per warp, up to 16 warps), then GATE_CHECK_SLOTS words that
# hand a gate's diagonal-block check from its first decay product to the later ones
REDUCE_WARP_SLOTS = 16
GATE_CHECK_SLOTS = 4
REDUCE_SLOTS_BYTES = 4 * (REDUCE_WARP_SLOTS + GATE_CHECK_SLOTS)
#: loads in flight per thread while a scan's initial carried value is read in (a path whose
#: consumers hold more registers raises it: Sm90NativeTileEmitter.state_load_batch)
STATE_LOAD_BATCH = 32


# ------------------------------------------------------------------------------------------
# memory operands
# ------------------------------------------------------------------------------------------


@dataclass
class MemRef:
    name: str
    ptr: object
    elt: str
    layout: str            # token | head | state | chunk | seqlens | pool | slots
    heads: str | None
    tail: tuple
    #: how a workspace tile is stored, chosen by the lowering of its readers
    #: (kdagen.codegen.lower.register_scan): [rows, cols] tiles stored transposed, and values
    #: rounded on store (e.g. "tf32" for a tile read only as a TF32 wgmma operand)
    transposed: bool = False
    round: str | None = None
    #: "bf16_hi_lo": each [rows, cols] f32 tile's bytes hold two bf16 tiles of the same shape,
    #: hi = bf16(x) then lo = bf16(x - hi) (~16 significant bits), for a tile read only as the
    #: B operand of bf16x3 register-scan products (register_scan.RingSlot.parts)
    split: str | None = None
    #: first column of dim ``col_axis`` this view addresses (int-like): the running part's
    #: value columns, for the memory ops of a program split over them (value_parts; the
    #: value dim is the last, or -2 for a state stored value-first)
    col0: object = 0
    col_axis: int = -1
    #: col0 is a multiple of this (the part width; 0: unknown)
    col_step: int = 0

    @property
    def inner(self) -> int:
        return T_.numel(self.tail)

    def flat(self, idx):
        """Offset within the row of a tail index (int-like), in the stored order."""
        idx, tail = list(idx), list(self.tail)
        if not (isinstance(self.col0, int) and self.col0 == 0):
            idx[self.col_axis] = idx[self.col_axis] + self.col0
        if self.transposed:
            idx[-2:], tail[-2:] = idx[-2:][::-1], tail[-2:][::-1]
        off = 0
        stride = 1
        for i, d in zip(reversed(idx), reversed(tail)):
            if not (isinstance(i, int) and i == 0):
                off = off + i * stride
            stride *= d
        return off

    def at(self, row, idx):
        """Element offset (64-bit int-like) of ``[row, *idx]`` for a row of ``inner`` elements."""
        fl = self.flat(idx)
        base = B.wide(row) * self.inner if self.inner != 1 else B.wide(row)
        if isinstance(fl, int) and fl == 0:
            return base
        return base + B.wide(fl)

    def _hi_lo_at(self, row, idx):
        """bf16 element offsets of ``[row, *idx]``'s hi and lo parts (``split``): a row of
        ``inner`` f32 holds 2·inner bf16, the hi tile then the lo tile."""
        hi = self.at(row, idx) + (B.wide(row) * self.inner if self.inner != 1 else B.wide(row))
        return hi, hi + self.inner

    def load(self, row, idx):
        if self.split is not None:
            hi, lo = self._hi_lo_at(row, idx)
            return B.add(B.load(self.ptr, hi, "bf16"), B.load(self.ptr, lo, "bf16"))
        return B.load(self.ptr, self.at(row, idx), self.elt)

    def vector_ok(self, n: int) -> bool:
        """Whether ``n`` consecutive elements of the last logical dim (from a multiple of
        ``n``) are consecutive and ``n``-element aligned in memory (rows of ``inner`` elements
        from a 16-byte aligned base; runtime.launch aligns every tensor)."""
        if self.split is not None or self.transposed or not self.tail:
            return False
        if self.inner % n or self.tail[-1] % n:
            return False
        shifted = not (isinstance(self.col0, int) and self.col0 == 0)
        if shifted and self.col_axis % len(self.tail) == len(self.tail) - 1:
            # the part's first column: a multiple of the part width
            step = self.col0 if isinstance(self.col0, int) else self.col_step
            if not step or step % n:
                return False
        return True

    def load_vec(self, row, idx, n: int) -> list:
        if n == 1:
            return [self.load(row, idx)]
        if self.vector_ok(n):
            return B.load_vec(self.ptr, self.at(row, idx), n, self.elt)
        B.count(T_.STRIDED.format(space="global"), n)
        return [self.load(row, i) for i in T_.lanes(idx, n)]

    def store_vec(self, values, row, idx) -> None:
        n = len(values)
        if n == 1:
            self.store(values[0], row, idx)
            return
        if self.vector_ok(n):
            if self.round is not None:
                values = [B.round_to(v, self.round) for v in values]
            B.store_vec(self.ptr, self.at(row, idx), values, self.elt)
            return
        B.count(T_.STRIDED.format(space="global"), n)
        for i, v in zip(T_.lanes(idx, n), values):
            self.store(v, row, i)

    def store(self, value, row, idx):
        if self.split is not None:
            if self.split != "bf16_hi_lo":
                raise LoweringError(f"{self.name}: unknown split storage {self.split!r}")
            hi, lo = self._hi_lo_at(row, idx)
            top = B.round_to(value, "bf16")
            B.store(self.ptr, hi, top, "bf16")
            B.store(self.ptr, lo, B.sub(value, top), "bf16")
            return
        if self.round is not None:
            value = B.round_to(value, self.round)
        B.store(self.ptr, self.at(row, idx), value, self.elt)


def mem_info(v: Value) -> tuple:
    if v.arg is not None:
        a = v.arg
        return a.name, a.elt, a.layout, a.heads, a.tail
    if v.workspace is not None:
        lead = {"token": 3, "state": 2, "chunk": 2}[v.workspace["layout"]]
        return (v.workspace["name"], v.elt, v.workspace["layout"], v.workspace.get("heads") or "v",
                tuple(v.shape[lead:]))
    raise LoweringError(f"memref {v} is neither an argument nor a workspace")


def workspace_specs(program: Program) -> list[dict]:
    """name, layout, element type, trailing shape (and heads) of every workspace."""
    out = []
    for n in program.nodes:
        if n.op == "kda.workspace":
            nm, elt, layout, heads, tail = mem_info(n.results[0])
            out.append(dict(name=nm, layout=layout, elt=elt, tail=list(tail), heads=heads))
    return out


# ------------------------------------------------------------------------------------------
# per-CTA geometry
# ------------------------------------------------------------------------------------------


class Geometry:
    """CTA coordinates and the chunk geometry of its sequence (uniform over the CTA)."""

    def __init__(self, program: Program, p: dict, coords: dict, need_chunk_off: bool):
        self.C = C = program.chunk_size
        self.ratio = program.gva_ratio
        self.tid = coords["tid"]
        self.hv = coords["hv"]
        self.n = coords["n"]
        self.T, self.N, self.HV = p["T"], p["N"], p["HV"]
        # a program split over its value columns: value_split CTAs per head (blockIdx.x =
        # head · value_split + part), part p owning columns [p·V/P, (p+1)·V/P)
        self.value_split = program.value_split
        self.v_part = 0
        if self.value_split > 1:
            self.hv = coords["hv"] // self.value_split
            self.v_part = coords["hv"] % self.value_split
        self.H = self.HV // self.ratio if self.ratio > 1 else self.HV
        if program.varlen:
            cu = p["cu_seqlens"]
            self.start = B.uniform(B.wide(B.load(cu, B.wide(self.n), "i64")))
            end = B.uniform(B.wide(B.load(cu, B.wide(self.n) + 1, "i64")))
            self.seqlen = B.uniform(B.narrow(end - self.start))
        else:
            self.start = B.wide(self.n) * B.wide(self.T)
            self.seqlen = self.T
        self.nchunks = (self.seqlen + (C - 1)) // C
        self.chunk_off = None
        if need_chunk_off:
            if program.varlen:
                cu = p["cu_seqlens"]

                def step(m, acc):
                    a = B.wide(B.load(cu, B.wide(m), "i64"))
                    b = B.wide(B.load(cu, B.wide(m) + 1, "i64"))
                    return [acc + (B.narrow(b - a) + (C - 1)) // C]
                (off,) = B.for_range(0, self.n, 1, step, [0])
                self.chunk_off = B.uniform(off)
            else:
                self.chunk_off = self.n * ((self.T + (C - 1)) // C)

    def state_row(self, slot=None):
        """The row of this CTA's (sequence, head) in a ``state`` tensor [N, HV, ...], or with
        ``slot`` (an int-like) in a ``pool`` [slots, HV, ...]."""
        seq = self.n if slot is None else slot
        return B.wide(seq) * B.wide(self.HV) + B.wide(self.hv)

    def read_slot(self, slots: MemRef):
        """The sequence's entry of a slot table (``slots`` layout, [N] int), 64-bit."""
        return B.uniform(B.wide(slots.load(self.n, ())))

    def chunk_row(self, c):
        return B.wide(self.chunk_off + c) * B.wide(self.HV) + B.wide(self.hv)

    def token_row(self, mem: MemRef, pos, head):
        heads = self.H if mem.heads == "qk" else self.HV
        return (self.start + B.wide(pos)) * B.wide(heads) + B.wide(head)


# ------------------------------------------------------------------------------------------
# tile kernels
# ------------------------------------------------------------------------------------------


def op_label(n) -> str:
    """How the cost report names a program op: ``kind %result [shape]`` (or the memref
    name of a store)."""
    if n.results:
        r = n.results[0]
        return f"{n.kind} %{r.name} {list(r.shape)}" if getattr(r, "name", None) else n.kind
    name = n.attrs.get("name")
    return f"{n.kind} {name}" if name else n.kind


def row_gate_sources(n) -> tuple | None:
    """The two [C] gate values of decay product ``n`` when both of its gates are a broadcast
    of one value per row over the contraction's columns (kda-narrow-broadcasts leaves GDN's
    so), else None: the decay then leaves the contraction (decay_matmul weights its left
    operand by 2^(g_i - g_j), decay_dot scales its result by it)."""
    if n.op not in ("kda.decay_dot", "kda.decay_matmul"):
        return None
    out = []
    for g in n.operands[2:4]:
        src = g.owner
        if (src is None or src.op != "kda.broadcast" or list(src.attrs.get("dims", ())) != [1]
                or len(src.operands[0].shape) != 1):
            return None
        out.append(src.operands[0])
    return tuple(out)


class TileKernelEmitter:
    def __init__(self, program: Program, group: KernelGroup, plan: StoragePlan, storage: str,
                 opts: LowerOptions):
        self.program = program
        self.group = group
        self.plan = plan
        self.storage = storage
        self.opts = opts
        self.env: dict = {}
        self.cost = NullCounter()       # emit_mlir's counter (kdagen.codegen.lower.cost)
        #: workspace value -> MemRef storage fields (transposed, round) that the program's
        #: kernels agree on (kernel.prepare)
        self.workspace_storage: dict = {}

    # -- parameters ----------------------------------------------------------------------
    def bind_memrefs(self, p) -> None:
        """The kernel's arguments and workspaces as MemRefs (with each workspace's storage
        contract), and its scalar arguments, in ``self.env``."""
        args, wss = self.memrefs()
        for v in args + wss:
            nm, elt, layout, heads, tail = mem_info(v)
            self.env[v] = MemRef(nm, p[nm], elt, layout, heads, tail,
                                 **self.workspace_storage.get(v, {}))
        for a, v in zip(self.program.args, self.program.arg_values):
            if a.layout == "scalar":
                self.env[v] = p[a.name]

    def memrefs(self) -> tuple[list, list]:
        used = []
        for n in self.group.nodes:
            for m in [n, *(walk(n.body) if n.body is not None else [])]:
                for o in m.operands:
                    if o.kind == "memref" and o not in used:
                        used.append(o)
        args = [v for v in self.program.arg_values if v.kind == "memref"
                and (v in used or v.arg.layout == "seqlens")]
        workspaces = [v for v in used if v.workspace is not None]
        return args, workspaces

    def params(self) -> list[Param]:
        args, wss = self.memrefs()
        ps = [Param(v.arg.name, "ptr", v.arg.elt) for v in args]
        ps += [Param(v.workspace["name"], "ptr", v.elt) for v in wss]
        ps += [Param("T", "i32"), Param("N", "i32"), Param("HV", "i32")]
        ps += [Param(a.name, "f32") for a in self.program.args if a.layout == "scalar"]
        if self.uses_global:
            ps.append(Param("scratch", "ptr", "f32"))
        return ps

    # pools: the cross-warp reduction slots go first in shared memory when the kernel has
    # any, else first in the global scratch
    @property
    def uses_smem(self) -> bool:
        return self.storage in ("smem", "hybrid")

    @property
    def uses_global(self) -> bool:
        return self.storage in ("global", "hybrid")

    def pool_base(self, space: str) -> int:
        reduce_here = (space == "smem") == self.uses_smem
        if not reduce_here:
            return 0
        return REDUCE_SLOTS_BYTES if space == "smem" else GLOBAL_ALIGN

    @property
    def smem_bytes(self) -> int:
        return self.pool_base("smem") + self.plan.smem_bytes if self.uses_smem else 0

    @property
    def scratch_bytes(self) -> int:
        if not self.uses_global:
            return 0
        n = self.pool_base("global") + self.plan.global_bytes
        return -(-n // GLOBAL_ALIGN) * GLOBAL_ALIGN

    @property
    def scratch_elems(self) -> int:
        return self.scratch_bytes // 4

    @property
    def smem_elems(self) -> int:
        return self.smem_bytes // 4

    # -- emission ------------------------------------------------------------------------
    def emit_mlir(self, builder: GpuModuleBuilder, name: str, count_cost: bool = True) -> None:
        """Emit the kernel into ``builder``; with ``count_cost``, :attr:`cost` is a fresh
        :class:`~kdagen.codegen.lower.cost.CostCounter` fed while emitting (same IR either way)."""
        from kdagen._mlir import llvm
        from kdagen.codegen.common import smem as smem_mod
        from kdagen.codegen.common.ints import IntVal
        from kdagen.codegen.common.sreg import block_idx, thread_idx
        nt = self.opts.nthreads
        self.cost = CostCounter() if count_cost else NullCounter()
        with builder.kernel(name, self.params(), (nt, 1, 1)) as p:
            with B.use(MlirBackend(cost=self.cost)):
                from kdagen._mlir import nvvm
                i32 = IntVal(thread_idx("x")).value.type
                coords = dict(tid=IntVal(thread_idx("x")), hv=IntVal(block_idx("x")),
                              n=IntVal(block_idx("y")), z=IntVal(block_idx("z")),
                              grid=(IntVal(nvvm.read_ptx_sreg_nctaid_x(results=[i32])),
                                    IntVal(nvvm.read_ptx_sreg_nctaid_y(results=[i32]))))
                p = {k: (IntVal(v) if k in ("T", "N", "HV") else v) for k, v in p.items()}
                if self.uses_smem:
                    smem_mod.declare_dynamic_smem(builder)
                    base = llvm.mlir_addressof(smem_mod.shared_ptr_type(),
                                               smem_mod.DYNAMIC_SMEM_SYMBOL)
                else:
                    base = None
                self.body(p, coords, base)

    def body(self, p: dict, coords: dict, smem_base) -> None:
        """The kernel body on the active backend. ``p``: parameter values by name;
        ``coords``: tid (int-like), hv, n, z (block indices), grid (gridDim.x, gridDim.y);
        ``smem_base``: the shared scratch pointer (smem storage)."""
        self.coords = coords
        self.env = {}
        nt = self.opts.nthreads
        need_off = any(m.op in ("kda.load_chunk", "kda.store_chunk", "kda.sum_chunks")
                       for n in self.group.nodes
                       for m in [n, *(walk(n.body) if n.body is not None else [])])
        geo = Geometry(self.program, p, coords, need_off)
        self.geo = geo
        self.th = T_.Threads(geo.tid, nt, self.opts.load_batch, self.opts.ordered_sums,
                             self.opts.vector_loops)
        self.pools = {}
        if self.uses_smem:
            self.pools["smem"] = T_.Scratch(smem_base, "smem")
        if self.uses_global:
            gx, gy = coords["grid"]
            cta = (B.wide(coords["z"]) * B.wide(gy) + B.wide(geo.n)) * B.wide(gx) + B.wide(coords["hv"])
            self.pools["global"] = T_.Scratch(B.gep(p["scratch"], cta * self.scratch_elems), "global")
        red_pool = self.pools["smem" if self.uses_smem else "global"]
        self.red = T_.ReduceScratch(T_.BufRef(red_pool, 0, (REDUCE_WARP_SLOTS,), (1,)))
        self.init_gate_checks(T_.BufRef(red_pool, REDUCE_WARP_SLOTS, (GATE_CHECK_SLOTS,), (1,)))
        self.bind_memrefs(p)
        self.read_slots()
        self.pending_reads, self.pending_writes = set(), set()
        for n in self.group.nodes:
            self.node(n)
        self.sync_pending()

    def read_slots(self) -> None:
        """The sequence's slot in each slot table the kernel uses (``self.slots``: memref
        value -> 64-bit int-like), read once at the top so that every region can use it."""
        self.slots = {v: self.geo.read_slot(self.env[v]) for v in self.memrefs()[0]
                      if v.arg.layout == "slots"}

    def bufref(self, v: Value) -> T_.BufRef:
        b = self.plan.buffers[v]
        return T_.BufRef(self.pools[b.space], (self.pool_base(b.space) + b.offset) // 4,
                         tuple(v.shape), buffer_strides(tuple(v.shape), b.space, b.row_pad))

    def node(self, n) -> None:
        if n.op == "kda.scan":
            self.sync_pending()
            return self.scan(n)
        label = op_label(n)
        with self.cost.op(label), B.op_scope(label):
            self._node(n)

    # -- barriers --------------------------------------------------------------------------
    # Every op that works across threads (products, reductions, scans of rows, state
    # loads/stores) ends at a barrier. Element-wise materialisations and tile stores, where
    # each thread reads and writes elements on its own, are followed by one only when a later
    # op needs it: an op that reads memory written since the last barrier, or writes memory
    # read or written since then (a buffer region first-fit reuses, a workspace this kernel
    # stores and reads), waits at a barrier first.
    state_load_batch = STATE_LOAD_BATCH

    def sync_pending(self) -> None:
        """A barrier if an element-wise op touched memory since the last one."""
        if self.pending_reads or self.pending_writes:
            self.barrier()

    def barrier(self) -> None:
        B.barrier()
        self.pending_reads, self.pending_writes = set(), set()

    def accesses(self, n):
        """(regions read, regions written, element-wise) of a materialising op: element-wise
        when it runs element by element on its own threads (a materialisation, a tile store),
        else it works across threads and ends at a barrier. Regions: ("smem"|"global", first
        byte, end byte) of a tile buffer, ("mem", id) of a memref. The staging tiles and
        reduction slots that cross-thread ops use internally are disjoint from the buffers."""
        if n.op in STORE_OPS:
            elementwise = n.kind in ("store", "store_chunk")
            writes = {("mem", id(n.operands[0]))}
        else:
            elementwise = n.op not in MATRIX_OPS
            writes = {self.region(r) for r in n.results if r in self.plan.buffers}
        operands = n.operands[2:] if n.kind in ("store", "store_chunk") else n.operands
        buffered, memrefs = expression_reads(operands, self.plan.buffers)
        reads = {self.region(v) for v in buffered} | {
            ("mem", id(m)) for m in memrefs if m in self.plan.written_memrefs}
        return reads, writes, elementwise

    def region(self, v: Value) -> tuple:
        b = self.plan.buffers[v]
        return (b.space, b.offset, b.offset + b.nbytes)

    def hazard(self, reads: set, writes: set) -> bool:
        def meets(a, regions):
            for b in regions:
                if a[0] != b[0]:
                    continue
                if a[0] == "mem" and a[1] == b[1]:
                    return True
                if a[0] != "mem" and a[1] < b[2] and b[1] < a[2]:
                    return True
            return False
        return (any(meets(r, self.pending_writes) for r in reads)
                or any(meets(w, self.pending_writes | self.pending_reads) for w in writes))

    def _node(self, n) -> None:
        op = n.op
        # a fresh thread index per op: its addressing is not hoisted out of the chunk loop
        self.th = T_.Threads(B.fresh_tid(), self.opts.nthreads, self.opts.load_batch,
                             self.opts.ordered_sums, self.opts.vector_loops)
        if op == "kda.workspace":
            return  # the memref is a kernel parameter (bound in body)
        if op == "kda.pipeline_release":
            return  # synchronisation marker: the step's end synchronises the ring
        if op in ("gpu.yield", "func.return"):
            raise LoweringError(f"unexpected {op}")
        lazy = not (op in STORE_OPS or op in MATRIX_OPS
                    or (n.results and self.plan.mode(n.results[0]) == "buffer"))
        if lazy:
            self.env[n.results[0]] = self.expr(n)
            return
        reads, writes, elementwise = self.accesses(n)
        if not self.opts.elide_barriers or self.hazard(reads, writes):
            self.sync_pending()
        if op in STORE_OPS:
            self.store(n)
        elif op in MATRIX_OPS:
            out = self.bufref(n.results[0])
            self.matrix(n, out)
            self.env[n.results[0]] = out
        else:
            r = n.results[0]
            out = self.bufref(r)
            T_.materialize(self.th, self.expr(n), out)
            self.env[r] = out
        if elementwise and self.opts.elide_barriers:
            self.pending_reads |= reads
            self.pending_writes |= writes
        else:
            self.barrier()

    def init_gate_checks(self, slots: T_.BufRef | None) -> None:
        """Gate checks of the decay products (:meth:`gate_check`): ``slots``, shared words
        that hand a check from a region's first product to the later ones (None: no hand-off,
        every product checks)."""
        self.gate_check_slots = slots
        self.gate_check_slot = {}         # (gate value, S, rows) -> its word, kernel-wide
        self.gates_checked = set()        # keys whose word the current region has written

    def gate_check(self, g: Value, g_ref: T_.Ref, S: int, rows: int):
        """The run-time check of gate ``g``'s diagonal blocks
        (:func:`~kdagen.codegen.lower.tiles.factorable`) once per gate value in each region
        (kernel body, chunk step): the decay products of a kernel mostly share one gate, and
        each check costs a counting barrier. The first product of the region checks and
        leaves the result in its gate's shared word (every op ends at a barrier, so the later
        ones see it); they read it back instead of holding it in registers across the ops
        between (a register more made the backward's dk kernel spill)."""
        key = (g, S, rows)
        slot = self.gate_check_slot.get(key)
        if key in self.gates_checked:
            flag = self.gate_check_slots.read([slot])
            return B.fle(flag, B.f(0.5)), B.fle(B.f(0.5), flag)
        gentle, steep = T_.factorable(self.th, g_ref, S, rows)
        if slot is None and self.gate_check_slots is not None \
                and len(self.gate_check_slot) < GATE_CHECK_SLOTS:
            slot = self.gate_check_slot[key] = len(self.gate_check_slot)
        if slot is not None:
            flag = B.sel(gentle, B.f(0.0), B.f(1.0))           # 1.0: some block is steep
            B.if_then(B.icmp("eq", self.th.tid, 0),
                      lambda: self.gate_check_slots.write([slot], flag))
            self.gates_checked.add(key)
        return gentle, steep

    # -- scans ---------------------------------------------------------------------------
    def scan(self, n) -> None:
        geo = self.geo
        carried = [self.bufref(r) for r in n.results]
        # the initial state: once per CTA, before anything else can run, so its loads go out
        # state_load_batch at a time (a [128, 128] state on 128 threads and 32 at a time: 4
        # rounds, not 16)
        state_th = replace(self.th, batch=max(self.th.batch, self.state_load_batch))
        for i, init in enumerate(n.operands):
            src = self.env[init]
            if not carried[i].same_storage(src):
                T_.materialize(state_th, src, carried[i], source_order=True)
        B.barrier()
        body = n.body
        reverse = bool(n.attrs.get("reverse", False))
        y = body.nodes[-1]

        def step(s, *_, it=None):
            c = (geo.nchunks - 1) - s if reverse else s
            it = s if it is None else it
            # values computed in the step's region don't dominate other regions
            outer_checked, self.gates_checked = self.gates_checked, set()
            self.step_begin(it)
            self.env[body.args[0]] = c
            for a, ref in zip(body.args[1:], carried):
                self.env[a] = ref
            for m in body.nodes[:-1]:
                self.node(m)
            self.sync_pending()
            copied = False
            for i, v in enumerate(y.operands):
                if self.plan.yield_copy.get((n, i)) == "skip":
                    continue
                src = self.env[v]
                if carried[i].same_storage(src):
                    continue
                T_.materialize(self.th, src, carried[i])
                copied = True
            if copied:
                B.barrier()
            self.step_end(it)
            self.step_done(c)
            self.gates_checked = outer_checked
            return []

        if self.group.parallel:
            z = self.coords["z"]

            def one_chunk():
                with self.cost.chunk_step():
                    step(z, it=0)
            B.if_then(B.icmp("lt", z, geo.nchunks), one_chunk)
        else:
            B.for_range(0, geo.nchunks, 1, step, trips=CHUNKS)
        for r, ref in zip(n.results, carried):
            self.env[r] = ref

    # hooks of the chunk loop (the native paths synchronise their load pipelines here);
    # ``it`` is the iteration index (0 in a chunk-parallel kernel)
    def step_begin(self, it) -> None:
        pass

    def step_end(self, it) -> None:
        pass

    def step_done(self, c) -> None:
        """After chunk ``c``'s step, every consumer thread past its last store (the native
        path publishes a chunk-ready flag here, kdagen.codegen.lower.chunk_flags)."""

    # -- expressions ---------------------------------------------------------------------
    def expr(self, n) -> T_.Ref:
        k = n.kind
        ops = [self.env.get(o) for o in n.operands]
        r = n.results[0]
        shape = tuple(r.shape)
        a = n.attrs
        geo = self.geo
        if k == "constant":
            return T_.ConstRef(float(a["value"]), shape)
        if k == "scalar":
            return T_.ScalarRef(ops[0], shape)
        if k in ("add", "sub", "mul", "div"):
            return T_.binary(k, ops[0], ops[1])
        if k in ("neg", "exp2", "log2", "sigmoid", "softplus", "rsqrt"):
            return T_.unary(k, ops[0], a)
        if k in ("assume_range", "pipeline_wait"):
            return ops[0]
        if k == "clamp":
            return T_.clamp(ops[0], float(a["lo"]), float(a["hi"]))
        if k == "in_range":
            return T_.in_range(ops[0], float(a["lo"]), float(a["hi"]))
        if k == "convert":
            return T_.convert(ops[0], n.operands[0].elt, r.elt)
        if k == "select":
            return T_.select(*ops)
        if k == "broadcast":
            return T_.broadcast(ops[0], a["dims"], shape)
        if k == "transpose":
            return T_.transpose(ops[0])
        if k == "extract_row":
            return T_.extract_row(ops[0], int(a["index"]))
        if k == "embed_row":
            return T_.embed_row(ops[0], int(a["index"]), shape)
        if k == "tril":
            return T_.tril(ops[0], int(a["diagonal"]))
        if k == "valid_rows":
            c = ops[0]
            return T_.FnRef(shape, lambda idx: B.sel(
                B.icmp("lt", c * geo.C + idx[0], geo.seqlen), B.f(1.0), B.f(0.0)))
        if k in ("load", "load_state", "load_chunk"):
            ops[0] = self.value_part(n, ops[0])
        if k == "load":
            return self.load_token(n, ops[0], ops[1])
        if k == "load_head":
            mem = ops[0]
            return T_.FnRef(shape, lambda idx: mem.load(geo.hv, idx),
                            vec=lambda idx, n: mem.load_vec(geo.hv, idx, n),
                            vec_ok=mem.vector_ok(T_.VEC))
        if k == "load_state" and len(n.operands) == 2:
            # a pool row: the sequence's slot; a skipped sequence (slot < 0) reads zeros (its
            # loads go to slot 0, which they leave unused)
            mem, slot = ops[0], self.slots[n.operands[1]]
            live = B.icmp("ge", slot, 0)
            row = geo.state_row(B.isel(live, slot, 0))
            return T_.FnRef(shape, lambda idx: B.sel(live, mem.load(row, idx), B.f(0.0)))
        if k == "load_state":
            mem = ops[0]
            return T_.FnRef(shape, lambda idx: mem.load(geo.state_row(), idx),
                            vec=lambda idx, n: mem.load_vec(geo.state_row(), idx, n),
                            vec_ok=mem.vector_ok(T_.VEC))
        if k == "slot_valid":
            live = B.sel(B.icmp("ge", self.slots[n.operands[0]], 0), B.f(1.0), B.f(0.0))
            return T_.ScalarRef(live, shape)
        if k == "load_chunk":
            mem, c = ops
            return T_.FnRef(shape, lambda idx: mem.load(geo.chunk_row(c), idx),
                            vec=lambda idx, n: mem.load_vec(geo.chunk_row(c), idx, n),
                            vec_ok=mem.vector_ok(T_.VEC))
        raise LoweringError(f"{n.op}: no expression lowering")

    def value_part(self, n, mem: MemRef) -> MemRef:
        """``mem`` as memory op ``n`` addresses it: with ``value_parts`` P, the running part's
        V / P columns of the last dim (Geometry.v_part), else all of it."""
        parts = int(n.attrs.get("value_parts", 1))
        if parts == 1:
            return mem
        axis = int(n.attrs.get("value_axis", -1))
        width = mem.tail[axis] // parts
        return replace(mem, col0=self.geo.v_part * width, col_axis=axis, col_step=width)

    def load_token(self, n, mem: MemRef, c) -> T_.Ref:
        geo = self.geo
        C = geo.C
        ratio = self.program.gva_ratio
        grouped = n.attrs.get("head_map") == "grouped" and mem.heads == "qk" and ratio > 1
        shape = tuple(n.results[0].shape)

        def row_of(idx):
            pos = c * C + idx[0]
            valid = B.icmp("lt", pos, geo.seqlen)
            safe = B.isel(valid, pos, c * C)          # row 0 of a chunk is always in range
            head = geo.hv // ratio if grouped else geo.hv
            return valid, geo.token_row(mem, safe, head)

        def read(idx):
            valid, row = row_of(idx)
            return B.sel(valid, mem.load(row, idx[1:]), B.f(0.0))

        def vec(idx, n):
            if len(idx) < 2:                          # [C] per-token values: one per row
                return [read(i) for i in T_.lanes(idx, n)]
            valid, row = row_of(idx)
            return [B.sel(valid, x, B.f(0.0)) for x in mem.load_vec(row, idx[1:], n)]

        return T_.FnRef(shape, read, vec=vec,
                        vec_ok=len(shape) >= 2 and mem.vector_ok(T_.VEC))

    # -- stores --------------------------------------------------------------------------
    def store(self, n) -> None:
        geo = self.geo
        k = n.kind
        mem = self.value_part(n, self.env[n.operands[0]])
        if k == "store":
            c = self.env[n.operands[1]]
            src = self.env[n.operands[2]]

            def write(idx, values):
                pos = c * geo.C + idx[0]
                B.if_then(B.icmp("lt", pos, geo.seqlen), lambda: mem.store_vec(
                    values, geo.token_row(mem, pos, geo.hv), idx[1:]))
            # the tile is read for rows past the sequence end too (they are computed, from
            # zero-masked loads) and only the rows inside it are stored
            self.store_loop(src, write, mem, rows_apart=len(src.shape) >= 2)
        elif k == "store_state" and len(n.operands) == 3:
            # a pool row: the sequence's slot, nothing for a skipped sequence (slot < 0)
            src, slot = self.env[n.operands[1]], self.slots[n.operands[2]]
            row = geo.state_row(slot)
            B.if_then(B.icmp("ge", slot, 0), lambda: self.store_loop(
                src, lambda idx, v: mem.store_vec(v, row, idx), mem))
        elif k == "store_state":
            src = self.env[n.operands[1]]
            self.store_loop(src, lambda idx, v: mem.store_vec(v, geo.state_row(), idx), mem)
        elif k == "store_chunk":
            c = self.env[n.operands[1]]
            src = self.env[n.operands[2]]
            order = self.opts.transposed_store_order
            if mem.transposed and len(src.shape) == 2 and order in ("stored", "stored_vec"):
                # a tile its reader wants transposed: consecutive threads take consecutive
                # stored addresses (the tile is read down its columns), not one 4-byte piece
                # of a different 32-byte sector each
                n = T_.VEC if order == "stored_vec" and T_.vec_ok(src) else 1
                T_.foreach_transposed(self.th, src, lambda idx, v: mem.store(
                    v, geo.chunk_row(c), idx), n)
                return
            self.store_loop(src, lambda idx, v: mem.store_vec(v, geo.chunk_row(c), idx), mem)

    def store_loop(self, src: T_.Ref, write, mem: MemRef, rows_apart: bool = True) -> None:
        """``write(idx, values)`` for groups of :func:`tiles.vector_width` consecutive elements
        of ``src``'s last dim (one vector store each where the memory allows; 1 element where
        the shape does not split so). ``rows_apart``: False where the first dim is the token
        dim of a per-token value (``write`` tests each token), which then stays 1 wide."""
        n = (T_.vector_width(self.th, src.shape, src, mem.vector_ok(T_.VEC)) if rows_apart
             else 1)
        T_.foreach_vec_batched(self.th, src.shape, n, lambda idx: T_.read_vec(src, idx, n),
                               write)

    # -- matrix ops ----------------------------------------------------------------------
    def product_precision(self, n) -> str:
        """The operand precision of matrix op ``n`` under the lowering's ``dot``
        (options.product_precision: its ``kda.precision`` for "auto")."""
        return product_precision(self.opts.dot, n.op, n.attrs.get("kda.precision"))

    def _row_gates(self, n):
        """(gamma_lhs, gamma_rhs) as [C] Refs when both gates of decay product ``n`` are a
        broadcast of one value per row (`row_gate_sources`), else None."""
        sources = row_gate_sources(n)
        return None if sources is None else tuple(self.env[g] for g in sources)

    def matrix(self, n, out: T_.BufRef) -> None:
        k = n.kind
        ops = [self.env.get(o) for o in n.operands]
        a = n.attrs
        th = self.th
        dot = self.product_precision(n)
        mma = dot in T_.MMA_PRECISIONS
        if k == "dot":
            lhs, rhs = ops
            if a.get("transpose_lhs"):
                lhs = T_.transpose(lhs)
            if a.get("transpose_rhs"):
                rhs = T_.transpose(rhs)
            if mma and T_.mma_supported(out.shape[0], out.shape[1], lhs.shape[1]):
                T_.emit_dot_mma(th, out, lhs, rhs, dot)
            else:
                T_.emit_dot(th, out, lhs, rhs)
        elif k in ("decay_dot", "decay_matmul") and (gates := self._row_gates(n)) is not None:
            gl, gr = gates
            if k == "decay_dot":
                T_.emit_decay_dot_row_gates(th, out, ops[0], ops[1], gl, gr, int(a["diagonal"]),
                                            a.get("clamp_min"), dot)
            else:
                T_.emit_decay_matmul_row_gates(th, out, ops[0], ops[1], gl, gr,
                                               int(a["diagonal"]), bool(a.get("transpose")),
                                               a.get("clamp_min"), dot)
        elif k in ("decay_dot", "decay_matmul"):
            S = int(a.get("subblock", 1))
            diagonal = int(a["diagonal"])
            # the contraction length: d for decay_dot, the chunk's rows for decay_matmul
            R = ops[0].shape[1] if k == "decay_dot" else ops[0].shape[0]
            mma = mma and T_.mma_supported(out.shape[0], out.shape[1], R)
            exact = bool(a.get("exact_diagonal")) and T_.exact_diagonal_supported(
                S, out.shape[0] if k == "decay_dot" else ops[0].shape[0], th.count, diagonal,
                n.operands[2] is n.operands[3]) and out.shape[0] == ops[0].shape[0] == (
                out.shape[1] if k == "decay_dot" else ops[0].shape[1])   # square [C, C] blocks
            gate_check = (self.gate_check(n.operands[2], ops[2], S, ops[0].shape[0])
                          if mma and exact else None)
            if k == "decay_dot" and mma and exact:
                T_.emit_decay_dot_mma_exact_diagonal(th, out, ops[0], ops[1], ops[2], diagonal,
                                                     a.get("clamp_min"), S, dot,
                                                     gate_check=gate_check)
            elif k == "decay_dot" and mma and not a.get("exact_diagonal") and S >= 16 and S % 16 == 0:
                T_.emit_decay_dot_mma(th, out, *ops, diagonal, a.get("clamp_min"), S,
                                      dot)
            elif k == "decay_dot":
                T_.emit_decay_dot(th, out, *ops, diagonal, a.get("clamp_min"))
            elif mma and exact:
                T_.emit_decay_matmul_mma_exact_diagonal(th, out, ops[0], ops[1], ops[2], diagonal,
                                                        bool(a.get("transpose")),
                                                        a.get("clamp_min"), S, dot,
                                                        gate_check=gate_check)
            else:
                T_.emit_decay_matmul(th, out, *ops, diagonal, bool(a.get("transpose")),
                                     a.get("clamp_min"))
        elif k == "cumsum":
            T_.emit_cumsum(th, out, ops[0], bool(a.get("reverse")))
        elif k == "reduce_sum":
            T_.emit_reduce_sum(th, out, ops[0], a["dims"], self.red)
        elif k == "tril_inv":
            T_.emit_tril_inv(th, out, ops[0], blocked=self.opts.tril_inv != "columns",
                             precision=dot if self.opts.tril_inv == "blocked" else "fma")
        elif k == "tril_solve":
            T_.emit_tril_solve(th, out, ops[0], ops[1])
        elif k == "sum_chunks":
            mem = ops[0]
            geo = self.geo

            def one(idx):
                def step(c, acc):
                    return [B.add(acc, mem.load(geo.chunk_row(c), idx))]
                (acc,) = B.for_range(0, geo.nchunks, 1, step, [B.f(0.0)])
                out.write(idx, acc)
            T_.foreach(th, out.shape, one)
        else:
            raise LoweringError(f"{n.op}: no matrix lowering")


# ------------------------------------------------------------------------------------------
# global kernels
# ------------------------------------------------------------------------------------------


class SharedMemoryKernelEmitter(TileKernelEmitter):
    """The calling convention of a kernel on a register path (register scan, register tiles):
    its tiles live in registers and a TMA-filled shared region, ``self.rplan`` sizes both
    (``smem_bytes``, ``block_threads``, ``tensor_maps()``), and every tensor map it reads is a
    parameter; no global scratch."""

    rplan = None

    @property
    def uses_smem(self) -> bool:
        return True

    @property
    def uses_global(self) -> bool:
        return False

    @property
    def scratch_bytes(self) -> int:
        return 0

    @property
    def smem_bytes(self) -> int:
        return self.rplan.smem_bytes

    @property
    def block_threads(self) -> int:
        return self.rplan.block_threads

    def params(self):
        from .options import tensormap_param_kind
        ps = super().params()
        names = {p.name for p in ps}
        for param in self.rplan.tensor_maps():
            if param not in names:
                ps.append(Param(param, tensormap_param_kind(self.opts)))
                names.add(param)
        return ps


class GlobalKernelEmitter:
    """kda.sum_head_groups / kda.sum_seqs: one thread per destination element."""

    def __init__(self, program: Program, node, block: int):
        self.program = program
        self.node = node
        self.block = block
        src_v, dst_v = node.operands
        self.src_info = mem_info(src_v)
        self.dst_info = mem_info(dst_v)
        self.cost = NullCounter()

    def params(self) -> list[Param]:
        s, d = self.src_info, self.dst_info
        return [Param(s[0], "ptr", s[1]), Param(d[0], "ptr", d[1]),
                Param("T", "i32"), Param("N", "i32"), Param("HV", "i32")]

    def launch(self) -> dict:
        inner = T_.numel(self.dst_info[4])
        size = (f"tokens * H * {inner}" if self.node.op == "kda.sum_head_groups"
                else f"HV * {inner}")
        return {"grid": [f"ceil_div({size}, {self.block})", "1", "1"],
                "block": [self.block, 1, 1], "dynamic_shared_memory": 0}

    def emit_mlir(self, builder: GpuModuleBuilder, name: str, count_cost: bool = True) -> None:
        from kdagen.codegen.common.ints import IntVal
        from kdagen.codegen.common.sreg import block_idx, thread_idx
        self.cost = CostCounter() if count_cost else NullCounter()
        with builder.kernel(name, self.params(), (self.block, 1, 1)) as p:
            with B.use(MlirBackend(cost=self.cost)):
                p = {k: (IntVal(v) if k in ("T", "N", "HV") else v) for k, v in p.items()}
                self.body(p, dict(tid=IntVal(thread_idx("x")), bx=IntVal(block_idx("x"))))

    def body(self, p: dict, coords: dict) -> None:
        s_name, s_elt, s_layout, s_heads, s_tail = self.src_info
        d_name, d_elt, d_layout, d_heads, d_tail = self.dst_info
        src = MemRef(s_name, p[s_name], s_elt, s_layout, s_heads, s_tail)
        dst = MemRef(d_name, p[d_name], d_elt, d_layout, d_heads, d_tail)
        inner = T_.numel(d_tail)
        ratio = self.program.gva_ratio
        e = B.wide(coords["bx"] * self.block + coords["tid"])
        HV, N, T = p["HV"], p["N"], p["T"]
        if self.node.op == "kda.sum_head_groups":
            H = HV // ratio if ratio > 1 else HV
            tokens = T if self.program.varlen else N * T
            total = B.wide(tokens) * B.wide(H) * inner

            def body():
                # e = (token * H + h) * inner + d; the token's value heads h*ratio .. +ratio-1
                acc = B.f(0.0)
                th, d = _divmod64(e, inner)
                t, h = _divmod64(th, H)
                for g in range(ratio):
                    row = t * B.wide(HV) + (h * ratio + g)
                    acc = B.add(acc, B.load(src.ptr, row * inner + d, s_elt))
                B.store(dst.ptr, e, acc, d_elt)
            B.if_then(B.icmp("lt", e, total), body)
        elif self.node.op == "kda.sum_seqs":
            total = B.wide(HV) * inner

            def body():
                def step(m, acc):
                    return [B.add(acc, B.load(src.ptr, B.wide(m) * total + e, s_elt))]
                (acc,) = B.for_range(0, N, 1, step, [B.f(0.0)])
                B.store(dst.ptr, e, acc, d_elt)
            B.if_then(B.icmp("lt", e, total), body)
        else:  # pragma: no cover
            raise LoweringError(self.node.op)


def _divmod64(x, d):
    """(x // d, x % d) of non-negative 64-bit int-likes (d an int or int-like)."""
    be = B.current()
    if be.name == "sim":
        return x // d, x % d
    from kdagen._mlir import arith
    xv = W64._v(x)
    dv = W64._v(d if not isinstance(d, int) else d)
    return W64(arith.divsi(xv, dv)), W64(arith.remsi(xv, dv))


