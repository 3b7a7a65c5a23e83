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

from dataclasses import dataclass

from . import backend as B

# ------------------------------------------------------------------------------------------
# references
# ------------------------------------------------------------------------------------------


class Ref:
    """Interface: ``shape``, ``cheap`` (reading costs a load at most), ``read(idx)``."""


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


@dataclass
class ScalarRef(Ref):
    value: object
    shape: tuple = ()
    cheap: bool = True

    def read(self, idx):
        return self.value


@dataclass
class FnRef(Ref):
    shape: tuple
    fn: object
    cheap: bool = False

    def read(self, idx):
        return self.fn(list(idx))


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
    return FnRef(shape, lambda idx: x.read([idx[d] for d in keep]), cheap=x.cheap)


def transpose(x: Ref) -> Ref:
    shape = (x.shape[1], x.shape[0])
    if isinstance(x, BufRef):
        return BufRef(x.scratch, x.offset, shape, (x.strides[1], x.strides[0]))
    if isinstance(x, ConstRef):
        return ConstRef(x.value, shape)
    return FnRef(shape, lambda idx: x.read([idx[1], idx[0]]), cheap=x.cheap)


def extract_row(x: Ref, index: int) -> Ref:
    if index < 0:
        index += x.shape[0]
    shape = tuple(x.shape[1:])
    if isinstance(x, BufRef):
        return BufRef(x.scratch, x.offset + index * x.strides[0], shape, tuple(x.strides[1:]))
    if isinstance(x, ConstRef):
        return ConstRef(x.value, shape)
    return FnRef(shape, lambda idx: x.read([index] + list(idx)), cheap=x.cheap)


# ------------------------------------------------------------------------------------------
# loops
# ------------------------------------------------------------------------------------------


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def unravel(e, shape) -> list:
    idx = []
    for d in reversed(shape):
        idx.insert(0, e % d)
        e = e // d
    return idx


def addk(i, k: int):
    """int-like + constant."""
    return i + k if k else i


@dataclass
class Threads:
    tid: object               # int-like thread index
    count: int


def foreach(th: Threads, shape, body) -> None:
    """Run ``body(idx)`` for every element of ``shape``, element e on thread e % count."""
    n = numel(shape)
    if n == 1:
        B.if_then(B.icmp("eq", th.tid, 0), lambda: body([0] * len(shape)))
        return
    if n % th.count == 0 and n // th.count <= 2:
        for k in range(n // th.count):
            body(unravel(addk(th.tid, k * th.count), shape))
        return
    if n < th.count:
        B.if_then(B.icmp("lt", th.tid, n), lambda: body(unravel(th.tid, shape)))
        return

    def step(e):
        body(unravel(e, shape))
        return []

    B.for_range(th.tid, n, th.count, step)


def materialize(th: Threads, src: Ref, dst: BufRef) -> None:
    foreach(th, dst.shape, lambda idx: dst.write(idx, src.read(idx)))


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
    """Threads as a tm x tn grid (a warp spans tn = min(N, 32) consecutive columns, so the
    row operand is a broadcast read and the column operand a contiguous one); each thread
    owns rm x rn outputs (rows ti + tm*a, cols tj + tn*b), in ``passes`` row passes so that
    rm * rn <= max_acc accumulators live in registers."""
    tn = min(N, 32)
    while N % tn:
        tn //= 2
    tm = min(M, max(1, nthreads // tn))
    while M % tm:
        tm //= 2
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

            def step(r, *acc):
                rv = [row_fn(rows[a], r) for a in range(plan.rm)]
                cv = [col_fn(r, cols[b]) for b in range(plan.rn)]
                new = []
                for a in range(plan.rm):
                    for b in range(plan.rn):
                        new.append(combine(acc[a * plan.rn + b], rv[a], cv[b], pre.get((a, b)),
                                           rows[a], cols[b], r))
                return new

            acc = B.for_range(0, R, 1, step, init)
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
# scans over rows, reductions, triangular solves
# ------------------------------------------------------------------------------------------


def emit_cumsum(th: Threads, out: BufRef, x: Ref, reverse: bool) -> None:
    """Inclusive cumulative sum over dim 0 (reverse: suffix sums): one thread per column,
    sequential over the rows."""
    rows = x.shape[0]

    def column(cidx):
        def step(r, acc):
            row = (rows - 1) - r if reverse else r
            v = B.add(acc, x.read([row] + list(cidx)))
            out.write([row] + list(cidx), v)
            return [v]
        B.for_range(0, rows, 1, step, [B.f(0.0)])

    foreach(th, tuple(x.shape[1:]), column)


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
        def one(oidx):
            def step(r, acc):
                return [B.add(acc, x.read(full_index(oidx, unravel(r, red_shape))))]
            (acc,) = B.for_range(0, n_red, 1, step, [B.f(0.0)])
            out.write(oidx, acc)
        foreach(th, out_shape, one)
        return
    # few outputs, long reductions: every thread a strided part, warp shuffles, one slot per
    # warp, thread 0 adds the slots (fixed order: deterministic)
    warps = th.count // 32
    lane = th.tid % 32
    warp = th.tid // 32

    def per_output(o, *_):
        oidx = unravel(o, out_shape) if out_shape else []

        def step(r, acc):
            return [B.add(acc, x.read(full_index(oidx, unravel(r, red_shape))))]

        (part,) = B.for_range(th.tid, n_red, th.count, step, [B.f(0.0)])
        for m in (16, 8, 4, 2, 1):
            part = B.add(part, B.shfl_xor(part, m))
        B.if_then(B.icmp("eq", lane, 0), lambda: red.ref.write([warp], part))
        B.barrier()

        def finish():
            tot = red.ref.read([0])
            for w in range(1, warps):
                tot = B.add(tot, red.ref.read([w]))
            out.write(oidx, tot)

        B.if_then(B.icmp("eq", th.tid, 0), finish)
        B.barrier()
        return []

    B.for_range(0, n_out, 1, per_output)


def emit_tril_inv(th: Threads, out: BufRef, x: Ref) -> None:
    """out = (I + strict_tril(x))^-1 by forward substitution, one thread per column j:
    out[i, j] = [i == j] - sum_{j <= k < i} x[i, k] out[k, j] (a column only reads itself)."""
    C = x.shape[0]
    zero, one = B.f(0.0), B.f(1.0)

    def column(jidx):
        (j,) = jidx

        def row(i, *_):
            def term(k, acc):
                return [B.fma(x.read([i, k]), out.read([k, j]), acc)]
            (acc,) = B.for_range(j, i, 1, term, [zero])
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
            (acc,) = B.for_range(0, i, 1, term, [B.f(0.0)])
            out.write([i] + list(cidx), B.sub(b.read([i] + list(cidx)), acc))
            return []
        B.for_range(0, C, 1, row)

    foreach(th, tuple(b.shape[1:]), column)


# ------------------------------------------------------------------------------------------
# element-wise expressions
# ------------------------------------------------------------------------------------------


def unary(op: str, x: Ref, attrs: dict) -> FnRef:
    if op == "exp2":
        lo = attrs.get("clamp_min")
        fn = lambda v: B.exp2_clamped(v, lo)  # noqa: E731
    else:
        fn = {"neg": B.neg, "log2": B.lg2, "sigmoid": B.sigmoid, "softplus": B.softplus,
              "rsqrt": B.rsqrt}[op]
    return FnRef(x.shape, lambda idx: fn(x.read(idx)))


def binary(op: str, a: Ref, b: Ref) -> FnRef:
    fn = {"add": B.add, "sub": B.sub, "mul": B.mul, "div": B.div}[op]
    return FnRef(a.shape, lambda idx: fn(a.read(idx), b.read(idx)))


def convert(x: Ref, src: str, dst: str) -> Ref:
    if dst == "i1":
        return FnRef(x.shape, lambda idx: B.sel(B.nonzero(x.read(idx)), B.f(1.0), B.f(0.0)))
    if dst in ("bf16", "f16") and src != dst:
        return FnRef(x.shape, lambda idx: B.round_to(x.read(idx), dst))
    return x


def select(c: Ref, a: Ref, b: Ref) -> FnRef:
    return FnRef(a.shape, lambda idx: B.sel(B.nonzero(c.read(idx)), a.read(idx), b.read(idx)))


def tril(x: Ref, diagonal: int) -> FnRef:
    return FnRef(x.shape, lambda idx: B.sel(B.icmp("le", idx[1], addk(idx[0], diagonal)),
                                            x.read(idx), B.f(0.0)))


def embed_row(x: Ref, index: int, shape) -> FnRef:
    if index < 0:
        index += shape[0]
    return FnRef(tuple(shape), lambda idx: B.sel(B.icmp("eq", idx[0], index), x.read(idx[1:]),
                                                 B.f(0.0)))
