"""Tile references and the per-op emitters of the lowering (a library, driven by kernel.py).

A tile value of the program is, while a kernel is emitted, a :class:`Ref`: something that can
produce element ``x[idx]`` (an f32 value) for any index tuple of int-likes. Kinds:

- :class:`BufRef`: a per-CTA fp32 buffer (shared memory or the global scratch), with element
  offset and strides, so broadcast / transpose / extract_row are free re-indexings of it;
- :class:`ConstRef`, :class:`ScalarRef`: a constant, a kernel scalar;
- :class:`FnRef`: a lazy expression, evaluated at the reader's index (element-wise ops, masks,
  loads from global memory): the consumer's loop computes it, nothing is stored.

Emitters (executed by the ``count`` threads of the CTA; the caller puts a barrier after each):
:func:`foreach` (thread-strided loop over a tile's elements), :func:`materialize`,
:func:`contraction` (register-tiled FMA loop: dot, decay_dot, decay_matmul), :func:`emit_cumsum`,
:func:`emit_reduce_sum`, :func:`emit_tril_inv`, :func:`emit_tril_solve`.

Everything is written in the primitives of backend.py, so the same code emits MLIR or runs in
the CPU simulator. Math is fp32: ``ex2.approx`` / ``lg2.approx`` / ``rcp.approx``, ``rsqrt`` as
``1 / sqrt.rn`` — no libdevice call is ever emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import backend as B

# ------------------------------------------------------------------------------------------
# references
# ------------------------------------------------------------------------------------------


class Ref:
    """Interface: ``shape``, ``cheap`` (reading costs a load at most), ``read(idx)``; optionally
    ``read_vec(idx, n)``: the ``n`` elements from ``idx`` along the last dim (``idx[-1]`` a
    multiple of ``n``), one vector load per memory operand where the layout allows."""


#: elements one thread takes together in element-wise loops (one 16-byte access for fp32)
VEC = 4
#: cost-report event: an element access of a thread's group that could not be one vector
#: access (a transposed or split operand): across a warp such accesses lie ``VEC`` elements
#: apart (more sectors per global instruction, bank conflicts in shared memory), which the
#: instruction counts alone do not show
STRIDED = "strided.{space}"


def lanes(idx, n: int) -> list:
    """The ``n`` indices from ``idx`` along the last dim."""
    return [list(idx[:-1]) + [addk(idx[-1], k)] for k in range(n)]


def vec_ok(x: Ref) -> bool:
    """Whether every memory read of ``x`` along its last dim is a vector access (or needs none:
    constants, broadcasts along it)."""
    if isinstance(x, BufRef):
        return bool(x.strides) and (x.strides[-1] == 0 or x.vector_ok(VEC))
    if isinstance(x, (ConstRef, ScalarRef)):
        return True
    return bool(getattr(x, "vec_ok", False))


def read_vec(x: Ref, idx, n: int) -> list:
    """``[x.read(i) for i in lanes(idx, n)]``, through ``x.read_vec`` where it has one."""
    if n == 1:
        return [x.read(list(idx))]
    vec = getattr(x, "read_vec", None)
    if vec is not None:
        return vec(list(idx), n)
    return [x.read(i) for i in lanes(idx, n)]


@dataclass
class Scratch:
    """The per-CTA scratch region: base pointer and where it lives ("smem" or "global")."""
    base: object
    space: str


@dataclass
class BufRef(Ref):
    scratch: Scratch
    offset: int               # element offset from the scratch base
    shape: tuple
    strides: tuple
    cheap: bool = True

    def address(self, idx):
        e = self.offset
        for i, s in zip(idx, self.strides):
            if s and not (isinstance(i, int) and i == 0):
                e = e + i * s
        return e

    def read(self, idx):
        return B.load(self.scratch.base, self.address(idx))

    def write(self, idx, value) -> None:
        B.store(self.scratch.base, self.address(idx), value)

    def vector_ok(self, n: int) -> bool:
        """Whether ``n`` elements from an index whose last part is a multiple of ``n`` are
        consecutive and ``n``-element aligned (the scratch pools start 16-byte aligned)."""
        return (bool(self.strides) and self.strides[-1] == 1 and self.offset % n == 0
                and all(s % n == 0 for s in self.strides[:-1]))

    def read_vec(self, idx, n: int) -> list:
        if self.strides and self.strides[-1] == 0:
            return [self.read(idx)] * n          # broadcast along the last dim: one load
        if self.vector_ok(n):
            return B.load_vec(self.scratch.base, self.address(idx), n)
        B.count(STRIDED.format(space=self.scratch.space), n)
        return [self.read(i) for i in lanes(idx, n)]

    def write_vec(self, idx, values) -> None:
        if self.vector_ok(len(values)):
            B.store_vec(self.scratch.base, self.address(idx), values)
            return
        B.count(STRIDED.format(space=self.scratch.space), len(values))
        for i, v in zip(lanes(idx, len(values)), values):
            self.write(i, v)

    def same_storage(self, other) -> bool:
        return (isinstance(other, BufRef) and other.offset == self.offset
                and other.strides == self.strides and other.shape == self.shape)


@dataclass
class ConstRef(Ref):
    value: float
    shape: tuple
    cheap: bool = True

    def read(self, idx):
        return B.f(self.value)

    def read_vec(self, idx, n: int) -> list:
        return [B.f(self.value)] * n


@dataclass
class ScalarRef(Ref):
    value: object
    shape: tuple = ()
    cheap: bool = True

    def read(self, idx):
        return self.value

    def read_vec(self, idx, n: int) -> list:
        return [self.value] * n


@dataclass
class FnRef(Ref):
    shape: tuple
    fn: object
    cheap: bool = False
    #: the Ref this one is the transpose of (`transpose`): `materialize` walks that one's
    #: order, so a transposed global read stays coalesced (a value-first state row)
    transpose_of: object = None
    #: ``vec(idx, n)``: what ``read_vec`` returns (None: element by element)
    vec: object = None
    #: every memory read ``vec`` makes is a vector access (:func:`vec_ok`)
    vec_ok: bool = False

    def read(self, idx):
        return self.fn(list(idx))

    def read_vec(self, idx, n: int) -> list:
        if self.vec is not None:
            return self.vec(list(idx), n)
        return [self.fn(i) for i in lanes(idx, n)]


def broadcast(x: Ref, dims, shape) -> Ref:
    dims = list(dims)
    keep = [d for d in range(len(shape)) if d not in dims]
    shape = tuple(shape)
    if isinstance(x, BufRef):
        strides = [0] * len(shape)
        for k, d in enumerate(keep):
            strides[d] = x.strides[k]
        return BufRef(x.scratch, x.offset, shape, tuple(strides))
    if isinstance(x, ConstRef):
        return ConstRef(x.value, shape)
    if isinstance(x, ScalarRef):
        return ScalarRef(x.value, shape)
    last_kept = bool(keep) and keep[-1] == len(shape) - 1

    def vec(idx, n):
        sub = [idx[d] for d in keep]
        return read_vec(x, sub, n) if last_kept else [x.read(sub)] * n
    return FnRef(shape, lambda idx: x.read([idx[d] for d in keep]), cheap=x.cheap, vec=vec,
                 vec_ok=vec_ok(x) if last_kept else True)


def transpose(x: Ref) -> Ref:
    shape = (x.shape[1], x.shape[0])
    if isinstance(x, BufRef):
        return BufRef(x.scratch, x.offset, shape, (x.strides[1], x.strides[0]))
    if isinstance(x, ConstRef):
        return ConstRef(x.value, shape)
    return FnRef(shape, lambda idx: x.read([idx[1], idx[0]]), cheap=x.cheap, transpose_of=x)


def extract_row(x: Ref, index: int) -> Ref:
    if index < 0:
        index += x.shape[0]
    shape = tuple(x.shape[1:])
    if isinstance(x, BufRef):
        return BufRef(x.scratch, x.offset + index * x.strides[0], shape, tuple(x.strides[1:]))
    if isinstance(x, ConstRef):
        return ConstRef(x.value, shape)
    return FnRef(shape, lambda idx: x.read([index] + list(idx)), cheap=x.cheap,
                 vec=lambda idx, n: read_vec(x, [index] + list(idx), n), vec_ok=vec_ok(x))


# ------------------------------------------------------------------------------------------
# loops
# ------------------------------------------------------------------------------------------


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def unravel(e, shape) -> list:
    """The index of flat element ``e`` (< numel(shape): the outermost dimension takes no
    modulo)."""
    if not shape:
        return []
    idx = []
    for d in reversed(shape[1:]):
        idx.insert(0, e % d)
        e = e // d
    return [e] + idx


def strided_indices(base, shape, stride: int, count: int) -> list:
    """The indices of flat elements ``base + k * stride`` for k < count (each < numel). Where
    ``stride`` is a multiple of the inner dimensions' size, they share the inner indices of
    ``base`` and differ by a constant in the outermost one, so an element's address is one
    shared variable part plus an immediate instead of a division chain of its own."""
    inner = numel(shape[1:])
    if shape and stride % inner == 0:
        first = unravel(base, shape)
        return [[addk(first[0], k * (stride // inner))] + first[1:] for k in range(count)]
    return [unravel(addk(base, k * stride), shape) for k in range(count)]


def addk(i, k: int):
    """int-like + constant."""
    return i + k if k else i


@dataclass
class Threads:
    tid: object               # int-like thread index
    count: int
    # elements (rows) whose loads a thread issues together in foreach_batched / fold_batched;
    # the lowering sets it from LowerOptions.load_batch
    batch: int = 4
    # cumsums and reductions sum in an order set by the tile's shape alone, not by ``count``
    # (LowerOptions.ordered_sums)
    ordered: bool = False
    # element-wise loops that take VEC elements per thread at a time (LowerOptions.vector_loops):
    # "all", "dst" (only where the destination takes vector accesses), "capable" (that and
    # every read of the source) or "off"
    vec_loops: str = "all"


def foreach(th: Threads, shape, body) -> None:
    """Run ``body(idx)`` for every element of ``shape``, element e on thread e % count."""
    n = numel(shape)
    if n == 1:
        B.if_then(B.icmp("eq", th.tid, 0), lambda: body([0] * len(shape)))
        return
    if n % th.count == 0 and n // th.count <= 2:
        for idx in strided_indices(th.tid, shape, th.count, n // th.count):
            body(idx)
        return
    if n < th.count:
        B.if_then(B.icmp("lt", th.tid, n), lambda: body(unravel(th.tid, shape)))
        return

    def step(e):
        body(unravel(e, shape))
        return []

    B.for_range(th.tid, n, th.count, step, trips=-(-n // th.count))


def each_round(th: Threads, items: int, body) -> None:
    """``body(m, e)`` for work item e = thread + m * count of ``items`` (round m): whole rounds
    unguarded, the last partial one only on the threads that have an item (a warp-uniform
    branch where ``items`` is a multiple of 32)."""
    for m in range(-(-items // th.count)):
        e = addk(th.tid, m * th.count)
        if (m + 1) * th.count <= items:
            body(m, e)
        else:
            B.if_then(B.icmp("lt", e, items), lambda m=m, e=e: body(m, e))


def foreach_batched(th: Threads, shape, read, write, straight_shared: bool = False) -> None:
    """``write(idx, read(idx))`` for every element of ``shape`` (element e on thread
    e % count), with each thread's reads of ``th.batch`` elements emitted before their writes:
    the loads of a batch are in flight together, so a loop of n elements costs about
    n / (count * batch) load latencies instead of n / count.

    The emitted loads of a batch do not wait on its stores, which is what lets them overlap
    (a store may alias a later load for all the compiler knows, so it keeps program order).
    Valid when no element's ``read`` depends on another element's ``write`` of the same loop,
    which holds for every loop the kernels run: the threads of a CTA run their elements
    concurrently without a barrier, so such a dependence would already be a race."""
    n = numel(shape)
    per = n // th.count if n % th.count == 0 else 0
    b = min(th.batch, per)
    while b > 1 and per % b:
        b -= 1
    if b <= 1:
        foreach(th, shape, lambda idx: write(idx, read(idx)))
        return

    def group(idxs):
        values = [read(idx) for idx in idxs]
        for idx, v in zip(idxs, values):
            write(idx, v)

    if per == b:
        # straight-line: the plain unravel unless ``straight_shared`` (with shared indices
        # everywhere, the backward's dk and dq kernels spilled 4-8 bytes at their 96 registers)
        group(strided_indices(th.tid, shape, th.count, b) if straight_shared else
              [unravel(addk(th.tid, k * th.count), shape) for k in range(b)])
        return
    # the loop starts at the thread index, so LLVM keeps it a loop (unrolled, the batches' loads
    # were hoisted together and the backward's dq kernel spilled at its 96 registers)
    def step(e):
        group(strided_indices(e, shape, th.count, b))
        return []

    B.for_range(th.tid, n, th.count * b, step, trips=per // b)


def vector_width(th: Threads, shape, src: Ref | None = None, dst_ok: bool = True) -> int:
    """Elements a thread takes together (:data:`VEC`) in an element-wise loop over ``shape``:
    where the last dim is a multiple of it and the groups split evenly over the threads (every
    thread the same trips), else 1. ``th.vec_loops`` "dst" also wants the destination to take
    vector accesses (``dst_ok``), "capable" that and every read of ``src``: a group's element
    accesses of a transposed or hi/lo-split operand go 16 bytes apart across a warp (4-way
    bank conflicts, 4x the sectors per instruction); "off" is 1 always."""
    if th.vec_loops == "off" or not shape or shape[-1] % VEC or (numel(shape) // VEC) % th.count:
        return 1
    if th.vec_loops == "dst" and not dst_ok:
        return 1
    if th.vec_loops == "capable" and not (dst_ok and (src is None or vec_ok(src))):
        return 1
    return VEC


def foreach_vec_batched(th: Threads, shape, n: int, read, write) -> None:
    """:func:`foreach_batched` over groups of ``n`` consecutive elements of the last dim:
    ``write(idx, read(idx))`` with ``idx`` each group's first element and values lists of
    ``n``; group g on thread g % count, a batch of ``th.batch // n`` groups (at least one)."""
    if n == 1:
        foreach_batched(th, shape, read, write)
        return
    gshape = tuple(shape[:-1]) + (shape[-1] // n,)
    gth = replace(th, batch=max(1, th.batch // n))

    def first(gidx):
        return list(gidx[:-1]) + [gidx[-1] * n]
    foreach_batched(gth, gshape, lambda g: read(first(g)), lambda g, v: write(first(g), v))


def foreach_transposed(th: Threads, src: Ref, write, n: int = 1) -> None:
    """``write([r, c], src[r, c])`` for every element of the 2-D ``src``, walked down its
    columns: consecutive threads take consecutive rows (consecutive addresses of a store that
    transposes the tile). With ``n`` > 1 a thread takes ``n`` consecutive columns of its row
    from one vector read (:func:`read_vec`) and writes them one by one: a warp's reads of a
    row-major source then go 16 bytes per lane instead of 4, one bank group per row, where
    reading down a column of an unpadded source put every lane of a warp on one bank."""
    rows, cols = src.shape
    if n == 1 or cols % n or (rows * cols // n) % th.count:
        view = transpose(src)
        foreach_batched(th, view.shape, view.read, lambda idx, v: write([idx[1], idx[0]], v))
        return
    gth = replace(th, batch=max(1, th.batch // n))

    def store(g, values):
        for k, v in enumerate(values):
            write([g[1], addk(g[0] * n, k)], v)
    foreach_batched(gth, (cols // n, rows), lambda g: read_vec(src, [g[1], g[0] * n], n), store)


def materialize(th: Threads, src: Ref, dst: BufRef, source_order: bool = False) -> None:
    """dst = src, element e of the loop on thread e % count. With ``source_order`` the
    transpose of a Ref is walked in that Ref's order (consecutive threads along its last dim,
    where a memory row is contiguous), writing dst transposed: the tile buffers' odd row pitch
    keeps those shared-memory writes free of bank conflicts (a value-first state row read
    along V had each warp's loads 32 rows apart: the H100's decode step 2.2x slower)."""
    inner = getattr(src, "transpose_of", None) if source_order else None
    if inner is not None:
        foreach_batched(th, inner.shape, inner.read, lambda idx, v: dst.write([idx[1], idx[0]], v))
        return
    n = vector_width(th, dst.shape, src, dst.vector_ok(VEC))
    if n > 1:
        foreach_vec_batched(th, dst.shape, n, lambda idx: read_vec(src, idx, n), dst.write_vec)
        return
    foreach_batched(th, dst.shape, src.read, dst.write)


def fold_batched(n: int, load, combine, init: list, batch: int) -> list:
    """``acc = combine(acc, r, load(r))`` for r = 0 .. n-1 from ``init`` (a list), with the
    loads of ``batch`` consecutive r emitted before they are combined: the loads overlap and
    the combination order, hence the result, is that of the plain loop."""
    b = min(batch, n)
    while b > 1 and n % b:
        b -= 1

    def step(r0, *acc):
        acc = list(acc)
        rs = [addk(r0, k) for k in range(b)]
        values = [load(r) for r in rs]
        for r, v in zip(rs, values):
            acc = combine(acc, r, v)
        return acc

    return B.for_range(0, n, b, step, list(init), trips=-(-n // b))


# ------------------------------------------------------------------------------------------
# contraction: out[p, q] = epilogue(p, q, fold_r combine(...)), register-tiled over threads
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContractionPlan:
    tm: int
    tn: int
    rm: int            # rows per thread per pass
    rn: int            # cols per thread
    passes: int

    @property
    def threads(self) -> int:
        return self.tm * self.tn


def contraction_plan(M: int, N: int, nthreads: int, max_acc: int = 64) -> ContractionPlan:
    """Threads as a tm x tn grid (a warp spans min(N, 32) consecutive columns, so the row
    operand is a broadcast read and the column operand a contiguous one); each thread owns
    rm x rn outputs (rows ti + tm*a, cols tj + tn*b), in ``passes`` row passes so that
    rm * rn <= max_acc accumulators live in registers. With too few rows to give every thread
    one (a decode step's [1, K] @ [K, V]), tn grows past a warp over the columns: more threads
    each fold fewer outputs (every output still folds over r in the same order)."""
    tn = min(N, 32)
    while N % tn:
        tn //= 2
    tm = min(M, max(1, nthreads // tn))
    while M % tm:
        tm //= 2
    while tm * tn * 2 <= nthreads and N % (tn * 2) == 0:
        tn *= 2
    rn = N // tn
    rm_total = M // tm
    rm = max(1, min(rm_total, max_acc // max(1, rn)))
    while rm_total % rm:
        rm -= 1
    return ContractionPlan(tm, tn, rm, rn, rm_total // rm)


def contraction(th: Threads, out: BufRef, R: int, row_fn, col_fn, combine, pre_fn=None,
                epilogue=None, max_acc: int = 32) -> None:
    """``out[p, q] = epilogue(p, q, acc)``, ``acc = fold over r < R of
    combine(acc, row_vals(p, r), col_vals(r, q), pre_vals(p, q), p, q, r)`` from 0.

    ``row_fn(p, r)`` / ``col_fn(r, q)`` return lists of f32 values (loaded once per r for all
    of the thread's rows / columns), ``pre_fn(p, q)`` a list hoisted out of the r loop.
    """
    M, N = out.shape
    plan = contraction_plan(M, N, th.count, max_acc)
    ti = th.tid // plan.tn
    tj = th.tid % plan.tn

    def body():
        for pss in range(plan.passes):
            rows = [addk(ti, plan.tm * (pss * plan.rm + a)) for a in range(plan.rm)]
            cols = [addk(tj, plan.tn * b) for b in range(plan.rn)]
            pre = {}
            if pre_fn is not None:
                for a in range(plan.rm):
                    for b in range(plan.rn):
                        pre[(a, b)] = pre_fn(rows[a], cols[b])
            init = [B.f(0.0)] * (plan.rm * plan.rn)

            def load(r):
                return ([row_fn(rows[a], r) for a in range(plan.rm)],
                        [col_fn(r, cols[b]) for b in range(plan.rn)])

            def fold(acc, r, vals):
                rv, cv = vals
                new = []
                for a in range(plan.rm):
                    for b in range(plan.rn):
                        new.append(combine(acc[a * plan.rn + b], rv[a], cv[b], pre.get((a, b)),
                                           rows[a], cols[b], r))
                return new

            acc = fold_batched(R, load, fold, init, th.batch)
            for a in range(plan.rm):
                for b in range(plan.rn):
                    v = acc[a * plan.rn + b]
                    if epilogue is not None:
                        v = epilogue(rows[a], cols[b], v)
                    out.write([rows[a], cols[b]], v)

    if plan.threads < th.count:
        B.if_then(B.icmp("lt", th.tid, plan.threads), body)
    else:
        body()


def emit_dot(th: Threads, out: BufRef, a: Ref, b: Ref) -> None:
    """out = a @ b (a: [M, R], b: [R, N], any views), fp32 FMA."""
    contraction(th, out, a.shape[1],
                lambda p, r: [a.read([p, r])],
                lambda r, q: [b.read([r, q])],
                lambda acc, rv, cv, pre, p, q, r: B.fma(rv[0], cv[0], acc))


def emit_decay_dot(th: Threads, out: BufRef, lhs: Ref, rhs: Ref, gl: Ref, gr: Ref,
                   diagonal: int, clamp_min) -> None:
    """out[i, j] = sum_d lhs[i, d] rhs[j, d] 2^(gl[i, d] - gr[j, d]) for j <= i + diagonal.

    Evaluated with the relative exponent of every term (the S = 1 form; it is exact for every
    subblock size — the factored S > 1 form is a tensor-core optimisation of the same value)."""
    zero = B.f(0.0)

    def combine(acc, rv, cv, pre, i, j, d):
        e = B.exp2_clamped(B.sub(rv[1], cv[1]), clamp_min)
        return B.fma(B.mul(rv[0], cv[0]), e, acc)

    contraction(th, out, lhs.shape[1],
                lambda i, d: [lhs.read([i, d]), gl.read([i, d])],
                lambda d, j: [rhs.read([j, d]), gr.read([j, d])],
                combine,
                epilogue=lambda i, j, v: B.sel(B.icmp("le", j, addk(i, diagonal)), v, zero))


def emit_decay_matmul(th: Threads, out: BufRef, w: Ref, x: Ref, g_row: Ref, g_col: Ref,
                      diagonal: int, transpose_w: bool, clamp_min) -> None:
    """E[i, j, d] = 2^(g_row[i, d] - g_col[j, d]) for j <= i + diagonal (else 0);
    not transposed: out[i, d] = sum_j w[i, j] x[j, d] E[i, j, d];
    transposed:     out[j, d] = sum_i w[i, j] x[i, d] E[i, j, d]."""
    zero = B.f(0.0)
    if not transpose_w:
        def combine(acc, rv, cv, pre, i, d, j):
            ok = B.icmp("le", j, addk(i, diagonal))
            e = B.exp2_clamped(B.sub(pre[0], cv[1]), clamp_min)
            return B.add(acc, B.sel(ok, B.mul(B.mul(rv[0], cv[0]), e), zero))

        contraction(th, out, w.shape[1],
                    lambda i, j: [w.read([i, j])],
                    lambda j, d: [x.read([j, d]), g_col.read([j, d])],
                    combine, pre_fn=lambda i, d: [g_row.read([i, d])])
    else:
        def combine(acc, rv, cv, pre, j, d, i):
            ok = B.icmp("le", j, addk(i, diagonal))
            e = B.exp2_clamped(B.sub(cv[1], pre[0]), clamp_min)
            return B.add(acc, B.sel(ok, B.mul(B.mul(rv[0], cv[0]), e), zero))

        contraction(th, out, w.shape[0],
                    lambda j, i: [w.read([i, j])],
                    lambda i, d: [x.read([i, d]), g_row.read([i, d])],
                    combine, pre_fn=lambda j, d: [g_col.read([j, d])])


# ------------------------------------------------------------------------------------------
# tensor-core contraction: mma.sync m16n8k16 bf16 -> f32, fragments loaded from any Ref
# ------------------------------------------------------------------------------------------

#: operands of the tensor-core products: bf16 (rounded), bf16x3 (hi + lo split, three
#: products, ~fp32), tf32 (rounded to TF32, m16n8k8: ~1e-3 relative per product, what the
#: accuracy goals need, docs/MATH.md)
MMA_PRECISIONS = ("bf16", "bf16x3", "tf32", "tf32x3")


@dataclass(frozen=True)
class MmaPlan:
    wm: int            # warps over rows
    wn: int            # warps over columns
    am: int            # 16-row atoms per warp per pass
    an: int            # 8-column atoms per warp per pass
    row_passes: int
    col_passes: int

    @property
    def warps(self) -> int:
        return self.wm * self.wn


def mma_plan(M: int, N: int, nthreads: int, max_acc: int = 32) -> MmaPlan:
    """Warps as a wm x wn grid over the [M, N] output (rows first: each warp's A fragments
    are its own rows); a warp owns [M / wm, N / wn] in m16n8 atoms, visited am x an atoms at a
    time so that am * an * 4 accumulators stay <= max_acc."""
    warps = max(1, nthreads // 32)
    wm = warps
    while wm > 1 and M % (16 * wm):
        wm //= 2
    wn = max(1, warps // wm)
    while wn > 1 and N % (8 * wn):
        wn //= 2
    am_total, an_total = (M // wm) // 16, (N // wn) // 8
    an = max(1, min(an_total, max_acc // 4))
    while an_total % an:
        an -= 1
    am = max(1, min(am_total, max_acc // (4 * an)))
    while am_total % am:
        am -= 1
    return MmaPlan(wm, wn, am, an, am_total // am, an_total // an)


def mma_supported(M: int, N: int, K: int) -> bool:
    return M % 16 == 0 and N % 8 == 0 and K % 16 == 0


def _split_pack(vals: dict, precision: str):
    """A fragment (dict (reg, half) -> f32) as packed bf16 registers: [hi] or [hi, lo] with
    lo = bf16(x - bf16(x)) (bf16x3: the product error drops from ~2^-9 to ~2^-17)."""
    nregs = max(r for r, _ in vals) + 1
    hi = [B.pack_bf16x2(vals[(r, 0)], vals[(r, 1)]) for r in range(nregs)]
    if precision == "bf16":
        return [hi]
    lo = []
    for r in range(nregs):
        pair = []
        for h in (0, 1):
            x = vals[(r, h)]
            pair.append(B.sub(x, B.round_to(x, "bf16")))
        lo.append(B.pack_bf16x2(pair[0], pair[1]))
    return [hi, lo]


def _mma_atom(precision: str, a_elem, b_elem, g, t) -> tuple:
    """(depth, A fragment (row atom, k0), B fragment (column atom, row atom, k0), product) of
    one mma.sync atom on this lane (g = lane / 4, t = lane % 4) for ``precision``: TF32
    m16n8k8, or bf16 m16n8k16 (bf16x3: hi and lo parts, three products)."""
    if precision == "tf32":
        def afrag(rb, k0):
            return [B.tf32_operand(a_elem(rb + g + 8 * (r % 2), k0 + t + 4 * (r // 2), rb))
                    for r in range(4)]

        def bfrag(cb, rb, k0):
            return [B.tf32_operand(b_elem(k0 + t + 4 * r, cb + g, rb)) for r in range(2)]
        return 8, afrag, bfrag, B.mma_tf32
    if precision == "tf32x3":
        # x = hi + lo, both TF32 (11 significant bits each): lo·hi + hi·lo + hi·hi keeps ~22
        # bits of every product (bf16x3: ~16), at one m16n8k8 per 8 deep per part pair
        def split(vals):
            his = [B.round_to(v, "tf32") for v in vals]
            return ([B.tf32_operand(h) for h in his],
                    [B.tf32_operand(B.sub(v, h)) for v, h in zip(vals, his)])

        def afrag(rb, k0):
            return split([a_elem(rb + g + 8 * (r % 2), k0 + t + 4 * (r // 2), rb)
                          for r in range(4)])

        def bfrag(cb, rb, k0):
            return split([b_elem(k0 + t + 4 * r, cb + g, rb) for r in range(2)])

        def mma3(a_parts, b_parts, c):
            c = B.mma_tf32(a_parts[1], b_parts[0], c)
            c = B.mma_tf32(a_parts[0], b_parts[1], c)
            return B.mma_tf32(a_parts[0], b_parts[0], c)
        return 8, afrag, bfrag, mma3

    def afrag(rb, k0):
        vals = {(r, h): a_elem(rb + g + 8 * (r % 2), k0 + 2 * t + h + 8 * (r // 2), rb)
                for r in range(4) for h in (0, 1)}
        return _split_pack(vals, precision)

    def bfrag(cb, rb, k0):
        vals = {(r, h): b_elem(k0 + 2 * t + h + 8 * r, cb + g, rb)
                for r in range(2) for h in (0, 1)}
        return _split_pack(vals, precision)

    def mma(a_parts, b_parts, c):
        if precision == "bf16x3":
            c = B.mma_bf16(a_parts[1], b_parts[0], c)
            c = B.mma_bf16(a_parts[0], b_parts[1], c)
        return B.mma_bf16(a_parts[0], b_parts[0], c)
    return 16, afrag, bfrag, mma


@dataclass(frozen=True)
class LiveTriangle:
    """Where a product with a (block-)triangular operand mask can be nonzero, per 16-row
    block ``rb`` of its output (static ints): ``k_range(rb) -> (lo, hi)``, the partners
    [lo, hi) of the contraction that may contribute (the rest are masked to exact zeros), and
    ``cols(rb)``, the output columns [0, cols) that may be nonzero (the rest are zero). Either
    may be None (all of it). :func:`mma_contraction` skips the rest and gives the warps equal
    shares of what is left (:func:`triangle_jobs`); the sums are the same, bit for bit (what
    it skips adds exact zeros)."""
    k_range: object = None
    cols: object = None


@dataclass(frozen=True)
class WarpSegment:
    """One pass of a warp over a 16-row block (first row 16 rb): output column atoms (8
    wide) [c0, c0 + atoms), contraction [k_lo, k_hi). Every warp's pass holds the same
    number of atoms (:func:`triangle_jobs`' slots); a warp with fewer repeats its first atom
    in the rest and does not write them."""
    rb: int
    c0: int
    atoms: int
    k_lo: int
    k_hi: int


def _balanced_column_split(live: list, warps: int):
    """Warps per row block (each warp one row block, whole atoms) such that the most atoms any
    warp holds is smallest: every block with live atoms gets a warp, the rest go one at a
    time to the block whose warps hold the most. None when there are fewer warps than blocks."""
    blocks = [rb for rb, n in enumerate(live) if n]
    if len(blocks) > warps:
        return None
    share = {rb: 1 for rb in blocks}
    for _ in range(warps - len(blocks)):
        rb = max(blocks, key=lambda b: (-(-live[b] // share[b]), live[b]))
        if share[rb] >= live[rb]:
            break
        share[rb] += 1
    return share


def triangle_jobs(M: int, N: int, K: int, kstep: int, warps: int, live: LiveTriangle,
                  max_acc: int = 32):
    """Each warp's passes (:class:`WarpSegment` lists, the same number of passes and held
    atoms on every warp) for a product whose live part is ``live``, or None where the plain
    tiling is as good or the shape does not split.

    - Live columns (decay_dot: block row rb keeps columns up to its block's diagonal): each
      warp takes consecutive atoms of one row block, warps spread over the blocks by their
      live atoms (:func:`_balanced_column_split`): at 64 x 64 on 8 warps 3 atoms each
      instead of 4.
    - Live partners (decay_matmul: block row rb sums the partners up to, or from, its
      block): row blocks paired first with last, second with second-to-last, ..., so every
      pair sums the same number of partners; each warp takes both blocks of a pair on its
      share of the columns: at 64 rows the longest warp runs 5/8 of the partner steps."""
    if M % 16 or N % 8 or K % kstep or M // 16 < 2:
        return None
    R, atoms_n = M // 16, N // 8

    def k_of(rb):
        lo, hi = live.k_range(rb) if live.k_range is not None else (0, K)
        lo, hi = max(0, lo) // kstep * kstep, min(K, -(-hi // kstep) * kstep)
        return lo, max(lo, hi)
    if live.cols is not None:
        n_live = [max(0, min(atoms_n, -(-live.cols(rb) // 8))) for rb in range(R)]
        share = _balanced_column_split(n_live, warps)
        if share is None:
            return None
        slots = max(-(-n_live[rb] // share[rb]) for rb in share)
        plain = mma_plan(M, N, warps * 32, max_acc)
        if slots * 4 > max_acc or slots >= plain.am * plain.an * plain.row_passes * plain.col_passes:
            return None
        jobs = []
        for rb in sorted(share, reverse=True):
            c = 0
            for w in range(share[rb]):
                take = -(-(n_live[rb] - c) // (share[rb] - w))
                jobs.append([WarpSegment(rb, c, take, *k_of(rb))])
                c += take
        while len(jobs) < warps:                   # spare warps: nothing to hold
            jobs.append([WarpSegment(0, 0, 0, 0, 0)])
        return jobs, [slots]
    if R % 2:
        return None
    pairs = R // 2
    if warps % pairs:
        return None
    per_pair = warps // pairs
    if atoms_n % per_pair:
        return None
    held = atoms_n // per_pair
    if held * 4 > max_acc:
        return None
    trips = [(k_of(rb)[1] - k_of(rb)[0]) // kstep for rb in range(R)]
    longest = max(trips[p] + trips[R - 1 - p] for p in range(pairs)) * held
    plain = mma_plan(M, N, warps * 32, max_acc)
    plain_longest = max(trips) * plain.an * plain.am * plain.row_passes * plain.col_passes
    if longest >= plain_longest:
        return None
    jobs = []
    for p in range(pairs):
        for w in range(per_pair):
            jobs.append([WarpSegment(rb, w * held, held, *k_of(rb)) for rb in (p, R - 1 - p)])
    return jobs, [held, held]


def _per_warp(warp, values: list):
    """``values[warp]`` for a run-time warp index (a chain of selects; a constant when all
    are equal)."""
    v = values[0]
    for w in range(1, len(values)):
        if values[w] != values[0]:
            v = B.isel(B.icmp("eq", warp, w), values[w], v)
    return v


def _mma_triangle(th: Threads, out: BufRef, jobs, slots, live: LiveTriangle, kstep: int,
                  afrag, bfrag, mma, epilogue) -> None:
    """The product over :func:`triangle_jobs`' passes, then zeros in the columns
    ``live.cols`` leaves out."""
    lane = th.tid % 32
    warp = th.tid // 32
    g, t = lane // 4, lane % 4
    zero = B.f(0.0)
    for s, held in enumerate(slots):
        segs = [j[s] for j in jobs]
        rb = _per_warp(warp, [x.rb * 16 for x in segs])
        c0 = _per_warp(warp, [x.c0 for x in segs])
        atoms = _per_warp(warp, [x.atoms for x in segs])
        k_lo = _per_warp(warp, [x.k_lo // kstep for x in segs])
        k_hi = _per_warp(warp, [x.k_hi // kstep for x in segs])
        vary = len({x.atoms for x in segs}) > 1
        cbases = []
        for y in range(held):
            a = c0 + y if not vary else B.isel(B.icmp("lt", y, atoms), c0 + y, c0)
            cbases.append(a * 8)
        # the cost report counts thread 0 (warp 0): its trips
        trips = (segs[0].k_hi - segs[0].k_lo) // kstep

        def step(kk, *acc):
            k0 = kk * kstep
            afr = afrag(rb, k0)
            new = list(acc)
            for y, cb in enumerate(cbases):
                new[4 * y:4 * y + 4] = mma(afr, bfrag(cb, rb, k0), new[4 * y:4 * y + 4])
            return new

        acc = B.for_range(k_lo, k_hi, 1, step, [zero] * (4 * held), trips=trips)

        for y, cb in enumerate(cbases):
            def write(y=y, cb=cb):
                for i in range(4):
                    r = rb + g + 8 * (i // 2)
                    c = cb + 2 * t + (i % 2)
                    v = acc[4 * y + i]
                    if epilogue is not None:
                        v = epilogue(r, c, v, rb)
                    out.write([r, c], v)
            if vary or any(x.atoms == 0 for x in segs):
                B.if_then(B.icmp("lt", y, atoms), write)
            else:
                write()
    if live.cols is None:
        return
    M, N = out.shape

    def clear(idx):
        i, j = idx
        limit = 0
        for rb in range(M // 16):          # the live width of row i's block
            limit = B.isel(B.icmp("ge", i, rb * 16),
                           min(N, -(-live.cols(rb) // 8) * 8), limit)
        B.if_then(B.icmp("ge", j, limit), lambda: out.write([i, j], zero))
    foreach(th, (M, N), clear)


def _below_diagonal(diagonal: int) -> LiveTriangle:
    """decay_dot's live part: row i keeps the columns j <= i + diagonal."""
    return LiveTriangle(cols=lambda rb: 16 * rb + 16 + diagonal)


def _partners(C: int, diagonal: int, transpose_w: bool, S: int | None = None,
              in_block: bool = True) -> LiveTriangle:
    """decay_matmul's live partners for a 16-row output block rb: not transposed, row i sums
    the partners j <= i + diagonal; transposed, row j sums the partners i >= j - diagonal.
    ``S``: the factored form's S-row blocks, whose partners also stop at (not transposed) or
    start after (transposed) the block (``in_block``) or its diagonal block (not
    ``in_block``)."""
    def k_range(rb):
        lo, hi = (16 * rb - diagonal, C) if transpose_w else (0, 16 * rb + 16 + diagonal)
        if S is not None:
            bs = (16 * rb) // S * S
            if transpose_w:
                lo = max(lo, bs if in_block else bs + S)
            else:
                hi = min(hi, bs + S if in_block else bs)
        return lo, hi
    return LiveTriangle(k_range=k_range)


def mma_contraction(th: Threads, out: BufRef, K: int, a_elem, b_elem, precision: str = "bf16x3",
                    epilogue=None, b_per_atom: bool = False, max_acc: int = 32,
                    live: LiveTriangle | None = None) -> None:
    """``out[i, j] = epilogue(i, j, sum_k a_elem(i, k, atom_row0) * b_elem(k, j, atom_row0),
    atom_row0)`` (``atom_row0``: the first row of row i's 16-row atom) on tensor
    cores. Each lane loads its fragment elements straight from the operands (any Ref: buffers
    with any strides, views, lazy expressions) and rounds them to bf16 (``bf16x3``: hi + lo
    split, three mmas, ~fp32 accuracy) or to TF32 (``tf32``: m16n8k8, one mma per 8 deep). ``b_per_atom``: B depends on the output row atom (its
    first row is passed), so B fragments are loaded per row atom."""
    if precision not in MMA_PRECISIONS:
        raise ValueError(f"mma precision must be one of {MMA_PRECISIONS}, got {precision!r}")
    M, N = out.shape
    lane = th.tid % 32
    warp = th.tid // 32
    g, t = lane // 4, lane % 4
    kstep, afrag, bfrag, mma = _mma_atom(precision, a_elem, b_elem, g, t)
    if live is not None and th.count % 32 == 0:
        split = triangle_jobs(M, N, K, kstep, th.count // 32, live, max_acc)
        if split is not None:
            # B fragments per pass: each pass is one row block (b_per_atom holds either way)
            _mma_triangle(th, out, *split, live, kstep, afrag, bfrag, mma, epilogue)
            return
    plan = mma_plan(M, N, th.count, max_acc)
    row0 = (warp // plan.wn) * (M // plan.wm)
    col0 = (warp % plan.wn) * (N // plan.wn)

    def body():
        for pss, cps in [(p_, q_) for p_ in range(plan.row_passes) for q_ in range(plan.col_passes)]:
            rbases = [row0 + 16 * (pss * plan.am + x) for x in range(plan.am)]
            cbases = [col0 + 8 * (cps * plan.an + y) for y in range(plan.an)]
            init = [B.f(0.0)] * (plan.am * plan.an * 4)

            def step(kk, *acc):
                k0 = kk * kstep
                afr = [afrag(rb, k0) for rb in rbases]
                new = list(acc)
                # one B fragment at a time (few live registers), all row atoms against it
                for y, cb in enumerate(cbases):
                    shared = None if b_per_atom else bfrag(cb, rbases[0], k0)
                    for x, rb in enumerate(rbases):
                        b_frag = shared if shared is not None else bfrag(cb, rb, k0)
                        base = (x * plan.an + y) * 4
                        new[base:base + 4] = mma(afr[x], b_frag, new[base:base + 4])
                return new

            acc = B.for_range(0, K // kstep, 1, step, init)
            for x, rb in enumerate(rbases):
                for y, cb in enumerate(cbases):
                    for i in range(4):
                        r = rb + g + 8 * (i // 2)
                        c = cb + 2 * t + (i % 2)
                        v = acc[(x * plan.an + y) * 4 + i]
                        if epilogue is not None:
                            v = epilogue(r, c, v, rb)
                        out.write([r, c], v)

    if plan.warps * 32 < th.count:
        B.if_then(B.icmp("lt", th.tid, plan.warps * 32), body)
    else:
        body()


def emit_dot_mma(th: Threads, out: BufRef, a: Ref, b: Ref, precision: str) -> None:
    mma_contraction(th, out, a.shape[1], lambda i, k, rb: a.read([i, k]),
                    lambda k, j, rb: b.read([k, j]), precision)


def _atom_block_start(i, rb, S: int):
    """The first row of the S-row block of output row ``i``, which lies in the 16-row mma atom
    starting at ``rb`` (16-aligned): that atom's block when S is a multiple of 16 (one
    division per atom, not per element), else from ``i``."""
    return (rb // S) * S if S % 16 == 0 else (i // S) * S


def _to_block_start(val, g_ref: Ref, g_own: Ref, j, d, rb, S: int, clamp_min):
    """``val`` (row j, column d) times 2^(g_ref[bs, d] - g_own[j, d]), bs the first row of
    the S-row block of ``rb``: unmasked, so it may overflow for rows past the block."""
    bs = (rb // S) * S
    return B.mul(val, B.exp2_clamped(B.sub(g_ref.read([bs, d]), g_own.read([j, d])), clamp_min))


def emit_decay_dot_mma(th: Threads, out: BufRef, lhs: Ref, rhs: Ref, gl: Ref, gr: Ref,
                       diagonal: int, clamp_min, subblock: int, precision: str) -> None:
    """decay_dot with subblock S (a multiple of 16) on tensor cores, factored through
    r = gl[first row of the S-row block]: out[i, j] = sum_d (lhs[i, d] 2^(gl[i, d] - r_d)) *
    (rhs[j, d] 2^(r_d - gr[j, d])), both exponents proven bounded by kda-stable-reassociate for
    j <= block end + diagonal; a later column's factor may overflow, which reaches only that
    output column, and the result is selected to j <= i + diagonal."""
    S = subblock
    zero = B.f(0.0)

    def a_elem(i, d, rb):
        bs = _atom_block_start(i, rb, S)
        return B.mul(lhs.read([i, d]), B.exp2_clamped(B.sub(gl.read([i, d]), gl.read([bs, d])),
                                                     clamp_min))

    def b_elem(d, j, rb):
        # column j's factor may overflow past the block; only output column j reads it, and
        # the epilogue selects it away there
        return _to_block_start(rhs.read([j, d]), gl, gr, j, d, rb, S, clamp_min)

    mma_contraction(th, out, lhs.shape[1], a_elem, b_elem, precision,
                    epilogue=lambda i, j, v, rb: B.sel(B.icmp("le", j, addk(i, diagonal)), v,
                                                       zero),
                    b_per_atom=True, live=_below_diagonal(diagonal))


def emit_decay_dot_row_gates(th: Threads, out: BufRef, lhs: Ref, rhs: Ref, gl: Ref, gr: Ref,
                             diagonal: int, clamp_min, precision: str) -> None:
    """decay_dot with gates that are the same in every column d (``gl``, ``gr``: [C], the
    rows' gates; kda-narrow-broadcasts leaves GDN's per-token gate so):
    out[i, j] = 2^(gl[i] - gr[j]) sum_d lhs[i, d] rhs[j, d] for j <= i + diagonal. The decay
    leaves the contraction: the product runs on the raw operands (tensor cores where
    ``precision`` asks and the shape allows, else FMA) and one exponential per output element
    scales it; its argument is <= 0 on every kept element of a decaying gate (clamped below at
    ``clamp_min``), and the elements past the diagonal are selected away, never multiplied."""
    zero = B.f(0.0)

    def epilogue(i, j, v, rb=None):
        e = B.exp2_clamped(B.sub(gl.read([i]), gr.read([j])), clamp_min)
        return B.sel(B.icmp("le", j, addk(i, diagonal)), B.mul(v, e), zero)

    M, N = out.shape
    D = lhs.shape[1]
    if precision in MMA_PRECISIONS and mma_supported(M, N, D):
        mma_contraction(th, out, D, lambda i, d, rb: lhs.read([i, d]),
                        lambda d, j, rb: rhs.read([j, d]), precision, epilogue=epilogue,
                        live=_below_diagonal(diagonal))
        return
    contraction(th, out, D, lambda i, d: [lhs.read([i, d])], lambda d, j: [rhs.read([j, d])],
                lambda acc, rv, cv, pre, i, j, d: B.fma(rv[0], cv[0], acc), epilogue=epilogue)


def emit_decay_matmul_row_gates(th: Threads, out: BufRef, w: Ref, x: Ref, g_row: Ref,
                                g_col: Ref, diagonal: int, transpose_w: bool, clamp_min,
                                precision: str) -> None:
    """decay_matmul with gates the same in every column d (``g_row``, ``g_col``: [C]):
    E[i, j] = 2^(g_row[i] - g_col[j]) for j <= i + diagonal (else 0) no longer depends on d,
    so it weights w before one plain product: not transposed out = (w ⊙ E) x, transposed
    out = (w ⊙ E)ᵀ x. Each weight's exponent is <= 0 for a decaying gate (clamped below at
    ``clamp_min``); the masked ones are selected away."""
    zero = B.f(0.0)
    C = w.shape[0]
    M, N = out.shape

    def weight(i, j):
        e = B.exp2_clamped(B.sub(g_row.read([i]), g_col.read([j])), clamp_min)
        return B.sel(B.icmp("le", j, addk(i, diagonal)), B.mul(w.read([i, j]), e), zero)

    # a_elem(r, k): row r of the output, partner k
    a_elem = (lambda j, i: weight(i, j)) if transpose_w else weight
    if precision in MMA_PRECISIONS and mma_supported(M, N, C):
        mma_contraction(th, out, C, lambda r, k, rb: a_elem(r, k),
                        lambda k, d, rb: x.read([k, d]), precision,
                        live=_partners(C, diagonal, transpose_w))
        return
    contraction(th, out, C, lambda r, k: [a_elem(r, k)], lambda k, d: [x.read([k, d])],
                lambda acc, rv, cv, pre, r, d, k: B.fma(rv[0], cv[0], acc))


def exact_diagonal_supported(subblock: int, rows: int, nthreads: int, diagonal: int,
                             same_gamma: bool) -> bool:
    """The exact-diagonal tensor-core forms below need S-row blocks of whole mma atoms, the
    threads split evenly over the diagonal blocks (whole warps each), a mask that keeps every
    column left of the row block (diagonal 0 or -1), and one gamma on both sides (the
    reference point is a row of it)."""
    if subblock < 16 or subblock % 16 or rows % subblock or diagonal not in (0, -1):
        return False
    blocks = rows // subblock
    return same_gamma and nthreads % blocks == 0 and (nthreads // blocks) % 32 == 0


@dataclass
class _BlockOut:
    """``out`` seen from one diagonal block: [rows, cols] at (r0, c0)."""
    out: BufRef
    shape: tuple
    r0: object
    c0: object

    def write(self, idx, v):
        self.out.write([idx[0] + self.r0, idx[1] + self.c0], v)


def _per_diagonal_block(th: Threads, S: int, rows: int, body) -> None:
    """``body(bs, sub)``: the threads split evenly over the rows // S diagonal blocks (block
    start bs, warp-uniform), each group a register-tiled contraction of its own block."""
    per = th.count // (rows // S)
    body((th.tid // per) * S, replace(th, tid=th.tid % per, count=per))
    # the tensor-core pass reads these results back in its epilogue, on other threads
    B.barrier()


def _pair_jobs_fit(S: int, count: int) -> bool:
    """Whether :func:`_decay_dot_diagonal_pairs` splits an S x S block evenly over ``count``
    threads: S even, count / S threads for the diagonal, the rest an equal share of the
    S (S - 1) / 2 pairs below it."""
    return (S % 2 == 0 and count >= S and count % S == 0
            and (S * (S - 1) // 2) % (count - count // S) == 0
            and S % (count // S) == 0)


def _decay_dot_diagonal_pairs(th: Threads, out: BufRef, lhs: Ref, rhs: Ref, g: Ref, bs, S: int,
                              diagonal: int, clamp_min) -> None:
    """decay_dot's diagonal S x S block from ``bs``: out[i, j] = sum_d lhs[i, d] rhs[j, d]
    2^(g[i, d] - g[j, d]) for j < i (+ the diagonal, without exponentials, when
    ``diagonal`` = 0), zeros above. Only the pairs the mask keeps are summed: the S (S - 1) / 2
    pairs below the diagonal are folded into an (S / 2) x (S - 1) rectangle (rows a and
    S - 1 - a share one: a + (S - 1 - a) = S - 1 pairs) and split evenly over all but
    count / S threads; those take the diagonal (no exponentials, twice the pairs each).
    Each thread also writes the zero mirrored above the diagonal of each of its pairs."""
    count = th.count
    n_diag = count // S
    n_low = count - n_diag
    per_low = (S * (S - 1) // 2) // n_low
    per_diag = S // n_diag
    D = lhs.shape[1]
    t = th.tid
    zero = B.f(0.0)

    def pair_sum(i, j, with_exp):
        def load(d):
            vals = [lhs.read([addk(bs, 0) + i, d]), rhs.read([addk(bs, 0) + j, d])]
            if with_exp:
                vals += [g.read([addk(bs, 0) + i, d]), g.read([addk(bs, 0) + j, d])]
            return vals

        def fold(acc, d, v):
            prod = B.mul(v[0], v[1])
            if not with_exp:
                return [B.add(acc[0], prod)]
            return [B.fma(prod, B.exp2_clamped(B.sub(v[2], v[3]), clamp_min), acc[0])]
        (acc,) = fold_batched(D, load, fold, [zero], th.batch)
        return acc

    def lower():
        for m in range(per_low):
            e = t + m * n_low
            a, b = e // (S - 1), e % (S - 1)
            first = B.icmp("lt", b, a)           # row a's pairs, else row S - 1 - a's
            i = B.isel(first, a, (S - 1) - a)
            j = B.isel(first, b, b - a)
            v = pair_sum(i, j, True)
            out.write([addk(bs, 0) + i, addk(bs, 0) + j], v)
            out.write([addk(bs, 0) + j, addk(bs, 0) + i], zero)

    def on_diagonal():
        for m in range(per_diag):
            i = (t - n_low) * per_diag + m
            v = pair_sum(i, i, False) if diagonal >= 0 else zero
            out.write([addk(bs, 0) + i, addk(bs, 0) + i], v)

    B.if_then(B.icmp("lt", t, n_low), lower)
    B.if_then(B.icmp("ge", t, n_low), on_diagonal)


# A diagonal block whose gate falls by at most this much (log2 units, in every column) across
# its rows is factored like the blocks left of it, at the block's first (last) row: the two
# factors then lie within 2^(+-64), far from fp32's range limits (2^(+-126)) even after the
# products' sums, and each keeps its relative precision
FACTORED_SPAN_MAX = 64.0


def steep_diagonal_blocks(th: Threads, g: Ref, S: int, rows: int):
    """How many threads found an S-row diagonal block of ``g`` (non-increasing down the rows)
    that falls by more than :data:`FACTORED_SPAN_MAX` in some column: the span checks split
    across the threads, one counting barrier; the same int-like on every thread."""
    D = g.shape[1]
    n = (rows // S) * D
    steep = 0
    for m in range(-(-n // th.count)):
        e = th.tid + m * th.count
        if (m + 1) * th.count > n:
            e = B.isel(B.icmp("lt", e, n), e, 0)    # past the end: re-check item 0
        bs, d = (e // D) * S, e % D
        span = B.sub(g.read([bs, d]), g.read([addk(bs, S - 1), d]))
        flag = B.isel(B.fle(span, B.f(FACTORED_SPAN_MAX)), 0, 1)   # NaN: steep
        steep = flag if m == 0 else B.isel(B.icmp("ne", flag, 0), 1, steep)
    return B.barrier_count(steep)


def factorable(th: Threads, g: Ref, S: int, rows: int):
    """The gate check of the decay products: the uniform predicates (every diagonal block
    of ``g`` gentle enough to factor, some block steep) from :func:`steep_diagonal_blocks`.
    A kernel whose decay products share a gate runs it once and passes it to each (their
    ``gate_check`` argument)."""
    steep = steep_diagonal_blocks(th, g, S, rows)
    return B.icmp("eq", steep, 0), B.icmp("ne", steep, 0)


def _factored_or_exact(th: Threads, g: Ref, S: int, rows: int, product, diagonal_block,
                       gate_check=None) -> None:
    """A decay product with exact diagonals: ``product(True)`` (diagonal blocks factored
    with the rest) where every diagonal block of ``g`` is gentle enough, else the cold
    fallback for steep gates: the diagonal blocks in relative form (``diagonal_block``, one
    thread group per block), then ``product(False)`` for the rest. A uniform branch;
    ``gate_check``: :func:`factorable`'s predicates where the caller has them already."""
    gentle, steep = gate_check if gate_check is not None else factorable(th, g, S, rows)

    def exact():
        _per_diagonal_block(th, S, rows, diagonal_block)
        product(False)
    B.if_then(gentle, lambda: product(True))
    B.if_then(steep, exact, cold=True)


def _factored_from_block_start(val, g: Ref, j, d, rb, S: int, in_block: bool, clamp_min):
    """A product operand ``val`` of row j scaled to the reference of row block ``rb`` (its
    first row bs): val 2^(g[bs, d] - g[j, d]) for the rows before the block (and the block's
    own rows when ``in_block``), zero after them: later rows' factors may overflow, so they
    are selected away, not multiplied by a zero."""
    bs = (rb // S) * S
    v = _to_block_start(val, g, g, j, d, rb, S, clamp_min)
    return B.sel(B.icmp("lt", j, addk(bs, S) if in_block else bs), v, B.f(0.0))


def emit_decay_dot_mma_exact_diagonal(th: Threads, out: BufRef, lhs: Ref, rhs: Ref, g: Ref,
                                      diagonal: int, clamp_min, subblock: int,
                                      precision: str, gate_check=None) -> None:
    """decay_dot(lhs, rhs, g, g) for a gate that may be too steep to factor inside a block.
    Tensor cores take the columns left of the row block factored at r = g[first row of the
    block]: g[i] <= r <= g[j] there, so 2^(g[i] - r) and 2^(r - g[j]) are both <= 1 for any
    decaying gate. Where every diagonal block's gate span is small
    (:func:`steep_diagonal_blocks`, checked at run time) the diagonal blocks join the
    same product with the same reference; else they are sums with relative exponents (one
    thread group per block)."""
    S = subblock
    M, D = lhs.shape
    zero = B.f(0.0)

    def diagonal_block(bs, sub):
        if _pair_jobs_fit(S, sub.count):
            return _decay_dot_diagonal_pairs(sub, out, lhs, rhs, g, bs, S, diagonal, clamp_min)

        def combine(acc, rv, cv, pre, i, j, d):
            return B.fma(B.mul(rv[0], cv[0]), B.exp2_clamped(B.sub(rv[1], cv[1]), clamp_min), acc)
        contraction(sub, _BlockOut(out, (S, S), bs, bs), D,
                    lambda i, d: [lhs.read([bs + i, d]), g.read([bs + i, d])],
                    lambda d, j: [rhs.read([bs + j, d]), g.read([bs + j, d])],
                    combine,
                    epilogue=lambda i, j, v: B.sel(B.icmp("le", j, addk(i, diagonal)), v, zero))

    def a_elem(i, d, rb):
        bs = _atom_block_start(i, rb, S)
        return B.mul(lhs.read([i, d]), B.exp2_clamped(B.sub(g.read([i, d]), g.read([bs, d])),
                                                     clamp_min))

    def product(in_block: bool):
        def b_elem(d, j, rb):
            # column j's factor may overflow past the block (or, not in_block, in it): only
            # output column j reads it, and the epilogue selects it away there (no mask here)
            return _to_block_start(rhs.read([j, d]), g, g, j, d, rb, S, clamp_min)

        def epilogue(i, j, v, rb):
            below = B.sel(B.icmp("le", j, addk(i, diagonal)), v, zero)
            if in_block:
                return below
            bs = _atom_block_start(i, rb, S)
            return B.sel(B.icmp("eq", bs, (j // S) * S), out.read([i, j]), below)

        mma_contraction(th, out, D, a_elem, b_elem, precision, epilogue=epilogue,
                        b_per_atom=True, live=_below_diagonal(diagonal))

    _factored_or_exact(th, g, S, M, product, diagonal_block, gate_check)


# partners of decay_matmul's diagonal block held in registers at a time (x and g each): the
# whole 16-row block (32 values) made the backward's dk kernel spill at 96 registers
_DIAGONAL_PARTNERS_HELD = 8


def _decay_matmul_diagonal_block(th: Threads, out: BufRef, w: Ref, x: Ref, g: Ref, bs, S: int,
                                 diagonal: int, transpose_w: bool, clamp_min) -> None:
    """The in-block terms of decay_matmul for the S rows from ``bs``, a column per thread:
    the thread loads its column of x and g for a part of the block's partners at a time
    (:data:`_DIAGONAL_PARTNERS_HELD`) and sums, for each output row, only the partners the
    mask keeps (the triangle is static: about half the S x S pairs), each with its own
    relative exponent (none for the pair on the diagonal, whose factor is exactly 1); a row
    with partners in a later part adds to what the earlier part wrote. Not transposed:
    out[i, d] = sum_{k <= i + diagonal} w[i, k] x[k, d] 2^(g[i, d] - g[k, d]); transposed:
    out[j, d] = sum_{k >= j - diagonal} w[k, j] x[k, d] 2^(g[k, d] - g[j, d])."""
    D = out.shape[1]
    held = min(S, _DIAGONAL_PARTNERS_HELD)

    def partners_of(i):
        return (range(max(0, i - diagonal), S) if transpose_w
                else range(0, min(S, i + diagonal + 1)))

    def column(idx):
        d = idx[0]
        written = set()
        for k0 in range(0, S, held):
            part = range(k0, min(S, k0 + held))
            xs = {k: x.read([addk(bs, k), d]) for k in part}
            gs = {k: g.read([addk(bs, k), d]) for k in part}
            for i in range(S):
                partners = [k for k in partners_of(i) if k in xs]
                if not partners:
                    continue
                acc = out.read([addk(bs, i), d]) if i in written else B.f(0.0)
                gi = None
                for k in partners:
                    wv = w.read([addk(bs, k), addk(bs, i)] if transpose_w
                                else [addk(bs, i), addk(bs, k)])
                    t = B.mul(wv, xs[k])
                    if k == i:
                        acc = B.add(acc, t)
                        continue
                    if gi is None:
                        gi = gs[i] if i in gs else g.read([addk(bs, i), d])
                    arg = B.sub(gs[k], gi) if transpose_w else B.sub(gi, gs[k])
                    acc = B.fma(t, B.exp2_clamped(arg, clamp_min), acc)
                out.write([addk(bs, i), d], acc)
                written.add(i)
        for i in range(S):
            if i not in written:            # no partner at all (the strict diagonal's first row)
                out.write([addk(bs, i), d], B.f(0.0))

    foreach(th, (D,), column)


def emit_decay_matmul_mma_exact_diagonal(th: Threads, out: BufRef, w: Ref, x: Ref, g: Ref,
                                         diagonal: int, transpose_w: bool, clamp_min,
                                         subblock: int, precision: str,
                                         triangle: bool = False,
                                         gate_check=None) -> None:
    """decay_matmul(w, x, g, g) with E[i, j, d] = 2^(g[i, d] - g[j, d]) (j <= i + diagonal).
    The partners outside the output row's block go through tensor cores, factored at a
    reference row r between the two (not transposed: the block's first row, every partner j
    earlier; transposed: its last row, every partner i later), so both factors are <= 1. The
    S partners inside it join the same product where every diagonal block's gate span is
    small (:func:`steep_diagonal_blocks`, checked at run time); else they are
    register-tiled sums with relative exponents (one thread group per block).
    ``triangle``: the in-block sums over the static triangle only
    (:func:`_decay_matmul_diagonal_block`)."""
    S = subblock
    C, D = w.shape[0], out.shape[1]
    zero = B.f(0.0)

    def diagonal_block(bs, sub):
        if triangle:
            return _decay_matmul_diagonal_block(sub, out, w, x, g, bs, S, diagonal,
                                                transpose_w, clamp_min)
        # register-tiled over the whole S x S block, the mask as a select: twice the
        # exponentials of the triangle, but fewer registers live (the triangle made the
        # backward's dk kernel spill at its 112-register consumer budget)
        if transpose_w:
            def combine(acc, rv, cv, pre, j, d, k):
                ok = B.icmp("le", j, addk(k, diagonal))
                e = B.exp2_clamped(B.sub(cv[1], pre[0]), clamp_min)
                return B.add(acc, B.sel(ok, B.mul(B.mul(rv[0], cv[0]), e), zero))
            w_elem = lambda j, k: [w.read([bs + k, bs + j])]  # noqa: E731
        else:
            def combine(acc, rv, cv, pre, i, d, k):
                ok = B.icmp("le", k, addk(i, diagonal))
                e = B.exp2_clamped(B.sub(pre[0], cv[1]), clamp_min)
                return B.add(acc, B.sel(ok, B.mul(B.mul(rv[0], cv[0]), e), zero))
            w_elem = lambda i, k: [w.read([bs + i, bs + k])]  # noqa: E731
        contraction(sub, _BlockOut(out, (S, D), bs, 0), S, w_elem,
                    lambda k, d: [x.read([bs + k, d]), g.read([bs + k, d])],
                    combine, pre_fn=lambda r, d: [g.read([bs + r, d])])

    def product(in_block: bool):
        if not transpose_w:
            # out[i, d] = 2^(g[i] - r) sum_{j < bs} w[i, j] (x[j, d] 2^(r - g[j]))
            # (+ the in-block partners j <= i + diagonal when they are factored too)
            def a_elem(i, j, rb):
                v = w.read([i, j])
                return B.sel(B.icmp("le", j, addk(i, diagonal)), v, zero) if in_block else v

            def b_elem(j, d, rb):
                return _factored_from_block_start(x.read([j, d]), g, j, d, rb, S, in_block,
                                                  clamp_min)

            def epilogue(i, d, v, rb):
                bs = _atom_block_start(i, rb, S)
                v = B.mul(v, B.exp2_clamped(B.sub(g.read([i, d]), g.read([bs, d])), clamp_min))
                return v if in_block else B.add(v, out.read([i, d]))
        else:
            # out[j, d] = 2^(r - g[j]) sum_{i > be} w[i, j] (x[i, d] 2^(g[i] - r))
            # (+ the in-block partners i >= j - diagonal when they are factored too)
            def a_elem(j, i, rb):
                v = w.read([i, j])
                return B.sel(B.icmp("le", j, addk(i, diagonal)), v, zero) if in_block else v

            def b_elem(i, d, rb):
                bs = (rb // S) * S
                be = bs + (S - 1)
                v = B.mul(x.read([i, d]), B.exp2_clamped(B.sub(g.read([i, d]), g.read([be, d])),
                                                        clamp_min))
                return B.sel(B.icmp("ge", i, bs) if in_block else B.icmp("gt", i, be), v, zero)

            def epilogue(j, d, v, rb):
                be = _atom_block_start(j, rb, S) + (S - 1)
                v = B.mul(v, B.exp2_clamped(B.sub(g.read([be, d]), g.read([j, d])), clamp_min))
                return v if in_block else B.add(v, out.read([j, d]))

        mma_contraction(th, out, C, a_elem, b_elem, precision, epilogue=epilogue,
                        b_per_atom=True,
                        live=_partners(C, diagonal, transpose_w, S, in_block))

    _factored_or_exact(th, g, S, C, product, diagonal_block, gate_check)


# ------------------------------------------------------------------------------------------
# scans over rows, reductions, triangular solves
# ------------------------------------------------------------------------------------------


#: rows of a one-column cumsum that one warp scans by shuffles (per lane: up to 4 rows)
WARP_SCAN_ROWS = 128


#: rows of each segment of a many-column cumsum (the segmentation, and so the order of the
#: sums, follows from the tile's shape alone: every kernel that computes a cumsum gets the same
#: bits, whatever its thread count)
CUMSUM_SEGMENT_ROWS = 16


def emit_cumsum(th: Threads, out: BufRef, x: Ref, reverse: bool) -> None:
    """Inclusive cumulative sum over dim 0 (reverse: suffix sums). One column (a [C] vector,
    GDN's per-token gate and its adjoints): :func:`emit_cumsum_warp`; rows a multiple of
    :data:`CUMSUM_SEGMENT_ROWS` (and more than one segment): :func:`emit_cumsum_segmented`;
    else one thread per column, sequential over the rows.

    With ``th.ordered`` the segments follow from the shape only, never from the thread count:
    kernels with different thread counts that each compute the gate's cumsum (the backward's
    dq and dk kernels, the forward's prologue) then agree to the bit; otherwise the gate
    gradient's near-cancelling sums amplify the difference (tools.rounding_attribution: KDA
    K = 64 steep gate, dA_log 2.8e-4 with every kernel's cumsum rounded alike, 6.3e-2 with
    one kernel's alone). Without it (the default until the GPU check has run with it), as
    many segments as the threads fill."""
    rows = x.shape[0]
    cols = numel(tuple(x.shape[1:]))
    if (cols == 1 and rows % 32 == 0 and rows <= WARP_SCAN_ROWS and th.count >= 32
            and th.count % 32 == 0):
        return emit_cumsum_warp(th, out, x, reverse)
    if th.ordered:
        if rows % CUMSUM_SEGMENT_ROWS == 0 and rows > CUMSUM_SEGMENT_ROWS:
            return emit_cumsum_segmented(th, out, x, reverse, rows // CUMSUM_SEGMENT_ROWS)
    else:
        segments = th.count // cols if cols and th.count % cols == 0 else 1
        while segments > 1 and (rows % segments or rows // segments < 4):
            segments //= 2      # (then only segments x cols threads take part)
        if segments > 1 and (segments & (segments - 1)) == 0:
            return emit_cumsum_segmented(th, out, x, reverse, segments)

    def column(cidx):
        def row_of(r):
            return (rows - 1) - r if reverse else r

        def add(acc, r, x_r):
            v = B.add(acc[0], x_r)
            out.write([row_of(r)] + list(cidx), v)
            return [v]
        fold_batched(rows, lambda r: x.read([row_of(r)] + list(cidx)), add, [B.f(0.0)], th.batch)

    foreach(th, tuple(x.shape[1:]), column)


def emit_cumsum_warp(th: Threads, out: BufRef, x: Ref, reverse: bool) -> None:
    """The cumulative sum of one column (rows a multiple of 32, at most
    :data:`WARP_SCAN_ROWS`) on the first warp, no barrier inside: lane l takes ``per``
    consecutive rows in scan order (from the end when ``reverse``) and sums them; a butterfly
    of xor shuffles gives each lane the sum of the lanes before it (at step m a lane with bit
    m set adds its partner block's total, which lies wholly before it); the lane then writes
    its rows' running sums. The other warps wait at the barrier that ends the op. Sums in a
    tree, not sequentially: the same numbers as :func:`emit_cumsum_segmented` to rounding."""
    rows = x.shape[0]
    tail = [0] * (len(x.shape) - 1)
    per = rows // 32

    def row_of(r):          # the r-th row in scan order
        return (rows - 1) - r if reverse else r

    def scan():
        lane = th.tid
        vals = [x.read([row_of(lane * per + k)] + tail) for k in range(per)]
        total = vals[0]
        for v in vals[1:]:
            total = B.add(total, v)
        before = B.f(0.0)
        m = 1
        while m < 32:
            other = B.shfl_xor(total, m)
            upper = B.icmp("eq", (lane // m) % 2, 1)
            before = B.sel(upper, B.add(before, other), before)
            total = B.add(total, other)
            m *= 2
        run = before
        for k in range(per):
            run = B.add(run, vals[k])
            out.write([row_of(lane * per + k)] + tail, run)
    B.if_then(B.icmp("lt", th.tid, 32), scan)


def emit_cumsum_segmented(th: Threads, out: BufRef, x: Ref, reverse: bool,
                          segments: int) -> None:
    """The cumulative sum over dim 0 in ``segments`` row segments: item e (column e % cols,
    segment e // cols; a warp's reads stay coalesced) scans its segment into ``out``, then
    (after a barrier) adds the totals of the segments before it (after it, reversed), read
    from their end rows of ``out``, in segment order. Thread t takes items t, t + count, ...:
    the sums are the same whatever the thread count. Each element of ``x`` is evaluated once;
    the segment offsets cost one more read and write of ``out``."""
    rows = x.shape[0]
    col_shape = tuple(x.shape[1:])
    cols = numel(col_shape)
    seg = rows // segments
    items = segments * cols
    rounds = -(-items // th.count)
    zero = B.f(0.0)

    def item(e):
        return unravel(e % cols, col_shape), e // cols

    # the barriers between the phases stay outside each_round, on every thread
    def scan(m, e):
        cidx, part = item(e)

        def row_of(r):
            return part * seg + ((seg - 1) - r if reverse else r)

        def add(acc, r, x_r):
            v = B.add(acc[0], x_r)
            out.write([row_of(r)] + list(cidx), v)
            return [v]
        fold_batched(seg, lambda r: x.read([row_of(r)] + list(cidx)), add, [zero], th.batch)

    each_round(th, items, scan)
    B.barrier()
    offsets = []
    for m in range(rounds):
        cidx, part = item(addk(th.tid, m * th.count))
        offset = zero
        for q in range(segments):
            end = q * seg if reverse else q * seg + seg - 1      # where segment q's total is
            before = B.icmp("gt", part, q) if not reverse else B.icmp("lt", part, q)
            # a thread without an item in this round reads an end row of its column (in
            # bounds) and never uses the sum
            offset = B.add(offset, B.sel(before, out.read([end] + list(cidx)), zero))
        offsets.append(offset)
    B.barrier()          # every total is read before any row is shifted

    def shift(m, e):
        cidx, part = item(e)
        start = part * seg

        def step(acc, r, v):
            out.write([start + r] + list(cidx), B.add(v, offsets[m]))
            return acc
        fold_batched(seg, lambda r: out.read([start + r] + list(cidx)), step, [zero], th.batch)

    each_round(th, items, shift)


#: elements each lane of a grouped reduction folds (the group's lane count follows from the
#: reduced size alone, so every kernel sums a row the same way)
REDUCE_ELEMENTS_PER_LANE = 16


def _lanes_per_output(n_out: int, n_red: int, count: int | None = None) -> int:
    """Lanes that share one output of a reduction: a power of two dividing a warp and the
    reduced size, with whole warps of lane groups (n_out * lanes a multiple of 32); 1 where
    none fits. With ``count``: as many as ``count`` threads hold at once (the order of the
    sums then depends on ``count``); without: each lane folding at least
    :data:`REDUCE_ELEMENTS_PER_LANE` elements, from the shapes only."""
    for lanes in (32, 16, 8, 4, 2):
        fits = (n_out * lanes <= count if count is not None
                else n_red // lanes >= REDUCE_ELEMENTS_PER_LANE)
        if n_red % lanes == 0 and (n_out * lanes) % 32 == 0 and fits:
            return lanes
    return 1


#: partial sums of a reduction with few outputs: a thread's strided share of the reduced
#: elements, then a warp's shuffles, then the warps' slots in order (count-independent)
REDUCE_PARTIALS = 512


@dataclass
class ReduceScratch:
    """fp32 slots for cross-warp partial sums (one per warp)."""
    ref: BufRef


def emit_reduce_sum(th: Threads, out: BufRef, x: Ref, dims, red: ReduceScratch) -> None:
    dims = list(dims)
    keep = [d for d in range(len(x.shape)) if d not in dims]
    out_shape = tuple(x.shape[d] for d in keep)
    red_shape = tuple(x.shape[d] for d in dims)
    n_out, n_red = numel(out_shape), numel(red_shape)

    def full_index(oidx, ridx):
        idx = [None] * len(x.shape)
        for k, d in enumerate(keep):
            idx[d] = oidx[k]
        for k, d in enumerate(dims):
            idx[d] = ridx[k]
        return idx

    if n_red == 1:
        materialize(th, FnRef(out_shape, lambda o: x.read(full_index(o, [0] * len(dims)))), out)
        return
    if n_out >= 32 or n_red <= 64:
        lanes = _lanes_per_output(n_out, n_red, None if th.ordered else th.count)
        if lanes > 1:
            # ``lanes`` neighbouring lanes per output, each folding every lanes-th element
            # (coalesced along the reduced dim), then butterfly shuffles within the group;
            # work lane w = thread + round * count, so whole warps share a round's branch
            lane = th.tid % lanes
            # over the last dim, a lane folds groups of VEC consecutive elements (one vector
            # read each where x's memory allows; the order follows from the shapes alone)
            vec = VEC if (len(red_shape) == 1 and dims == [len(x.shape) - 1]
                          and (n_red // lanes) % VEC == 0) else 1

            def add_all(acc, t, vals):
                a = acc[0]
                for v in vals:
                    a = B.add(a, v)
                return [a]

            def grouped(m, w):
                oidx = unravel(w // lanes, out_shape)
                (acc,) = fold_batched(
                    n_red // (lanes * vec),
                    lambda t: read_vec(
                        x, full_index(oidx, unravel((t * lanes + lane) * vec, red_shape)), vec),
                    add_all, [B.f(0.0)], max(1, th.batch // vec))
                k = lanes // 2
                while k:
                    acc = B.add(acc, B.shfl_xor(acc, k))
                    k //= 2
                B.if_then(B.icmp("eq", lane, 0), lambda: out.write(oidx, acc))
            # whole warps idle past the outputs: the shuffles stay converged
            each_round(th, n_out * lanes, grouped)
            return

        def one(oidx):
            (acc,) = fold_batched(n_red, lambda r: x.read(full_index(oidx, unravel(r, red_shape))),
                                  lambda acc, r, v: [B.add(acc[0], v)], [B.f(0.0)], th.batch)
            out.write(oidx, acc)
        foreach(th, out_shape, one)
        return
    # few outputs, long reductions: P strided partial sums (partial p on thread p % count), a
    # warp's shuffles per 32 partials, one slot per such warp, thread 0 adds the slots in
    # order; P = REDUCE_PARTIALS with th.ordered (the same sums whatever the thread count),
    # else one partial per thread
    P = REDUCE_PARTIALS if th.ordered else th.count
    slots = P // 32
    lane = th.tid % 32

    # a partial sums groups of VEC consecutive elements of the last reduced dim (one vector
    # read each where x's memory allows; the order follows from the shapes alone)
    pvec = VEC if (red_shape and red_shape[-1] % VEC == 0 and dims[-1] == len(x.shape) - 1
                   and n_red % (P * VEC) == 0) else 1

    def per_output(o, *_):
        oidx = unravel(o, out_shape) if out_shape else []

        def partial(m, p):
            def step(r, acc):
                for v in read_vec(x, full_index(oidx, unravel(r * pvec, red_shape)), pvec):
                    acc = B.add(acc, v)
                return [acc]

            (part,) = B.for_range(p, n_red // pvec, P, step, [B.f(0.0)],
                                  trips=-(-n_red // (P * pvec)))
            for k in (16, 8, 4, 2, 1):
                part = B.add(part, B.shfl_xor(part, k))
            B.if_then(B.icmp("eq", lane, 0), lambda: red.ref.write([p // 32], part))

        each_round(th, P, partial)      # threads past the partials sit out, as whole warps
        B.barrier()

        def finish():
            tot = red.ref.read([0])
            for w in range(1, slots):
                tot = B.add(tot, red.ref.read([w]))
            out.write(oidx, tot)

        B.if_then(B.icmp("eq", th.tid, 0), finish)
        B.barrier()
        return []

    B.for_range(0, n_out, 1, per_output)


#: rows of the diagonal blocks of the blocked unit-lower-triangular inverse
TRIL_INV_BLOCK = 16


def block_view(x: Ref, r0: int, c0: int, rows: int, cols: int) -> Ref:
    """The [rows, cols] block of a 2-D tile starting at (r0, c0)."""
    if isinstance(x, BufRef):
        return BufRef(x.scratch, x.offset + r0 * x.strides[0] + c0 * x.strides[1],
                      (rows, cols), x.strides)
    if isinstance(x, ConstRef):
        return ConstRef(x.value, (rows, cols))
    return FnRef((rows, cols), lambda idx: x.read([addk(idx[0], r0), addk(idx[1], c0)]),
                 cheap=x.cheap)


def emit_tril_inv(th: Threads, out: BufRef, x: Ref, blocked: bool = True,
                  precision: str = "fma") -> None:
    """out = (I + strict_tril(x))^-1. Blocked where asked and the tile allows (C a multiple of
    TRIL_INV_BLOCK, more than one block, C <= threads): :func:`emit_tril_inv_blocked`, its
    block products on tensor cores where ``precision`` is an mma precision; else forward
    substitution by columns (:func:`emit_tril_inv_columns`)."""
    C = x.shape[0]
    nb = TRIL_INV_BLOCK
    if blocked and C % nb == 0 and C > nb and C <= th.count:
        emit_tril_inv_blocked(th, out, x, precision)
    else:
        emit_tril_inv_columns(th, out, x)


def _warp_jobs(th: Threads, jobs: list) -> None:
    """Run independent one-warp jobs (``job(warp_threads)``), job i on warp i mod warps
    (warp-uniform branches)."""
    warps = max(1, th.count // 32)
    lane = replace(th, tid=th.tid % 32, count=32)
    warp = th.tid // 32
    for i, job in enumerate(jobs):
        # the cost report counts thread 0, which runs warp 0's jobs only (cold: weight 0)
        B.if_then(B.icmp("eq", warp, i % warps), lambda job=job: job(lane), cold=i % warps != 0)


def emit_tril_inv_blocked(th: Threads, out: BufRef, x: Ref, precision: str = "fma") -> None:
    """out = (I + strict_tril(x))^-1 for C = n * 16, in fp32 (same products as forward
    substitution, grouped by 16x16 blocks), with few barriers and no long serial chain:

    1. diagonal blocks D_r = I + strict_tril(x_rr): each thread inverts one column of one
       block with the column in registers (16 rows, unrolled: the loads of x do not wait on
       each other) -> out_rr = D_r^-1;
    2. M_rk = D_r^-1 x_rk for every block below the diagonal (all independent), kept in the
       mirror block out_kr of the (still unused) upper triangle;
    3. by block rows r = 1 .. n-1: X_rc = -sum_{c <= k < r} M_rk X_kc (X_cc = D_c^-1), since
       D_r X_rc = -sum_k x_rk X_kc;
    4. the upper blocks are cleared.

    One barrier between the steps and between the block rows of step 3 (n + 2 in all, the
    caller's included) instead of C serial rows of dependent shared-memory rounds."""
    C = x.shape[0]
    S = TRIL_INV_BLOCK
    n = C // S
    zero, one = B.f(0.0), B.f(1.0)

    def diagonal_column():
        b = th.tid // S
        j = th.tid % S
        col = []
        for i in range(S):
            acc = zero
            row = b * S + i
            for k in range(i):
                acc = B.fma(x.read([row, b * S + k]), col[k], acc)
            # col[k] is 0 above the diagonal (k < j), so the sum is over j <= k < i
            v = B.sel(B.icmp("lt", i, j), zero, B.sel(B.icmp("eq", i, j), one, B.neg(acc)))
            col.append(v)
            out.write([row, b * S + j], v)

    B.if_then(B.icmp("lt", th.tid, C), diagonal_column)
    B.barrier()

    def block_products(dst: Ref, terms, negate: bool) -> None:
        """dst = (-)sum_t a_t @ b_t over [S, S] blocks (fp32 FMA, reads batched)."""
        def read(idx):
            i, j = idx
            acc = zero
            for a, b in terms:
                pairs = [(a.read([i, m]), b.read([m, j])) for m in range(S)]
                for av, bv in pairs:
                    acc = B.fma(av, bv, acc)
            return B.neg(acc) if negate else acc
        foreach_batched(th, (S, S), read, dst.write)

    def blk(r, c):
        return block_view(out, r * S, c * S, S, S)

    if precision in MMA_PRECISIONS:
        # one warp per [S, S] output block, one tensor-core contraction per term; the terms
        # after the first add to what the warp's own lanes wrote (same fragment owners)
        def product(dst, terms, negate):
            def job(lane):
                for t, (a, b) in enumerate(terms):
                    def epilogue(i, j, v, rb=None, first=t == 0):
                        v = B.neg(v) if negate else v
                        return v if first else B.add(dst.read([i, j]), v)
                    mma_contraction(lane, dst, S, lambda i, m, rb, a=a: a.read([i, m]),
                                    lambda m, j, rb, b=b: b.read([m, j]), precision,
                                    epilogue=epilogue)
            return job

        def run(jobs):
            _warp_jobs(th, jobs)
    else:
        # fp32 FMA, every block product on all the threads in turn
        def product(dst, terms, negate):
            return lambda _: block_products(dst, terms, negate)

        def run(jobs):
            for job in jobs:
                job(th)

    run([product(blk(k, r), [(blk(r, r), block_view(x, r * S, k * S, S, S))], False)
         for r in range(1, n) for k in range(r)])
    B.barrier()
    for r in range(1, n):
        run([product(blk(r, c), [(blk(k, r), blk(k, c)) for k in range(c, r)], True)
             for c in range(r)])
        B.barrier()
    for r in range(1, n):
        for k in range(r):
            foreach(th, (S, S), lambda idx, d=blk(k, r): d.write(idx, zero))


def emit_tril_inv_columns(th: Threads, out: BufRef, x: Ref) -> None:
    """out = (I + strict_tril(x))^-1 by forward substitution, one thread per column j:
    out[i, j] = [i == j] - sum_{j <= k < i} x[i, k] out[k, j] (a column only reads itself)."""
    C = x.shape[0]
    zero, one = B.f(0.0), B.f(1.0)

    def column(jidx):
        (j,) = jidx

        def row(i, *_):
            def term(k, acc):
                return [B.fma(x.read([i, k]), out.read([k, j]), acc)]
            # column 0 (thread 0) runs i terms in row i: (C - 1) / 2 on average
            (acc,) = B.for_range(j, i, 1, term, [zero], trips=(C - 1) / 2)
            v = B.sel(B.icmp("lt", i, j), zero, B.sel(B.icmp("eq", i, j), one, B.neg(acc)))
            out.write([i, j], v)
            return []

        B.for_range(0, C, 1, row)

    foreach(th, (C,), column)


def emit_tril_solve(th: Threads, out: BufRef, L: Ref, b: Ref) -> None:
    """out = (I + strict_tril(L))^-1 b by forward substitution, one thread per column d:
    out[i, d] = b[i, d] - sum_{k < i} L[i, k] out[k, d]."""
    C = L.shape[0]

    def column(cidx):
        def row(i, *_):
            def term(k, acc):
                return [B.fma(L.read([i, k]), out.read([k] + list(cidx)), acc)]
            (acc,) = B.for_range(0, i, 1, term, [B.f(0.0)], trips=(C - 1) / 2)   # avg over rows
            out.write([i] + list(cidx), B.sub(b.read([i] + list(cidx)), acc))
            return []
        B.for_range(0, C, 1, row)

    foreach(th, tuple(b.shape[1:]), column)


# ------------------------------------------------------------------------------------------
# element-wise expressions
# ------------------------------------------------------------------------------------------


def _map(x: Ref, fn) -> FnRef:
    """fn of each element of x (vector reads of x pass through)."""
    return FnRef(x.shape, lambda idx: fn(x.read(idx)),
                 vec=lambda idx, n: [fn(v) for v in read_vec(x, idx, n)], vec_ok=vec_ok(x))


def unary(op: str, x: Ref, attrs: dict) -> FnRef:
    if op == "exp2":
        lo, hi = attrs.get("clamp_min"), attrs.get("clamp_max")
        fn = lambda v: B.exp2_clamped(v, lo, hi)  # noqa: E731
    else:
        fn = {"neg": B.neg, "log2": B.lg2, "sigmoid": B.sigmoid, "softplus": B.softplus,
              "rsqrt": B.rsqrt}[op]
    return _map(x, fn)


def clamp(x: Ref, lo: float, hi: float) -> FnRef:
    return _map(x, lambda v: B.clamp(v, lo, hi))


def in_range(x: Ref, lo: float, hi: float) -> FnRef:
    return _map(x, lambda v: B.in_range(v, lo, hi))


def binary(op: str, a: Ref, b: Ref) -> FnRef:
    fn = {"add": B.add, "sub": B.sub, "mul": B.mul, "div": B.div}[op]
    return FnRef(a.shape, lambda idx: fn(a.read(idx), b.read(idx)),
                 vec=lambda idx, n: [fn(x, y) for x, y in zip(read_vec(a, idx, n),
                                                             read_vec(b, idx, n))],
                 vec_ok=vec_ok(a) and vec_ok(b))


def convert(x: Ref, src: str, dst: str) -> Ref:
    if dst == "i1":
        return _map(x, lambda v: B.sel(B.nonzero(v), B.f(1.0), B.f(0.0)))
    if dst in ("bf16", "f16") and src != dst:
        return _map(x, lambda v: B.round_to(v, dst))
    return x


def select(c: Ref, a: Ref, b: Ref) -> FnRef:
    def vec(idx, n):
        return [B.sel(B.nonzero(cv), av, bv) for cv, av, bv in
                zip(read_vec(c, idx, n), read_vec(a, idx, n), read_vec(b, idx, n))]
    return FnRef(a.shape, lambda idx: B.sel(B.nonzero(c.read(idx)), a.read(idx), b.read(idx)),
                 vec=vec, vec_ok=vec_ok(c) and vec_ok(a) and vec_ok(b))


def tril(x: Ref, diagonal: int) -> FnRef:
    def keep(idx, v):
        return B.sel(B.icmp("le", idx[1], addk(idx[0], diagonal)), v, B.f(0.0))
    return FnRef(x.shape, lambda idx: keep(idx, x.read(idx)),
                 vec=lambda idx, n: [keep(i, v) for i, v in zip(lanes(idx, n),
                                                                read_vec(x, idx, n))],
                 vec_ok=vec_ok(x))


def embed_row(x: Ref, index: int, shape) -> FnRef:
    if index < 0:
        index += shape[0]

    def vec(idx, n):
        on_row = B.icmp("eq", idx[0], index)
        return [B.sel(on_row, v, B.f(0.0)) for v in read_vec(x, idx[1:], n)]
    return FnRef(tuple(shape), lambda idx: B.sel(B.icmp("eq", idx[0], index), x.read(idx[1:]),
                                                 B.f(0.0)), vec=vec, vec_ok=vec_ok(x))
