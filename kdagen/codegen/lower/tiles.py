"""Tile references and the per-op emitters of the lowering (a library, driven by kernel.py).

A tile value of the program is, while a kernel is emitted, a :class:`Ref`: something that can
produce element ``x[idx]`` (an f32 SSA value) for any index tuple of int-likes (Python ints
or `IntVal`s). Kinds:

- :class:`BufRef`: a per-CTA fp32 buffer (shared memory or the global scratch), with element
  offset and strides, so broadcast / transpose / extract_row are free re-indexings of it;
- :class:`ConstRef`, :class:`ScalarRef`: a constant, a kernel scalar;
- :class:`FnRef`: a lazy expression, evaluated at the reader's index (element-wise ops, masks,
  loads from global memory): the consumer's loop computes it, nothing is stored.

Emitters (all executed by the ``nthreads`` threads of the CTA; the caller puts a barrier after
each): :func:`foreach` (thread-strided loop over a tile's elements), :func:`materialize`,
:func:`contraction` (register-tiled FMA loop, used by dot / decay_dot / decay_matmul),
:func:`emit_cumsum`, :func:`emit_reduce_sum`, :func:`emit_tril_inv`, :func:`emit_tril_solve`.
Math is fp32 throughout: ``ex2.approx`` / ``lg2.approx`` / ``rcp.approx`` (fastmath.py),
``rsqrt`` as ``1 / sqrt.rn``; no libdevice call is ever emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kdagen._mlir import arith, ir, llvm, nvvm, scf
from kdagen.codegen.common import fastmath
from kdagen.codegen.common.ints import IntVal, as_i32
from kdagen.codegen.common.shuffle import butterfly_reduce
from kdagen.codegen.common.smem import global_ptr_type, shared_ptr_type

_DYN = -2147483648


def f32t() -> ir.Type:
    return ir.F32Type.get()


def i32t() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def i64t() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def cf(x: float) -> ir.Value:
    return arith.constant(f32t(), float(x))


def ci32(x: int) -> ir.Value:
    return arith.constant(i32t(), int(x))


def idx_value(x) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), as_i32(x))


def i64(x) -> ir.Value:
    """Sign-extend an int-like / i32 / index value to i64."""
    if isinstance(x, int):
        return arith.constant(i64t(), x)
    v = x.value if isinstance(x, IntVal) else x
    if isinstance(v.type, ir.IndexType):
        return arith.index_cast(i64t(), v)
    if ir.IntegerType(v.type).width == 64:
        return v
    return arith.extsi(i64t(), v)


def icmp(pred: str, a, b) -> ir.Value:
    """Signed i32 comparison of int-likes."""
    p = {"lt": arith.CmpIPredicate.slt, "le": arith.CmpIPredicate.sle,
         "eq": arith.CmpIPredicate.eq, "ge": arith.CmpIPredicate.sge,
         "gt": arith.CmpIPredicate.sgt, "ne": arith.CmpIPredicate.ne}[pred]
    return arith.cmpi(p, as_i32(a), as_i32(b))


def sel(cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    return arith.select(cond, a, b)


def fma(a, b, c):
    return llvm.intr_fma(a, b, c)


def exp2_clamped(x: ir.Value, clamp_min) -> ir.Value:
    if clamp_min is not None:
        x = arith.maximumf(x, cf(clamp_min))
    return fastmath.exp2(x)


def rsqrt(x: ir.Value) -> ir.Value:
    """1 / sqrt(x), correctly rounded sqrt (sqrt.rn) then div.rn (no libdevice)."""
    s = llvm.inline_asm(f32t(), [x], "sqrt.rn.f32 $0, $1;", "=f,f")
    return arith.divf(cf(1.0), s)


def round_to(x: ir.Value, elt: str) -> ir.Value:
    """Round an f32 to bf16/f16 and back (what storing an intermediate in that type does)."""
    t = {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get()}[elt]
    return arith.extf(f32t(), arith.truncf(t, x))


def elem_type(elt: str) -> ir.Type:
    return {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get(), "f32": f32t(),
            "i32": i32t(), "i64": i64t(), "f64": ir.F64Type.get()}[elt]


# ------------------------------------------------------------------------------------------
# references
# ------------------------------------------------------------------------------------------


class Ref:
    """Interface: ``shape``, ``cheap`` (reading costs a load at most), ``read(idx)``."""

    def read(self, idx) -> ir.Value:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class Scratch:
    """The per-CTA scratch region: base pointer and address space ("smem" or "global")."""
    base: ir.Value
    space: str

    def ptr(self, elem_index) -> ir.Value:
        t = shared_ptr_type() if self.space == "smem" else global_ptr_type()
        return llvm.getelementptr(t, self.base, [as_i32(elem_index)], [_DYN], f32t(), 0)


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
            if s:
                e = e + i * s
        return e

    def read(self, idx) -> ir.Value:
        return llvm.load(f32t(), self.scratch.ptr(self.address(idx)))

    def write(self, idx, value: ir.Value) -> None:
        llvm.store(value, self.scratch.ptr(self.address(idx)))

    def same_storage(self, other) -> bool:
        return (isinstance(other, BufRef) and other.offset == self.offset
                and other.strides == self.strides and other.shape == self.shape)


@dataclass
class ConstRef(Ref):
    value: float
    shape: tuple
    cheap: bool = True

    def read(self, idx) -> ir.Value:
        return cf(self.value)


@dataclass
class ScalarRef(Ref):
    value: ir.Value
    shape: tuple = ()
    cheap: bool = True

    def read(self, idx) -> ir.Value:
        return self.value


@dataclass
class FnRef(Ref):
    shape: tuple
    fn: object
    cheap: bool = False

    def read(self, idx) -> ir.Value:
        return self.fn(list(idx))


def broadcast(x: Ref, dims, shape) -> Ref:
    dims = list(dims)
    keep = [d for d in range(len(shape)) if d not in dims]
    if isinstance(x, BufRef):
        strides = [0] * len(shape)
        for k, d in enumerate(keep):
            strides[d] = x.strides[k]
        return BufRef(x.scratch, x.offset, tuple(shape), tuple(strides))
    if isinstance(x, (ConstRef, ScalarRef)):
        return type(x)(x.value, tuple(shape)) if isinstance(x, ConstRef) else ScalarRef(x.value, tuple(shape))
    return FnRef(tuple(shape), lambda idx: x.read([idx[d] for d in keep]), cheap=x.cheap)


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


@dataclass
class Threads:
    tid: IntVal
    count: int


def if_then(cond: ir.Value, body) -> None:
    branch = scf.IfOp(cond)
    with ir.InsertionPoint(branch.then_block):
        body()
        scf.yield_([])


def for_range(lo, hi, step, body, iter_args=None):
    """scf.for over i32 int-likes; ``body(i: IntVal, *args) -> list of yielded values``."""
    iter_args = list(iter_args or [])
    loop = scf.ForOp(idx_value(lo), idx_value(hi), idx_value(step), iter_args)
    with ir.InsertionPoint(loop.body):
        out = body(IntVal(loop.induction_variable), *loop.inner_iter_args)
        scf.yield_(list(out or []))
    return list(loop.results) if iter_args else []


def foreach(th: Threads, shape, body) -> None:
    """Run ``body(idx)`` for every element of ``shape``, element e on thread e % count."""
    n = numel(shape)
    if n == 1:
        if_then(th.tid.eq(0), lambda: body([0] * len(shape)))
        return
    if n % th.count == 0 and n // th.count <= 2:
        for k in range(n // th.count):
            body(unravel(th.tid + k * th.count, shape))
        return
    if n < th.count:
        if_then(th.tid.lt(n), lambda: body(unravel(th.tid, shape)))
        return

    def step(e):
        body(unravel(e, shape))
        return []

    for_range(th.tid, n, th.count, step)


def materialize(th: Threads, src: Ref, dst: BufRef) -> None:
    foreach(th, dst.shape, lambda idx: dst.write(idx, src.read(idx)))


# ------------------------------------------------------------------------------------------
# contraction: out[p, q] = epilogue(p, q, sum_r combine(...)), register-tiled over threads
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
                epilogue=None, max_acc: int = 64, r_range=None) -> None:
    """``out[p, q] = epilogue(p, q, acc)``, ``acc = fold over r < R of
    combine(acc, row_vals(p, r), col_vals(r, q), pre_vals(p, q), p, q, r)``.

    ``row_fn(p, r)`` / ``col_fn(r, q)`` return lists of f32 values (loaded once per r for all
    of the thread's rows / columns), ``pre_fn(p, q)`` a list hoisted out of the r loop.
    """
    M, N = out.shape
    plan = contraction_plan(M, N, th.count, max_acc)
    ti = th.tid // plan.tn
    tj = th.tid % plan.tn

    def body():
        for pss in range(plan.passes):
            rows = [ti + plan.tm * (pss * plan.rm + a) for a in range(plan.rm)]
            cols = [tj + plan.tn * b for b in range(plan.rn)]
            pre = {}
            if pre_fn is not None:
                for a in range(plan.rm):
                    for b in range(plan.rn):
                        pre[(a, b)] = pre_fn(rows[a], cols[b])
            init = [cf(0.0)] * (plan.rm * plan.rn)

            def step(r, *acc):
                rv = [row_fn(rows[a], r) for a in range(plan.rm)]
                cv = [col_fn(r, cols[b]) for b in range(plan.rn)]
                new = []
                for a in range(plan.rm):
                    for b in range(plan.rn):
                        new.append(combine(acc[a * plan.rn + b], rv[a], cv[b], pre.get((a, b)),
                                           rows[a], cols[b], r))
                return new

            lo, hi = (0, R) if r_range is None else r_range
            acc = for_range(lo, hi, 1, step, init)
            for a in range(plan.rm):
                for b in range(plan.rn):
                    v = acc[a * plan.rn + b]
                    if epilogue is not None:
                        v = epilogue(rows[a], cols[b], v)
                    out.write([rows[a], cols[b]], v)

    if plan.threads < th.count:
        if_then(th.tid.lt(plan.threads), body)
    else:
        body()


def emit_dot(th: Threads, out: BufRef, a: Ref, b: Ref) -> None:
    """out = a @ b (a: [M, R], b: [R, N], any views), fp32 FMA."""
    R = a.shape[1]
    contraction(th, out, R,
                lambda p, r: [a.read([p, r])],
                lambda r, q: [b.read([r, q])],
                lambda acc, rv, cv, pre, p, q, r: fma(rv[0], cv[0], acc))


def emit_decay_dot(th: Threads, out: BufRef, lhs: Ref, rhs: Ref, gl: Ref, gr: Ref,
                   diagonal: int, clamp_min) -> None:
    """out[i, j] = sum_d lhs[i, d] rhs[j, d] 2^(gl[i, d] - gr[j, d]) for j <= i + diagonal.

    Evaluated with the relative exponent per term (the S = 1 form, exact for every subblock
    size; the factored S > 1 form is a tensor-core optimisation with the same value)."""
    D = lhs.shape[1]

    def combine(acc, rv, cv, pre, i, j, d):
        e = exp2_clamped(arith.subf(rv[1], cv[1]), clamp_min)
        return fma(arith.mulf(rv[0], cv[0]), e, acc)

    zero = cf(0.0)
    contraction(th, out, D,
                lambda i, d: [lhs.read([i, d]), gl.read([i, d])],
                lambda d, j: [rhs.read([j, d]), gr.read([j, d])],
                combine,
                epilogue=lambda i, j, v: sel(icmp("le", j, _add(i, diagonal)), v, zero))


def emit_decay_matmul(th: Threads, out: BufRef, w: Ref, x: Ref, g_row: Ref, g_col: Ref,
                      diagonal: int, transpose_w: bool, clamp_min) -> None:
    """E[i, j, d] = 2^(g_row[i, d] - g_col[j, d]) for j <= i + diagonal (else 0);
    not transposed: out[i, d] = sum_j w[i, j] x[j, d] E[i, j, d];
    transposed:     out[j, d] = sum_i w[i, j] x[i, d] E[i, j, d]."""
    zero = cf(0.0)
    if not transpose_w:
        J = w.shape[1]

        def combine(acc, rv, cv, pre, i, d, j):
            ok = icmp("le", j, _add(i, diagonal))
            e = exp2_clamped(arith.subf(pre[0], cv[1]), clamp_min)
            term = arith.mulf(arith.mulf(rv[0], cv[0]), e)
            return arith.addf(acc, sel(ok, term, zero))

        contraction(th, out, J,
                    lambda i, j: [w.read([i, j])],
                    lambda j, d: [x.read([j, d]), g_col.read([j, d])],
                    combine, pre_fn=lambda i, d: [g_row.read([i, d])])
    else:
        I = w.shape[0]

        def combine(acc, rv, cv, pre, j, d, i):
            ok = icmp("le", j, _add(i, diagonal))
            e = exp2_clamped(arith.subf(cv[1], pre[0]), clamp_min)
            term = arith.mulf(arith.mulf(rv[0], cv[0]), e)
            return arith.addf(acc, sel(ok, term, zero))

        contraction(th, out, I,
                    lambda j, i: [w.read([i, j])],
                    lambda i, d: [x.read([i, d]), g_row.read([i, d])],
                    combine, pre_fn=lambda j, d: [g_col.read([j, d])])


def _add(i, k: int):
    if isinstance(i, int):
        return i + k
    return IntVal(arith.addi(as_i32(i), ci32(k)))


# ------------------------------------------------------------------------------------------
# scans over rows, reductions, triangular solves
# ------------------------------------------------------------------------------------------


def _columns(shape):
    return tuple(shape[1:])


def emit_cumsum(th: Threads, out: BufRef, x: Ref, reverse: bool) -> None:
    """Inclusive cumulative sum over dim 0 (reverse: suffix sums): one thread per column,
    sequential over the rows."""
    rows = x.shape[0]
    cols = _columns(x.shape)

    def column(cidx):
        def step(r, acc):
            row = IntVal(arith.subi(ci32(rows - 1), as_i32(r))) if reverse else r
            v = arith.addf(acc, x.read([row] + list(cidx)))
            out.write([row] + list(cidx), v)
            return [v]
        for_range(0, rows, 1, step, [cf(0.0)])

    foreach(th, cols, column)


@dataclass
class ReduceScratch:
    """A few fp32 slots for cross-warp partial sums (one per warp)."""
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
                return [arith.addf(acc, x.read(full_index(oidx, unravel(r, red_shape))))]
            (acc,) = for_range(0, n_red, 1, step, [cf(0.0)])
            out.write(oidx, acc)
        foreach(th, out_shape, one)
        return
    # few outputs, long reductions: all threads per output, warp shuffles + one slot per warp
    warps = th.count // 32
    lane = th.tid % 32
    warp = th.tid // 32

    def per_output(o, *_):
        oidx = unravel(o, out_shape) if out_shape else []

        def step(r, acc):
            return [arith.addf(acc, x.read(full_index(oidx, unravel(r, red_shape))))]

        (part,) = for_range(th.tid, n_red, th.count, step, [cf(0.0)])
        part = butterfly_reduce(part, "sum")
        if_then(lane.eq(0), lambda: red.ref.write([warp], part))
        nvvm.barrier()

        def finish():
            tot = red.ref.read([0])
            for w in range(1, warps):
                tot = arith.addf(tot, red.ref.read([w]))
            out.write(oidx, tot)

        if_then(th.tid.eq(0), finish)
        nvvm.barrier()
        return []

    for_range(0, n_out, 1, per_output)


def emit_tril_inv(th: Threads, out: BufRef, x: Ref) -> None:
    """out = (I + strict_tril(x))^-1 by forward substitution, one thread per column j:
    out[i, j] = [i == j] - sum_{j <= k < i} x[i, k] out[k, j] (a column only reads itself)."""
    C = x.shape[0]
    zero, one = cf(0.0), cf(1.0)

    def column(jidx):
        (j,) = jidx

        def row(i, *_):
            def term(k, acc):
                return [fma(x.read([i, k]), out.read([k, j]), acc)]
            (acc,) = for_range(j, i, 1, term, [zero])
            v = sel(icmp("lt", i, j), zero, sel(icmp("eq", i, j), one, arith.negf(acc)))
            out.write([i, j], v)
            return []

        for_range(0, C, 1, row)

    foreach(th, (C,), column)


def emit_tril_solve(th: Threads, out: BufRef, L: Ref, b: Ref) -> None:
    """out = (I + strict_tril(L))^-1 b by forward substitution, one thread per column d:
    out[i, d] = b[i, d] - sum_{k < i} L[i, k] out[k, d]."""
    C = L.shape[0]
    cols = tuple(b.shape[1:])

    def column(cidx):
        def row(i, *_):
            def term(k, acc):
                return [fma(L.read([i, k]), out.read([k] + list(cidx)), acc)]
            (acc,) = for_range(0, i, 1, term, [cf(0.0)])
            out.write([i] + list(cidx), arith.subf(b.read([i] + list(cidx)), acc))
            return []
        for_range(0, C, 1, row)

    foreach(th, cols, column)


# ------------------------------------------------------------------------------------------
# element-wise expressions
# ------------------------------------------------------------------------------------------


def unary(op: str, x: Ref, attrs: dict) -> FnRef:
    if op == "neg":
        f = arith.negf
    elif op == "exp2":
        lo = attrs.get("clamp_min")
        f = lambda v: exp2_clamped(v, lo)  # noqa: E731
    elif op == "log2":
        f = fastmath.log2
    elif op == "sigmoid":
        f = fastmath.sigmoid
    elif op == "softplus":
        f = fastmath.softplus
    elif op == "rsqrt":
        f = rsqrt
    else:  # pragma: no cover
        raise ValueError(op)
    return FnRef(x.shape, lambda idx: f(x.read(idx)))


def binary(op: str, a: Ref, b: Ref) -> FnRef:
    f = {"add": arith.addf, "sub": arith.subf, "mul": arith.mulf, "div": arith.divf}[op]
    return FnRef(a.shape, lambda idx: f(a.read(idx), b.read(idx)))


def convert(x: Ref, src: str, dst: str) -> Ref:
    if dst == "i1":
        return FnRef(x.shape, lambda idx: sel(arith.cmpf(arith.CmpFPredicate.UNE, x.read(idx), cf(0.0)),
                                               cf(1.0), cf(0.0)))
    if dst in ("bf16", "f16"):
        return FnRef(x.shape, lambda idx: round_to(x.read(idx), dst))
    return x


def select(c: Ref, a: Ref, b: Ref) -> FnRef:
    return FnRef(a.shape, lambda idx: sel(arith.cmpf(arith.CmpFPredicate.UNE, c.read(idx), cf(0.0)),
                                          a.read(idx), b.read(idx)))


def tril(x: Ref, diagonal: int) -> FnRef:
    return FnRef(x.shape, lambda idx: sel(icmp("le", idx[1], _add(idx[0], diagonal)),
                                          x.read(idx), cf(0.0)))


def embed_row(x: Ref, index: int, shape) -> FnRef:
    if index < 0:
        index += shape[0]
    return FnRef(tuple(shape), lambda idx: sel(icmp("eq", idx[0], index), x.read(idx[1:]), cf(0.0)))
