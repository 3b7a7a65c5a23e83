"""sm_90a register-resident lowering of a serial scan (kda-partition's state kernels).

The carried state S [K, V] never leaves registers: each consumer warpgroup owns 64 of its value
columns and holds Sᵀ (its V-block as the wgmma M dimension) as a wgmma f32 accumulator across
chunks. Every [R, V] tile of the step lives the same way, as an accumulator fragment of
``AccLayout(64, R)`` whose column n holds row ``interleave8(n)`` of the tile
(`kdagen.codegen.common.layouts.interleave8`). A product ``dot(L, X)`` with X such a fragment
is computed transposed, ``(L·X)ᵀ = Xᵀ·Lᵀ``: A = Xᵀ straight from X's registers (rounded to TF32
by `tf32_operand_bits`, one integer add), B = L from the TMA ring, K-major as TF32 requires, its
rows loaded through the ``interleave8_rows`` tensor-map view so the result again has the
interleaved column order — no register ever moves between warps and no tile passes through shared memory. ``add(X, dot)``
accumulates the product onto X (wgmma's own accumulate); other elementwise ops run on the
registers; ring tiles read element-wise (u, the decay vector) are read from shared memory at
the fragment's coordinates; checkpoints are stored from registers.

bf16x3 scans (every product of the kernel kda-assign-precision gives bf16x3: KDA's backward,
docs/MATH.md §3) hold their tiles in natural column order instead (column n = row n: a 16-bit
A fragment pairs accumulator columns 2t and 2t + 1), read B as bf16 hi and lo tiles its writer
stored in the bytes of one f32 tile (``RingSlot.parts``, ``MemRef.split``; no tensor-map view)
and issue three m64nNk16 products per 16-deep block.

Roles: ``warpgroups`` consumer warpgroups (threads 0 .. 128·wg − 1) and one producer warpgroup
whose elected thread fills a ring of ``depth`` stages with TMA (one 'full' mbarrier with the
stage's byte count, one 'empty' mbarrier every consumer thread arrives on once its reads of the
stage are done). No named barrier is needed inside the step: registers carry every hand-off.

Measured on the H200 (kda B1_T8k_H16; bench/results/h200_ncu_hotspots_kda_bwd_k3.txt): the
backward's reverse step reads 121 KB a step, so its ring has one stage (two do not fit with the
checkpoint's staging tile), and 37% of its warp samples wait at the step's 'full' barrier: each
stage is refilled only after the whole step frees it, at ~92 GB/s into one SM. A barrier pair
per tile, each freed after its last read and given a second stage where it fits, was slower
(3.72 -> 4.29 us per reverse step, 1.73 -> 2.10 per forward step;
h200_per_slot_ring_ablation_kda.log): the waits inside the step cost more than the overlap won.

Workspace contract: a tile read as the transposed left operand of a product (``kr`` in
``krᵀ·v'``) is stored transposed by the kernel that writes it, and a tile read only as a wgmma
B operand is stored already rounded to TF32 (``MemRef.transposed`` / ``MemRef.round``;
`workspace_storage` says which, `kernel.prepare` applies it to every kernel of the program).

`match` decides whether a kernel fits (else the tile lowering of sm90_native.py takes it) and
says why not.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kdagen._mlir import llvm, nvvm
from kdagen.runtime.tensormap import ELEM_BYTES
from kdagen.target import Target

from ..common import barrier as bar
from ..common import smem as smem_mod
from ..common.convert import bf16_split_pack, tf32_operand_bits, tf32_split_operand_bits
from ..common.shuffle import shfl_idx
from ..common.ints import IntVal, ival
from ..common.kernel import Param
from ..common.launch import set_launch_bounds
from ..common.layouts import (SmemLayout, acc_reg_for_tf32_a, acc_regs_for_half_a, lane_group,
                              lane_in_group)
from ..common.smem import byte_gep, shared_addr32, shared_ptr_type
from ..common.sreg import block_idx, thread_idx
from ..sm90 import flags, regalloc, tma, wgmma
from . import backend as B
from .chunk_flags import FLAGS_PARAM
from .cost import CHUNKS, CostCounter, NullCounter
from .emitter import Geometry, SharedMemoryKernelEmitter, mem_info
from .mlir_backend import MlirBackend
from .options import product_precision
from .plan import LoweringError

PATH_NAME = "sm90-register-scan"
WG_THREADS = 128
V_BLOCK = 64                 # value columns per consumer warpgroup (the wgmma M extent)
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232
SWIZZLE = 128
TF32_K = 8
BF16_K = 16
#: the products' precisions this path lowers, one per kernel: "tf32" (one m64nNk8 per 8-deep
#: block, the tile's columns interleaved) or "bf16x3" (A and B split into bf16 hi and lo
#: parts, three m64nNk16 per 16-deep block, natural column order)
SCAN_PRECISIONS = ("tf32", "bf16x3")
MAX_WARPGROUPS = 2
SMEM_LIMIT = 227 * 1024
EXCHANGE_BARRIER = 1         # named barrier of a K-split scan's partial-sum exchange
STAGING_BARRIER = 2          # named barrier of the checkpoint staging tile (TMA stores)
COLUMN_SUM_CHAINS = 4        # independent add chains of a column sum (`_column_sums`)

_RING_LOADS = ("kda.load", "kda.load_chunk")
_PASS_THROUGH = ("kda.pipeline_wait", "kda.convert", "kda.assume_range")
_ELEMENTWISE = ("kda.add", "kda.sub", "kda.mul", "kda.neg")
#: ops on column vectors ([V]: one value per value column, `ColumnVector`)
_VECTOR_OPS = _ELEMENTWISE + ("kda.rsqrt",)


@dataclass
class RingSlot:
    """One producer load of a chunk: its tile in each ring stage and its TMA boxes."""
    node: object
    mem: object                  # the memref value (argument or workspace) it reads
    tensor: str
    elt: str
    kind: str                    # "token" | "chunk"
    shape: tuple                 # logical tile shape
    heads: str | None
    operand: bool = False        # read as a wgmma B operand (K-major)
    transposed: bool = False     # stored transposed by its writer (operand of a transposed dot)
    offset: int = 0
    v_cols: int = 0              # [R, V] tile read element-wise: the CTA loads only its V columns
    # operands: 1 = one TF32 tile, rows loaded through the interleave8_rows view; 2 = a bf16x3
    # operand stored by its writer as bf16 hi and lo tiles in the bytes of one f32 tile
    # (MemRef.split), rows in natural order
    parts: int = 1

    @property
    def smem_elt(self) -> str:
        return "bf16" if self.parts == 2 else self.elt

    @property
    def cols_loaded(self) -> int:
        return self.v_cols or self.smem_shape[-1]

    @property
    def smem_shape(self) -> tuple:
        """[rows, cols] as it sits in shared memory (stored order)."""
        return tuple(reversed(self.shape)) if self.transposed else tuple(self.shape)

    @property
    def layout(self) -> SmemLayout | None:
        """Operands: 128B-swizzled panels (what a K-major descriptor reads). Tiles read
        element-wise: plain rows, so a lane's addresses are one base plus constants."""
        if len(self.shape) != 2:
            return None
        rows, _ = self.smem_shape
        return SmemLayout(rows, self.cols_loaded, ELEM_BYTES[self.smem_elt],
                          SWIZZLE if self.operand else 0)

    @property
    def part_bytes(self) -> int:
        """Bytes of one part (the hi or lo tile of a bf16x3 operand; else the whole tile)."""
        if len(self.shape) == 1:
            return ELEM_BYTES[self.elt] * self.shape[0]
        return self.layout.size_bytes

    @property
    def nbytes(self) -> int:
        return self.parts * self.part_bytes

    @property
    def panel_cols(self) -> int:
        return self.layout.panel_cols if self.layout is not None else self.shape[-1]

    @property
    def param(self) -> str:
        return f"{self.tensor}_tmap" + ("_b" if self.operand else "")

    def box(self) -> tuple:
        """TMA box (torch order, after flattening) of one panel."""
        if len(self.shape) == 1:
            return (1, self.shape[0])
        rows = self.smem_shape[0]
        if self.kind == "token":
            return (rows, 1, self.panel_cols)
        return (1, rows, self.panel_cols)

    def tensor_map(self) -> dict:
        spec = {"tensor": self.tensor, "dtype": self.smem_elt, "flatten": 2,
                "box": list(self.box()), "swizzle": SWIZZLE if self.operand else 0}
        if self.operand and self.parts == 1:
            spec["view"] = "interleave8_rows"
        if self.parts != 1:
            spec["parts"] = self.parts
        if self.transposed:
            spec["transposed"] = True        # the writer stored the [rows, cols] tiles transposed
        return spec


@dataclass
class StoreSlot:
    """A per-chunk checkpoint of the carried value stored by TMA: the consumers write their
    registers into a 128B-swizzled staging tile (the CTA's value columns, one panel per 32),
    one thread copies it to global memory asynchronously. Plain per-thread global stores of
    the state fill the LSU queue at the start of every step (measured on the H200: 0.79 of
    2.41 us per forward step); shared stores cost a fraction of that and the copy overlaps
    the step's products."""
    node: object
    mem: object
    tensor: str
    rows: int                    # K
    cols: int                    # the CTA's value columns
    offset: int = 0              # byte offset of the staging tile in shared memory
    elt: str = "f32"             # the checkpoint's element type (f16: converted when staged)

    @property
    def layout(self) -> SmemLayout:
        return SmemLayout(self.rows, self.cols, ELEM_BYTES[self.elt], SWIZZLE)

    @property
    def nbytes(self) -> int:
        return self.layout.size_bytes

    @property
    def param(self) -> str:
        return f"{self.tensor}_tmap_st"

    def tensor_map(self) -> dict:
        return {"tensor": self.tensor, "dtype": self.elt, "flatten": 2,
                "box": [1, self.rows, self.layout.panel_cols], "swizzle": SWIZZLE}


@dataclass
class RegisterScanPlan:
    scan: object
    K: int                       # rows of the carried state
    V: int
    warpgroups: int              # value blocks per CTA, 64 value columns each
    v_ctas: int = 1              # CTAs per value head, each owning warpgroups·64 columns
    slots: list = field(default_factory=list)
    depth: int = 1
    stage_bytes: int = 0
    # K split: k_split warpgroups share one value block, each owning K / k_split rows of the
    # state (see `_plan_k_split`); 1 = one warpgroup holds all K rows
    k_split: int = 1
    split_values: set = field(default_factory=set)    # tiles held as K / k_split row slices
    exchanges: dict = field(default_factory=dict)     # partial product -> slot it meets in
    stores: list = field(default_factory=list)        # checkpoints stored by TMA (StoreSlot)
    # K split: the column sums of state slices (a column scale's norms) a step adds over the
    # warpgroups, and where their partials meet in shared memory (`column_exchange_bytes`)
    column_exchanges: int = 0
    column_exchange_offset: int = 0
    precision: str = "tf32"      # of every product (SCAN_PRECISIONS)
    # a one-stage ring with a full and an empty barrier per slot, not per stage: each slot is
    # refilled for the next chunk as soon as this step's last read of it completes, so the
    # refill overlaps the rest of the step (`RegisterScanEmitter._release_slots`)
    slot_barriers: bool = False
    # the lowering options of this kernel: the caller's with the tuning table's entries for
    # it applied (kernel._register_scan_plans)
    options: object = None
    tuned: dict = field(default_factory=dict)    # the entries applied: {option: value}

    @property
    def natural_order(self) -> bool:
        """Whether accumulator column n holds tile row n (bf16x3: a 16-bit A fragment pairs
        columns 2t and 2t + 1, which the accumulator holds), not row interleave8(n) (TF32)."""
        return self.precision == "bf16x3"

    @property
    def consumer_warpgroups(self) -> int:
        return self.warpgroups * self.k_split

    @property
    def ring_bytes(self) -> int:
        return self.depth * self.stage_bytes

    @property
    def barrier_offset(self) -> int:
        return self.ring_bytes

    @property
    def barrier_pairs(self) -> int:
        """Full/empty mbarrier pairs: one per ring stage, or one per slot."""
        return len(self.slots) if self.slot_barriers else self.depth

    @property
    def column_exchange_bytes(self) -> int:
        """Each warpgroup's partial column sums, per sum, in two buffers (step parity: a
        warpgroup writing the next step's partials never meets one still reading these)."""
        return 2 * self.column_exchanges * self.k_split * V_BLOCK * 4

    @property
    def smem_bytes(self) -> int:
        end = self.ring_bytes + 16 * self.barrier_pairs
        for st in self.stores:
            end = max(end, st.offset + st.nbytes)
        if self.column_exchanges:
            end = max(end, self.column_exchange_offset + self.column_exchange_bytes)
        return end

    @property
    def stage_bytes_tx(self) -> int:
        return sum(s.nbytes for s in self.slots)

    @property
    def block_threads(self) -> int:
        return (self.consumer_warpgroups + 1) * WG_THREADS

    @property
    def grid(self) -> list:
        return ["HV" if self.v_ctas == 1 else f"HV * {self.v_ctas}", "N", "1"]

    def carry(self, group) -> dict:
        """The carried state's endpoints as program arguments, for a runtime that runs the
        scan over segments of a sequence (kdagen.runtime.segments): ``init`` the state-layout
        input it starts from (None: a constant), ``final`` the state-layout output it ends in
        (None: not stored), ``reverse`` whether it walks the chunks backwards."""
        init_value = self.scan.operands[0] if self.scan.operands else None
        owner = init_value.owner if init_value is not None else None
        init = None
        if owner is not None and owner.op == "kda.load_state" and owner.operands[0].arg:
            init = owner.operands[0].arg.name
        final = None
        after = False
        for n in group.nodes:
            if n is self.scan:
                after = True
            elif after and n.op == "kda.store_state" and n.operands[0].arg:
                final = n.operands[0].arg.name
        return {"init": init, "final": final, "reverse": bool(self.scan.attrs.get("reverse"))}

    def tensor_maps(self) -> dict:
        maps = {s.param: s.tensor_map() for s in self.slots}
        maps.update({st.param: st.tensor_map() for st in self.stores})
        return maps

    def workspace_storage(self) -> dict:
        """{workspace value: MemRef storage fields} its writer must use. Keyed by the value, not
        the name: the backward's two chunk kernels write workspaces of the same name (one buffer,
        used in turn) for two scans that want different layouts."""
        out = {}
        for s in self.slots:
            if s.kind == "chunk" and (s.transposed or s.operand):
                if s.parts == 2:
                    out[s.mem] = {"transposed": s.transposed, "round": None,
                                  "split": "bf16_hi_lo"}
                else:
                    out[s.mem] = {"transposed": s.transposed,
                                  "round": "tf32" if s.operand else None}
        return out


def slice_start(layout: SmemLayout, kind: str, part, extent: int):
    """Byte offset in a K-major wgmma B tile at which warpgroup ``part`` of a K-split scan
    starts: ``kind`` "k", its slice of ``extent`` K rows (whole swizzle panels, `_plan_k_split`
    checks); "n", its ``extent`` N rows (one swizzle row each). ``part`` may be an `IntVal`."""
    if kind == "k":
        return part * ((extent // layout.panel_cols) * layout.panel_bytes)
    if kind == "n":
        return part * (extent * layout.swizzle)
    raise ValueError(f"slice kind {kind!r}: 'k' or 'n'")


_DECLARATIONS = ("kda.load", "kda.load_chunk", "kda.pipeline_wait", "kda.pipeline_release",
                 "kda.convert", "kda.assume_range", "kda.broadcast", "kda.constant")


def sole_add(n) -> tuple:
    """(add, y): the only user of product ``n``'s result when it is a ``kda.add``, and that
    add's other operand (what the product may accumulate onto; None when it adds the product
    to itself); (None, None) otherwise."""
    users = [u for u, _ in n.results[0].uses]
    if len(users) != 1 or users[0].op != "kda.add":
        return None, None
    other = [o for o in users[0].operands if o is not n.results[0]]
    return users[0], (other[0] if other else None)


def schedule_step(nodes: list, carried, skip=()) -> list:
    """The emission order of a scan step's nodes (``skip``: already emitted), a list schedule
    that issues each product as early as its operands allow, so independent products overlap
    and waits come late:

    1. declarations (ring reads, broadcasts: they emit nothing);
    2. element-wise ops reading only the carried value and declarations, before any product
       (after one is issued they would read registers a wgmma of the previous step wrote while
       one is in flight, and ptxas serialises: C7517);
    3. then, repeatedly, the first node in program order that waits for no in-flight product
       — a product whose right operand is ready (its accumulator may be an in-flight product:
       wgmma chains them), an add fused into a product, element-wise ops and stores of ready
       values — else the first node that does wait; a product whose fused add reads an
       element-wise value not yet emitted gets that value emitted first.
    """
    done = set(skip)
    order = [n for n in nodes if n.op in _DECLARATIONS and n not in done]
    done.update(order)
    producer = {r: n for n in nodes for r in n.results}
    regs = {carried} | {r for n in nodes if n.op in ("kda.dot", *_ELEMENTWISE) for r in n.results}
    fused = {}              # add fused into the product that feeds it -> that product
    for n in nodes:
        if n.op == "kda.dot":
            add, y = sole_add(n)
            if y is not None and y in regs:
                fused[add] = n
    fused_products = set(fused.values())     # products an add is fused into
    in_flight = {}          # value held by an issued, unwaited product -> its issue number
    uses = {}
    for n in nodes:
        for o in n.operands:
            uses[o] = uses.get(o, 0) + 1

    def computed(o):
        """Whether value ``o`` is available: its producer emitted, and for a declaration (a
        broadcast emits nothing: its users read its source) its operands as well."""
        p = producer.get(o)
        if p is None:
            return True
        if p.op in _DECLARATIONS:
            return all(computed(x) for x in p.operands)
        return p in done

    def ready(n):
        return all(computed(o) for o in n.operands)

    def awaited(n):
        """The in-flight values ``n`` must wait for."""
        if n in fused:
            return []
        if n.op == "kda.dot":
            out = [n.operands[1]] if n.operands[1] in in_flight else []
            if n in fused_products:  # its accumulator: chained if the only use, else waited
                y = sole_add(n)[1]
                if y in in_flight and uses.get(y, 0) > 1:
                    out.append(y)
            return out
        return [o for o in n.operands if o in in_flight]

    def emit(n):
        wait = awaited(n)
        order.append(n)
        done.add(n)
        if wait:                    # products complete in issue order
            last = max(in_flight[v] for v in wait)
            for v in [v for v, i in in_flight.items() if i <= last]:
                del in_flight[v]
        if n.op == "kda.dot" or n in fused:
            for r in n.results:
                in_flight[r] = len(order)

    first = [n for n in nodes if n not in done and n.op in _ELEMENTWISE
             and all(o is carried or computed(o) for o in n.operands)
             and carried in n.operands]
    for n in first:
        emit(n)

    def fused_operand(n):
        """The not yet emitted, ready producer of the value product ``n`` accumulates onto:
        the emitter fuses the add only when that value exists when the product issues (else
        the add waits for the product, and the next product issues after that wait)."""
        if n not in fused_products:
            return None
        p = producer.get(sole_add(n)[1])
        return p if p is not None and p not in done and ready(p) and not awaited(p) else None

    while True:
        rest = [n for n in nodes if n not in done and ready(n)]
        if not rest:
            break
        free = [n for n in rest if not awaited(n)]
        pick = free[0] if free else rest[0]
        emit(fused_operand(pick) or pick)
    left = [n for n in nodes if n not in done]
    if left:
        raise LoweringError(f"register scan: cannot order {[n.op for n in left]}")
    return order


class NoMatch(Exception):
    """Why a kernel does not fit the register-resident scan."""


def stores_carried(n, carried) -> bool:
    """Whether store node ``n`` stores a checkpoint of the carried value: the value as it is,
    converted (kda-narrow-checkpoints{dtype=fp16}: the state at chunk start in f16), or
    computed from it alone (its column scale: the state divided by its column norms, and
    the norms), so that it can be stored before the step issues a product."""
    reaches, stack, seen = False, [n.operands[2]], set()
    while stack:
        v = stack.pop()
        if v is carried:
            reaches = True
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        o = v.owner
        if o is None or o.op in _RING_LOADS or o.op == "kda.dot":
            return False
        if o.op == "kda.constant":
            continue
        if o.op not in _VECTOR_OPS + ("kda.convert", "kda.broadcast", "kda.reduce_sum"):
            return False
        stack.extend(o.operands)
    return reaches


def _summed_product(v) -> bool:
    """Whether ``v`` is a product of tiles read only by a column sum (`RegisterScanEmitter.
    _column_sums` takes its factors as FMAs; it is never made)."""
    o = v.owner
    return (o is not None and o.op == "kda.mul" and len(v.shape) == 2 and len(v.uses) == 1
            and v.uses[0][0].op == "kda.reduce_sum")


def _apply(op: str, operands: list) -> list:
    """An element-wise op (`_ELEMENTWISE`) over lists of its operands' register values."""
    if op == "kda.neg":
        return [B.neg(a) for a in operands[0]]
    f = {"kda.add": B.add, "kda.sub": B.sub, "kda.mul": B.mul}[op]
    return [f(a, b) for a, b in zip(*operands)]


def column_sum_source(n, frag: set):
    """The register tile a ``kda.reduce_sum`` node ``n`` sums over its rows (dims [0]: one sum
    per value column), else None."""
    src = n.operands[0]
    if list(n.attrs.get("dims", ())) != [0] or src not in frag or len(src.shape) != 2:
        return None
    return src


def _source(v):
    """The ring load or carried argument behind pass-through ops."""
    while v.owner is not None and v.owner.op in _PASS_THROUGH:
        v = v.owner.operands[0]
    return v


def match(program, group, target: Target | None, smem_limit: int = SMEM_LIMIT,
          warpgroups: int = 1, k_split: int = 1, tma_stores: bool = True,
          dot: str = "auto", slot_barriers: bool = False) -> RegisterScanPlan:
    """The plan of ``group`` on this path; raises `NoMatch` with the reason when it does not fit.
    ``warpgroups``: value blocks per CTA, one consumer warpgroup each (the value columns are
    split over V / (64·warpgroups) CTAs per head). ``k_split``: consumer warpgroups sharing one
    value block, each owning K / k_split state rows (`_plan_k_split`; taken where the scan
    allows it, else 1). ``tma_stores``: checkpoints of the carried value go through a shared
    staging tile and TMA stores (`StoreSlot`) where it fits. ``dot``: the lowering's product
    precision option (`options.product_precision`); the scan's products must agree on one of
    :data:`SCAN_PRECISIONS`. ``slot_barriers``: a one-stage ring (what does not fit twice) takes
    a barrier pair per slot (`RegisterScanPlan.slot_barriers`; not with a K split, whose
    partial sums go through ring tiles)."""
    if target is None or not all(getattr(target, c) for c in ("has_wgmma", "has_tma", "has_setmaxnreg")):
        raise NoMatch("the chip lacks wgmma, TMA or setmaxnreg")
    if group.kind != "tile" or group.parallel or len(group.scans) != 1:
        raise NoMatch("not a kernel of one serial scan")
    if program.value_split > 1:
        raise NoMatch("a program split over its value columns (value_split)")
    scan = group.scans[0]
    outside = [n for n in group.nodes if n is not scan]
    for n in outside:
        if n.op not in ("kda.workspace", "kda.load_state", "kda.store_state", "kda.scalar",
                        "kda.constant"):
            raise NoMatch(f"{n.op} outside the scan")
        if any(o.kind == "memref" and o.arg is not None and o.arg.layout == "slots"
               for o in n.operands):
            raise NoMatch(f"{n.op} of a state pool (rows chosen by a slot table)")
    if len(scan.results) != 1:
        raise NoMatch("the scan carries more than one value")
    carried = scan.body.args[1]
    if len(carried.shape) != 2 or carried.elt != "f32":
        raise NoMatch("the carried value is not an f32 matrix")
    K, V = carried.shape
    if V % V_BLOCK or V // V_BLOCK > MAX_WARPGROUPS or K % 8 or K > 256:
        raise NoMatch(f"carried shape [{K}, {V}] (needs V a multiple of 64 up to "
                      f"{MAX_WARPGROUPS * V_BLOCK}, K a multiple of 8 up to 256)")
    blocks = V // V_BLOCK
    wgs = max(1, min(warpgroups, blocks))
    if blocks % wgs:
        raise NoMatch(f"{blocks} value blocks do not split over {wgs} warpgroups")
    plan = RegisterScanPlan(scan, K, V, wgs, blocks // wgs)
    slots: dict = {}
    frag = {carried}
    columns = set()         # [V] column vectors (`ColumnVector`)
    precisions = set()

    def slot_of(v, operand=False, transposed=False):
        src = _source(v)
        n = src.owner
        if n is None or n.op not in _RING_LOADS or n.attrs.get("kda.role") != "producer":
            raise NoMatch(f"{v} is neither a register tile nor a ring load")
        name, elt, layout, heads, tail = mem_info(n.operands[0])
        kind = "token" if n.op == "kda.load" else "chunk"
        if (kind == "token") != (layout == "token") or elt not in ELEM_BYTES:
            raise NoMatch(f"{name}: a load TMA cannot express")
        if operand and (kind != "chunk" or elt != "f32"):
            raise NoMatch(f"{name}: a wgmma B operand must be an f32 workspace tile")
        s = slots.get(n)
        if s is None:
            s = slots[n] = RingSlot(n, n.operands[0], name, elt, kind, tuple(src.shape), heads)
        if s.operand and (operand or s.transposed) and (s.transposed != transposed):
            raise NoMatch(f"{name} is read both transposed and not")
        if operand:
            s.operand, s.transposed = True, transposed
        elif s.operand:
            raise NoMatch(f"{name} is read both as an operand and element-wise")
        return s

    for n in scan.body.nodes:
        op = n.op
        if op in _RING_LOADS:
            continue
        if op in ("kda.pipeline_release", "gpu.yield"):
            continue
        if op in _PASS_THROUGH:
            if n.operands[0] in frag:
                frag.add(n.results[0])
            continue
        if op == "kda.dot":
            lhs, rhs = n.operands
            if n.attrs.get("transpose_rhs") or rhs not in frag:
                raise NoMatch("a product whose right operand is not a register tile")
            M = n.results[0].shape[0]
            Kd = rhs.shape[0]
            chosen = product_precision(dot, "kda.dot", n.attrs.get("kda.precision"))
            # more precise than TF32 (fp32 FMA, tf32x3): bf16x3, as the native chunk kernels
            # stage them (sm90_native.wgmma_precision)
            precisions.add("bf16x3" if chosen in ("fma", "tf32x3") else chosen)
            if M % 8 or M > 256 or Kd % TF32_K:
                raise NoMatch(f"product shape [{M}, {Kd}]")
            slot_of(lhs, operand=True, transposed=bool(n.attrs.get("transpose_lhs")))
            frag.add(n.results[0])
            continue
        if op == "kda.reduce_sum":
            if column_sum_source(n, frag) is None:
                raise NoMatch("a reduction that is not a column sum of a register tile")
            columns.add(n.results[0])
            continue
        if op in _VECTOR_OPS and list(n.results[0].shape) == [V]:
            for o in n.operands:
                if o not in columns and (o.owner is None or o.owner.op != "kda.constant"):
                    raise NoMatch(f"{op} of a [V] vector that is not a column vector")
            columns.add(n.results[0])
            continue
        if op in _ELEMENTWISE:
            if len(n.results[0].shape) != 2 or n.results[0].shape[1] != V:
                raise NoMatch(f"{op} on a tile that is not [R, V]")
            for o in n.operands:
                if o not in frag:
                    _elementwise_source(o, slot_of, columns)
            frag.add(n.results[0])
            continue
        if op in ("kda.broadcast", "kda.constant"):
            continue                  # checked at their users
        if op == "kda.store_chunk":
            if n.operands[2] in columns:
                if mem_info(n.operands[0])[1] != "f32":
                    raise NoMatch("a column vector stored to a workspace that is not f32")
                continue
            if n.operands[2] not in frag:
                raise NoMatch("a stored tile is not a register tile")
            continue
        raise NoMatch(f"{op} in the scan body")
    if scan.body.nodes[-1].operands[0] not in frag:
        raise NoMatch("the yielded value is not a register tile")
    if len(precisions) > 1 or not precisions <= set(SCAN_PRECISIONS):
        raise NoMatch(f"products of precision {', '.join(sorted(precisions))} (this path takes "
                      f"one of {', '.join(SCAN_PRECISIONS)} per kernel)")
    plan.precision = precisions.pop() if precisions else "tf32"
    plan.slots = sorted(slots.values(), key=lambda s: s.node.index)
    if plan.precision == "bf16x3":
        for s in plan.slots:
            if s.operand:
                s.parts = 2
                if s.smem_shape[1] % (SWIZZLE // 2):
                    raise NoMatch(f"{s.tensor}: a bf16x3 operand's contraction of "
                                  f"{s.smem_shape[1]} is not whole 64-column panels")
    for s in plan.slots:
        if not s.operand and len(s.shape) == 2 and s.shape[1] == V and plan.v_ctas > 1:
            s.v_cols = V // plan.v_ctas
    off = 0
    for s in plan.slots:
        s.offset = off
        off += -(-s.nbytes // 1024) * 1024
    plan.stage_bytes = off
    plan.depth = 2 if 2 * off + 32 <= smem_limit else 1
    if plan.smem_bytes > smem_limit:
        raise NoMatch(f"a ring stage of {off} bytes does not fit in shared memory")
    k_split = k_split_for(k_split, K)
    if k_split > 1 and plan.warpgroups == 1:
        try:
            _plan_k_split(plan, carried, k_split)
        except NoMatch:
            plan.k_split, plan.split_values, plan.exchanges = 1, set(), {}
            plan.column_exchanges = 0
    plan.slot_barriers = bool(slot_barriers and plan.depth == 1 and not plan.exchanges)
    if plan.smem_bytes > smem_limit:
        plan.slot_barriers = False
    if tma_stores:
        _plan_checkpoint_stores(plan, carried, smem_limit)
    if plan.column_exchanges:
        plan.column_exchange_offset = -(-plan.smem_bytes // 16) * 16
        if plan.smem_bytes > smem_limit:
            raise NoMatch("the column sums' exchange does not fit in shared memory")
    return plan


def _plan_checkpoint_stores(plan: RegisterScanPlan, carried, smem_limit: int) -> None:
    """Stage the carried value's per-chunk checkpoints for TMA stores where they fit in shared
    memory after the ring (else they stay per-thread global stores). Only the carried value:
    staging v' as well measured slower on the H200 (kda B1_T8k_H16 forward step 2.00 vs 1.75
    us: its wait for the first copy and two more barriers cost more than its 32 global stores,
    which overlap the second product)."""
    end = -(-(plan.ring_bytes + 16 * plan.barrier_pairs) // 1024) * 1024
    for n in plan.scan.body.nodes:
        if n.op != "kda.store_chunk" or not stores_carried(n, carried):
            continue
        name, elt, layout, heads, tail = mem_info(n.operands[0])
        if len(n.operands[2].shape) != 2:
            continue                  # a column vector (the checkpoint's column norms)
        rows = n.operands[2].shape[0]
        if (elt not in ("f32", "f16") or layout == "token"
                or list(tail) != list(n.operands[2].shape) or tail[-1] != plan.V or rows % 8):
            continue
        st = StoreSlot(n, n.operands[0], name, rows, plan.V // plan.v_ctas, end, elt)
        if st.offset + st.nbytes > smem_limit:
            continue
        plan.stores.append(st)
        end += st.nbytes


#: state rows one consumer warpgroup holds at most under ``scan_k_split="auto"``: 128 x 64
#: fp32 is 64 registers per thread, which the scans hold beside their operands at 232 without
#: spilling; 256 rows (K = 256) spilled 336-600 bytes (ptxas, sm_90a)
AUTO_SPLIT_ROWS = 128


def k_split_for(option, K: int) -> int:
    """Warpgroups splitting the state's K rows: ``option`` (LowerOptions.scan_k_split), or for
    ``"auto"`` as many as keep each warpgroup at :data:`AUTO_SPLIT_ROWS` rows at most."""
    if option == "auto":
        return max(1, -(-K // AUTO_SPLIT_ROWS))
    if not isinstance(option, int) or option < 1:
        raise LoweringError(f"scan_k_split={option!r}: a positive number of warpgroups or "
                            "'auto'")
    return option


def _plan_k_split(plan: RegisterScanPlan, carried, k: int) -> None:
    """Split the state's K rows over ``k`` warpgroups of one value block (raises `NoMatch` when
    the scan does not allow it). The carried value is held as row slices; a product whose right
    operand is a slice is a partial sum over the warpgroup's K rows (`exchanges`: the
    warpgroups add their partials through shared memory, each writing into the part of the
    product's ring tile that only its own wgmma read); a product of a whole tile whose result
    has the state's shape computes only the warpgroup's rows (its N columns); other tiles are
    whole in every warpgroup. Each warpgroup's products are 1/k of the unsplit ones, but the
    warpgroups share the SM's tensor cores, so this pays only where one warpgroup leaves them
    idle; measured slower on the H200 at K = 128 (LowerOptions.scan_k_split)."""
    K = plan.K
    if K % (8 * k):
        raise NoMatch(f"K = {K} does not split into {k} slices of a multiple of 8")
    split = {carried}
    whole = set()
    exchanges = {}
    column_sums = 0
    uses: dict = {}
    body = plan.scan.body
    for n in body.nodes:
        if n.op in _PASS_THROUGH or n.op == "kda.pipeline_release":
            continue
        for o in n.operands:
            src = _source(o)
            if src.owner is not None and src.owner.op in _RING_LOADS:
                uses[src.owner] = uses.get(src.owner, 0) + 1

    def cls(v):
        return "split" if v in split else ("whole" if v in whole else None)

    for n in body.nodes:
        op = n.op
        if op in _PASS_THROUGH and n.operands[0] in split | whole:
            (split if n.operands[0] in split else whole).add(n.results[0])
        elif op == "kda.dot":
            lhs, rhs = n.operands
            slot = next(s for s in plan.slots if s.node is _source(lhs).owner)
            res = n.results[0]
            if rhs in split:
                lay, M = slot.layout, res.shape[0]
                local = K // k
                if uses.get(slot.node) != 1:
                    raise NoMatch(f"{slot.tensor} is read by more than one product")
                if slot.transposed or local % lay.panel_cols or lay.num_panels % k:
                    raise NoMatch(f"{slot.tensor}: its K slices are not whole swizzle panels")
                if M * V_BLOCK * 4 > slot.part_bytes // k:
                    raise NoMatch(f"the partial sums of {slot.tensor}'s product do not fit "
                                  "in its K slice")
                exchanges[n] = slot
                whole.add(res)
            elif tuple(res.shape) == tuple(carried.shape):
                if res.shape[0] % (8 * k):
                    raise NoMatch(f"product rows {res.shape[0]} do not split into {k}")
                split.add(res)
            else:
                whole.add(res)
        elif op == "kda.reduce_sum":
            # a column sum of a slice: its partials are added over the warpgroups
            if n.operands[0] in split:
                column_sums += 1
        elif op in _ELEMENTWISE and len(n.results[0].shape) == 2:
            kinds = {cls(o) for o in n.operands} - {None}
            if len(kinds) > 1:
                raise NoMatch(f"{op} mixes state slices and whole tiles")
            (split if kinds == {"split"} else whole).add(n.results[0])
    if body.nodes[-1].operands[0] not in split:
        raise NoMatch("the yielded value is not held as state slices")
    if not exchanges:
        raise NoMatch("no product sums over the state's rows")
    plan.k_split, plan.split_values, plan.exchanges = k, split, exchanges
    plan.column_exchanges = column_sums


def _elementwise_source(v, slot_of, columns=frozenset()):
    """Check a non-register operand of an element-wise op: a ring tile, a broadcast vector
    from the ring, a broadcast column vector (``columns``) or a broadcast scalar."""
    n = v.owner
    if n is not None and n.op == "kda.broadcast":
        src = n.operands[0]
        if len(src.shape) == 0:
            return
        dims = list(n.attrs["dims"])
        if len(src.shape) == 1 and dims == [1]:
            slot_of(src)
            return
        if src in columns and dims == [0]:
            return
        raise NoMatch(f"broadcast {list(src.shape)} over dims {dims}")
    if n is not None and n.op == "kda.constant":
        return
    slot_of(v)


def _ring_reads(n, slot_of: dict) -> list:
    """The ring slots node ``n`` of a scan step reads: a product's B operand, an element-wise
    op's ring tiles and broadcast ring vectors (`_elementwise_source`)."""
    def slot(v):
        src = _source(v)
        if src.owner is not None and src.owner.op == "kda.broadcast":
            src = _source(src.owner.operands[0])
        return slot_of.get(src.owner) if src.owner is not None else None
    if n.op == "kda.dot":
        operands = n.operands[:1]
    elif n.op in _ELEMENTWISE:
        operands = n.operands
    else:
        return []
    return [s for s in (slot(o) for o in operands) if s is not None]


# ------------------------------------------------------------------------------------------
# emission
# ------------------------------------------------------------------------------------------


class _DynBarrier:
    """An mbarrier chosen at run time (ring stage): what the barrier emitters need (``ptr``)."""

    def __init__(self, base, offset):
        self.base, self.offset = base, offset

    def ptr(self, byte_offset=0):
        return byte_gep(self.base, ival(byte_offset) + self.offset, shared_ptr_type())


class Frag:
    """A [R, V-block] tile as wgmma accumulator registers (column n = row interleave8(n)).
    ``row0``: None for a whole tile; for a state slice of a K-split scan, the first tile row
    this warpgroup holds (``rows`` of them)."""

    def __init__(self, rows: int, values: list, row0=None):
        self.rows, self.values, self.row0 = rows, values, row0


class ColumnVector:
    """A [V] vector with one value per value column (a column sum of a register tile, and
    element-wise ops on such): this thread's two columns, ``v0 + 16·warp + g`` and 8 after
    it, the two accumulator rows its registers hold."""

    def __init__(self, values: list):
        self.values = values


class _Pending:
    """An issued wgmma group (``group``: its commit number) whose registers are valid only
    after a wait."""

    def __init__(self, rows: int, values: list, row0=None, group: int = 0):
        self.rows, self.values, self.row0, self.group = rows, values, row0, group


class RegisterScanEmitter(SharedMemoryKernelEmitter):
    """Emits a serial scan kernel as described in the module doc."""

    path = PATH_NAME

    def __init__(self, program, group, opts, target: Target, plan: RegisterScanPlan):
        for capability in ("has_wgmma", "has_tma", "has_setmaxnreg"):
            target.require(capability, "the register-resident scan lowering (wgmma + TMA)")
        super().__init__(program, group, None, "smem", opts)
        self.target = target
        self.rplan = plan
        self.slot_of = {s.node: s for s in plan.slots}
        self.slot_index = {id(s): i for i, s in enumerate(plan.slots)}
        self._fused: dict = {}          # id(add node) -> the product accumulated onto its operand
        #: wait for the chunk-ready flag of each chunk before loading it (kernel.prepare sets
        #: it where this scan overlaps the chunk kernel before it, lower.chunk_flags)
        self.wait_flags = False
        self.flag_value = 1             # the pair's ordinal in the program (sm90.flags)

    # -- calling convention (SharedMemoryKernelEmitter, and the flags of a paired scan) ------
    def params(self):
        ps = super().params()
        if self.wait_flags:
            ps.append(Param(FLAGS_PARAM, "ptr", "i32"))
        return ps

    # -- kernel ------------------------------------------------------------------------------
    def emit_mlir(self, builder, name: str, count_cost: bool = True) -> None:
        rp = self.rplan
        cost = self.cost = CostCounter() if count_cost else NullCounter()
        nconsumer = rp.consumer_warpgroups * WG_THREADS
        with builder.kernel(name, self.params(), (rp.block_threads, 1, 1)) as p:
            with B.use(MlirBackend(cost=cost)):
                i32 = IntVal(thread_idx("x")).value.type
                tid = IntVal(thread_idx("x"))
                bx = IntVal(block_idx("x"))
                # CTA bx owns value head bx // v_ctas, columns from cta_v0
                self.cta_v0 = (bx % rp.v_ctas) * (rp.warpgroups * V_BLOCK) if rp.v_ctas > 1 else 0
                coords = dict(tid=tid, hv=bx // rp.v_ctas if rp.v_ctas > 1 else bx,
                              n=IntVal(block_idx("y")),
                              z=IntVal(block_idx("z")),
                              grid=(IntVal(nvvm.read_ptx_sreg_nctaid_x(results=[i32])),
                                    IntVal(nvvm.read_ptx_sreg_nctaid_y(results=[i32]))))
                p = {k: (IntVal(v) if k in ("T", "N", "HV") else v) for k, v in p.items()}
                smem_mod.declare_dynamic_smem(builder)
                self.smem_base = llvm.mlir_addressof(smem_mod.shared_ptr_type(),
                                                     smem_mod.DYNAMIC_SMEM_SYMBOL)

                def init():
                    for s in range(rp.barrier_pairs):
                        bar.mbarrier_init(self._full(s), 1)
                        bar.mbarrier_init(self._empty(s), nconsumer)
                    bar.fence_mbarrier_init()
                B.if_then(B.icmp("eq", tid, 0), init)
                bar.sync_threads()
                cost.event("bar.sync")
                self._bind(p, coords)

                def producer():
                    regalloc.release_registers(self.target, PRODUCER_REGISTERS)

                    def elected():
                        with cost.role("producer"):
                            self.producer_body(p)
                    B.if_then(B.icmp("eq", tid, nconsumer), elected)

                def consumer():
                    regalloc.claim_registers(self.target, CONSUMER_REGISTERS)
                    self.consumer_body(tid)

                # the role as a warp-uniform value (a shuffle from lane 0): with a plain
                # tid comparison ptxas cannot tell that the consumer branch is warp-uniform, and
                # serialises every wgmma in it (C7520)
                role = IntVal(shfl_idx((tid // WG_THREADS).value, 0))
                self.role = role
                B.if_then(B.icmp("ge", role, rp.consumer_warpgroups), producer)
                B.if_then(B.icmp("lt", role, rp.consumer_warpgroups), consumer)
        set_launch_bounds(builder, name, min_blocks_per_sm=1)

    def _bind(self, p, coords):
        self.p = p
        self.env = {}
        self.init_gate_checks(None)
        self.geo = Geometry(self.program, p, coords, need_chunk_off=True)
        self.bind_memrefs(p)

    def _full(self, stage):
        return _DynBarrier(self.smem_base, self.rplan.barrier_offset + 8 * stage)

    def _empty(self, stage):
        return _DynBarrier(self.smem_base,
                           self.rplan.barrier_offset + 8 * (self.rplan.barrier_pairs + stage))

    def _step_order(self, body) -> tuple:
        """(the checkpoint stores emitted first, the rest of a step's nodes in emission
        order); the same every step."""
        nodes = body.nodes[:-1]
        # checkpoints of the carried value go first, with what computes them from it (a column
        # scale): stored after the first product is issued, ptxas waits for that product
        # before the stores (C7517) and nothing overlaps
        stores = [n for n in nodes if n.op == "kda.store_chunk"
                  and stores_carried(n, body.args[1])]
        inside, cone = set(nodes), set(stores)
        for n in reversed(nodes):
            if n in cone:
                cone.update(o.owner for o in n.operands if o.owner in inside)
        early = [n for n in nodes if n in cone]
        order = schedule_step(nodes, body.args[1], early) if self.opts.scan_schedule == "early" \
            else [n for n in nodes if n not in early]
        return early, order

    def _last_reads(self, order: list) -> dict:
        """{slot index: the node of a step's emission ``order`` that reads it last}."""
        last = {}
        for n in order:
            for s in _ring_reads(n, self.slot_of):
                last[self.slot_index[id(s)]] = n
        return last

    def _refill_order(self) -> list:
        """Slot indices in the order a step frees them (slot barriers: the producer refills
        them in that order); slots no node reads last."""
        order = self._step_order(self.rplan.scan.body)[1]
        pos = {id(n): i for i, n in enumerate(order)}
        last = self._last_reads(order)
        return sorted(range(len(self.rplan.slots)),
                      key=lambda i: pos[id(last[i])] if i in last else len(order))

    def _stage(self, it):
        d = self.rplan.depth
        if d == 1:
            return 0, it & 1
        return it % d, (it // d) & 1

    def _chunk(self, s):
        reverse = bool(self.rplan.scan.attrs.get("reverse", False))
        return (self.geo.nchunks - 1) - s if reverse else s

    def _tile_offset(self, slot, stage):
        """Byte offset in shared memory of ``slot``'s tile in ring stage ``stage``."""
        return stage * self.rplan.stage_bytes + slot.offset

    # -- producer ----------------------------------------------------------------------------
    def producer_body(self, p: dict) -> None:
        rp, geo = self.rplan, self.geo
        maps = {}
        for s in rp.slots:
            if s.param not in maps:
                maps[s.param] = tma.tensormap_pointer(self.target, p[s.param])
        ratio = self.program.gva_ratio

        def step(it, *_):
            c = self._chunk(it)
            stage, phase = self._stage(it)
            # the chunk kernel running beside this one has stored chunk c
            # (kdagen.codegen.lower.chunk_flags)
            def wait_for_chunk():
                flags.wait_published(self.target, p[FLAGS_PARAM], geo.chunk_row(c),
                                     self.flag_value)
            if self.wait_flags:
                # the wait under a branch on the pointer (null: in order). A second version
                # of the loop without the waits for the in-order case (stop 52) did not speed
                # it up (the slowdown was C7518: scan_group_wait) and spilled; removed
                B.if_then(flags.is_set(p[FLAGS_PARAM]), wait_for_chunk)
                self.cost.event("flag.wait")
            if not rp.slot_barriers:
                bar.mbarrier_wait(self._empty(stage), phase ^ 1)
                bar.mbarrier_arrive_expect_tx(self._full(stage), rp.stage_bytes_tx)
                self.cost.event("mbarrier.wait")
                self.cost.event("mbarrier.arrive")
            for i in (self._refill_order() if rp.slot_barriers else range(len(rp.slots))):
                s = rp.slots[i]
                if rp.slot_barriers:    # refill the slot once this step's reads of it are done
                    bar.mbarrier_wait(self._empty(i), phase ^ 1)
                    bar.mbarrier_arrive_expect_tx(self._full(i), s.nbytes)
                    self.cost.event("mbarrier.wait")
                    self.cost.event("mbarrier.arrive")
                full = self._full(i) if rp.slot_barriers else self._full(stage)
                lay = s.layout
                panels = lay.num_panels if lay is not None else 1
                for part, pn in [(part, pn) for part in range(s.parts) for pn in range(panels)]:
                    off = (self._tile_offset(s, stage) + part * s.part_bytes
                           + (pn * lay.panel_bytes if lay else 0))
                    dst = byte_gep(self.smem_base, off, shared_ptr_type())
                    inner = pn * s.panel_cols + (self.cta_v0 if s.v_cols else 0)
                    if s.kind == "token":
                        grouped = (s.node.attrs.get("head_map") == "grouped" and s.heads == "qk"
                                   and ratio > 1)
                        head = geo.hv // ratio if grouped else geo.hv
                        crd = [inner, head, B.narrow(geo.start + B.wide(c * geo.C))]
                    elif s.operand and s.parts == 1:         # the interleave8_rows view
                        crd = [inner, 0, 0, 0, B.narrow(geo.chunk_row(c))]
                    elif s.operand:                 # part p's rows follow the others' (parts)
                        crd = [inner, part * s.smem_shape[0], B.narrow(geo.chunk_row(c))]
                    else:
                        crd = [inner] + [0] * (len(s.box()) - 2) + [B.narrow(geo.chunk_row(c))]
                    tma.tma_load(self.target, dst, maps[s.param], crd, full)
                    self.cost.event("tma.load")
            return []
        B.for_range(0, geo.nchunks, 1, step, trips=CHUNKS)

    # -- consumers ---------------------------------------------------------------------------
    def consumer_body(self, tid) -> None:
        rp, geo = self.rplan, self.geo
        k = rp.k_split
        self.wg = self.role // k if k > 1 else self.role      # value block of this warpgroup
        self.kpart = self.role % k if k > 1 else 0            # its K slice (K-split scans)
        self.tid_wg = tid % WG_THREADS
        self.warp = (tid // 32) % 4
        self.lane = tid % 32
        self.v0 = self.cta_v0 + self.wg * V_BLOCK
        self.k_local = rp.K // k
        self.row0 = self.kpart * self.k_local if k > 1 else None
        scan = rp.scan
        # values defined outside the scan (scalars, the initial state)
        for n in self.group.nodes:
            if n is scan:
                break
            if n.op == "kda.scalar":
                self.env[n.results[0]] = self.env[n.operands[0]]
            elif n.op == "kda.constant" and not n.results[0].shape:
                self.env[n.results[0]] = B.f(float(n.attrs["value"]))
        init = self._initial(scan.operands[0])
        body = scan.body
        self.store_of = {st.node: st for st in rp.stores}
        self.store_maps = {st.param: tma.tensormap_pointer(self.target, self.p[st.param])
                           for st in rp.stores}
        self.elected = B.icmp("eq", tid, 0)
        self._groups = self._completed = 0      # wgmma groups committed / known complete
        self._a_reads = {}      # id(Frag) -> the last group whose TF32 A came from its registers

        def step(it, *carried):
            c = self._chunk(it)
            stage, phase = self._stage(it)
            with self.cost.chunk_step():
                self._phase_now = phase

                def ring_wait():
                    if rp.slot_barriers:
                        return
                    bar.mbarrier_wait(self._full(stage), phase)
                    self.cost.event("mbarrier.wait")
                    if rp.depth == 1:   # this step's loads started only when the last one ended
                        self.cost.event("ring.refill_bytes", rp.stage_bytes_tx)
                first = self.opts.scan_checkpoints_first
                if not first:
                    ring_wait()
                out = self._step(body, c, stage, Frag(self.k_local, list(carried), self.row0),
                                 ring_wait if first else None)
                if rp.exchanges:
                    # the partial sums were written (generic proxy) into ring tiles TMA refills
                    bar.fence_proxy_async_shared()
                    self.cost.event("fence.proxy.async")
                if not rp.slot_barriers:
                    bar.mbarrier_arrive(self._empty(stage))
                    self.cost.event("mbarrier.arrive")
            return out.values
        final = B.for_range(0, geo.nchunks, 1, step, init.values, trips=CHUNKS)
        if rp.stores:     # the last checkpoints are in flight: finish them before exiting
            tma.tma_store_wait(self.target, 0, read_only=False)
        result = Frag(self.k_local, list(final), self.row0)
        after = False
        for n in self.group.nodes:
            if n is scan:
                after = True
            elif after and n.op == "kda.store_state":
                self._store(result, self.env[n.operands[0]], geo.state_row())

    def _initial(self, v) -> Frag:
        rp, geo = self.rplan, self.geo
        n = v.owner
        if n is not None and n.op == "kda.load_state":
            mem = self.env[n.operands[0]]
            ptr, offsets = self._lane_addresses(mem, geo.state_row(), self.k_local, self.row0)
            return Frag(self.k_local, [B.load(ptr, o, mem.elt) for o in offsets], self.row0)
        if n is not None and n.op == "kda.constant":
            return Frag(self.k_local, [B.f(float(n.attrs["value"]))] * (self.k_local // 2),
                        self.row0)
        raise LoweringError(f"register scan: initial state from {n.op if n else v}")

    def _lane_row(self):
        """The tile row of this lane's accumulator register 0 (`_reg_row` gives the others'
        offsets from it): its column 2t holds row t in the TF32 scans' interleaved order
        (`interleave8`), row 2t in natural order (bf16x3)."""
        t = lane_in_group(self.lane)
        return 2 * t if self.rplan.natural_order else t

    def _reg_row(self, i) -> int:
        """Tile row of accumulator register ``i`` minus `_lane_row` (a constant): register i
        sits at column 8·(i // 4) + 2t + i % 2 (`wgmma_d_coord`)."""
        return 8 * (i // 4) + (1 if self.rplan.natural_order else 4) * (i % 2)

    def _coord(self, i):
        """(tile row, value column) of accumulator register ``i`` of this thread: the register
        sits at (m, n) of `wgmma_d_coord`, and column n holds tile row interleave8(n) (TF32) or
        n (bf16x3)."""
        g = lane_group(self.lane)
        m = self.warp * 16 + g + 8 * ((i // 2) % 2)
        return self._lane_row() + self._reg_row(i), self.v0 + m

    def _lane_addresses(self, mem, row, rows, row0=None) -> tuple:
        """(pointer, constant element offsets) of this lane's registers of an [rows, V] tile
        at ``row`` of ``mem`` (from tile row ``row0`` for a state slice): one address per lane,
        the rest immediates (hoisting one address per register would cost two registers
        each)."""
        sr, sc = (1, mem.tail[-2]) if mem.transposed else (mem.tail[-1], 1)
        g, t = lane_group(self.lane), self._lane_row()
        lane = (t + (row0 if row0 is not None else 0)) * sr + (self.v0 + self.warp * 16 + g) * sc
        ptr = B.gep(mem.ptr, B.wide(row) * mem.inner + B.wide(lane), mem.elt)
        offsets = []
        for i in range(rows // 2):
            r, m = self._reg_row(i), 8 * ((i // 2) % 2)
            offsets.append(r * sr + m * sc)
        return ptr, offsets

    def _store(self, frag: Frag, mem, row) -> None:
        if mem.split is not None:
            raise LoweringError(f"register scan: {mem.name} is stored split ({mem.split}), "
                                "which only the chunk kernels' stores write")
        frag = self._ready(frag)
        ptr, offsets = self._lane_addresses(mem, row, frag.rows, frag.row0)
        pairs = list(zip(offsets, frag.values))

        def store(part):
            for o, x in part:
                if mem.round is not None:
                    x = B.round_to(x, mem.round)
                B.store(ptr, o, x, mem.elt)
        k = self.rplan.k_split
        if frag.row0 is not None or k == 1:
            store(pairs)
            return
        # a whole tile every warpgroup of the value block holds: each stores 1/k of its rows
        share = len(pairs) // k
        for part in range(k):
            B.if_then(B.icmp("eq", self.kpart, part),
                      lambda part=part: store(pairs[part * share:(part + 1) * share]))

    # -- one chunk step ------------------------------------------------------------------------
    def _step(self, body, c, stage, carried: Frag, ring_wait=None) -> Frag:
        """One chunk step; ``ring_wait``: the wait for the stage's ring tiles, made after the
        checkpoints of the carried value (which read no ring tile) are stored, so that their
        work overlaps the copies still landing."""
        env = self.env
        env[body.args[0]] = c
        env[body.args[1]] = carried
        self._carried_arg = body.args[1]
        self._c, self._stage_now = c, stage
        self._column_sum_index = 0
        early, order = self._step_order(body)
        self._early = list(early)
        self._flush_early()
        if ring_wait is not None:
            ring_wait()
        slots = self.rplan.slots if self.rplan.slot_barriers else []
        self._acquired, self._released, self._releasing = set(), set(), []
        last = self._last_reads(order) if slots else {}
        if slots and self.opts.scan_slot_acquire != "first_read":
            # "products": the element-wise slots and the first product's at the start, the
            # other products' slots together before the first of them
            first_dot = next((n for n in order if n.op == "kda.dot"), None)
            first = set(map(id, _ring_reads(first_dot, self.slot_of))) if first_dot else set()
            for s in slots:
                if (self.opts.scan_slot_acquire == "start" or not s.operand
                        or id(s) in first):
                    self._wait_slot(s)
        at_start = set(self._acquired)
        for n in order:
            self._node(n)
            for i, reader in last.items():
                # a product's reads end when its group completes: the slot is released after
                # that wait; a slot read element-wise last is released at the step's end (an
                # arrive between the ops there kept values live across it: gdn_bwd spilled)
                if reader is n and n.op == "kda.dot":
                    self._releasing.append((i, self._groups))
            self._release_slots()
        self._flush_early()
        out = self._ready(env[body.nodes[-1].operands[0]])
        if slots:
            self._complete(max((g for _, g in self._releasing), default=0))
            releasing = self._released | {i for i, _ in self._releasing}
            self._releasing += [(i, 0) for i in range(len(slots)) if i not in releasing]
            freed_mid_step = set(self._released)
            self._release_slots()
            # the model's exposed refill: slots freed only at the step's end that the next
            # step waits for at its start (a slot waited for later, or freed mid-step, is
            # counted as refilled behind the step)
            exposed = (set(self._released) - freed_mid_step) & at_start
            if exposed:
                self.cost.event("ring.refill_bytes", sum(slots[i].nbytes for i in exposed))
        return out

    def _slot_base(self, slot) -> int:
        """Byte offset of ``slot``'s tile in this step's stage; with slot barriers, wait for its
        load first (once per step) and refuse a read after the step released the slot."""
        if self.rplan.slot_barriers:
            i = self.slot_index[id(slot)]
            if i in self._released:
                raise LoweringError(f"register scan: {slot.tensor} read after its ring slot "
                                    f"was released for the next chunk")
            if i not in self._acquired:
                # "products": the first product slot waited for mid-step waits for the other
                # product slots with it: one wait point, not one between products in flight
                # (there, gdn_bwd's reverse scan spilled 12 bytes)
                late = [k for k, s in enumerate(self.rplan.slots)
                        if s.operand and k not in self._acquired and k != i]
                self._wait_slot(slot)
                if self.opts.scan_slot_acquire == "products":
                    for k in late:
                        self._wait_slot(self.rplan.slots[k])
        return self._tile_offset(slot, self._stage_now)

    def _wait_slot(self, slot) -> None:
        i = self.slot_index[id(slot)]
        if i not in self._acquired:
            bar.mbarrier_wait(self._full(i), self._phase_now)
            self.cost.event("mbarrier.wait")
            self._acquired.add(i)

    def _release_slots(self) -> None:
        """Arrive on the empty barrier of each slot whose last read in this step is done (a
        product's, once its wgmma group completed), so the producer refills it for the next
        chunk while the step goes on."""
        keep = []
        for i, group in self._releasing:
            if group > self._completed:
                keep.append((i, group))
                continue
            bar.mbarrier_arrive(self._empty(i))
            self.cost.event("mbarrier.arrive")
            self._released.add(i)
        self._releasing = keep

    def _flush_early(self):
        for n in self._early:
            if n.op != "kda.store_chunk":
                self._node(n)
                continue
            st = self.store_of.get(n)
            if st is not None and not (self.env[n.operands[0]].transposed
                                       or self.env[n.operands[0]].round):
                self._store_staged(n, st)
            else:
                self._store_chunk(n)
        self._early = []

    def _store_staged(self, n, st: StoreSlot) -> None:
        """The checkpoint through its staging tile and a TMA store (`StoreSlot`): the consumers
        wait until the previous step's copy has read the tile (only thread 0 has one in
        flight), write their registers (swizzled: at most 2-way bank conflicts) and fence them
        for the async proxy; thread 0 issues one copy per 32-column panel."""
        rp, geo = self.rplan, self.geo
        frag = self._ready(self._stored(n))
        nconsumer = rp.consumer_warpgroups * WG_THREADS
        # every consumer thread waits and commits (no groups in flight but thread 0's: free);
        # only the copies are predicated on thread 0 — branches here made ptxas spill
        tma.tma_store_wait(self.target, 0, read_only=True)
        bar.named_barrier_sync(STAGING_BARRIER, nconsumer)
        self.cost.event("bar.sync")
        lay, eb = st.layout, ELEM_BYTES[st.elt]
        g, t = lane_group(self.lane), self._lane_row()
        col = (self.v0 - self.cta_v0) + self.warp * 16 + g
        row = t if frag.row0 is None else t + frag.row0
        base = {}
        for i, x in enumerate(frag.values):
            h, q, j = i % 2, (i // 2) % 2, i // 4
            if (h, q) not in base:
                # one pointer per swizzle phase (it depends on the row mod 8 only), the 8-row
                # groups as immediates: an address per register would be hoisted out of the
                # chunk loop, two registers each, and spill
                first = (lay.byte_offset(row + self._reg_row(h), col + 8 * q) + st.offset) // eb
                base[(h, q)] = B.gep(self.smem_base, first, st.elt)
            B.store(base[(h, q)], 8 * j * lay.row_pitch // eb, x, st.elt)
        bar.fence_proxy_async_shared()
        self.cost.event("fence.proxy.async")
        bar.named_barrier_sync(STAGING_BARRIER, nconsumer)
        self.cost.event("bar.sync")
        tmap = self.store_maps[st.param]
        c = self._c

        for pn in range(lay.num_panels):
            src = byte_gep(self.smem_base, st.offset + pn * lay.panel_bytes, shared_ptr_type())
            crd = [self.cta_v0 + pn * lay.panel_cols, 0, B.narrow(geo.chunk_row(c))]
            tma.tma_store(self.target, src, tmap, crd, predicate=self.elected)
            self.cost.event("tma.store")
        tma.tma_store_commit(self.target)

    def _node(self, n) -> None:
        op, env = n.op, self.env
        r = n.results[0] if n.results else None
        if op in _RING_LOADS:
            env[r] = ("ring", self.slot_of[n])
        elif op in ("kda.pipeline_wait", "kda.assume_range"):
            env[r] = env[n.operands[0]]
        elif op == "kda.convert":
            env[r] = env[n.operands[0]]         # ring reads widen to f32; registers are f32
        elif op == "kda.pipeline_release":
            pass
        elif op == "kda.broadcast":
            env[r] = ("broadcast", n)
        elif op == "kda.constant":
            env[r] = ("scalar", B.f(float(n.attrs["value"])))
        elif op == "kda.dot":
            self._dot(n)
        elif op == "kda.reduce_sum":
            env[r] = self._column_sums(n)
        elif op in _VECTOR_OPS and len(r.shape) == 1:
            env[r] = self._column_op(op, [env[o] for o in n.operands])
        elif r is not None and _summed_product(r):
            env[r] = ("summed", n)      # its column sum takes the products as FMAs
        elif op in _ELEMENTWISE:
            if self._fused.get(id(n)) is not None:
                env[r] = self._fused.pop(id(n))
                return
            rows, row0 = r.shape[0], None
            for o in n.operands:
                x = env.get(o)
                if isinstance(x, (Frag, _Pending)):
                    rows, row0 = x.rows, x.row0        # a state slice stays one
            self._await_a_reads(n.operands)
            ops = [self._elementwise_operand(o, rows, row0) for o in n.operands]
            env[r] = Frag(rows, _apply(op, ops), row0)
        elif op == "kda.store_chunk":
            self._store_chunk(n)
        else:
            raise LoweringError(f"register scan: {op}")

    def _await_a_reads(self, operands) -> None:
        """Wait for the wgmma groups that read an operand's registers as TF32 A before an
        element-wise op on it: its result may take those registers, and ptxas inserts that
        wait itself (C7517), or, where a flag-waiting producer puts it on a divergent path,
        serialises every wgmma of the kernel (C7518)."""
        if not self.opts.scan_group_wait:
            return
        self._complete(max((self._a_reads.get(id(self.env.get(o)), 0) for o in operands),
                           default=0))

    def _elementwise_operand(self, v, rows, row0=None) -> list:
        x = self.env[v]
        if isinstance(x, (Frag, _Pending)):
            return self._ready(x).values
        kind, obj = x
        if kind == "scalar":
            return [obj] * (rows // 2)
        if kind == "ring":
            return self._read_ring(obj, rows, row0).values
        if kind == "broadcast":
            src = obj.operands[0]
            if len(src.shape) == 0:
                s = self.env[src]
                s = s[1] if isinstance(s, tuple) else s
                return [s] * (rows // 2)
            if isinstance(self.env[src], ColumnVector):
                # register i sits in accumulator row 16·warp + g + 8·((i // 2) % 2)
                col = self.env[src].values
                return [col[(i // 2) % 2] for i in range(rows // 2)]
            _, slot = self.env[src]
            first = self._slot_base(slot) // ELEM_BYTES[slot.elt]
            if row0 is not None:
                first = row0 + first
            cache, out = {}, []
            for i in range(rows // 2):
                key = (i // 4, i % 2)           # registers of one column share the value
                if key not in cache:
                    r, _ = self._coord(i)
                    cache[key] = B.load(self.smem_base, first + r, slot.elt)
                out.append(cache[key])
            return out
        raise LoweringError(f"register scan: operand {kind}")

    def _read_ring(self, slot: RingSlot, rows, row0=None) -> Frag:
        """The fragment of a ring tile read element-wise (masked past the sequence end for
        token tiles); rows from ``row0`` for a state slice."""
        geo = self.geo
        cols = slot.cols_loaded
        g, t = lane_group(self.lane), self._lane_row()
        if row0 is not None:
            t = t + row0
        col0 = self.v0 - self.cta_v0 if slot.v_cols else self.v0
        first = self._slot_base(slot) // ELEM_BYTES[slot.elt]
        ptr = B.gep(self.smem_base, first + t * cols + col0 + self.warp * 16 + g, slot.elt)
        vals = []
        for i in range(rows // 2):
            r, m = self._reg_row(i), 8 * ((i // 2) % 2)
            x = B.load(ptr, r * cols + m, slot.elt)
            if slot.kind == "token":
                x = B.sel(B.icmp("lt", self._c * geo.C + (t + r), geo.seqlen), x, B.f(0.0))
            vals.append(x)
        return Frag(rows, vals, row0)

    def _commit(self) -> int:
        """Commit the wgmma issued since the last commit as a group; its number."""
        wgmma.wgmma_commit(self.target)
        self.cost.event("wgmma.commit")
        self._groups += 1
        return self._groups

    def _complete(self, group: int) -> None:
        """Wait until wgmma group ``group`` (and so every earlier one) has completed."""
        if group > self._completed:
            # groups complete in order: wait until at most the later ones are in flight
            wgmma.wgmma_wait(self.target, self._groups - group)
            self.cost.event("wgmma.wait")
            self._completed = group

    def _ready(self, x):
        if isinstance(x, _Pending):
            self._complete(x.group)
            vals = wgmma.fence_accumulators(x.values)
            done = Frag(x.rows, vals, x.row0)
            for k, v in list(self.env.items()):
                if v is x:
                    self.env[k] = done
            return done
        return x

    def _dot(self, n) -> None:
        env, rp = self.env, self.rplan
        lhs, rhs = n.operands
        slot = env[lhs][1]
        X = self._ready(env[rhs])
        M = n.results[0].shape[0]
        Kd = X.rows
        partial = n in rp.exchanges             # X is a state slice: a sum over its K rows
        sliced = n.results[0] in rp.split_values  # only this warpgroup's rows of the result
        rows, row0 = (M // rp.k_split, self.row0) if sliced else (M, None)
        # add(Y, dot) with Y ready: accumulate onto Y (not a partial sum: Y would count twice)
        init, fuse = None, None
        add, other = sole_add(n) if not partial else (None, None)
        if add is not None:
            y = env.get(other) if other is not None else None
            if isinstance(y, _Pending) and len(other.uses) == 1:
                # accumulate onto an in-flight product (its only use): wgmma orders the two
                # on the shared accumulator, no wait
                init, fuse = y.values, add
            elif isinstance(y, (Frag, _Pending)):
                init, fuse = self._ready(y).values, add
        acc = list(init) if init is not None else [B.f(0.0)] * (rows // 2)
        lay = slot.layout
        base = self._slot_base(slot)
        base32 = shared_addr32(byte_gep(self.smem_base, base, shared_ptr_type()))
        if partial:
            base32 = base32 + slice_start(lay, "k", self.kpart, self.k_local)
        elif sliced:
            base32 = base32 + slice_start(lay, "n", self.kpart, rows)
        if rp.precision == "bf16x3":
            acc = self._bf16x3_products(X, acc, lay, base32, slot.part_bytes, Kd, rows)
        else:
            acc = self._tf32_products(X, acc, lay, base32, Kd, rows, rhs is self._carried_arg)
        group = self._commit()
        if rp.precision != "bf16x3":            # bf16x3 packs A into new registers
            self._a_reads[id(X)] = group
        pending = _Pending(rows, acc, row0, group)
        env[n.results[0]] = pending
        if partial:
            env[n.results[0]] = self._exchange(self._ready(pending), slot, base)
        if fuse is not None:
            self._fused[id(fuse)] = pending
        self._flush_early()

    def _bf16x3_products(self, X: Frag, acc: list, lay, base32, part_bytes: int, Kd: int,
                         rows: int) -> list:
        """acc += X-as-A · B in bf16x3: per 16-deep block, A's hi and lo bf16 parts packed from
        X's registers (natural column order: `acc_regs_for_half_a`), B's hi and lo tiles
        ``part_bytes`` apart, three m64nNk16 products, the two small cross terms first."""
        blocks = Kd // BF16_K
        b_hi = wgmma.k_block_descriptors(lay, base32, blocks, BF16_K)
        b_lo = wgmma.k_block_descriptors(lay, base32 + part_bytes, blocks, BF16_K)
        group = self.opts.scan_a_group or blocks
        for k0 in range(0, blocks, group):
            if k0 and self.opts.scan_group_wait:
                # A packed from X after earlier blocks' wgmma are issued: ptxas waits for them
                # there anyway (C7517), and where it must place that wait on a divergent path
                # (a producer with flag waits) it serialises every wgmma of the kernel (C7518:
                # kda_bwd's reverse scan 4.06 -> 5.60 us/step, H200). Committing and waiting
                # here says so in the PTX.
                self._complete(self._commit())
                acc = wgmma.fence_accumulators(acc)
            a_parts = []
            for kb in range(k0, min(blocks, k0 + group)):
                pairs = [bf16_split_pack(*(X.values[r] for r in acc_regs_for_half_a(kb, j)))
                         for j in range(4)]
                a_parts.append(([hi for hi, _ in pairs], [lo for _, lo in pairs]))
            # every A register of the group is written before its fence (see _tf32_products)
            wgmma.wgmma_fence(self.target)
            for (a_hi, a_lo), d_hi, d_lo in zip(a_parts, b_hi[k0:], b_lo[k0:]):
                for a, d in ((a_hi, d_lo), (a_lo, d_hi), (a_hi, d_hi)):
                    acc = wgmma.wgmma_half_rs(self.target, acc, a, d, rows, "bf16")
                    self.cost.event("wgmma")
        self.cost.event("cvt.bf16x2", Kd)
        self.cost.event("alu.f32", Kd)
        return acc

    def _tf32_products(self, X: Frag, acc: list, lay, base32, Kd: int, rows: int,
                       of_state: bool) -> list:
        """acc += X-as-A · B in TF32 (X's registers in the interleaved column order:
        `acc_reg_for_tf32_a`), A split into hi + lo parts where ``scan_a_split`` says."""
        # every A register is written before the fence: a register written between the fence
        # and the wgmma that reads it makes ptxas insert a wait before each wgmma (C7517)
        split = self.opts.scan_a_split
        if split == "all" or (split == "state" and of_state):
            # hi and lo parts per k block, lo's product first (the smaller terms accumulate
            # before the larger ones)
            a_regs = []
            for kb in range(Kd // TF32_K):
                parts = [tf32_split_operand_bits(X.values[acc_reg_for_tf32_a(kb, j)])
                         for j in range(4)]
                a_regs.append(([lo for _, lo in parts], [hi for hi, _ in parts]))
            self.cost.event("cvt.tf32", Kd)
            self.cost.event("alu.f32", Kd)
        else:
            a_regs = [([tf32_operand_bits(X.values[acc_reg_for_tf32_a(kb, j)])
                        for j in range(4)],) for kb in range(Kd // TF32_K)]
            self.cost.event("cvt.tf32", Kd // 2)
        descs = wgmma.k_block_descriptors(lay, base32, Kd // TF32_K, TF32_K)
        wgmma.wgmma_fence(self.target)
        for parts, desc in zip(a_regs, descs):
            for a in parts:
                acc = wgmma.wgmma_tf32_rs(self.target, acc, a, desc, rows)
                self.cost.event("wgmma")
        return acc

    def _exchange(self, part: Frag, slot: RingSlot, base: int) -> Frag:
        """The whole product from this warpgroup's partial sum and the other slices' partials:
        each warpgroup writes its registers into the K slice of the product's ring tile that
        only its own (completed) wgmma read, in register-major order (conflict-free: a
        register's 128 lanes are consecutive words), meets the others at a named barrier,
        and adds theirs. Every warpgroup adds the same partials (in slice order), so all hold
        bit-identical values."""
        k, n = self.rplan.k_split, len(part.values)
        words = slot.part_bytes // k // 4      # one slice of the (hi) tile, in f32 words
        first = base // 4 + self.tid_wg

        def at(p, i):
            return p * words + i * WG_THREADS + first
        own = self.kpart * words + first
        for i, x in enumerate(part.values):
            B.store(self.smem_base, own + i * WG_THREADS, x, "f32")
        bar.named_barrier_sync(EXCHANGE_BARRIER, k * WG_THREADS)
        self.cost.event("bar.sync")
        out = []
        for i in range(n):
            if k == 2:     # own + other: the same sum in both (addition commutes exactly)
                out.append(B.add(part.values[i], B.load(self.smem_base, at(1 - self.kpart, i))))
                continue
            total = None
            for p in range(k):
                x = B.load(self.smem_base, at(p, i), "f32")
                total = x if total is None else B.add(total, x)
            out.append(total)
        return Frag(part.rows, out)

    def _store_chunk(self, n) -> None:
        x = self._stored(n)
        if isinstance(x, ColumnVector):
            self._store_columns(x, self.env[n.operands[0]], self.geo.chunk_row(self._c))
            return
        self._store(x, self.env[n.operands[0]], self.geo.chunk_row(self._c))

    # -- column vectors ([V]: one value per value column) -----------------------------------
    def _column_sums(self, n) -> ColumnVector:
        """The sums over the rows of a register tile, per value column: each value column is
        one accumulator row, held by one lane quad (its rows spread over the quad's four
        lanes), so a thread adds its registers of each of its two rows and two butterfly
        shuffles add the quad's partial sums (no shared memory, no barrier). A tile of
        products read only here (a square for a norm) is summed as FMAs."""
        x = self.env[n.operands[0]]
        if isinstance(x, tuple) and x[0] == "summed":
            frag = self._ready(self.env[x[1].operands[0]])
            rows, row0 = frag.rows, frag.row0
            a, b = (self._elementwise_operand(o, rows, row0) for o in x[1].operands)
            terms = list(zip(a, b))
        else:
            frag = self._ready(x)
            rows, row0 = frag.rows, frag.row0
            terms = [(v, None) for v in frag.values]
        out = []
        for q in (0, 1):
            # COLUMN_SUM_CHAINS independent chains, then added: a chain as long as the tile
            # is deep waits on each add's latency
            chains = [None] * COLUMN_SUM_CHAINS
            mine = [t for i, t in enumerate(terms) if (i // 2) % 2 == q]
            for j, (u, w) in enumerate(mine):
                c = j % COLUMN_SUM_CHAINS
                if w is None:
                    chains[c] = u if chains[c] is None else B.add(chains[c], u)
                else:
                    chains[c] = B.mul(u, w) if chains[c] is None else B.fma(u, w, chains[c])
                self.cost.event("alu.f32")
            chains = [c for c in chains if c is not None]
            while len(chains) > 1:
                chains = [B.add(chains[k], chains[k + 1]) if k + 1 < len(chains) else chains[k]
                          for k in range(0, len(chains), 2)]
                self.cost.event("alu.f32", len(chains))
            acc = chains[0]
            for mask in (1, 2):
                acc = B.add(acc, B.shfl_xor(acc, mask))
                self.cost.event("shfl")
            out.append(acc)
        if row0 is not None:        # a K-split slice: add the other warpgroups' partials
            out = self._exchange_columns(out)
        return ColumnVector(out)

    def _exchange_columns(self, part: list) -> list:
        """The column sums of the whole state from this warpgroup's partials over its K slice:
        each writes its two columns' partials to shared memory (the buffer of this step's
        parity and this sum), meets the others at the exchange barrier, and adds every
        warpgroup's in slice order (so all hold the same sums)."""
        rp, k = self.rplan, self.rplan.k_split
        per_sum = k * V_BLOCK
        index = self._column_sum_index
        self._column_sum_index += 1
        parity = self._c & 1            # consecutive steps take consecutive chunks
        base = (rp.column_exchange_offset // 4
                + (parity * rp.column_exchanges + index) * per_sum)
        col = self.warp * 16 + lane_group(self.lane)
        for q, x in enumerate(part):
            B.store(self.smem_base, base + self.kpart * V_BLOCK + col + 8 * q, x, "f32")
        self.cost.event("st.shared", 2)
        bar.named_barrier_sync(EXCHANGE_BARRIER, k * WG_THREADS)
        self.cost.event("bar.sync")
        out = []
        for q in (0, 1):
            total = None
            for p in range(k):
                x = B.load(self.smem_base, base + p * V_BLOCK + col + 8 * q, "f32")
                total = x if total is None else B.add(total, x)
            self.cost.event("ld.shared", k)
            out.append(total)
        return out

    def _column_op(self, op: str, operands: list) -> ColumnVector:
        def pair(x):
            if isinstance(x, ColumnVector):
                return x.values
            if isinstance(x, tuple) and x[0] == "scalar":
                return [x[1], x[1]]
            raise LoweringError(f"register scan: {op} of {x!r} on column vectors")
        args = [pair(x) for x in operands]
        if op == "kda.rsqrt":
            # a scale: it need not be correctly rounded (its users multiply by it and by the
            # norm it makes, both from this one value: x·r and s·r give back x·s·r², within
            # 2^-21 of x), so one MUFU.RSQ instead of an IEEE square root and division
            vals = [B.rsqrt_approx(a) for a in args[0]]
        else:
            vals = _apply(op, args)
        self.cost.event("alu.f32", 2)
        return ColumnVector(vals)

    def _store_columns(self, x: ColumnVector, mem, row) -> None:
        """A column vector into a [.., V] chunk workspace: the quad's first lane stores its
        two columns."""
        col = self.v0 + self.warp * 16 + lane_group(self.lane)
        ptr = B.gep(mem.ptr, B.wide(row) * mem.inner + B.wide(col), mem.elt)

        def store():
            for q, v in enumerate(x.values):
                B.store(ptr, 8 * q, v, mem.elt)
        leader = B.icmp("eq", lane_in_group(self.lane), 0)
        if self.rplan.k_split > 1:        # every slice holds the whole sums: the first stores
            leader = B.band(leader, B.icmp("eq", self.kpart, 0))
        B.if_then(leader, store)
        self.cost.event("st.global", 2)

    def _stored(self, n):
        """The register tile store node ``n`` writes: its operand, seen through conversions
        (pass-through here: the store converts to the memory's element type), which an early
        checkpoint store meets before the step has evaluated them."""
        v = n.operands[2]
        while v not in self.env and v.owner is not None and v.owner.op == "kda.convert":
            v = v.owner.operands[0]
        return self.env[v]


__all__ = ["match", "NoMatch", "RegisterScanPlan", "RegisterScanEmitter", "PATH_NAME"]
