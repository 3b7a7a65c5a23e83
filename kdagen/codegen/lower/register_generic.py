"""The register-tile lowering's general rules (issue 11 item 4, second step): the forms the
backward chunk kernels add to the forward's, each correct for any operand kinds at the price of
a shared-memory hand-off where registers cannot meet.

* **products** ``dot(L, R)`` with either operand transposed, and GDN's ``decay_matmul`` (one
  gate per row): the result is a [64, N] wgmma accumulator; A comes into registers from any
  readable value (a ring tile, a tile expression, a shared tile, an accumulator through shared
  memory), element by element at its fragment coordinates, so a transpose or a decay weight
  costs nothing extra; B is a bf16 ring tile as TMA stored it (either major-ness: exact, with
  A split into bf16 hi + lo), an f32 ring tile already K-major (TF32), or staged by the
  warpgroup into a K-major tile (TF32, bf16 hi + lo for bf16x3, or TF32 hi + lo for tf32x3:
  three products each);
* **element-wise ops** on accumulators with any other operand: the op's expression evaluated
  per register at its coordinates; an accumulator of the other orientation is read through
  shared memory (a *materialised* copy);
* **row sums** of an accumulator: the four lanes of a row by two shuffles; a transposed one
  through its materialised copy; **a vector's sum** by one warp;
* **stores** of a [C, N] accumulator or a [C] vector to a token tensor.

`generic_dot_regions` sizes what `match` places; `GenericTileOps` is the emitter side (a mixin
of register_tiles.RegisterTileEmitter).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..common import barrier as bar
from ..common.convert import bf16_split_pack, tf32_operand_bits, tf32_split_operand_bits
from ..common.layouts import SmemLayout, wgmma_tf32_a_coord
from ..common.shuffle import shfl
from ..sm90 import wgmma
from . import backend as B
from . import tiles as T_
from .emitter import row_gate_sources
from .options import product_precision
from .plan import LoweringError
from .register_values import SWIZZLE, VIEWS, Acc, row_scaled, through_views

MAT_PAD = 4          # f32 elements padding each row of a materialised accumulator
#: ops evaluated per register from their operands' register values (lazy tile expressions)
ELEMENTWISE = ("kda.add", "kda.sub", "kda.mul", "kda.div", "kda.neg", "kda.exp2", "kda.log2",
               "kda.sigmoid", "kda.softplus", "kda.rsqrt", "kda.clamp", "kda.in_range",
               "kda.select", "kda.tril", "kda.convert")


@dataclass
class Points:
    """Where a thread evaluates a value: its coordinates, which of them share a row or a
    column (``row_key(k)``, ``col_key(k)`` of coordinate k), the key its values are kept
    under, whether coordinates 2q and 2q + 1 are adjacent columns of one row, and the
    accumulator layout they are the registers of (None: not an accumulator's)."""
    coords: list
    row_key: Callable
    col_key: Callable
    sig: tuple
    pairs: bool
    layout: tuple | None = None


def _acc_layout(acc) -> tuple:
    return (acc.transposed, acc.n, acc.col0, len(acc.values))


def product_operands(n) -> tuple:
    """(W, B source, transpose of W, transpose of B) of a product: ``dot(L, R)`` is
    op(L)·op(R); ``decay_matmul(W, X)`` is (W ∘ E)·X, or (W ∘ E)ᵀ·X when transposed."""
    if n.op == "kda.decay_matmul":
        return n.operands[0], n.operands[1], bool(n.attrs.get("transpose")), False
    return (n.operands[0], n.operands[1], bool(n.attrs.get("transpose_lhs")),
            bool(n.attrs.get("transpose_rhs")))


def product_shape(n) -> tuple:
    """(M, K, N) of a product."""
    w, x, tw, tx = product_operands(n)
    M, K = (w.shape[1], w.shape[0]) if tw else (w.shape[0], w.shape[1])
    N = x.shape[0] if tx else x.shape[1]
    return M, K, N


def b_operand_form(n, slot_elt, kinds, dot: str) -> str:
    """How a product's B operand reaches the tensor core: "bf16" (a bf16 ring tile as TMA
    stored it; its row factors, if any, along K: folded into A), "tf32" (an f32 ring tile
    stored [N, K], TF32 products), "stage_tf32", "stage_split" or "stage_split_tf32" (written
    by the warpgroup into a K-major tile: TF32, bf16 hi + lo, or TF32 hi + lo for a tf32x3
    product, whose ~22 bits neither an exact bf16 B with a bf16-split A nor bf16x3 keeps).
    ``slot_elt(load)``: the element type of a ring tile's load."""
    _, x, _, tx = product_operands(n)
    prec = product_precision(dot, n.op, n.attrs.get("kda.precision"))
    if prec == "tf32x3":
        return "stage_split_tf32"
    xn, xf = row_scaled(x)
    if xn is not None and slot_elt(xn) == "bf16" and not (tx and xf):
        return "bf16"
    src = through_views(x)
    if (tx and prec in ("tf32", "bf16") and kinds.get(src) == "ring"
            and slot_elt(src.owner) == "f32"):
        return "tf32"
    return "stage_tf32" if prec in ("tf32", "bf16") else "stage_split"


#: the staged forms of a B operand: (bytes per element, tiles (hi and lo: 2), the k depth of
#: one wgmma)
STAGED_FORMS = {"stage_tf32": (4, 1, 8), "stage_split": (2, 2, 16),
                "stage_split_tf32": (4, 2, 8)}


def staging_depth(form: str, K: int, sliced: bool) -> int:
    """The K depth a staged B takes at once: all of K, or sliced, one 128-byte swizzle panel
    (32 f32 or 64 bf16 elements) where K is deeper."""
    eb = STAGED_FORMS[form][0]
    return min(K, SWIZZLE // eb) if sliced else K


def generic_dot_regions(n, form: str, sliced: bool = False) -> int:
    """Shared bytes a product's staged B takes ([N, depth], K-major; `staging_depth`)."""
    if form not in STAGED_FORMS:
        return 0
    _, K, N = product_shape(n)
    eb, parts, _ = STAGED_FORMS[form]
    return parts * N * staging_depth(form, K, sliced) * eb


class GenericTileOps:
    """Emitter methods of the general rules (see the module doc)."""

    # -- shared copies of accumulators -------------------------------------------------------
    def _materialised(self, v):
        """A readable form of value ``v``: its Ref, or for an accumulator its copy in shared
        memory (written once, at the first op that needs it, into the region `match` placed
        for it)."""
        x = self.env[v]
        if not hasattr(x, "values"):
            return x
        got = self._mats.get(v)
        if got is not None:
            return got
        self._region_barrier()
        R, N = v.shape
        base = self.rplan.smem[f"mat{self.rplan.mats.index(v)}"] // 4
        ref = T_.BufRef(T_.Scratch(self.smem_base, "smem"), base, (R, N), (N + MAT_PAD, 1))
        for val, (i, j) in zip(x.values, x.coords(self.warp, self.lane)):
            ref.write((i, j), val)
        bar.sync_threads()
        self.cost.event("bar.sync")
        self._mats[v] = ref
        return ref

    def _acc_expression(self, n, ops):
        """Element-wise op ``n`` with an accumulator operand, at the registers of its leading
        accumulator."""
        lead = next(x for x in ops if hasattr(x, "values"))
        return Acc(self._evaluate_at(n, self._acc_points(lead)), lead.n, lead.transposed,
                   lead.col0)

    def _acc_points(self, lead) -> Points:
        """The registers of accumulator ``lead`` as points."""
        per = lead.n // 2

        def m_key(k):          # registers of one accumulator row
            return ((k % per) // 2) % 2, k // per

        def n_key(k):          # registers of one accumulator column
            return (k % per) // 4, k % 2
        row_key, col_key = (n_key, m_key) if lead.transposed else (m_key, n_key)
        layout = _acc_layout(lead)
        return Points(lead.coords(self.warp, self.lane), row_key, col_key, layout,
                      not lead.transposed, layout)

    def _column_points(self, rows, col) -> Points:
        """Rows ``rows`` of one column ``col`` (values kept for this call only)."""
        self._point_sets += 1
        return Points([(r, col) for r in rows], lambda k: k, lambda k: 0,
                      ("column", self._point_sets), False)

    def _evaluate_at(self, n, pts: Points) -> list:
        """Element-wise op ``n`` evaluated at each of the points, every 2-D operand as its
        values there (`_register_values`)."""
        cell = [0]
        saved = {}
        for o in n.operands:
            if len(o.shape) < 2 or o in saved:
                continue
            saved[o] = self.env[o]
            vals = self._register_values(o, self.env[o], pts)
            self.env[o] = T_.FnRef(tuple(o.shape), lambda idx, v=vals: v[cell[0]])
        try:
            ref = self.expr(n)
        finally:
            self.env.update(saved)
        out = []
        for i, (row, col) in enumerate(pts.coords):
            cell[0] = i
            out.append(ref.read((row, col)))
        return out

    def _register_values(self, o, x, pts: Points) -> list:
        """2-D value ``o`` (``x`` its env entry) at the points, evaluated once per set of
        points and kept: an accumulator of the points' layout is its registers, one of
        another layout is read through its shared copy; a broadcast is read once per row
        (column) the points hold; other expressions two adjacent columns at a time where the
        points pair up."""
        if isinstance(x, Acc) and _acc_layout(x) == pts.layout:
            return x.values
        sig = pts.sig
        got = self._reg_values.get((o, sig))
        if got is not None:
            return got
        ref = self._materialised(o) if isinstance(x, Acc) else x
        coords, row_key, col_key = pts.coords, pts.row_key, pts.col_key
        src = o.owner
        dims = list(src.attrs.get("dims", ())) if src is not None and \
            src.op == "kda.broadcast" else None
        vals = []
        if src is not None and not isinstance(x, Acc) and src.op in VIEWS:
            vals = self._register_values(src.operands[0], self.env[src.operands[0]], pts)
        elif src is not None and not isinstance(x, Acc) and src.op in ELEMENTWISE:
            vals = self._evaluate_at(src, pts)      # its operands' values kept for other uses
        elif dims is not None:
            key = {(1,): row_key, (0,): col_key}.get(tuple(dims), lambda k: 0)
            seen = {}
            for k, idx in enumerate(coords):
                kk = key(k)
                if kk not in seen:
                    seen[kk] = ref.read(idx)
                vals.append(seen[kk])
        elif pts.pairs:
            for k in range(0, len(coords), 2):       # registers 2q, 2q + 1: columns c, c + 1
                vals.extend(T_.read_vec(ref, coords[k], 2))
        else:
            vals = [ref.read(idx) for idx in coords]
        if dims is not None or not self.rplan.sliced_staging:
            # kept for the op's other readers; where the plan is tight (it stages B a panel at
            # a time) only the broadcasts are: a whole tile's values kept from one reader to
            # the next held registers ptxas then spilled (gdn_bwd's dk kernel)
            self._reg_values[(o, sig)] = vals
        return vals

    # -- reductions --------------------------------------------------------------------------
    def _acc_row_sums(self, v):
        """Σ over the columns of [64, N] accumulator ``v``: a thread's registers of each of its
        two rows, then the four lanes of the row (two shuffles); a transposed accumulator
        through its shared copy."""
        x = self.env[v]
        if x.transposed:
            return self._row_sums(self._materialised(v), tuple(v.shape))
        out = self._vector()
        W = self.rplan.warpgroups
        # several warpgroups each hold a share of the columns: each writes its partial sums to
        # a vector of its own, then the first C threads add them up
        parts = [out] + [self._vector() for _ in range(W - 1)]
        rows = {}
        for r, val in enumerate(x.values):
            half = (r // 2) % 2                       # registers of row g (0) or g + 8 (1)
            rows[half] = val if half not in rows else B.add(rows[half], val)
        coords = x.coords(self.warp, self.lane)
        for half in (0, 1):
            s = rows[half]
            for m in (1, 2):
                s = B.add(s, shfl(s, m, "bfly"))
                self.cost.event("shfl")
            row = coords[2 * half][0]
            for g, vec in enumerate(parts):
                cond = B.icmp("eq", self.lane % 4, 0)
                if W > 1:
                    cond = B.band(cond, B.icmp("eq", self.wg, g))
                B.if_then(cond, lambda row=row, s=s, vec=vec: vec.write((row,), s))
        bar.sync_threads()
        self.cost.event("bar.sync")
        if W > 1:
            C = self.rplan.C

            def total():
                t = out.read((self.tid,))
                for vec in parts[1:]:
                    t = B.add(t, vec.read((self.tid,)))
                out.write((self.tid,), t)
            B.if_then(B.icmp("lt", self.tid, C), total)
            bar.sync_threads()
            self.cost.event("bar.sync")
        return out

    def _vector_sum(self, x: T_.Ref, length: int) -> T_.Ref:
        """Σ of a [length] vector: warp 0, lanes over the elements, a butterfly; the sum lands
        in a shared vector's first element, read back by every thread."""
        out = self._vector(1)

        def total():
            s = None
            for e in range(0, length, 32):
                idx = self.lane + e
                val = x.read((idx,))
                if length - e < 32:
                    val = B.sel(B.icmp("lt", idx, length), val, B.f(0.0))
                s = val if s is None else B.add(s, val)
            for m in (16, 8, 4, 2, 1):
                s = B.add(s, shfl(s, m, "bfly"))
                self.cost.event("shfl")
            B.if_then(B.icmp("eq", self.lane, 0), lambda: out.write((0,), s))
        B.if_then(B.icmp("lt", self.tid, 32), total)
        bar.sync_threads()
        self.cost.event("bar.sync")
        return T_.FnRef((), lambda idx: out.read((0,)))

    # -- products ----------------------------------------------------------------------------
    def _a_element(self, n):
        """``a(m, k)``: element (m, k) of the product's A = op(W) (∘ E for decay_matmul)."""
        w, _, tw, _ = product_operands(n)
        wr = self._materialised(w)
        if n.op != "kda.decay_matmul":
            return (lambda m, k: wr.read((k, m))) if tw else (lambda m, k: wr.read((m, k)))
        gates = row_gate_sources(n)
        if gates is None:
            raise LoweringError("register tiles: a decay_matmul with per-channel gates")
        P, Q = (self.env[g] for g in gates)
        diagonal = int(n.attrs.get("diagonal", 0))
        clamp_min = n.attrs.get("clamp_min")
        clamp_min = None if clamp_min is None else float(clamp_min)

        def weighted(i, j):
            # W[i, j] · 2^(P[i] - Q[j]), masked to j <= i + diagonal
            e = B.exp2_clamped(B.sub(P.read((i,)), Q.read((j,))), clamp_min)
            keep = B.icmp("le", j, i + diagonal) if diagonal else B.icmp("le", j, i)
            return B.sel(keep, B.mul(wr.read((i, j)), e), B.f(0.0))
        return (lambda m, k: weighted(k, m)) if tw else weighted

    def _dot_any(self, n):
        """A [64, N] product by the general rule (module doc)."""
        M, K, N = product_shape(n)
        if M != 64:
            raise LoweringError(f"register tiles: a product of {M} rows")
        _, x, _, tx = product_operands(n)
        form = self.rplan.b_forms[n]
        a_el = self._a_element(n)
        if form == "bf16":
            return self._dot_b_ring_bf16(n, a_el, x, tx, K, N)
        if form == "tf32":
            xs = self.slot_of[through_views(x).owner]
            return self._dot_tf32(a_el, xs.layout, xs.offset, K, N)
        base = self.rplan.smem[f"bstage{self.rplan.b_stages.index(n)}"]
        xr = self._materialised(x)
        b_el = (lambda k, j: xr.read((j, k))) if tx else (lambda k, j: xr.read((k, j)))
        return self._dot_staged(form, a_el, b_el, base, K, N)

    def _dot_staged(self, form: str, a_el, b_el, base: int, K: int, N: int):
        """A (registers) · B staged by the warpgroups K-major at ``base``: in one piece, or
        where the plan slices the staging (`staging_depth`), one 128-byte panel of K at a
        time through one buffer (each slice's products complete before the next overwrites
        it). Forms: "stage_tf32" (TF32, one product per 8-deep block), "stage_split" (B and A
        as bf16 hi + lo, three per 16-deep block) and "stage_split_tf32" (TF32 hi + lo, three
        per 8-deep block); in each the small terms first."""
        eb, parts, kstep = STAGED_FORMS[form]
        ks = staging_depth(form, K, self.rplan.sliced_staging)
        lay = SmemLayout(N, ks, eb, SWIZZLE)
        Nw, col0, rows = self._b_rows(N)
        values = [B.f(0.0)] * (Nw // 2)
        for k0 in range(0, K, ks):
            if k0:
                # this warpgroup's products of the last slice have read the buffer
                wgmma.wgmma_commit(self.target)
                wgmma.wgmma_wait(self.target, 0)
                self.cost.event("wgmma.commit")
                self.cost.event("wgmma.wait")
            self._region_barrier()
            self._stage_slice(form, b_el, base, lay, k0, ks, N)
            bar.fence_proxy_async_shared()
            bar.sync_threads()
            self.cost.event("bar.sync")
            ds = [wgmma.k_block_descriptors(lay, self._addr32(base + p * lay.size_bytes) + rows,
                                            ks // kstep, kstep) for p in range(parts)]
            el = (lambda m, k, k0=k0: a_el(m, k0 + k))
            a_regs = (self._half_a_split(ks, el) if form == "stage_split" else
                      self._tf32_a_regs(ks, el, split=parts == 2))
            wgmma.wgmma_fence(self.target)
            for kb, regs in enumerate(a_regs):
                if parts == 1:
                    values = wgmma.wgmma_tf32_rs(self.target, values, regs, ds[0][kb], Nw)
                    self.cost.event("wgmma")
                    continue
                (ahi, alo), dh, dl = regs, ds[0][kb], ds[1][kb]
                for a, d in ((alo, dh), (ahi, dl), (ahi, dh)):
                    values = (wgmma.wgmma_half_rs(self.target, values, a, d, Nw, "bf16")
                              if form == "stage_split" else
                              wgmma.wgmma_tf32_rs(self.target, values, a, d, Nw))
                self.cost.event("wgmma", 3)
        return Acc(self._finish(values), Nw, False, col0)

    def _stage_slice(self, form: str, b_el, base: int, lay: SmemLayout, k0: int, ks: int,
                     N: int) -> None:
        """Write B[k0 : k0 + ks, :] K-major into the staging tile(s) at ``base``."""
        threads = self.consumer_threads
        if form == "stage_split":
            for it in range(N * ks // (2 * threads)):
                e = self.tid + it * threads
                j, k = e // (ks // 2), 2 * (e % (ks // 2))
                hi, lo = bf16_split_pack(b_el(k0 + k, j), b_el(k0 + k + 1, j))
                at = lay.byte_offset(j, k) // 4
                B.store(self.smem_base, base // 4 + at, hi, "i32")
                B.store(self.smem_base, (base + lay.size_bytes) // 4 + at, lo, "i32")
            return
        for it in range(N * ks // threads):
            e = self.tid + it * threads
            j, k = e // ks, e % ks
            v = b_el(k0 + k, j)
            hi = B.round_to(v, "tf32")
            at = (base + lay.byte_offset(j, k)) // 4
            B.store(self.smem_base, at, hi, "f32")
            if form == "stage_split_tf32":
                B.store(self.smem_base, at + lay.size_bytes // 4,
                        B.round_to(B.sub(v, hi), "tf32"), "f32")

    def _b_rows(self, N: int) -> tuple:
        """(columns of the result this warpgroup computes, the first of them, the byte offset
        of its first row in a K-major B tile): all of N with one warpgroup, else its share (a
        K-major tile's rows are one 128-byte swizzle row each)."""
        W = self.rplan.warpgroups
        if W == 1:
            return N, 0, 0
        col0 = self.wg * (N // W)
        return N // W, col0, col0 * SWIZZLE

    def _b_panels(self, lay: SmemLayout, N: int) -> tuple:
        """The same for an N-major tile (`lay`): all of N with one warpgroup, else one
        64-column swizzle panel each (match checks N = 64 x the warpgroups)."""
        if self.rplan.warpgroups == 1:
            return N, 0, 0
        return lay.panel_cols, self.wg * lay.panel_cols, self.wg * lay.panel_bytes

    def _tf32_a_regs(self, K: int, element, split: bool = False, row_factors=None) -> list:
        """Per 8-deep block, the TF32 A fragment registers of A[m, k] = ``element(m, k)``
        (this warp's rows, PTX's m64nNk8 layout); ``split``: (hi, lo) register lists, hi + lo
        = A to ~22 bits (`tf32_split_operand_bits`); ``row_factors``: a factor for each of
        the thread's two rows (16·warp + g and 8 after it), multiplied in before rounding."""
        out = []
        for kb in range(K // 8):
            regs = []
            for jj in range(4):
                m, kc = wgmma_tf32_a_coord(self.warp, self.lane, jj)
                v = element(m, 8 * kb + kc)
                if row_factors is not None:
                    v = B.mul(v, row_factors[jj % 2])
                regs.append(tf32_split_operand_bits(v) if split else tf32_operand_bits(v))
            out.append(([r[0] for r in regs], [r[1] for r in regs]) if split else regs)
        return out

    def _dot_tf32(self, a_el, lay: SmemLayout, base: int, K: int, N: int):
        """A (TF32 registers, ``a_el``) · B (K-major f32 tile [N, K] at ``base``)."""
        a_regs = self._tf32_a_regs(K, a_el)
        N, col0, rows = self._b_rows(N)
        descs = wgmma.k_block_descriptors(lay, self._addr32(base) + rows, K // 8, 8)
        values = [B.f(0.0)] * (N // 2)
        wgmma.wgmma_fence(self.target)
        for regs, d in zip(a_regs, descs):
            values = wgmma.wgmma_tf32_rs(self.target, values, regs, d, N)
            self.cost.event("wgmma")
        return Acc(self._finish(values), N, False, col0)

    def _dot_b_ring_bf16(self, n, a_el, x, tx: bool, K: int, N: int):
        """A (bf16 hi + lo registers) · B, a bf16 ring tile as TMA stored it: [N, K] (K-major,
        one wgmma per k block) or [K, N] (N-major: one per k block and 64-column panel). Row
        factors of a [K, N] tile scale A's columns."""
        xn, xf = row_scaled(x)
        xs = self.slot_of[xn]
        factor = self._factors(xf)
        el = a_el if factor is None else (lambda m, k: B.mul(a_el(m, k), factor.read((k,))))
        a_regs = self._half_a_split(K, el)
        lay = xs.layout
        N, col0, share = self._b_rows(N) if tx else self._b_panels(lay, N)
        base = self._addr32(xs.offset) + share
        values = [B.f(0.0)] * (N // 2)
        wgmma.wgmma_fence(self.target)
        for kb, (hi, lo) in enumerate(a_regs):
            panels = [(0, N)] if tx else [(n0, lay.panel_cols) for n0 in range(0, N, lay.panel_cols)]
            for n0, width in panels:
                st, lbo, sbo = wgmma.operand_start_and_strides(lay, "b", tx, n0, 16 * kb)
                d = wgmma.make_descriptor(base + st, lbo, sbo, SWIZZLE)
                part = values[n0 // 2:(n0 + width) // 2]
                for regs in (lo, hi):
                    part = wgmma.wgmma_half_rs(self.target, part, regs, d, width, "bf16",
                                               b_mn_major=not tx)
                    self.cost.event("wgmma")
                values[n0 // 2:(n0 + width) // 2] = part
        return Acc(self._finish(values), N, False, col0)

    # -- stores ------------------------------------------------------------------------------
    def _store_rows(self, n) -> None:
        """A [C, N] accumulator (not transposed) to a token tensor: bf16 rows staged in shared
        memory, then 16-byte stores of the rows inside the sequence; a [C] vector by one thread
        per row."""
        v = n.operands[2]
        mem = self.value_part(n, self.env[n.operands[0]])
        geo = self.geo
        C = self.rplan.C
        x = self.env[v]
        if len(v.shape) == 1:
            pos = self._c * geo.C + self.tid

            def one():
                mem.store(x.read((self.tid,)), geo.token_row(mem, pos, geo.hv), [])
            B.if_then(B.band(B.icmp("lt", self.tid, C), B.icmp("lt", pos, geo.seqlen)), one)
            return
        self._store_token_rows(mem, x, v.shape[1], 0)

    def _store_token_rows(self, mem, acc, width: int, col0) -> None:
        """Accumulator ``acc`` (``width`` logical columns from ``col0``) to token tensor
        ``mem``: bf16 rows staged in shared memory (the next `out` region), then 16-byte stores
        of the rows inside the sequence."""
        self._region_barrier()
        geo, C = self.geo, self.rplan.C
        base = self.rplan.smem[f"out{self._outs}"] // 2
        self._outs += 1
        plain = isinstance(col0, int) and col0 == 0
        for val, (i, j) in zip(acc.values, acc.coords(self.warp, self.lane)):
            B.store(self.smem_base, base + i * width + (j if plain else j - col0), val, "bf16")
        bar.sync_threads()
        self.cost.event("bar.sync")
        per_row = width // 8
        for it in range(C * per_row // self.consumer_threads):
            idx = self.tid + it * self.consumer_threads
            row, part = idx // per_row, idx % per_row
            vals = B.load_vec(self.smem_base, base + row * width + part * 8, 8, "bf16")
            pos = self._c * geo.C + row

            def write(vals=vals, pos=pos, part=part):
                mem.store_vec(vals, geo.token_row(mem, pos, geo.hv),
                              [part * 8 if plain else col0 + part * 8])
            B.if_then(B.icmp("lt", pos, geo.seqlen), write)


__all__ = ["GenericTileOps", "product_operands", "product_shape", "b_operand_form",
           "generic_dot_regions", "MAT_PAD"]
