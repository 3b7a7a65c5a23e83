"""sm_90a register-tile lowering of chunk-parallel kernels (issue 11 item 4, first step).

Every tile value of the kernel lives where its layout puts it, never in a per-op fp32 buffer:

* **ring tiles**: the chunk's inputs and workspace tiles, TMA-copied once into 128B-swizzled
  shared memory (one 'full' mbarrier for all of them; one chunk per CTA, so no ring stages);
* **accumulators**: the results of matrix products and the element-wise ops on them stay in
  wgmma f32 accumulator registers (`Acc`); a product is held *transposed* (``Acc.transposed``:
  the tile's columns as the wgmma M dimension) where its right operand is a ring tile, so
  that operand becomes the register A operand read straight from shared memory at fragment
  coordinates and the left operand's ring tile is the K-major B operand as TMA wrote it;
* **per-row vectors** (norms, gates, their cumsums): lazy expressions (`tiles.Ref`) over
  per-token loads and small shared vectors; only reductions and cumsums are materialised, one
  64-float vector each;
* **row factors of product operands**: an operand ``X * broadcast(r)`` with X a ring tile is
  multiplied as X and its rows scaled in the product's epilogue (exact algebra: a row scale
  commutes with the contraction), so raw bf16 inputs meet in an exact bf16 product
  (PERF.md §4: GDN's q·kᵀ with the scalar decay and the L2 norms factored out).

Lowering rules (one per op form; `match` refuses a kernel with any other form, which then
takes the tile lowering of sm90_native.py):

========================================  =================================================
``decay_dot(X·r, Y·s, g, h)`` with one    wgmma bf16 (both operands from shared memory), then
gate value per row (GDN)                   ``acc · r_i · s_j · 2^(g_i - h_j)``, masked to j <= i + d
``dot(X·r, W)``, X a bf16 ring tile, W    transposed: Wᵀ from shared memory into registers as
an f32 ring tile                           bf16 hi + lo parts (two products; X is exact in bf16),
                                           B = X; rows scaled by r in the epilogue
``dot(A, W)``, A an accumulator, W f32    transposed: Wᵀ as the TF32 A operand from shared
                                           memory, A stored once (TF32) as the K-major B tile;
                                           accumulated onto the other operand of its sole add
element-wise on accumulators               per register, other operands read at its coordinates
``reduce_sum`` over columns, ``cumsum``    one shared vector of C floats (pairs of threads per
                                           row; one warp's shuffle scan)
``convert`` + ``store`` of a token tile    staged in shared memory as bf16, 16-byte stores
========================================  =================================================

Grid: V / 64 CTAs per value head (each owning 64 value columns), one chunk each, one consumer
warpgroup of 128 threads (thread 0 issues the copies); small enough for two CTAs per SM.
"""
from __future__ import annotations

import contextlib

from dataclasses import dataclass, field

from kdagen._mlir import llvm
from kdagen.runtime.tensormap import ELEM_BYTES
from kdagen.target import Target

from ..common import barrier as bar
from ..common import smem as smem_mod
from ..common.convert import bf16_split_pack
from ..common.ints import IntVal
from ..common.launch import set_launch_bounds
from ..common.layouts import SmemLayout, lane_group, lane_in_group
from ..common.shuffle import shfl
from ..common.smem import byte_gep, shared_addr32, shared_ptr_type
from ..common.sreg import block_idx, thread_idx
from ..sm90 import tma, wgmma
from . import backend as B
from . import tiles as T_
from ..common.kernel import Param
from .chunk_flags import FLAGS_PARAM, publish_chunk_ready
from .cost import CostCounter, NullCounter
from .emitter import Geometry, SharedMemoryKernelEmitter, mem_info, op_label, row_gate_sources
from .mlir_backend import MlirBackend
from .options import product_precision
from .plan import LoweringError
from .program import new_node
from .register_generic import (MAT_PAD, GenericTileOps, b_operand_form, generic_dot_regions,
                               product_operands, product_shape)
from .register_values import (SWIZZLE, V_BLOCK, VIEWS, Acc, column_scaled, row_scaled,
                              through_views)

PATH_NAME = "sm90-register-tile"
THREADS = 128                # one consumer warpgroup
SMEM_LIMIT = 227 * 1024      # sm_90a's block budget (two CTAs per SM up to 113 KB)
TWO_PER_SM = 113 * 1024
TILE_ALIGN = 1024            # a 128B-swizzled tile's base alignment
TRIL_PITCH = 68              # f32 row pitch of the inverse's shared tiles (64 + 4: no conflicts)
TRIL_TMP_PITCH = 24          # f32 row pitch of a warp's 16 x 16 merge block (B-operand reads
                             # of rows t + 4q, columns g: conflict-free)
GRID_PAD = 4                 # f32 elements padding each row of a 2-D cumsum's shared tile
#: a 16-row block of a per-channel decay product takes the factored product through its first
#: row where its gates fall by at most this many powers of two inside it (factors <= 2^64:
#: far from overflow, and TF32 rounding is relative); steeper blocks take exact products
STEEP_BLOCK = 64.0

_VECTOR_OPS = ("kda.add", "kda.sub", "kda.mul", "kda.div", "kda.neg", "kda.exp2", "kda.log2",
               "kda.sigmoid", "kda.softplus", "kda.rsqrt", "kda.clamp", "kda.in_range",
               "kda.select", "kda.constant", "kda.valid_rows", "kda.broadcast", "kda.convert",
               "kda.load", "kda.load_chunk", "kda.scalar", "kda.load_head",
               "kda.extract_row") + VIEWS
_ACC_ELEMENTWISE = ("kda.add", "kda.sub", "kda.mul", "kda.neg")
_OUTSIDE = ("kda.workspace", "kda.scalar", "kda.constant", "kda.load_head")


class NoMatch(Exception):
    """Why a kernel does not fit the register-tile lowering."""


class _WholeHead(NoMatch):
    """A general rule (register_generic) met in a plan that splits the value columns over
    CTAs: those rules take whole tiles, so the kernel is planned again one CTA per head."""


@dataclass
class TileSlot:
    """One TMA copy of the chunk into shared memory: a [rows, cols] tile, 128B-swizzled."""
    node: object
    mem: object
    tensor: str
    elt: str
    kind: str                    # "token" | "chunk"
    rows: int
    cols: int                    # columns this CTA loads (its value block of a [.., V] tile)
    value_cols: bool             # the tile's columns are value columns (CTA offset applies)
    heads: str | None
    offset: int = 0
    #: where its copy is issued: -1 with the chunk's first copies, else before body node
    #: ``issue`` (its bytes reused: every region there before it is dead by then)
    issue: int = -1
    #: a CTA of two chunks: where the second chunk's copy lands (RegisterTilePlan.chunks_per_cta)
    offset_b: int = -1

    @property
    def elem_bytes(self) -> int:
        return ELEM_BYTES[self.elt]

    @property
    def layout(self) -> SmemLayout:
        return SmemLayout(self.rows, self.cols, self.elem_bytes, SWIZZLE)

    @property
    def nbytes(self) -> int:
        return self.layout.size_bytes

    @property
    def param(self) -> str:
        return f"{self.tensor}_tmap_rt"

    def box(self) -> list:
        panel = self.layout.panel_cols
        return [self.rows, 1, panel] if self.kind == "token" else [1, self.rows, panel]

    def tensor_map(self) -> dict:
        return {"tensor": self.tensor, "dtype": self.elt, "flatten": 2, "box": self.box(),
                "swizzle": SWIZZLE}


@dataclass
class RegisterTilePlan:
    scan: object
    C: int
    V: int
    v_ctas: int
    slots: list = field(default_factory=list)
    vectors: int = 0             # materialised per-row vectors (C floats each)
    inverses: int = 0            # tril_inv results ([C, C] f32 in shared memory)
    grids: list = field(default_factory=list)        # 2-D cumsums ([C, N] f32, shared)
    channel_decays: list = field(default_factory=list)   # per-channel decay products (K)
    at: dict = field(default_factory=dict)       # region -> the node that creates it
    live: dict = field(default_factory=dict)     # region -> (offset, bytes, first, last node)
    staged: list = field(default_factory=list)     # products' accumulators stored as B tiles
    smem: dict = field(default_factory=dict)       # region -> byte offset
    smem_bytes: int = 0
    kinds: dict = field(default_factory=dict)      # value -> its register-tile form
    mats: list = field(default_factory=list)       # accumulators read through shared copies
    b_forms: dict = field(default_factory=dict)    # general products -> their B form
    #: products whose W is a ring tile times a factor per column -> (that ring tile's value,
    #: the [V] factor vector)
    column_factors: dict = field(default_factory=dict)
    b_stages: list = field(default_factory=list)   # general products staging their B
    outs: list = field(default_factory=list)       # token-tile stores (a staging area each)
    vec_len: int = 64                              # floats per shared vector
    warpgroups: int = 1                            # consumer warpgroups (one value block each)
    one_warpgroup: list = field(default_factory=list)   # rules used that take one warpgroup
    tuned: dict = field(default_factory=dict)      # tuning entries applied: {option: value}
    sliced_staging: bool = False                   # staged B operands one K panel at a time
    vec_mats: set = field(default_factory=set)     # vectors computed once (`_costly_vectors`)
    # chunks per CTA: 2 copies the second chunk's tiles into bytes of their own at the CTA's
    # start, so they land while the first chunk computes (its ring tiles then stay theirs for
    # the whole chunk: no other region reuses them)
    chunks_per_cta: int = 1

    @property
    def phases(self) -> list:
        """The body positions where later copies are issued (each with its own mbarrier), in
        order; the chunk's first copies (issue -1) are not among them."""
        return sorted({s.issue for s in self.slots if s.issue >= 0})

    @property
    def grid(self) -> list:
        chunks = ("max_chunks" if self.chunks_per_cta == 1 else
                  f"ceil_div(max_chunks, {self.chunks_per_cta})")
        return [f"HV * {self.v_ctas}" if self.v_ctas > 1 else "HV", "N", chunks]

    @property
    def barrier_bytes(self) -> int:
        """The mbarriers of one chunk's copies (its first copies and each later phase)."""
        return 8 * (1 + len(self.phases))

    @property
    def block_threads(self) -> int:
        return THREADS * self.warpgroups

    def tensor_maps(self) -> dict:
        return {s.param: s.tensor_map() for s in self.slots}


def cumsum_segments(C: int, N: int, threads: int) -> int:
    """Row segments per column of a [C, N] 2-D cumsum on ``threads`` threads: as many as the
    threads give each column (a power of two dividing C, each at least 8 rows), else 1."""
    segs = 1
    while N * segs * 2 <= threads and C % (segs * 2) == 0 and C // (segs * 2) >= 8:
        segs *= 2
    return segs


def cta_chunk(group, z, nchunks):
    """The chunk CTA ``z`` of the grid's z dimension takes: a reverse group's CTAs take the
    chunks last first, as the native path's do. The grid is dispatched in z order, and a
    reverse scan beside the kernel (chunk flags) waits for the last chunk first."""
    if bool(group.scans[0].attrs.get("reverse", False)):
        return (nchunks - 1) - z
    return z


def _slot_for(node, value_block: bool, v_ctas: int) -> TileSlot:
    name, elt, layout, heads, tail = mem_info(node.operands[0])
    kind = "token" if node.op == "kda.load" else "chunk"
    if (kind == "token") != (layout == "token"):
        raise NoMatch(f"{name}: a load TMA cannot express")
    if elt not in ("bf16", "f16", "f32"):
        raise NoMatch(f"{name}: element type {elt}")
    rows, cols = node.results[0].shape
    if value_block:
        if cols % (V_BLOCK * v_ctas) and cols != V_BLOCK * v_ctas:
            raise NoMatch(f"{name}: {cols} value columns")
        cols //= v_ctas
    if (cols * ELEM_BYTES[elt]) % SWIZZLE or rows % 8:
        raise NoMatch(f"{name}: a [{rows}, {cols}] {elt} tile is not whole 128-byte panels")
    return TileSlot(node, node.operands[0], name, elt, kind, rows, cols, value_block, heads)


#: how precise each product precision is (kdagen.ir.precision), for the rules' own
#: operand precisions by accuracy: a rule that gives bf16x3 (bf16 hi + lo; ~16 significant
#: bits) refuses a product asking for tf32x3 (~22): GDN's dq kernel with its row-gate decay
#: product at the bf16x3 level failed the steep-gate dA_log check (H100, 2.1e-2 against 8e-3,
#: bench/results/h100_stop57_check_dq1_full_reordered.log) while ranked level with tf32x3
_RANK = {"bf16": 0, "tf32": 1, "bf16x3": 2, "tf32x3": 3, "fma": 4}


def _precision_at_most(n, dot: str, best: str) -> None:
    """Refuse matrix op ``n`` where it asks for more precision than ``best`` (the rule's)."""
    asked = product_precision(dot, n.op, n.attrs.get("kda.precision"))
    if _RANK.get(asked, _RANK["fma"]) > _RANK[best]:
        raise NoMatch(f"{n.op} asks for {asked} products; this rule gives {best}")


def match(program, group, target: Target | None, smem_limit: int = SMEM_LIMIT,
          dot: str = "auto", warpgroups: int = 1, chunks_per_cta: int = 1) -> RegisterTilePlan:
    """The plan of chunk-parallel kernel ``group`` on this path; raises `NoMatch` saying why
    not. ``dot``: the lowering's product precision option (each rule refuses a product that
    asks for more than it gives). ``warpgroups`` > 1: one CTA per head whose consumer
    warpgroups each take one 64-column value block of the transposed products and a share of
    the columns of the others (V = 64 x warpgroups; only the rules that split so).
    ``chunks_per_cta`` 2: two chunks per CTA where the second chunk's copies fit beside the
    first's (else one)."""
    if chunks_per_cta not in (1, 2):
        raise NoMatch(f"chunks_per_cta {chunks_per_cta} (1 or 2)")
    if target is None or not all(getattr(target, c) for c in ("has_wgmma", "has_tma")):
        raise NoMatch("the chip lacks wgmma or TMA")
    if group.kind != "tile" or not group.parallel or len(group.scans) != 1:
        raise NoMatch("not a chunk-parallel kernel of one scan")
    if program.value_split > 1:
        raise NoMatch("a program split over its value columns (value_split)")
    scan = group.scans[0]
    if scan.results:
        raise NoMatch("the scan carries a value")
    for n in group.nodes:
        if n is not scan and n.op not in _OUTSIDE:
            raise NoMatch(f"{n.op} outside the scan")
    C = program.chunk_size
    V = int(program.attrs.get("head_v_dim", 0))
    if C != 64 or V % V_BLOCK:
        raise NoMatch(f"chunk size {C}, value dim {V} (needs C = 64 and V a multiple of 64)")
    # the value columns split over CTAs (V_BLOCK each) where every 2-D tile the kernel stores
    # is a [C, V] tile: a kernel storing anything else (w, kr: [C, K]) runs one CTA per head
    stores = [n for n in scan.body.nodes if n.op in ("kda.store", "kda.store_chunk")]
    value_only = all(len(n.operands[2].shape) == 2 and n.operands[2].shape[1] == V
                     for n in stores)
    # ... and where nothing V-independent is costly enough to do once per head rather than
    # once per value block (KDA's per-channel decay and gate cumsum)
    heavy = any(n.op == "kda.decay_dot" and row_gate_sources(n) is None or
                n.op == "kda.cumsum" and len(n.results[0].shape) == 2 for n in scan.body.nodes)
    v_ctas = V // V_BLOCK if value_only and not heavy else 1
    if warpgroups > 1:
        if V != V_BLOCK * warpgroups:
            raise NoMatch(f"{warpgroups} warpgroups take V = {V_BLOCK * warpgroups}, not {V}")
        plan = _plan(program, scan, C, V, 1, dot, smem_limit, warpgroups, chunks_per_cta)
        if plan.one_warpgroup:
            raise NoMatch(f"{', '.join(sorted(set(plan.one_warpgroup)))}: one warpgroup only")
        return plan
    try:
        return _plan(program, scan, C, V, v_ctas, dot, smem_limit, 1, chunks_per_cta)
    except _WholeHead:
        return _plan(program, scan, C, V, 1, dot, smem_limit, 1, chunks_per_cta)


def _plan(program, scan, C: int, V: int, v_ctas: int, dot: str, smem_limit: int,
          warpgroups: int = 1, chunks_per_cta: int = 1) -> RegisterTilePlan:
    """`match`'s plan at ``v_ctas`` CTAs per value head."""
    slots: dict = {}          # load node -> TileSlot
    plan = RegisterTilePlan(scan, C, V, v_ctas, warpgroups=warpgroups)
    kinds = plan.kinds        # value -> "ring" | "vec" | "scalar" | "tile" | "acc" | "acc_t" | ...

    def kind(v):
        k = kinds.get(v)
        if k is None:
            k = "scalar" if len(v.shape) == 0 else "vec" if len(v.shape) == 1 else None
            if k is None:
                raise NoMatch(f"{v} has no register-tile form")
        return k

    def slot(load, value_block):
        s = slots.get(load)
        if s is None:
            s = slots[load] = _slot_for(load, value_block, v_ctas)
        return s

    def general():
        # the general rules read and write whole tiles
        if v_ctas > 1:
            raise _WholeHead("a general rule")

    def materialise(v, reader):
        # an accumulator read through a shared copy, written at its first such reader
        if kinds.get(v) in ("acc", "acc_t") and v not in plan.mats:
            plan.mats.append(v)
            plan.at[f"mat{len(plan.mats) - 1}"] = reader

    def general_product(n):
        general()
        M, K, N = product_shape(n)
        if M != C or N % 16 or N > 256 or K % 16:
            raise NoMatch(f"a [{M}, {K}] x [{K}, {N}] product")
        _precision_at_most(n, dot, "tf32x3")     # tf32x3: B staged TF32 hi + lo
        w, x = n.operands[:2]
        for o in (w, x):
            if kinds.get(through_views(o)) not in ("ring", "tile", "smem", "acc", "acc_t"):
                raise NoMatch(f"{n.op}: an operand of kind {kinds.get(through_views(o))}")
        materialise(w, n)
        xn, xf = row_scaled(x)
        if xn is not None:
            slot(xn, False)
        src = through_views(x)
        if kinds.get(src) == "ring":
            slot(src.owner, False)
        form = b_operand_form(n, lambda ld: slot(ld, False).elt, kinds, dot)
        if form == "bf16" and xf:
            plan.vectors += 1
        # several warpgroups share out N: K-major B rows (8 at least each), or 64-column panels
        # of an N-major bf16 tile
        n_major = form == "bf16" and not product_operands(n)[3]
        if warpgroups > 1 and ((N // warpgroups) % 8 or n_major and N != 64 * warpgroups):
            plan.one_warpgroup.append(f"a {N}-column product")
        if form.startswith("stage"):
            materialise(x, n)
            plan.b_stages.append(n)
        plan.b_forms[n] = form
        kinds[n.results[0]] = "acc"

    body = scan.body.nodes
    for n in body:
        op = n.op
        r = n.results[0] if n.results else None
        if op in ("kda.pipeline_release", "gpu.yield"):
            continue
        if op in ("kda.load", "kda.load_chunk") and r is not None and len(r.shape) == 2:
            kinds[r] = "ring"
            continue
        if r is not None and len(r.shape) <= 1:
            if op not in _VECTOR_OPS:
                if op in ("kda.reduce_sum", "kda.cumsum"):
                    if op == "kda.cumsum" and len(n.operands[0].shape) != 1:
                        raise NoMatch("a cumsum over a tile")
                    if op == "kda.reduce_sum":
                        src, dims = n.operands[0], list(n.attrs.get("dims", ()))
                        if len(src.shape) == 1 and dims == [0]:
                            general()                   # a vector's sum
                        elif len(src.shape) != 2 or dims != [1]:
                            raise NoMatch(f"a reduction over dims {dims}")
                        elif kind(src) in ("acc", "acc_t"):
                            general()
                            if kind(src) == "acc_t":
                                materialise(src, n)
                            else:
                                plan.vectors += warpgroups - 1   # the warpgroups' partial sums
                        elif kind(src) != "tile":
                            raise NoMatch("a reduction of a tile with no register-tile form")
                        plan.vec_len = max(plan.vec_len, src.shape[0])
                    plan.vectors += 1
                    kinds[r] = "scalar" if len(r.shape) == 0 else "vec"
                    continue
                raise NoMatch(f"{op} on a vector")
            if op == "kda.extract_row" and kinds.get(n.operands[0]) == "smem":
                kinds[r] = "vec"            # a row of a shared tile
                continue
            if any(kind(o) not in ("vec", "scalar") for o in n.operands if o.kind == "tile"):
                raise NoMatch(f"{op}: a vector computed from a tile")
            kinds[r] = "scalar" if len(r.shape) == 0 else "vec"
            continue
        if op in VIEWS or (op == "kda.convert" and r.elt == "f32" and
                            kinds.get(n.operands[0]) in ("ring", "tile")):
            kinds[r] = "tile" if kinds.get(n.operands[0]) in ("ring", "tile") else \
                kinds.get(n.operands[0])
            if kinds[r] is None:
                raise NoMatch(f"{op} of an unsupported value")
            continue
        if op in ("kda.broadcast", "kda.constant"):
            kinds[r] = "bcast"
            continue
        if op == "kda.embed_row" and len(n.operands[0].shape) == 1:
            general()
            kinds[r] = "tile"            # a vector in one row, zeros elsewhere: read lazily
            continue
        if op == "kda.cumsum":
            if kinds.get(n.operands[0]) not in ("tile", "ring", "smem"):
                raise NoMatch("a cumsum of a tile that is not an expression of ring tiles")
            plan.grids.append(tuple(r.shape))
            plan.at[f"grid{len(plan.grids) - 1}"] = n
            kinds[r] = "smem"
            continue
        if op == "kda.decay_dot" and row_gate_sources(n) is None:
            # per-channel gates (KDA): column blocks factored through a reference row
            lhs, rhs = n.operands[:2]
            (ln, lf), (rn, rf) = row_scaled(lhs), row_scaled(rhs)
            if ln is None or rn is None:
                raise NoMatch("a decay product that is not of row-scaled ring tiles")
            if any(kinds.get(g) not in ("smem",) for g in n.operands[2:4]) or \
                    through_views(n.operands[2]) is not through_views(n.operands[3]):
                raise NoMatch("a decay product whose gates are not one cumsum in shared memory")
            sl, sr = slot(ln, False), slot(rn, False)
            if sl.elt != "bf16" or sr.elt != "bf16" or sl.rows != C or sr.rows != C \
                    or sl.cols != sr.cols or sl.cols % 32:
                raise NoMatch("a decay product of tiles that are not [C, K] bf16")
            _precision_at_most(n, dot, "tf32")
            plan.vectors += bool(lf) + bool(rf) + 1          # + the steep-block flags
            plan.channel_decays.append(sl.cols)
            if (C // 16) % warpgroups:
                plan.one_warpgroup.append("a per-channel decay product")
            plan.at[f"decay{len(plan.channel_decays) - 1}"] = n
            kinds[r] = "acc"
            continue
        if op == "kda.decay_dot":
            lhs, rhs = n.operands[:2]
            (ln, lf), (rn, rf) = row_scaled(lhs), row_scaled(rhs)
            if ln is None or rn is None:
                raise NoMatch("a decay product that is not of row-scaled ring tiles with one "
                              "gate per row")
            sl, sr = slot(ln, False), slot(rn, False)
            plan.vectors += bool(lf) + bool(rf)      # each operand's row factors, multiplied once
            if sl.elt != "bf16" or sr.elt != "bf16" or sl.cols != sr.cols or sl.rows != C \
                    or sr.rows != C or sl.cols % 16:
                raise NoMatch("a decay product of tiles that are not [C, K] bf16")
            kinds[r] = "acc"
            continue
        if op == "kda.tril_inv":
            _precision_at_most(n, dot, "tf32")      # its block merges: TF32 mma.sync
            if kinds.get(n.operands[0]) != "acc" or list(r.shape) != [C, C]:
                raise NoMatch("an inverse of a tile that is not a [C, C] accumulator")
            plan.inverses += 1
            plan.at[f"tril{plan.inverses - 1}"] = n
            kinds[r] = "smem"
            continue
        if op == "kda.decay_matmul":
            if row_gate_sources(n) is None:
                raise NoMatch("a decay_matmul with per-channel gates")
            general_product(n)
            continue
        if op == "kda.dot" and (n.attrs.get("transpose_lhs") or n.attrs.get("transpose_rhs")):
            general_product(n)
            continue
        if op == "kda.dot":
            lhs, rhs = n.operands
            rsrc = through_views(rhs)
            rn, rf = row_scaled(rhs)
            if kinds.get(lhs) == "smem" and rn is not None:
                # natural: A = lhs · diag(rf) from shared memory (bf16 hi + lo), B the ring tile
                _precision_at_most(n, dot, "bf16x3")
                sr = slot(rn, False)
                if sr.elt != "bf16" or sr.rows != lhs.shape[1] or sr.rows % 16 or sr.cols % 64:
                    raise NoMatch("a product whose right operand is not a [C, N] bf16 tile")
                plan.vectors += bool(rf)
                if warpgroups > 1 and sr.cols != 64 * warpgroups:
                    plan.one_warpgroup.append("a product of a shared tile")  # 64-column panels
                kinds[r] = "acc"
                continue
            if kinds.get(through_views(lhs)) == "smem" and kinds.get(rsrc) in ("tile", "smem") \
                    and rhs.shape[0] % 8 == 0 and rhs.shape[1] % 32 == 0 and rhs.shape[1] <= 256:
                # natural: A from the shared tile (TF32), B the expression staged transposed
                _precision_at_most(n, dot, "tf32")
                plan.staged.append((rhs.shape[1], rhs.shape[0]))
                plan.at[f"staged{len(plan.staged) - 1}"] = n
                if (rhs.shape[1] // warpgroups) % 8:
                    plan.one_warpgroup.append("a product of a shared tile")
                kinds[r] = "acc"
                continue
            # W is read element-wise into A fragments: an f32 ring tile, or an f16 one (the
            # fp16 checkpoints of kda-narrow-checkpoints{dtype=fp16}: exact in TF32 and in
            # bf16 hi + lo), possibly times a factor per column (their column norms): the
            # A fragment's rows are W's columns, so each A element is multiplied by its row's
            # factor, as the program does before the product
            cw, cf = column_scaled(rhs)
            if cw is not None and kinds.get(cw) == "ring" and cf.shape[0] == V:
                rsrc = cw
                plan.column_factors[n] = (cw, cf)
            if kinds.get(rsrc) != "ring" or rhs.shape[1] != V or \
                    mem_info(rsrc.owner.operands[0])[1] not in ("f32", "f16"):
                general_product(n)
                continue
            ln, lf = row_scaled(lhs)
            lsrc = through_views(lhs)
            ring_f32 = (kinds.get(lsrc) == "ring" and lhs.shape[0] == C and
                        mem_info(lsrc.owner.operands[0])[1] == "f32")
            if not (kinds.get(lhs) == "acc" or (ln is not None and slot(ln, False).elt == "bf16")
                    or ring_f32 or (kinds.get(lsrc) in ("tile", "smem") and lhs.shape[0] == C
                                    and lhs.shape[1] % 32 == 0)):
                general_product(n)
                continue
            slot(rsrc.owner, True)
            if kinds.get(lhs) == "acc":
                _precision_at_most(n, dot, "tf32")
                if list(lhs.shape) != [C, C]:
                    raise NoMatch("an accumulator operand that is not [C, C]")
                plan.staged.append(tuple(lhs.shape))
                plan.at[f"staged{len(plan.staged) - 1}"] = n
            elif ln is not None and slot(ln, False).elt == "bf16":
                _precision_at_most(n, dot, "bf16x3")     # W split bf16 hi + lo, X exact
                plan.vectors += bool(lf)
                sl = slot(ln, False)
                if sl.rows != C or sl.cols != rhs.shape[0] or sl.cols % 16:
                    raise NoMatch("a product whose left operand is not a [C, K] bf16 tile")
            elif ring_f32:
                _precision_at_most(n, dot, "tf32")      # the ring tile is the K-major B tile
                slot(lsrc.owner, False)
            elif kinds.get(lsrc) in ("tile", "smem") and lhs.shape[0] == C \
                    and lhs.shape[1] % 32 == 0:
                _precision_at_most(n, dot, "tf32")
                plan.staged.append(tuple(lhs.shape))     # an expression, staged as TF32
                plan.at[f"staged{len(plan.staged) - 1}"] = n
            kinds[r] = "acc_t"
            continue
        if op == "kda.convert" and kinds.get(n.operands[0]) in ("acc", "acc_t"):
            kinds[r] = kinds[n.operands[0]]
            continue
        if op in _ACC_ELEMENTWISE or ((op in _VECTOR_OPS or op == "kda.tril")
                                      and len(r.shape) == 2):
            ks = {kinds.get(o) for o in n.operands if o.kind == "tile"}
            accs = [kinds[o] for o in n.operands if kinds.get(o) in ("acc", "acc_t")]
            if not accs:
                if ks <= {"ring", "tile", "bcast", "smem"}:
                    kinds[r] = "tile"       # an expression of ring tiles (its users decide)
                    continue
                raise NoMatch(f"{op} of {sorted(k for k in ks if k)}")
            lead = accs[0]
            if op not in _ACC_ELEMENTWISE:
                general()
            for o in n.operands:
                k = kinds.get(o)
                if o.kind != "tile" or len(o.shape) < 2 or k == "bcast":
                    continue
                if k in ("acc", "acc_t"):
                    if k != lead:
                        general()
                        materialise(o, n)
                elif k in ("ring", "tile", "smem"):
                    general()
                else:
                    raise NoMatch(f"{op} of an accumulator and a {k} tile")
            kinds[r] = lead
            continue
        if op == "kda.convert" and kinds.get(n.operands[0]) in ("acc", "acc_t"):
            kinds[r] = kinds[n.operands[0]]
            continue
        if op == "kda.store_chunk":
            k = kinds.get(n.operands[2], "vec" if len(n.operands[2].shape) <= 1 else None)
            if k not in ("acc", "acc_t", "smem", "tile", "vec", "scalar"):
                raise NoMatch(f"a chunk store of a {k} value")
            if k == "acc_t":
                general()
            if k == "tile":
                ln, lf = row_scaled(n.operands[2])
                if ln is not None:
                    slot(ln, False)
                    plan.vectors += bool(lf)
            continue
        if op == "kda.store":
            v = n.operands[2]
            k = kinds.get(v, "vec" if len(v.shape) == 1 else None)
            name, elt, layout, heads, tail = mem_info(n.operands[0])
            if layout != "token" or (elt != "bf16" and len(v.shape) == 2):
                raise NoMatch(f"a store to {name} ({layout}, {elt})")
            if k == "acc_t":
                plan.outs.append(n)
            elif k == "acc":
                general()
                plan.outs.append(n)
            elif k == "vec" and v.shape[0] == C:
                general()
            else:
                raise NoMatch(f"a store of a {k} value")
            continue
        raise NoMatch(f"{op} in the chunk")
    for n in body:
        if n.op in ("kda.load", "kda.load_chunk") and n.results and \
                len(n.results[0].shape) == 2 and n not in slots and n.results[0].uses:
            slot(n, False)          # read by element-wise expressions only
    plan.slots = sorted(slots.values(), key=lambda s: s.node.index)
    # every copy at the chunk's start; where that does not fit, workspace tiles copied where
    # their bytes come free, then staged B operands a K panel at a time as well, then the
    # chunk step re-ordered so that workspace tiles are first read as late as they can be
    saved = _snapshot(scan.body)
    # two chunks per CTA first where asked: the plan as programmed, every ring tile kept for
    # its chunk and a second set for the next chunk (none of the tight plans' deferred copies)
    if chunks_per_cta == 2:
        plan.smem, plan.live, plan.chunks_per_cta = {}, {}, 2
        off = _place_regions(plan, body, kinds, C, V, v_ctas, prefetch=True)
        off = _vectors_and_barriers(plan, off)
        if off <= smem_limit:
            return plan
        plan.chunks_per_cta = 1
    for defer, sliced, late in ((False, False, False), (True, False, False),
                                (True, True, False), (True, True, True)):
        if late:
            # terms ordered by when the schedule makes them, then scheduled again; costly
            # vectors computed once (a barrier each: not worth it in the kernels that fit as
            # programmed, by the cost model)
            _late_workspace_reads(scan.body, plan.slots, kinds)
            _sums_by_availability(scan.body, kinds)
            plan.vectors += _row_sums_by_term(scan.body, kinds, warpgroups)
            body = _late_workspace_reads(scan.body, plan.slots, kinds)
            plan.vec_mats = _costly_vectors(body, kinds)
            plan.vectors += len(plan.vec_mats)
            plan.vec_len = max([plan.vec_len] + [v.shape[0] for v in plan.vec_mats])
        plan.smem, plan.live, plan.sliced_staging = {}, {}, sliced
        for s in plan.slots:
            s.issue = -1
        off = _place_regions(plan, body, kinds, C, V, v_ctas, defer)
        off = _vectors_and_barriers(plan, off)
        if off <= smem_limit:
            return plan
    # the kernel keeps the native path: it lowers the step as programmed (order and sums)
    _restore(scan.body, saved)
    raise NoMatch(f"{off} bytes of shared memory (limit {smem_limit})")


def _vectors_and_barriers(plan: RegisterTilePlan, off: int) -> int:
    """Place the shared vectors and the copies' mbarriers (a set per chunk of the CTA) from
    byte ``off``; returns (and records) the plan's shared bytes."""
    plan.smem["vectors"] = off
    off += 4 * plan.vec_len * max(plan.vectors, 1)
    plan.smem["barrier"] = off
    off += plan.barrier_bytes * plan.chunks_per_cta + 8
    plan.smem_bytes = off
    return off


def _snapshot(block) -> tuple:
    """The step's order and every op's operands (and so every value's readers), to undo the
    tight plan's re-ordering and re-association (`_restore`)."""
    nodes = list(block.nodes)
    return nodes, [(list(n.operands), n.op, dict(n.attrs)) for n in nodes], \
        {id(v): (v, list(v.uses)) for n in nodes for v in list(n.operands) + list(n.results)}


def _restore(block, saved: tuple) -> None:
    nodes, operands, uses = saved
    block.nodes[:] = nodes
    for n, (ops, op, attrs) in zip(nodes, operands):
        n.operands[:] = ops
        n.op, n.attrs = op, attrs
    for v, us in uses.values():
        v.uses[:] = us


#: vector ops that cost more than an add each time a lazy expression evaluates them
_COSTLY_VECTOR_OPS = ("kda.exp2", "kda.log2", "kda.sigmoid", "kda.softplus", "kda.rsqrt",
                      "kda.div", "kda.load", "kda.load_head")


def _costly_vectors(body: list, kinds: dict) -> set:
    """The f32 vectors worth computing once into shared memory: a vector is a lazy expression
    evaluated wherever an element is read, and a tile reading it through a broadcast reads
    each row's element once per column (gdn_bwd's dk kernel evaluated its gate's exp2 and
    softplus, and the L2 norms' rsqrt, ~500 times per thread). Those whose expression holds an
    exponential, a division, a square root or a global load, read by a tile op."""
    inside = set(body)
    costly: dict = {}

    def is_costly(v) -> bool:
        if v in costly:
            return costly[v]
        o = v.owner
        c = False
        if o is not None and o in inside and len(v.shape) <= 1 and \
                o.op not in ("kda.reduce_sum", "kda.cumsum"):
            c = o.op in _COSTLY_VECTOR_OPS or any(
                is_costly(x) for x in o.operands if x.kind == "tile" and len(x.shape) <= 1)
        costly[v] = c
        return c
    out = set()
    for n in body:
        if not n.results or len(n.results[0].shape) != 1 or kinds.get(n.results[0]) != "vec":
            continue
        r = n.results[0]
        if r.elt != "f32" or n.op in VIEWS or n.op in ("kda.reduce_sum", "kda.cumsum"):
            continue
        if any(u in inside and u.results and len(u.results[0].shape) == 2 for u, _ in r.uses) \
                and is_costly(r):
            out.add(r)
    return out


#: the value kinds evaluated where they are used (their operands stay live until then)
_LAZY_KINDS = ("ring", "tile", "bcast")


def _place_regions(plan: RegisterTilePlan, body: list, kinds: dict, C: int, V: int,
                   v_ctas: int, defer: bool = False, prefetch: bool = False) -> int:
    """Byte offsets of the kernel's shared regions (``plan.smem``, the slots' ``offset``), by
    first fit over their live ranges in body order: a ring tile lives from the copies at the
    start to its last reader (through lazy expressions), a product's staged operand and a
    decay's blocks within their op, a shared tile from its op to its last reader. Returns the
    end of the regions. ``prefetch``: every ring tile lives for the whole chunk, and a second
    set of them (the next chunk's, ``offset_b``) too."""
    index = {n: i for i, n in enumerate(body)}

    def last_use(v, seen=None) -> int:
        seen = set() if seen is None else seen
        last = -1
        for u, _ in v.uses:
            if u not in index or u.op == "kda.pipeline_release" or u in seen:
                continue
            seen.add(u)
            last = max(last, index[u])
            r = u.results[0] if u.results else None
            lazy = r is not None and (kinds.get(r) in _LAZY_KINDS or (
                len(r.shape) <= 1 and u.op not in ("kda.reduce_sum", "kda.cumsum")))
            if lazy:
                last = max(last, last_use(r, seen))
        return last

    def first_read(v) -> int:
        # the first op reading ``v`` other than through views
        first = len(body)
        for u, _ in v.uses:
            if u not in index or u.op == "kda.pipeline_release":
                continue
            r = u.results[0] if u.results else None
            first = min(first, first_read(r) if u.op in VIEWS and r is not None
                        else index[u])
        return first

    regions = []        # (name, bytes, first, last, alignment)
    for k, s in enumerate(plan.slots):
        # a workspace tile lives from its load op (copied there, or earlier where its bytes
        # are free: `_issue_points`), so tiles read late reuse the bytes of tiles read early;
        # token tiles come with the chunk's first copies (their rows past the sequence end
        # are zeroed once, after those copies land)
        first = first_read(s.node.results[0]) if defer and s.kind == "chunk" else -1
        last = len(body) if prefetch else last_use(s.node.results[0])
        regions.append((s, s.nbytes, first, last, TILE_ALIGN))
        if prefetch:
            regions.append((f"next{k}", s.nbytes, -1, len(body), TILE_ALIGN))
    for i, shape in enumerate(plan.staged):
        at = index[plan.at[f"staged{i}"]]
        regions.append((f"staged{i}", shape[0] * shape[1] * 4, at, at, TILE_ALIGN))
    for i, K in enumerate(plan.channel_decays):
        at = index[plan.at[f"decay{i}"]]
        # a [16, K] f32 B tile per column block, and the exact diagonal blocks [C, 16]
        regions.append((f"decay_b{i}", (C // 16) * 16 * K * 4, at, at, TILE_ALIGN))
        regions.append((f"decay_diag{i}", C * 17 * 4, at, at, 16))
    for i, shape in enumerate(plan.grids):
        n = plan.at[f"grid{i}"]
        regions.append((f"grid{i}", shape[0] * (shape[1] + GRID_PAD) * 4, index[n],
                        last_use(n.results[0]), 16))
    for i in range(plan.inverses):
        n = plan.at[f"tril{i}"]
        # the strictly lower input, the inverse (rows padded against bank conflicts) and a
        # 16 x 16 scratch block per warp for the block merges
        regions.append((f"tril_x{i}", C * TRIL_PITCH * 4, index[n], index[n], 16))
        regions.append((f"tril_out{i}", C * TRIL_PITCH * 4, index[n], last_use(n.results[0]),
                        16))
        regions.append((f"tril_tmp{i}", 4 * 16 * TRIL_TMP_PITCH * 4, index[n], index[n], 16))
    for i, n in enumerate(plan.outs):
        width = n.operands[2].shape[1] // (v_ctas if kinds.get(n.operands[2]) == "acc_t" else 1)
        regions.append((f"out{i}", C * width * 2, index[n], index[n], 16))
    for i, v in enumerate(plan.mats):
        # an accumulator's shared copy: from the accumulator to its last reader
        R, N = v.shape
        regions.append((f"mat{i}", R * (N + MAT_PAD) * 4, index[plan.at[f"mat{i}"]],
                        last_use(v), 16))
    for i, n in enumerate(plan.b_stages):
        regions.append((f"bstage{i}", generic_dot_regions(n, plan.b_forms[n],
                                                          plan.sliced_staging),
                        index[n], index[n], TILE_ALIGN))
    # first fit over three orders (by first use, largest first, longest lived first):
    # whichever ends lowest
    orders = [sorted(regions, key=lambda r: (r[2], -r[1])),
              sorted(regions, key=lambda r: (-r[1], r[2])),
              sorted(regions, key=lambda r: (r[2] - r[3], -r[1]))]
    best = None
    for order in orders:
        placed, offsets, end = [], {}, 0   # placed: (offset, bytes, first, last)
        for name, size, first, last, align in order:
            off = 0
            for o, b, f, l in sorted(placed):
                if l < first or last < f:
                    continue                          # not live at the same time
                if off + size <= o:
                    break
                off = max(off, -(-(o + b) // align) * align)
            placed.append((off, size, first, last))
            offsets[id(name) if isinstance(name, TileSlot) else name] = (off, size, first, last)
            end = max(end, off + size)
        if best is None or end < best[0]:
            best = (end, offsets)
    end, offsets = best
    for name, size, first, last, align in regions:
        off, size, first, last = offsets[id(name) if isinstance(name, TileSlot) else name]
        plan.live[name.tensor if isinstance(name, TileSlot) else name] = (off, size, first, last)
        if isinstance(name, TileSlot):
            name.offset = off
        else:
            plan.smem[name] = off
    for k, s in enumerate(plan.slots):
        s.offset_b = plan.smem.get(f"next{k}", -1)
    if defer:
        _issue_points(plan.slots, offsets)
    return -(-end // 16) * 16


def _late_workspace_reads(block, slots: list, kinds: dict) -> list:
    """Re-order the chunk step (``block.nodes``, in place) for the kernels that do not fit
    as programmed: a list schedule that, among the ready ops, runs

    1. an op that frees accumulator registers (the last reader of accumulators, net of the one
       it makes: a store, a sum folding a product in), most freed first;
    2. then an op reading no workspace tile not yet read;
    3. then the rest; ties in program order.

    So each workspace tile is first read as late as the dependencies allow and tiles read
    early die before the next one's copy lands (gdn_bwd's dk kernel: the state checkpoints S
    and dS no longer share the step with the tiles v' comes from), and accumulators are
    consumed soon after they are made (ptxas spilled that kernel's in program order). Each op
    computes what it did from the same operands, so results are bitwise the same; the
    dependencies are the native path's schedule's (`schedule.list_schedule`)."""
    from .schedule import list_schedule
    nodes = [n for n in block.nodes if n.op != "gpu.yield"]
    tail = [n for n in block.nodes if n.op == "gpu.yield"]
    loads = {s.node.results[0] for s in slots if s.kind == "chunk"}
    inside = set(nodes)

    def tiles_read(n) -> set:
        if n.op in VIEWS or n.op == "kda.pipeline_release":
            return set()
        return {through_views(o) for o in n.operands if through_views(o) in loads}

    def acc_bytes(v) -> int:
        return 4 * v.numel if kinds.get(v) in ("acc", "acc_t") else 0

    readers_left = {}
    for n in nodes:
        for o in set(n.operands):
            if acc_bytes(o) and n.op != "kda.pipeline_release":
                readers_left[o] = readers_left.get(o, 0) + 1

    def stored_only(v) -> bool:
        return bool(v.uses) and all(u.op in ("kda.store", "kda.store_chunk") for u, _ in v.uses)

    def freed(n) -> int:
        gone = sum(acc_bytes(o) for o in set(n.operands)
                   if acc_bytes(o) and readers_left.get(o) == 1 and o.owner in inside)
        # a conversion read only by stores: its registers go with the store right after
        return gone - sum(acc_bytes(r) for r in n.results if not stored_only(r))

    position = {n: i for i, n in enumerate(nodes)}
    opened: set = set()

    def taken(n):
        opened.update(tiles_read(n))
        if n.op != "kda.pipeline_release":
            for o in set(n.operands):
                if o in readers_left:
                    readers_left[o] -= 1
    order = list_schedule(nodes, lambda ready: min(ready, key=lambda m: (
        -max(freed(m), 0), bool(tiles_read(m) - opened), position[m])), taken)
    block.nodes[:] = order + tail
    return block.nodes


def _sums_by_availability(block, kinds: dict) -> None:
    """Re-associate each sum of three or more accumulators (a tree of kda.add whose inner sums
    have no other reader) into a chain that adds the terms in the order they are made, so a
    term made early joins the running sum then instead of holding its registers until the
    program's order reaches it (gdn_bwd's dk kernel sums five products into dk and six into
    the gate's gradient: in program order ten [64, 128] accumulators were live at once, more
    than a thread's 255 registers). fp32 addition in another order: not bitwise the program
    order's sums."""
    nodes = block.nodes
    position = {n: i for i, n in enumerate(nodes)}
    inside = set(nodes)

    def is_sum(n) -> bool:
        if n.op != "kda.add" or n not in inside:
            return False
        k = kinds.get(n.results[0])
        return k in ("acc", "acc_t") and all(
            kinds.get(o) == k or kinds.get(o) not in ("acc", "acc_t") for o in n.operands)

    def inner(v) -> bool:
        # a partial sum read only by one sum of the same tree
        return v.owner is not None and is_sum(v.owner) and len(v.uses) == 1 and \
            is_sum(v.uses[0][0])

    for root in [n for n in nodes if is_sum(n) and not inner(n.results[0])]:
        adds, terms = _sum_tree(root, inner)
        if len(terms) < 3:
            continue
        # accumulators in the order they are made; the lazy terms (expressions of shared
        # tiles, evaluated where added) join the first, so every sum has an accumulator
        accs = sorted((v for v in terms if kinds.get(v) in ("acc", "acc_t")),
                      key=lambda v: position.get(v.owner, -1))
        terms = accs[:1] + [v for v in terms if kinds.get(v) not in ("acc", "acc_t")] + accs[1:]
        chain = sorted((a for a in adds if a is not root), key=lambda a: position[a]) + [root]
        for a in adds:
            for i, o in enumerate(a.operands):
                o.uses.remove((a, i))
        running = terms[0]
        for a, t in zip(chain, terms[1:]):
            a.operands[:] = [running, t]
            for i, o in enumerate(a.operands):
                o.uses.append((a, i))
            running = a.results[0]


def _row_sums_by_term(block, kinds: dict, warpgroups: int) -> int:
    """A row sum of a sum of accumulators (``reduce_sum(t0 + t1 + ...)`` over the columns,
    the sum read by nothing else) becomes the sum of the terms' row sums: each term is
    reduced when it is made and its registers go with it, instead of a [64, N] partial sum
    held until the last term (gdn_bwd's dk kernel: the gate gradient's six terms). The
    reduce op itself becomes the last vector add, so its readers are unchanged. fp32 sums in
    another order. Returns the shared vectors it adds to the plan's count."""
    nodes = block.nodes
    inside = set(nodes)
    extra = 0
    for u in [n for n in nodes if n.op == "kda.reduce_sum"]:
        src = u.operands[0]
        root = src.owner
        if list(u.attrs.get("dims", ())) != [1] or root is None or root not in inside or \
                root.op != "kda.add" or len(src.uses) != 1 or \
                kinds.get(src) not in ("acc", "acc_t"):
            continue
        adds, terms = _sum_tree(root, lambda o: (
            o.owner is not None and o.owner in inside and o.owner.op == "kda.add"
            and len(o.uses) == 1 and kinds.get(o) == kinds.get(src)))
        if len(terms) < 3 or any(len(t.shape) != 2 for t in terms):
            continue
        for a in adds:
            for i, o in enumerate(a.operands):
                o.uses.remove((a, i))
            nodes.remove(a)
        src.uses.remove((u, 0))
        at = nodes.index(u)
        shape = u.results[0].shape

        def vector(op, operands, attrs=None):
            nonlocal at
            r = new_node(block, op, operands, shape, attrs=attrs, at=at, index=u.index,
                         prefix="rowsum")
            at += 1
            kinds[r] = "vec"
            return r
        sums = [vector("kda.reduce_sum", [t], {"dims": [1]}) for t in terms]
        extra += sum(warpgroups if kinds.get(t) == "acc" else 1 for t in terms)
        running = sums[0]
        for v in sums[1:-1]:
            running = vector("kda.add", [running, v])
        u.op, u.attrs = "kda.add", {}
        u.operands[:] = [running, sums[-1]]
        running.uses.append((u, 0))
        sums[-1].uses.append((u, 1))
        extra -= warpgroups if kinds.get(src) == "acc" else 1     # the reduce it replaces
    return extra


def _sum_tree(root, inner) -> tuple:
    """(the kda.add nodes, the terms) of the sum tree under ``root``: an operand ``o`` with
    ``inner(o)`` is a partial sum of the tree, walked into; any other is a term."""
    adds, terms = [], []

    def walk(n):
        adds.append(n)
        for o in n.operands:
            if inner(o):
                walk(o.owner)
            else:
                terms.append(o)
    walk(root)
    return adds, terms


def _issue_points(slots: list, offsets: dict) -> None:
    """Each workspace tile's copy as early as its bytes allow: right after the last op that
    reads a region overlapping them before the tile's own load op (-1, the chunk's first
    copies, where none does). ``offsets``: region key -> (offset, bytes, first, last) as
    placed, which keeps overlapping regions' live ranges apart, so none of them is live from
    there to the tile's last reader."""
    for s in slots:
        if s.kind != "chunk":
            continue
        off, size, first, _ = offsets[id(s)]
        ends = [l for o, b, f, l in offsets.values()
                if o < off + size and off < o + b and l < first]
        s.issue = max(ends) + 1 if ends else -1


def _moved_stores(body: list, kinds: dict) -> set:
    """ids of the chunk stores `_early_stores` moves up to the op making their accumulator."""
    return {id(n) for n in body if n.op == "kda.store_chunk"
            and kinds.get(n.operands[2]) in ("acc", "acc_t") and n.operands[2].owner in body}


def _early_stores(body: list, kinds: dict) -> list:
    """The body in emission order: a chunk store of an accumulator right after the op that
    makes it, not where the schedule put it (often the end of the chunk), so the accumulator's
    registers are free from there on (nothing in the kernel reads what it stores)."""
    moved = {}
    for n in body:
        if n.op == "kda.store_chunk" and kinds.get(n.operands[2]) in ("acc", "acc_t") \
                and n.operands[2].owner in body:
            moved.setdefault(n.operands[2].owner, []).append(n)
    late = {id(s) for stores in moved.values() for s in stores}
    out = []
    for n in body:
        if id(n) not in late:
            out.append(n)
            out.extend(moved.get(n, ()))
    return out


class RegisterTileEmitter(GenericTileOps, SharedMemoryKernelEmitter):
    """Emits a chunk-parallel kernel as described in the module doc."""

    path = PATH_NAME

    def __init__(self, program, group, opts, target: Target, plan: RegisterTilePlan):
        target.require("has_wgmma", "the register-tile lowering (wgmma + TMA)")
        target.require("has_tma", "the register-tile lowering (wgmma + TMA)")
        super().__init__(program, group, None, "smem", opts)
        self.target = target
        self.rplan = plan
        self.slot_of = {s.node: s for s in plan.slots}
        #: publish a chunk-ready flag after the chunk's stores (kernel.prepare sets it where a
        #: register scan runs beside this kernel: kdagen.codegen.lower.chunk_flags)
        self.publish_flags = False
        self.flag_value = 1
        self._buffer = 0             # the CTA's chunk being lowered (its copies' bytes)

    def params(self):
        ps = super().params()
        if self.publish_flags:
            ps.append(Param(FLAGS_PARAM, "ptr", "i32"))
        return ps

    @property
    def consumer_threads(self) -> int:
        return self.threads

    @property
    def threads(self) -> int:
        return THREADS * self.rplan.warpgroups

    def _parts(self, cols: int) -> list:
        """The 64-column value blocks of a transposed product this thread's warpgroup
        computes: all of ``cols`` with one warpgroup, else its own (a run-time index)."""
        if self.rplan.warpgroups == 1:
            return list(range(cols // V_BLOCK))
        return [self.wg]

    def _first_warpgroup(self, cond):
        """``cond`` and, with several warpgroups, being in the first (work done by warp
        index within a warpgroup, once)."""
        if self.rplan.warpgroups == 1:
            return cond
        return B.band(cond, B.icmp("eq", self.wg, 0))

    def _value_col0(self):
        """The first logical value column of this warpgroup's transposed accumulators."""
        if self.rplan.warpgroups == 1:
            return self.cta_v0
        return self.cta_v0 + self.wg * V_BLOCK

    # -- kernel ------------------------------------------------------------------------------
    def emit_mlir(self, builder, name: str, count_cost: bool = True) -> None:
        rp = self.rplan
        cost = self.cost = CostCounter() if count_cost else NullCounter()
        with builder.kernel(name, self.params(), (self.threads, 1, 1)) as p:
            with B.use(MlirBackend(cost=cost)):
                from kdagen._mlir import nvvm
                i32 = IntVal(thread_idx("x")).value.type
                tid = IntVal(thread_idx("x"))
                bx = IntVal(block_idx("x"))
                self.cta_v0 = (bx % rp.v_ctas) * V_BLOCK if rp.v_ctas > 1 else 0
                coords = dict(tid=tid, hv=bx // rp.v_ctas if rp.v_ctas > 1 else bx,
                              n=IntVal(block_idx("y")), z=IntVal(block_idx("z")),
                              grid=(IntVal(nvvm.read_ptx_sreg_nctaid_x(results=[i32])),
                                    IntVal(nvvm.read_ptx_sreg_nctaid_y(results=[i32]))))
                p = {k: (IntVal(v) if k in ("T", "N", "HV") else v) for k, v in p.items()}
                smem_mod.declare_dynamic_smem(builder)
                self.smem_base = llvm.mlir_addressof(smem_mod.shared_ptr_type(),
                                                     smem_mod.DYNAMIC_SMEM_SYMBOL)
                self.p = p
                self.p_flags = p.get(FLAGS_PARAM)
                self.env = {}
                self.init_gate_checks(None)
                self.geo = Geometry(self.program, p, coords, need_chunk_off=True)
                self.coords = coords
                self.bind_memrefs(p)
                self.tid, self.warp, self.lane = tid, (tid // 32) % 4, tid % 32
                self.wg = tid // THREADS            # the consumer warpgroup
                z = coords["z"]
                with cost.chunk_step():
                    if rp.chunks_per_cta == 1:
                        chunk = cta_chunk(self.group, z, self.geo.nchunks)
                        B.if_then(B.icmp("lt", z, self.geo.nchunks),
                                  lambda: self._chunk(chunk, [(chunk, None)]))
                    else:
                        self._two_chunks(z)
        set_launch_bounds(builder, name,
                          min_blocks_per_sm=2 if rp.smem_bytes <= TWO_PER_SM else 1)

    def _region_barrier(self) -> None:
        """Before an op writes a shared region: regions share bytes with regions an earlier
        op read (`_place_regions`), and a warp may still be reading those."""
        bar.sync_threads()
        self.cost.event("bar.sync")

    def _full(self, phase: int = -1, buffer: int | None = None):
        """The mbarrier of the chunk's first copies (phase -1) or of later copy phase
        ``phase`` (RegisterTilePlan.phases), of the CTA's chunk ``buffer`` (default: the one
        being lowered)."""
        buffer = self._buffer if buffer is None else buffer
        at = self.rplan.smem["barrier"] + self.rplan.barrier_bytes * buffer + 8 * (phase + 1)
        return smem_mod.SmemRegion(self.smem_base, at, 8)

    def _wait_for_copies(self, n, deferred: dict) -> None:
        """Before op ``n``: wait for the copy phases of the later-copied tiles it reads."""
        if not deferred or n.op in VIEWS or n.op == "kda.pipeline_release":
            return
        for o in n.operands:
            k = deferred.get(through_views(o))
            if k is not None and k not in self._waited:
                self._waited.add(k)
                bar.mbarrier_wait(self._full(k), 0)
                self.cost.event("mbarrier.wait")

    def _issue_phase(self, k: int, at: int, maps: dict, c) -> None:
        """Copy phase ``k`` (issued before body position ``at``): every thread is past the
        last reader of the bytes it overwrites (the barrier; the fence orders their generic
        accesses before the async proxy's writes), then one thread issues its copies."""
        slots = [s for s in self.rplan.slots if s.issue == at]
        bar.fence_proxy_async_shared()
        bar.sync_threads()
        self.cost.event("bar.sync")
        full = self._full(k)

        def issue():
            bar.mbarrier_arrive_expect_tx(full, sum(s.nbytes for s in slots))
            for s in slots:
                self._copy(s, maps[s.param], c, full)
        B.if_then(B.icmp("eq", self.tid, 0), issue)

    def _two_chunks(self, z) -> None:
        """CTA ``z`` of a plan of two chunks per CTA: chunks 2z and 2z + 1 (each where the
        sequence has it), both chunks' copies issued at the start, each into its own bytes,
        so the second chunk's land while the first computes."""
        n = self.geo.nchunks
        first, second = cta_chunk(self.group, z * 2, n), cta_chunk(self.group, z * 2 + 1, n)
        has_second = B.icmp("lt", z * 2 + 1, n)

        def both():
            # inside the first chunk's condition: its copies need none of their own
            self._chunk(first, [(first, None), (second, has_second)])
            bar.sync_threads()       # the first chunk's regions read before the second's writes
            self.cost.event("bar.sync")
            with self._second_buffer():
                B.if_then(has_second, lambda: self._chunk(second, None))
        B.if_then(B.icmp("lt", z * 2, n), both)

    @contextlib.contextmanager
    def _second_buffer(self):
        """Lower under the second chunk's copies: its ring tiles and mbarriers."""
        slots = self.rplan.slots
        saved = [s.offset for s in slots]
        for s in slots:
            s.offset = s.offset_b
        self._buffer = 1
        try:
            yield
        finally:
            for s, off in zip(slots, saved):
                s.offset = off
            self._buffer = 0

    def _issue_first_copies(self, chunks: list, maps: dict) -> None:
        """Initialise the mbarriers of every chunk of the CTA and issue each chunk's first
        copies (``chunks``: [(chunk, whether the sequence has it, or None)], one per buffer)."""
        rp = self.rplan
        first = [s for s in rp.slots if s.issue < 0]

        def issue():
            for b in range(len(chunks)):
                for k in range(-1, len(rp.phases)):
                    bar.mbarrier_init(self._full(k, b), 1)
            bar.fence_mbarrier_init()
            for b, (c, valid) in enumerate(chunks):
                def copies(b=b, c=c):
                    full = self._full(-1, b)
                    bar.mbarrier_arrive_expect_tx(full, sum(s.nbytes for s in first))
                    for s in first:
                        self._copy(s, maps[s.param], c, full, s.offset if b == 0 else s.offset_b)
                if valid is None:
                    copies()
                else:
                    B.if_then(valid, copies)
        B.if_then(B.icmp("eq", self.tid, 0), issue)
        bar.sync_threads()           # the barriers are initialised before anyone waits on them
        self.cost.event("bar.sync")

    def _chunk(self, c, first_copies: list | None) -> None:
        """One chunk's step; ``first_copies``: the CTA's chunks whose first copies to issue
        first (None: issued already, by the CTA's first chunk)."""
        rp = self.rplan
        self._c = c
        full = self._full()
        maps = {s.param: tma.tensormap_pointer(self.target, self.p[s.param]) for s in rp.slots}
        phases = rp.phases
        if first_copies is not None:
            self._issue_first_copies(first_copies, maps)
        # values defined outside the scan (scalars, per-head parameters)
        for n in self.group.nodes:
            if n is rp.scan:
                break
            if n.op != "kda.workspace" and n.results:
                self.env[n.results[0]] = self.expr(n)
        self.env[rp.scan.body.args[0]] = c
        self._column_factor_values = self._prefetch_column_factors()
        bar.mbarrier_wait(full, 0)
        self.cost.event("mbarrier.wait")
        self._zero_rows_past_the_end(c)
        self._vectors = 0
        self._staged = 0
        self._inverses = 0
        self._grids = 0
        self._decays = 0
        self._fused: dict = {}
        self._mats: dict = {}          # accumulator -> its shared copy (register_generic)
        self._reg_values: dict = {}    # (value, points) -> its values there
        self._point_sets = 0
        self._outs = 0
        self._waited = set()           # copy phases waited for
        position = {id(n): i for i, n in enumerate(rp.scan.body.nodes)}
        moved = _moved_stores(rp.scan.body.nodes, rp.kinds)
        # a later copy phase is waited for before the first op reading one of its tiles (the
        # position its placement starts from), not at the load op, which may come first
        deferred = {s.node.results[0]: phases.index(s.issue) for s in rp.slots
                    if s.issue >= 0}
        issued = 0
        for n in _early_stores(rp.scan.body.nodes, rp.kinds):
            at = position[id(n)]
            # a chunk store moved up to its accumulator reads registers only: it does not
            # mark the body position the copy phases wait for
            while issued < len(phases) and phases[issued] <= at and id(n) not in moved:
                self._issue_phase(issued, phases[issued], maps, c)
                issued += 1
            self._wait_for_copies(n, deferred)
            label = op_label(n)
            with self.cost.op(label), B.op_scope(label):
                self._node(n)
        if self._vectors > max(rp.vectors, 1):
            raise LoweringError(f"register tiles: {self._vectors} shared vectors used, "
                                f"{rp.vectors} planned")
        if self.publish_flags:
            publish_chunk_ready(self.target, self.p_flags, self.geo.chunk_row(c),
                                self.flag_value, self.tid, self.cost, self.opts.flag_fence)

    def _zero_rows_past_the_end(self, c) -> None:
        """Zero the rows of the token tiles past the sequence end (the last chunk of a
        sequence): TMA copies the next sequence's tokens there (or zeros past the tensor), and
        the products read the tiles straight from shared memory, so a contraction over tokens
        would otherwise take them in."""
        tokens = [s for s in self.rplan.slots if s.kind == "token"]
        if not tokens:
            return
        geo, C = self.geo, self.rplan.C
        valid = geo.seqlen - c * C

        def zero():
            for s in tokens:
                lay = s.layout
                per_panel = s.rows * (SWIZZLE // 16)                  # 16-byte pieces
                chunks = lay.num_panels * per_panel
                for it in range(-(-chunks // self.threads)):
                    e = self.tid + it * self.threads
                    panel, rest = e // per_panel, e % per_panel
                    row = rest // (SWIZZLE // 16)
                    at = (s.offset + panel * lay.panel_bytes) // 4 + rest * 4
                    cond = B.icmp("ge", row, valid)
                    if chunks % self.threads:
                        cond = B.band(cond, B.icmp("lt", e, chunks))
                    # a whole 128-byte row of a panel: where the swizzle puts its pieces
                    # does not matter
                    B.if_then(cond, lambda at=at: B.store_vec(self.smem_base, at,
                                                              [B.f(0.0)] * 4, "f32"))
        B.if_then(B.icmp("lt", valid, C), zero)
        bar.fence_proxy_async_shared()       # before wgmma reads them (the async proxy)
        bar.sync_threads()
        self.cost.event("bar.sync")

    def _copy(self, s: TileSlot, tmap, c, full, offset: int | None = None) -> None:
        geo = self.geo
        lay = s.layout
        offset = s.offset if offset is None else offset
        for pn in range(lay.num_panels):
            dst = byte_gep(self.smem_base, offset + pn * lay.panel_bytes, shared_ptr_type())
            inner = pn * lay.panel_cols + (self.cta_v0 if s.value_cols else 0)
            if s.kind == "token":
                ratio = self.program.gva_ratio
                grouped = (s.node.attrs.get("head_map") == "grouped" and s.heads == "qk"
                           and ratio > 1)
                head = geo.hv // ratio if grouped else geo.hv
                crd = [inner, head, B.narrow(geo.start + B.wide(c * geo.C))]
            else:
                crd = [inner, 0, B.narrow(geo.chunk_row(c))]
            tma.tma_load(self.target, dst, tmap, crd, full)
            self.cost.event("tma.load")

    # -- values ------------------------------------------------------------------------------
    def _ring_ref(self, s: TileSlot) -> T_.Ref:
        """Element reads of a ring tile (logical [rows, all columns] coordinates; a value-block
        tile is read at its own columns only). Token rows past the sequence end read 0: they
        are zeroed in shared memory before the step (`_zero_rows_past_the_end`), so a read
        needs no mask of its own (a select per element: 558 of the dq kernel's 8808 SASS
        instructions)."""
        lay = s.layout
        eb = s.elem_bytes

        def offset(row, col):
            if s.value_cols:
                col = col - self.cta_v0
            return (s.offset + lay.byte_offset(row, col)) // eb

        def read(idx):
            row, col = idx
            return B.load(self.smem_base, offset(row, col), s.elt)

        def vec(idx, n):
            # n consecutive columns from a multiple of n stay in one 16-byte swizzle chunk
            row, col = idx          # col: a multiple of n (the read_vec contract)
            piece = 16 // eb        # elements of one 16-byte swizzle chunk
            if n * eb > 16 and n % piece == 0:
                # several whole chunks (each where the swizzle puts it): one load each
                return [x for c in range(0, n, piece)
                        for x in B.load_vec(self.smem_base, offset(row, col + c), piece, s.elt)]
            if 16 % (n * eb):
                return [read([row, col + c]) for c in range(n)]
            return B.load_vec(self.smem_base, offset(row, col), n, s.elt)
        return T_.FnRef((s.rows, s.cols), read, vec=vec)

    def _node(self, n) -> None:
        op, env = n.op, self.env
        r = n.results[0] if n.results else None
        if op in ("kda.pipeline_release", "gpu.yield"):
            return
        if op in ("kda.load", "kda.load_chunk") and r is not None and len(r.shape) == 2:
            s = self.slot_of.get(n)
            env[r] = self._ring_ref(s) if s is not None else None
            return
        if op == "kda.reduce_sum":
            src = n.operands[0]
            if len(src.shape) == 1:
                env[r] = self._vector_sum(env[src], src.shape[0])
            elif isinstance(env[src], Acc):
                env[r] = self._acc_row_sums(src)
            else:
                env[r] = self._row_sums(env[src], src.shape)
            return
        if op == "kda.cumsum":
            rev = bool(n.attrs.get("reverse", False))
            env[r] = (self._cumsum(env[n.operands[0]], rev) if len(r.shape) == 1 else
                      self._cumsum_rows(n.operands[0], tuple(r.shape), rev))
            return
        if op == "kda.decay_dot":
            env[r] = (self._decay_dot(n) if row_gate_sources(n) is not None else
                      self._decay_dot_channels(n))
            return
        if op == "kda.decay_matmul" or n in self.rplan.b_forms:
            env[r] = self._dot_any(n)
            return
        if op == "kda.dot":
            env[r] = self._dot(n)
            return
        if op == "kda.store":
            if self.rplan.kinds.get(n.operands[2]) == "acc_t":
                self._store_tile(n)
            else:
                self._store_rows(n)
            return
        if op == "kda.store_chunk":
            self._store_chunk(n)
            return
        if op == "kda.tril_inv":
            env[r] = self._tril_inv(env[n.operands[0]])
            return
        ops = [env.get(o) for o in n.operands]
        if any(isinstance(x, Acc) for x in ops):
            if op == "kda.convert":
                env[r] = ops[0]        # rounded by the store
                return
            if id(n) in self._fused:
                env[r] = self._fused.pop(id(n))
                return
            lead = next(x for x in ops if isinstance(x, Acc))
            plain = op in _ACC_ELEMENTWISE and all(
                isinstance(x, Acc) and x.transposed == lead.transposed or
                self.rplan.kinds.get(o) == "bcast" or len(o.shape) < 2
                for o, x in zip(n.operands, ops))
            env[r] = self._acc_elementwise(n, ops) if plain else self._acc_expression(n, ops)
            return
        if op == "kda.convert_layout":
            env[r] = ops[0]
            return
        if any(o is None for o in ops if not isinstance(o, (int,))):
            env[r] = None               # a value only its product reads (row-scaled operand)
            return
        env[r] = self.expr(n)
        if r in self.rplan.vec_mats:
            env[r] = self._vector_once(env[r], r.shape[0])

    def _native_sums(self) -> bool:
        """LowerOptions.register_tile_sums: sums in the native kernels' order."""
        mode = self.opts.register_tile_sums
        if mode not in ("own", "native"):
            raise LoweringError(f"register_tile_sums: {mode!r}; use 'own' or 'native'")
        return mode == "native"

    def _threads(self) -> T_.Threads:
        """This kernel's consumer threads as the tile lowering's emitters take them, its sums
        ordered by the tiles' shapes alone (as LowerOptions.ordered_sums orders a native
        kernel's)."""
        return T_.Threads(self.tid, self.threads, self.opts.load_batch, True,
                          self.opts.vector_loops)

    def _vector_once(self, x: T_.Ref, length: int) -> T_.BufRef:
        """Vector expression ``x`` evaluated once, one element per thread, into a shared
        vector (`_costly_vectors`)."""
        out = self._vector(length)
        for it in range(-(-length // self.threads)):
            e = self.tid + it * self.threads
            B.if_then(B.icmp("lt", e, length), lambda e=e: out.write((e,), x.read((e,))))
        bar.sync_threads()
        self.cost.event("bar.sync")
        return out

    def _vector(self, length: int | None = None) -> T_.BufRef:
        """The next shared vector (slots of ``vec_len`` floats), shaped as the value it holds
        (``length``, C by default): a row taken from its end (extract_row -1) must read the
        value's last element, not the slot's (a [64] cumsum in a 128-float slot: gdn_bwd's dk
        kernel read an unwritten float as its chunk's gate total)."""
        n = self.rplan.vec_len
        length = self.rplan.C if length is None else length
        if length > n:
            raise LoweringError(f"register tiles: a [{length}] vector in {n}-float slots")
        off = self.rplan.smem["vectors"] // 4 + self._vectors * n
        self._vectors += 1
        return T_.BufRef(T_.Scratch(self.smem_base, "smem"), off, (length,), (1,))

    def _row_sums(self, x: T_.Ref, shape) -> T_.BufRef:
        """sum over the columns of [R, K] expression ``x``: two threads per row, each half of
        it, a shuffle, then one store per row (64 rows at a time)."""
        R, K = shape
        out = self._vector(R)
        if self._native_sums():
            T_.emit_reduce_sum(self._threads(), out, x, [1], None)
            bar.sync_threads()
            self.cost.event("bar.sync")
            return out
        half = self.tid % 2
        width = 8 if (K // 2) % 8 == 0 else 1
        per = self.threads // 2
        for r0 in range(0, R, per):
            row = r0 + self.tid // 2

            def one(row=row):
                acc = None
                for j in range(0, K // 2, width):
                    for v in T_.read_vec(x, (row, half * (K // 2) + j), width):
                        acc = v if acc is None else B.add(acc, v)
                acc = B.add(acc, shfl(acc, 1, "bfly"))
                self.cost.event("shfl")
                B.if_then(B.icmp("eq", half, 0), lambda: out.write((row,), acc))
            if R - r0 < per:
                # whole warps past the last row (16 rows a warp) skip it
                B.if_then(B.icmp("lt", row, R), one)
            else:
                one()
        bar.sync_threads()
        self.cost.event("bar.sync")
        return out

    def _cumsum(self, x: T_.Ref, reverse: bool) -> T_.BufRef:
        """Inclusive cumsum of a [C] expression: warp 0, two rows per lane, a shuffle scan
        over the lanes' sums."""
        C = self.rplan.C
        out = self._vector()
        if self._native_sums():
            T_.emit_cumsum_warp(self._threads(), out, x, reverse)
            bar.sync_threads()
            self.cost.event("bar.sync")
            return out

        def scan():
            lane = self.lane
            rows = [2 * lane, 2 * lane + 1]
            if reverse:
                rows = [(C - 1) - r for r in rows]
            a = x.read((rows[0],))
            b = B.add(a, x.read((rows[1],)))
            total = b
            for d in (1, 2, 4, 8, 16):
                up = shfl(total, d, "up")
                total = B.sel(B.icmp("ge", lane, d), B.add(total, up), total)
                self.cost.event("shfl")
            before = B.sub(total, b)
            out.write((rows[0],), B.add(before, a))
            out.write((rows[1],), total)
        B.if_then(B.icmp("lt", self.tid, 32), scan)
        bar.sync_threads()
        self.cost.event("bar.sync")
        return out

    def _cumsum_rows(self, v, shape, reverse: bool) -> T_.BufRef:
        """Inclusive cumsum down the rows of [C, N] expression ``v`` into a shared f32 tile:
        each column in ``cumsum_segments`` row segments, a thread per (segment, column), in
        row order; the column's values evaluated as points of one column
        (`_register_values`: what is the same down the column, a per-channel parameter, read
        once). A later segment then adds the totals of the segments before it (their last
        rows) to its rows. One segment per column left half of two warpgroups idle with the
        busiest thread evaluating all C rows (KDA's gate: 1223 of the output kernel's 3529
        instructions per thread)."""
        self._region_barrier()
        C, N = shape
        i = self._grids
        self._grids += 1
        out = T_.BufRef(T_.Scratch(self.smem_base, "smem"), self.rplan.smem[f"grid{i}"] // 4,
                        (C, N), (N + GRID_PAD, 1))
        rows = list(range(C - 1, -1, -1)) if reverse else list(range(C))
        segs = cumsum_segments(C, N, self.threads)
        length = C // segs

        def segment(col, part):
            seg_rows = rows[part * length:(part + 1) * length]
            vals = self._register_values(v, self.env[v], self._column_points(seg_rows, col))
            acc = None
            for r, x in zip(seg_rows, vals):
                acc = x if acc is None else B.add(acc, x)
                out.write((r, col), acc)

        if segs == 1:
            for it in range(-(-N // self.threads)):
                col = self.tid + it * self.threads
                if N % self.threads:
                    B.if_then(B.icmp("lt", col, N), lambda col=col: segment(col, 0))
                else:
                    segment(col, 0)
            bar.sync_threads()
            self.cost.event("bar.sync")
            return out
        col, part = self.tid % N, self.tid // N
        # the cost report counts the busiest thread's path: one segment (the first), then the
        # last segment's shift; the other branches' code is emitted but not that thread's
        for k in range(segs):
            with contextlib.nullcontext() if k == 0 else self.cost.cold():
                B.if_then(B.icmp("eq", part, k), lambda k=k: segment(col, k))
        bar.sync_threads()
        self.cost.event("bar.sync")
        # the totals of the segments before each one: read before any segment changes its
        # rows (a barrier between, where a segment's last row is itself updated)
        offsets = {}
        for k in range(1, segs):
            total = None
            for j in range(k):
                x = out.read((rows[(j + 1) * length - 1], col))
                total = x if total is None else B.add(total, x)
            offsets[k] = total
        if segs > 2:
            bar.sync_threads()
            self.cost.event("bar.sync")

        def shift(k):
            for r in rows[k * length:(k + 1) * length]:
                out.write((r, col), B.add(out.read((r, col)), offsets[k]))
        for k in range(1, segs):
            with contextlib.nullcontext() if k == segs - 1 else self.cost.cold():
                B.if_then(B.icmp("eq", part, k), lambda k=k: shift(k))
        bar.sync_threads()
        self.cost.event("bar.sync")
        return out

    def _decay_dot_channels(self, n) -> Acc:
        """Σ_d X[i, d] Y[j, d] 2^(G[i, d] - G[j, d]) for j <= i + diagonal (KDA's per-channel
        decay), X and Y row-scaled bf16 ring tiles, G a cumsum in shared memory.

        Column block c (16 columns) is one wgmma m64n16 in TF32 over a reference row r of G:
        A = X[i]·2^(G[i] - G[r]) from registers (rows above the block zeroed), B = Y[j]·
        2^(G[r] - G[j]) staged in shared memory. r is the block's first row, so the diagonal
        block comes out of the same product, where G falls inside the block by at most
        STEEP_BLOCK powers of two (both factors within 2^64); a steeper block takes r = its
        last row (every factor <= 1) for the rows below it and its diagonal block exactly,
        element by element, by the warp owning those rows."""
        self._region_barrier()
        C = self.rplan.C
        i_dec = self._decays
        self._decays += 1
        (ln, lf), (rn, rf) = row_scaled(n.operands[0]), row_scaled(n.operands[1])
        xs, ys = self.slot_of[ln], self.slot_of[rn]
        xr, yr = self._ring_ref(xs), self._ring_ref(ys)
        G = self.env[n.operands[2]]
        K = xs.cols
        diagonal = int(n.attrs.get("diagonal", 0))
        clamp_min = n.attrs.get("clamp_min")
        clamp_min = None if clamp_min is None else float(clamp_min)
        fl, fr = self._factors(lf), self._factors(rf)
        blocks = C // 16
        flags = self._vector()
        w, lane = self.warp, self.lane

        def steepness():
            # warp w: the largest fall of G inside row block w over the channels
            top = None
            for d0 in range(0, K, 32):
                d = lane + d0
                v = B.sub(G.read((16 * w, d)), G.read((16 * w + 15, d)))
                top = v if top is None else B.maxf(top, v)
            for m in (16, 8, 4, 2, 1):
                top = B.maxf(top, shfl(top, m, "bfly"))
            B.if_then(B.icmp("eq", lane, 0), lambda: flags.write(
                (w,), B.sel(B.fle(B.f(STEEP_BLOCK), top), B.f(1.0), B.f(0.0))))
        W = self.rplan.warpgroups
        if W > 1:
            B.if_then(B.icmp("eq", self.wg, 0), steepness)    # warp w: row block w, once
        else:
            steepness()
        bar.sync_threads()
        steep = [B.nonzero(flags.read((c,))) for c in range(blocks)]
        ref = [B.isel(steep[c], 16 * c + 15, 16 * c) for c in range(blocks)]
        first = [B.isel(steep[c], 16 * c + 16, 16 * c) for c in range(blocks)]
        blay = SmemLayout(16, K, 4, SWIZZLE)
        bbase = self.rplan.smem[f"decay_b{i_dec}"]
        for c in range(blocks):
            for it in range(16 * K // self.threads):
                e = self.tid + it * self.threads
                jj, d = e // K, e % K
                j = 16 * c + jj
                v = yr.read((j, d))
                if fr is not None:
                    v = B.mul(v, fr.read((j,)))
                v = B.mul(v, B.exp2_clamped(B.sub(G.read((ref[c], d)), G.read((j, d))), clamp_min))
                B.store(self.smem_base, (bbase + c * blay.size_bytes + blay.byte_offset(jj, d)) // 4,
                        B.round_to(v, "tf32"), "f32")
        bar.fence_proxy_async_shared()
        bar.sync_threads()
        self.cost.event("bar.sync")
        # several warpgroups: each its share of the column blocks (a run-time block index)
        local = blocks // W
        block_of = ((lambda cl: cl) if W == 1 else (lambda cl: self.wg * local + cl))
        values = [B.f(0.0)] * (C // 2 // W)
        for cl in range(local):
            c = block_of(cl)
            if W == 1:
                ref_c, first_c = ref[c], first[c]
            else:
                steep_c = B.nonzero(flags.read((c,)))
                ref_c = B.isel(steep_c, 16 * c + 15, 16 * c)
                first_c = B.isel(steep_c, 16 * c + 16, 16 * c)
            def element(m, d, ref_c=ref_c, first_c=first_c):
                v = xr.read((m, d))
                if fl is not None:
                    v = B.mul(v, fl.read((m,)))
                v = B.mul(v, B.exp2_clamped(B.sub(G.read((m, d)), G.read((ref_c, d))),
                                            clamp_min))
                return B.sel(B.icmp("ge", m, first_c), v, B.f(0.0))
            a_regs = self._tf32_a_regs(K, element)
            descs = wgmma.k_block_descriptors(blay, self._addr32(bbase + c * blay.size_bytes),
                                              K // 8, 8)
            part = values[8 * cl:8 * cl + 8]
            wgmma.wgmma_fence(self.target)
            for regs, dsc in zip(a_regs, descs):
                part = wgmma.wgmma_tf32_rs(self.target, part, regs, dsc, 16)
                self.cost.event("wgmma")
            values[8 * cl:8 * cl + 8] = part
        values = self._finish(values)
        # steep diagonal blocks, exactly: warp w its own block, pairs (a, b) of its rows
        diag = T_.BufRef(T_.Scratch(self.smem_base, "smem"),
                         self.rplan.smem[f"decay_diag{i_dec}"] // 4, (C, 16), (17, 1))
        steep_w = B.nonzero(flags.read((w,)))      # this warp's row block is steep
        strict = diagonal < 0
        pairs = 120 if strict else 136
        tri = [m * (m + 1) // 2 for m in range(1, 16)]

        def exact():
            for rnd in range(-(-pairs // 32)):
                p = lane + 32 * rnd
                a = 1 if strict else 0
                base = 0
                for m, tm in enumerate(tri[:15 - (1 if strict else 0)], start=1):
                    ge = B.icmp("ge", p, tm)
                    a = B.isel(ge, a + 1, a)
                    base = B.isel(ge, tm, base)
                b = p - base
                ra, rb = 16 * w + a, 16 * w + b

                def one(ra=ra, rb=rb, b=b):
                    acc = None
                    for d0 in range(0, K, 8):
                        xa = T_.read_vec(xr, (ra, d0), 8)
                        yb = T_.read_vec(yr, (rb, d0), 8)
                        for h in range(8):
                            e = B.exp2_clamped(B.sub(G.read((ra, d0 + h)), G.read((rb, d0 + h))),
                                               clamp_min)
                            t = B.mul(B.mul(xa[h], yb[h]), e)
                            acc = t if acc is None else B.add(acc, t)
                    if fl is not None:
                        acc = B.mul(acc, fl.read((ra,)))
                    if fr is not None:
                        acc = B.mul(acc, fr.read((rb,)))
                    diag.write((ra, b), acc)
                B.if_then(B.icmp("lt", p, pairs), one)
        # a fallback for steep gates, expected not to run (the cost report weighs it 0)
        B.if_then(self._first_warpgroup(steep_w), exact, cold=True)
        bar.sync_threads()
        self.cost.event("bar.sync")
        acc = Acc(values, C // W, False, 0 if W == 1 else self.wg * (C // W))
        out = []
        for reg, (v, (i, j)) in enumerate(zip(values, acc.coords(w, lane))):
            c = block_of(reg // 8)            # the column block of this register
            mine = B.band(steep_w, B.icmp("eq", w, c))
            v = B.sel(mine, diag.read((i, j - 16 * c)), v)
            keep = B.icmp("le", j, i + diagonal) if diagonal else B.icmp("le", j, i)
            out.append(B.sel(keep, v, B.f(0.0)))
        return Acc(out, acc.n, False, acc.col0)

    def _factors(self, factors) -> T_.Ref | None:
        """The product of an operand's row factors as one shared vector (each evaluated once
        per row, by threads 0 .. C-1), or None without factors."""
        if not factors:
            return None
        out = self._vector()

        def rows():
            v = None
            for f in factors:
                x = self.env[f].read((self.tid,))
                v = x if v is None else B.mul(v, x)
            out.write((self.tid,), v)
        B.if_then(B.icmp("lt", self.tid, self.rplan.C), rows)
        bar.sync_threads()
        self.cost.event("bar.sync")
        return out

    def _acc_elementwise(self, n, ops) -> Acc:
        acc = next(x for x in ops if isinstance(x, Acc))
        coords = acc.coords(self.warp, self.lane)
        # a broadcast read once per row (column) the registers hold, a scalar once, not once
        # per register: their expressions may hold exponentials (a row vector is read at each
        # register's row: the coordinates are per register)
        pts = None
        scalars: dict = {}
        vals = []
        for i, (row, col) in enumerate(coords):
            args = []
            for o, x in zip(n.operands, ops):
                if isinstance(x, Acc):
                    if x.transposed != acc.transposed:
                        raise LoweringError("register tiles: accumulators of two orientations")
                    args.append(x.values[i])
                elif len(o.shape) == 2:
                    pts = pts or self._acc_points(acc)
                    args.append(self._register_values(o, x, pts)[i])
                elif len(o.shape) == 1:
                    args.append(x.read((row,)))
                else:
                    if o not in scalars:
                        scalars[o] = x.read(())
                    args.append(scalars[o])
            if n.op == "kda.neg":
                vals.append(B.neg(args[0]))
            else:
                f = {"kda.add": B.add, "kda.sub": B.sub, "kda.mul": B.mul}[n.op]
                vals.append(f(args[0], args[1]))
        return Acc(vals, acc.n, acc.transposed, acc.col0)

    # -- products ----------------------------------------------------------------------------
    def _addr32(self, offset: int):
        return shared_addr32(byte_gep(self.smem_base, offset, shared_ptr_type()))

    def _finish(self, values: list) -> list:
        wgmma.wgmma_commit(self.target)
        wgmma.wgmma_wait(self.target, 0)
        self.cost.event("wgmma.commit")
        self.cost.event("wgmma.wait")
        return wgmma.fence_accumulators(values)

    def _decay_dot(self, n) -> Acc:
        """acc = X·Yᵀ in bf16 (both operands K-major ring tiles), then the row factors, the
        per-row decay and the causal mask per register."""
        C = self.rplan.C
        (ln, lf), (rn, rf) = row_scaled(n.operands[0]), row_scaled(n.operands[1])
        sl, sr = self.slot_of[ln], self.slot_of[rn]
        gl, gr = row_gate_sources(n)
        K = sl.cols
        a32, b32 = self._addr32(sl.offset), self._addr32(sr.offset)
        N, col0, share = self._b_rows(C)      # several warpgroups: each its share of B's rows
        b32 = b32 + share
        values = [B.f(0.0)] * (N // 2)
        wgmma.wgmma_fence(self.target)
        for kk in range(K // 16):
            st, lbo, sbo = wgmma.operand_start_and_strides(sl.layout, "a", False, 0, kk * 16)
            da = wgmma.make_descriptor(a32 + st, lbo, sbo, SWIZZLE)
            st, lbo, sbo = wgmma.operand_start_and_strides(sr.layout, "b", True, 0, kk * 16)
            db = wgmma.make_descriptor(b32 + st, lbo, sbo, SWIZZLE)
            values = wgmma.wgmma_async(self.target, values, da, db, N, "bf16",
                                       accumulate=kk > 0)
            self.cost.event("wgmma")
        values = self._finish(values)
        diagonal = int(n.attrs.get("diagonal", 0))
        clamp_min = n.attrs.get("clamp_min")
        acc = Acc(values, N, False, col0)
        fl, fr = self._factors(lf), self._factors(rf)
        out = []
        rows_f, cols_f, g_rows, g_cols = {}, {}, {}, {}
        for reg, (v, (i, j)) in enumerate(zip(values, acc.coords(self.warp, self.lane))):
            key_i, key_j = (reg // 2) % 2, (reg // 4, reg % 2)   # registers sharing a row / column
            if key_i not in rows_f:
                rows_f[key_i] = fl.read((i,)) if fl is not None else None
                g_rows[key_i] = self.env[gl].read((i,))
            if key_j not in cols_f:
                cols_f[key_j] = fr.read((j,)) if fr is not None else None
                g_cols[key_j] = self.env[gr].read((j,))
            x = v
            for f in (rows_f[key_i], cols_f[key_j]):
                if f is not None:
                    x = B.mul(x, f)
            e = B.exp2_clamped(B.sub(g_rows[key_i], g_cols[key_j]),
                               None if clamp_min is None else float(clamp_min))
            x = B.mul(x, e)
            keep = B.icmp("le", j, i + diagonal) if diagonal else B.icmp("le", j, i)
            out.append(B.sel(keep, x, B.f(0.0)))
        return Acc(out, N, False, col0)

    def _dot(self, n) -> Acc:
        lhs, rhs = n.operands
        x = self.env.get(lhs)
        if row_scaled(rhs)[0] is not None and self.slot_of[row_scaled(rhs)[0]].elt == "bf16":
            return self._dot_tile(n, x)
        if isinstance(x, T_.BufRef):
            return self._dot_shared(n, x, self.env[rhs])
        factors = self.rplan.column_factors
        w = factors[n][0] if n in factors else through_views(rhs)
        ws = self.slot_of[w.owner]
        ln = row_scaled(lhs)[0]
        if not isinstance(x, Acc) and ln is not None and self.slot_of[ln].elt == "bf16":
            return self._dot_ring(n, ws)
        return self._dot_acc(n, x, ws)

    def _init_from_add(self, n):
        """The accumulator ``n`` may accumulate onto: the other operand of its sole add, when
        that is a transposed accumulator already computed (the add then is the product)."""
        users = [u for u, _ in n.results[0].uses]
        if len(users) != 1 or users[0].op != "kda.add":
            return None, None
        other = [o for o in users[0].operands if o is not n.results[0]]
        y = self.env.get(other[0]) if other else None
        if isinstance(y, Acc) and y.transposed:
            return users[0], y
        return None, None

    def _half_a_split(self, K: int, element, row_factors=None) -> list:
        """[(hi, lo)] per 16-deep block: the 16-bit A fragments of A[m, k] = ``element(m, k)``
        (rows of this warp, PTX's m64nNk16 register layout) as bf16 hi and lo parts, hi + lo =
        A to ~16 significant bits; ``row_factors``: the factors of the thread's two rows."""
        g, t = lane_group(self.lane), lane_in_group(self.lane)
        m0 = self.warp * 16 + g
        out = []
        for kb in range(K // 16):
            hi_regs, lo_regs = [], []
            for j in range(4):
                m = m0 + 8 * (j % 2)
                k = 16 * kb + 8 * (j // 2) + 2 * t
                x0, x1 = element(m, k), element(m, k + 1)
                if row_factors is not None:
                    x0, x1 = B.mul(x0, row_factors[j % 2]), B.mul(x1, row_factors[j % 2])
                hi, lo = bf16_split_pack(x0, x1)
                hi_regs.append(hi)
                lo_regs.append(lo)
            out.append((hi_regs, lo_regs))
        return out

    def _a_row_factors(self, n, part: int):
        """The column factors of product ``n``'s W (`RegisterTilePlan.column_factors`) at the
        two A rows this thread holds in value block ``part`` (rows 16·warp + g and 8 after it:
        W's columns), else None; read at the chunk's start where they are a chunk load."""
        if n not in self.rplan.column_factors:
            return None
        if (n, part) in self._column_factor_values:
            return self._column_factor_values[(n, part)]
        return self._column_factor_rows(self.env[self.rplan.column_factors[n][1]], part)

    def _column_factor_rows(self, ref, part: int) -> list:
        col = self.cta_v0 + V_BLOCK * part + self.warp * 16 + lane_group(self.lane)
        return [ref.read((col + 8 * h,)) for h in (0, 1)]

    def _prefetch_column_factors(self) -> dict:
        """{(product, value block): its A rows' column factors} for the products whose factor
        is a [V] chunk load (the fp16 checkpoints' norms), loaded before the chunk's copies are
        waited for: read at the product, each load's latency sat right before its A
        fragments (H100, gdn B1_T32k_H16: the output kernel 406 -> 441 us over unscaled)."""
        out = {}
        for n, (w, f) in self.rplan.column_factors.items():
            load = through_views(f).owner
            if load is None or load.op != "kda.load_chunk":
                continue
            ref = self.expr(load)
            for part in self._parts(self.slot_of[w.owner].cols):
                out[(n, part)] = self._column_factor_rows(ref, part)
        return out

    def _ring_element(self, ws: TileSlot, row, col):
        """Element (row, col) of ring tile ``ws`` as f32 (an f16 or bf16 tile widened)."""
        eb = ws.elem_bytes
        return B.load(self.smem_base, (ws.offset + ws.layout.byte_offset(row, col)) // eb,
                      ws.elt)

    def _dot_ring(self, n, ws: TileSlot) -> Acc:
        """(X·r)·W as its transpose: Wᵀ (f32, shared memory) split into bf16 hi + lo register A
        fragments, X (bf16, K-major ring tile) as B; the row factors r scale the result's
        columns."""
        C = self.rplan.C
        ln, lf = row_scaled(n.operands[0])
        xs = self.slot_of[ln]
        K = xs.cols
        descs = wgmma.k_block_descriptors(xs.layout, self._addr32(xs.offset), K // 16, 16)
        values = []
        for part in self._parts(ws.cols):       # the 64-column value blocks it computes
            a_regs = self._half_a_split(K, lambda m, k, p=part: self._ring_element(
                ws, k, m + V_BLOCK * p), self._a_row_factors(n, part))
            vals = [B.f(0.0)] * (C // 2)
            wgmma.wgmma_fence(self.target)
            for (hi, lo), d in zip(a_regs, descs):
                vals = wgmma.wgmma_half_rs(self.target, vals, lo, d, C, "bf16")
                vals = wgmma.wgmma_half_rs(self.target, vals, hi, d, C, "bf16")
                self.cost.event("wgmma", 2)
            values += self._finish(vals)
        acc = Acc(values, C, True, self._value_col0())
        factor = self._factors(lf)
        if factor is not None:
            out, cache = [], {}
            for reg, (v, (i, _)) in enumerate(zip(values, acc.coords(self.warp, self.lane))):
                k = (reg // 4, reg % 2)          # registers of one accumulator column
                if k not in cache:
                    cache[k] = factor.read((i,))
                out.append(B.mul(v, cache[k]))
            acc = Acc(out, C, True, self._value_col0())
        return acc

    def _dot_acc(self, n, a, ws: TileSlot) -> Acc:
        """L·W, L an accumulator [C, C] (its contraction runs over tokens: W's rows past the
        sequence end read 0) or a tile expression [C, K]: as its transpose Wᵀ·Lᵀ in TF32, Wᵀ
        from shared memory into registers, L stored once (TF32) as the K-major B tile;
        accumulated onto the other operand of its sole add. An f32 ring tile L is the B tile
        as TMA stored it."""
        C, geo = self.rplan.C, self.geo
        K = n.operands[0].shape[1]
        lsrc = through_views(n.operands[0])
        ring = self.slot_of.get(lsrc.owner) if lsrc.owner is not None else None
        tokens = isinstance(a, Acc)
        if ring is not None and ring.elt == "f32" and not tokens:
            base, lay = ring.offset, ring.layout
        else:
            self._region_barrier()
            base = self.rplan.smem[f"staged{self._staged}"]
            self._staged += 1
            lay = SmemLayout(C, K, 4, SWIZZLE)
            ring = None
        if ring is not None:
            pass
        elif tokens:
            if a.transposed:
                raise LoweringError("register tiles: a transposed accumulator as a left operand")
            for v, (i, j) in zip(a.values, a.coords(self.warp, self.lane)):
                B.store(self.smem_base, (base + lay.byte_offset(i, j)) // 4,
                        B.round_to(v, "tf32"), "f32")
        else:
            for it in range(C * K // (4 * self.threads)):
                e = self.tid + it * self.threads
                i, j = e // (K // 4), 4 * (e % (K // 4))
                vals = [B.round_to(v, "tf32") for v in T_.read_vec(a, (i, j), 4)]
                B.store_vec(self.smem_base, (base + lay.byte_offset(i, j)) // 4, vals, "f32")
        if ring is None:
            bar.fence_proxy_async_shared()
            bar.sync_threads()
            self.cost.event("bar.sync")
        add, init = self._init_from_add(n)
        descs = wgmma.k_block_descriptors(lay, self._addr32(base), K // 8, 8)
        values = []
        per = C // 2
        for i_part, part in enumerate(self._parts(ws.cols)):    # its 64-column value blocks
            def element(m, k, part=part):
                x = self._ring_element(ws, k, m + V_BLOCK * part)
                if tokens:
                    x = B.sel(B.icmp("lt", self._c * geo.C + k, geo.seqlen), x, B.f(0.0))
                return x
            a_regs = self._tf32_a_regs(K, element, row_factors=self._a_row_factors(n, part))
            vals = (list(init.values[per * i_part:per * (i_part + 1)]) if init is not None
                    else [B.f(0.0)] * per)
            wgmma.wgmma_fence(self.target)
            for regs, d in zip(a_regs, descs):
                vals = wgmma.wgmma_tf32_rs(self.target, vals, regs, d, C)
                self.cost.event("wgmma")
            values += self._finish(vals)
        acc = Acc(values, C, True, self._value_col0())
        if add is not None:
            self._fused[id(add)] = acc
        return acc

    def _dot_tile(self, n, a: T_.BufRef) -> Acc:
        """A·(Y·r) with A an f32 tile in shared memory and Y a bf16 ring tile [K, N]: the row
        factors r of Y scale A's columns, A·diag(r) goes into registers as bf16 hi + lo parts
        (two products; Y is exact in bf16), Y is the B operand as TMA stored it (N-major:
        one wgmma per 64 columns)."""
        yn, yf = row_scaled(n.operands[1])
        ys = self.slot_of[yn]
        K, N = ys.rows, ys.cols
        factor = self._factors(yf)

        def element(m, k):
            x = a.read((m, k))
            return x if factor is None else B.mul(x, factor.read((k,)))
        a_regs = self._half_a_split(K, element)
        lay = ys.layout
        N, col0, share = self._b_panels(lay, N)
        base = self._addr32(ys.offset) + share
        values = [B.f(0.0)] * (N // 2)
        wgmma.wgmma_fence(self.target)
        for kb, (hi, lo) in enumerate(a_regs):
            for n0 in range(0, N, lay.panel_cols):
                st, lbo, sbo = wgmma.operand_start_and_strides(lay, "b", False, n0, 16 * kb)
                d = wgmma.make_descriptor(base + st, lbo, sbo, SWIZZLE)
                part = values[n0 // 2:(n0 + lay.panel_cols) // 2]
                for regs in (lo, hi):
                    part = wgmma.wgmma_half_rs(self.target, part, regs, d, lay.panel_cols,
                                               "bf16", b_mn_major=True)
                    self.cost.event("wgmma")
                values[n0 // 2:(n0 + lay.panel_cols) // 2] = part
        return Acc(self._finish(values), N, False, col0)

    def _dot_shared(self, n, a: T_.BufRef, y: T_.Ref) -> Acc:
        """A·Y, A an f32 tile in shared memory [C, K] and Y a tile expression [K, N]: A as
        TF32 register fragments, Y staged transposed ([N, K], TF32) as the K-major B tile."""
        self._region_barrier()
        K, N = n.operands[1].shape
        base = self.rplan.smem[f"staged{self._staged}"]
        self._staged += 1
        lay = SmemLayout(N, K, 4, SWIZZLE)
        for it in range(K * N // (4 * self.threads)):
            e = self.tid + it * self.threads
            k, j = e // (N // 4), 4 * (e % (N // 4))
            for h, v in enumerate(T_.read_vec(y, (k, j), 4)):
                B.store(self.smem_base, (base + lay.byte_offset(j + h, k)) // 4,
                        B.round_to(v, "tf32"), "f32")
        bar.fence_proxy_async_shared()
        bar.sync_threads()
        self.cost.event("bar.sync")
        a_regs = self._tf32_a_regs(K, lambda m, k: a.read((m, k)))
        N, col0, share = self._b_rows(N)
        addr = self._addr32(base) + share
        values = [B.f(0.0)] * (N // 2)
        descs = wgmma.k_block_descriptors(lay, addr, K // 8, 8)
        wgmma.wgmma_fence(self.target)
        for regs, d in zip(a_regs, descs):
            values = wgmma.wgmma_tf32_rs(self.target, values, regs, d, N)
            self.cost.event("wgmma")
        return Acc(self._finish(values), N, False, col0)

    def _tril_inv(self, x: Acc) -> T_.BufRef:
        """(I + strict_lower(x))⁻¹ in shared memory: each warp inverts its 16 x 16 diagonal
        block by forward substitution (a lane per column, fp32), then the blocks below the
        diagonal by distance d = 1, 2, 3 from it, L[b, c] = -L[b, b] · Σ_k X[b, k] · L[k, c]
        (k = c .. b - 1), as TF32 mma.sync products of the warp owning row block b."""
        self._region_barrier()
        C = self.rplan.C
        i = self._inverses
        self._inverses += 1
        sm = T_.Scratch(self.smem_base, "smem")
        X = T_.BufRef(sm, self.rplan.smem[f"tril_x{i}"] // 4, (C, C), (TRIL_PITCH, 1))
        L = T_.BufRef(sm, self.rplan.smem[f"tril_out{i}"] // 4, (C, C), (TRIL_PITCH, 1))
        tmp = T_.BufRef(sm, self.rplan.smem[f"tril_tmp{i}"] // 4 + self.warp * 16 * TRIL_TMP_PITCH,
                        (16, 16), (TRIL_TMP_PITCH, 1))
        # the strictly lower part of x; L zero above the diagonal blocks
        for v, (r, c) in zip(x.values, x.coords(self.warp, self.lane)):
            X.write((r, c), B.sel(B.icmp("lt", c, r), v, B.f(0.0)))
        for it in range(C * C // self.threads):
            e = self.tid + it * self.threads
            L.write((e // C, e % C), B.f(0.0))
        bar.sync_threads()
        self.cost.event("bar.sync")
        w, lane = self.warp, self.lane
        r0 = 16 * w
        col = lane % 16

        def diagonal():
            rows = []
            for a in range(16):
                v = B.sel(B.icmp("eq", col, a), B.f(1.0), B.f(0.0))
                for k in range(a):
                    v = B.sub(v, B.mul(X.read((r0 + a, r0 + k)), rows[k]))
                rows.append(v)
            for a in range(16):
                L.write((r0 + a, r0 + col), rows[a])
        B.if_then(self._first_warpgroup(B.icmp("lt", lane, 16)), diagonal)
        self.cost.event("fma", 120)
        bar.sync_threads()
        self.cost.event("bar.sync")
        g, t = lane_group(lane), lane_in_group(lane)

        def block_product(terms, write):
            """Σ A·B over ``terms`` [(a_at, b_at)] of 16 x 16 blocks (``a_at(r, c)``, ``b_at``:
            the blocks' elements) as TF32 mma.sync m16n8k8 of this warp; ``write(r, c, v)``
            per element of the 16 x 16 result."""
            for nb in range(2):
                acc = [B.f(0.0)] * 4
                for a_at, b_at in terms:
                    for kb in range(2):
                        a = [B.tf32_operand(a_at(g + 8 * (q % 2), 8 * kb + t + 4 * (q // 2)))
                             for q in range(4)]
                        bb = [B.tf32_operand(b_at(8 * kb + t + 4 * q, 8 * nb + g))
                              for q in range(2)]
                        acc = B.mma_tf32(a, bb, acc)
                for q, v in enumerate(acc):
                    write(g + 8 * (q // 2), 8 * nb + 2 * t + q % 2, v)

        for d in (1, 2, 3):
            b, c = w, w - d          # this warp's row block and the column block at distance d

            def level():
                # T = Σ_{k=c}^{b-1} X[b, k] · L[k, c] into the warp's scratch block (k over
                # 0 .. 2 with the terms outside c .. b - 1 zeroed)
                terms = []
                for k in range(3):
                    live = B.band(B.icmp("ge", k, c), B.icmp("lt", k, b))
                    terms.append((
                        lambda r, cc, k=k, live=live: B.sel(
                            live, X.read((16 * b + r, 16 * k + cc)), B.f(0.0)),
                        lambda r, cc, k=k: L.read((16 * k + r, 16 * c + cc))))
                block_product(terms, lambda r, cc, v: tmp.write((r, cc), v))
            B.if_then(self._first_warpgroup(B.icmp("ge", w, d)), level)
            bar.sync_threads()       # tmp written (each warp its own) before its reads below

            def finish():
                block_product([(lambda r, cc: L.read((16 * b + r, 16 * b + cc)),
                                lambda r, cc: tmp.read((r, cc)))],
                              lambda r, cc, v: L.write((16 * b + r, 16 * c + cc), B.neg(v)))
            B.if_then(self._first_warpgroup(B.icmp("ge", w, d)), finish)
            bar.sync_threads()
            self.cost.event("bar.sync", 2)
        return L

    def _store_chunk(self, n) -> None:
        """A chunk value to its workspace (the MemRef applies the readers' storage contract:
        transposed, rounded, split): accumulators from their registers, shared tiles and
        ring-tile expressions by an element loop in the stored order, vectors one element per
        thread."""
        mem = self.env[n.operands[0]]
        v = n.operands[2]
        x = self.env[v]
        row = self.geo.chunk_row(self._c)
        if isinstance(x, Acc) and x.transposed:
            # a register pair holds two rows of one column: element stores
            for val, idx in zip(x.values, x.coords(self.warp, self.lane)):
                mem.store(val, row, list(idx))
            return
        if isinstance(x, Acc):
            coords = x.coords(self.warp, self.lane)
            for k in range(0, len(x.values), 2):
                (i, j) = coords[k]
                mem.store_vec([x.values[k], x.values[k + 1]], row, [i, j])
            return
        if len(v.shape) <= 1:
            count = v.shape[0] if v.shape else 1
            for it in range(-(-count // self.threads)):
                e = self.tid + it * self.threads
                idx = [e] if v.shape else []
                B.if_then(B.icmp("lt", e, count),
                          lambda idx=idx: mem.store(x.read(tuple(idx)), row, idx))
            return
        R, N = v.shape
        if not isinstance(x, T_.BufRef) and row_scaled(v)[0] is not None:
            # a ring tile times row factors: the factors multiplied once per row
            ln, lf = row_scaled(v)
            ring, factor = self._ring_ref(self.slot_of[ln]), self._factors(lf)
            x = ring if factor is None else T_.FnRef(
                (R, N), lambda idx: B.mul(ring.read(idx), factor.read((idx[0],))),
                vec=lambda idx, k: [B.mul(y, factor.read((idx[0],)))
                                    for y in T_.read_vec(ring, idx, k)])
        if mem.transposed or mem.split is not None:
            # consecutive threads take consecutive stored addresses: down the tile's columns
            for it in range(R * N // self.threads):
                e = self.tid + it * self.threads
                i, j = e % R, e // R
                mem.store(x.read((i, j)), row, [i, j])
            return
        for it in range(R * N // (4 * self.threads)):
            e = self.tid + it * self.threads
            i, j = e // (N // 4), 4 * (e % (N // 4))
            mem.store_vec(T_.read_vec(x, (i, j), 4), row, [i, j])

    # -- stores ------------------------------------------------------------------------------
    def _store_tile(self, n) -> None:
        """A transposed accumulator [C, V block] to a token tensor: bf16 rows staged in shared
        memory, then 16-byte stores of the rows inside the sequence."""
        acc = self.env[n.operands[2]]
        mem = self.value_part(n, self.env[n.operands[0]])
        width = self.rplan.V // self.rplan.v_ctas          # the CTA's value columns
        self._store_token_rows(mem, acc, width, self.cta_v0)


__all__ = ["match", "NoMatch", "RegisterTilePlan", "RegisterTileEmitter", "PATH_NAME"]
