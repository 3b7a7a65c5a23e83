"""The primitive operations the lowering's emitters are written in, with two backends.

Every emitter (tiles.py, kernel.py) builds kernels only through the functions of this module
(float math, int-likes, memory, structured control flow, barriers, shuffles). Two backends
implement them:

- :class:`MlirBackend` emits ``arith`` / ``llvm`` / ``scf`` / ``nvvm`` ops at the current
  insertion point (int-likes are ``ints.IntVal`` for i32 and :class:`W64` for i64; Python ints
  fold);
- :class:`SimBackend` *executes* the same emitter code on the CPU for one CTA at a time, all
  threads in lockstep as numpy arrays (one lane per thread) with an active-lane mask for
  divergent loops and branches. It checks what the GPU cannot tell us cheaply: barriers in
  divergent code, shuffles with inactive lanes, out-of-bounds accesses, and shared-scratch
  races (a read of an element another thread wrote, or a write of an element another thread
  read, since the last barrier).

So the CPU tests run the very index arithmetic, liveness plan and op schedules a kernel is
built from (the simulator's math is float32 numpy: ex2/lg2/rcp/sqrt are exact-rounded there).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

__all__ = ["current", "use", "MlirBackend", "SimBackend", "SimPtr", "SimError"]

_STACK: list = []


def current():
    if not _STACK:
        raise RuntimeError("no lowering backend is active (use backend.use(...))")
    return _STACK[-1]


@contextmanager
def use(backend):
    _STACK.append(backend)
    try:
        yield backend
    finally:
        _STACK.pop()


LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


# --------------------------------------------------------------------------------------
# module-level API (dispatch to the active backend)
# --------------------------------------------------------------------------------------

def f(x: float):
    return current().const_f(float(x))


def add(a, b):
    return current().add(a, b)


def sub(a, b):
    return current().sub(a, b)


def mul(a, b):
    return current().mul(a, b)


def div(a, b):
    return current().div(a, b)


def neg(a):
    return current().neg(a)


def maxf(a, b):
    return current().maxf(a, b)


def minf(a, b):
    return current().minf(a, b)


def fma(a, b, c):
    return current().fma(a, b, c)


def ex2(a):
    return current().ex2(a)


def lg2(a):
    return current().lg2(a)


def rcp(a):
    return current().rcp(a)


def sqrt(a):
    return current().sqrt(a)


def sel(cond, a, b):
    return current().sel(cond, a, b)


def fle(a, b):
    """bool: a <= b (ordered: false when either is NaN)."""
    return current().fle(a, b)


def nonzero(x):
    """bool: x != 0 (an i1 mask held as 0.0 / 1.0)."""
    return current().nonzero(x)


def round_to(x, elt: str):
    return current().round_to(x, elt)


def icmp(pred: str, a, b):
    """Signed comparison of int-likes: lt, le, eq, ne, ge, gt."""
    return current().icmp(pred, a, b)


def isel(cond, a, b):
    return current().isel(cond, a, b)


def band(a, b):
    return current().band(a, b)


def wide(x):
    """An int-like as a 64-bit int-like (sign-extended)."""
    return current().wide(x)


def narrow(x):
    """A 64-bit int-like truncated to 32 bits."""
    return current().narrow(x)


def for_range(lo, hi, step, body, iter_args=None):
    """Loop i = lo, lo+step, ... < hi (int-likes, may differ per thread); ``body(i, *args)``
    returns the next iteration arguments; returns the final ones."""
    return current().for_range(lo, hi, step, body, list(iter_args or []))


def if_then(cond, body):
    return current().if_then(cond, body)


def barrier():
    return current().barrier()


def shfl_xor(x, mask: int):
    return current().shfl_xor(x, mask)


def load(ptr, index, elt: str = "f32"):
    """Element ``index`` (int-like, i32 or 64-bit) of type ``elt`` at ``ptr``, as f32 (i64 raw)."""
    return current().load(ptr, index, elt)


def store(ptr, index, value, elt: str = "f32"):
    """Store an f32 value as ``elt`` (rounded to nearest) at element ``index`` of ``ptr``."""
    return current().store(ptr, index, value, elt)


def gep(ptr, index, elt: str = "f32"):
    return current().gep(ptr, index, elt)


def uniform(x):
    """A value every thread holds equally, made a plain scalar where the backend can
    (the simulator turns equal lanes into a Python int; MLIR values pass through)."""
    return current().uniform(x)


def fresh_tid():
    """The thread index, re-read so that the compiler cannot hoist what depends on it out of
    enclosing loops (each op's addressing stays local to the op: low register pressure)."""
    return current().fresh_tid()


def pack_bf16x2(lo, hi):
    """Two f32 rounded to bf16 (round to nearest even) in one 32-bit register, lo first."""
    return current().pack_bf16x2(lo, hi)


def mma_bf16(a: list, b: list, c: list) -> list:
    """mma.sync.m16n8k16.row.col.f32.bf16: 4 packed A registers, 2 packed B registers, 4 f32
    accumulators of this lane (PTX fragment layouts, see common/layouts.py) -> 4 f32."""
    return current().mma_bf16(a, b, c)


# derived math (same formulas on both backends)

def exp2_clamped(x, clamp_min):
    if clamp_min is not None:
        x = maxf(x, f(clamp_min))
    return ex2(x)


def clamp(x, lo: float, hi: float):
    """min(max(x, lo), hi); NaN stays NaN (maximumf/minimumf propagate it)."""
    if lo > -math.inf:
        x = maxf(x, f(lo))
    if hi < math.inf:
        x = minf(x, f(hi))
    return x


def in_range(x, lo: float, hi: float):
    """1.0 where lo <= x <= hi, else 0.0 (also for NaN: ordered comparisons)."""
    return sel(band(fle(f(lo), x), fle(x, f(hi))), f(1.0), f(0.0))


def sigmoid(x):
    """1 / (1 + 2^(-x log2 e)): saturates cleanly to 0 or 1."""
    return rcp(add(f(1.0), ex2(mul(x, f(-LOG2E)))))


def softplus(x):
    """max(x, 0) + ln2 * log2(1 + 2^(-|x| log2 e)): no overflow for any x."""
    ax = maxf(x, neg(x))
    tail = lg2(add(f(1.0), ex2(mul(ax, f(-LOG2E)))))
    return add(maxf(x, f(0.0)), mul(tail, f(LN2)))


def rsqrt(x):
    return div(f(1.0), sqrt(x))


# --------------------------------------------------------------------------------------
# MLIR backend
# --------------------------------------------------------------------------------------


class W64:
    """An i64 SSA value with + - * (signed) for address arithmetic."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    @staticmethod
    def _v(x):
        from kdagen._mlir import arith, ir
        if isinstance(x, W64):
            return x.value
        if isinstance(x, int):
            return arith.constant(ir.IntegerType.get_signless(64), x)
        return MlirBackend._i64(x)

    def _bin(self, other, fn, rev=False):
        a, b = self.value, W64._v(other)
        return W64(fn(b, a) if rev else fn(a, b))

    def __add__(self, o):
        from kdagen._mlir import arith
        if isinstance(o, int) and o == 0:
            return self
        return self._bin(o, arith.addi)

    __radd__ = __add__

    def __sub__(self, o):
        from kdagen._mlir import arith
        return self._bin(o, arith.subi)

    def __rsub__(self, o):
        from kdagen._mlir import arith
        return self._bin(o, arith.subi, rev=True)

    def __mul__(self, o):
        from kdagen._mlir import arith
        if isinstance(o, int) and o == 1:
            return self
        return self._bin(o, arith.muli)

    __rmul__ = __mul__


class MlirBackend:
    name = "mlir"

    def __init__(self, barrier: tuple[int, int] | None = None):
        """``barrier``: (named barrier id, thread count) that `barrier()` synchronises on, for
        kernels whose tile code runs in one warpgroup of several (None: the whole CTA)."""
        from kdagen._mlir import arith, ir, llvm, nvvm, scf
        from kdagen.codegen.common import ints
        self.arith, self.ir, self.llvm, self.nvvm, self.scf, self.ints = arith, ir, llvm, nvvm, scf, ints
        self.named_barrier = barrier

    # types
    def f32(self):
        return self.ir.F32Type.get()

    def i32(self):
        return self.ir.IntegerType.get_signless(32)

    @staticmethod
    def _i64(x):
        from kdagen._mlir import arith, ir
        from kdagen.codegen.common.ints import IntVal, as_i32
        i64 = ir.IntegerType.get_signless(64)
        if isinstance(x, W64):
            return x.value
        if isinstance(x, int):
            return arith.constant(i64, x)
        v = x.value if isinstance(x, IntVal) else x
        if isinstance(v.type, ir.IndexType):
            return arith.index_cast(i64, v)
        if ir.IntegerType(v.type).width == 64:
            return v
        return arith.extsi(i64, as_i32(v))

    # float
    def const_f(self, x):
        return self.arith.constant(self.f32(), x)

    def add(self, a, b):
        return self.arith.addf(a, b)

    def sub(self, a, b):
        return self.arith.subf(a, b)

    def mul(self, a, b):
        return self.arith.mulf(a, b)

    def div(self, a, b):
        return self.arith.divf(a, b)

    def neg(self, a):
        return self.arith.negf(a)

    def maxf(self, a, b):
        return self.arith.maximumf(a, b)

    def minf(self, a, b):
        return self.arith.minimumf(a, b)

    def fma(self, a, b, c):
        return self.llvm.intr_fma(a, b, c)

    def ex2(self, a):
        return self.nvvm.ex2(a)

    def lg2(self, a):
        return self.nvvm.log2(a)

    def rcp(self, a):
        return self.nvvm.rcp_approx_ftz_f(a)

    def sqrt(self, a):
        return self.llvm.inline_asm(self.f32(), [a], "sqrt.rn.f32 $0, $1;", "=f,f")

    def sel(self, cond, a, b):
        return self.arith.select(cond, a, b)

    def nonzero(self, x):
        return self.arith.cmpf(self.arith.CmpFPredicate.UNE, x, self.const_f(0.0))

    def fle(self, a, b):
        return self.arith.cmpf(self.arith.CmpFPredicate.OLE, a, b)

    def round_to(self, x, elt):
        t = {"bf16": self.ir.BF16Type.get(), "f16": self.ir.F16Type.get()}[elt]
        return self.arith.extf(self.f32(), self.arith.truncf(t, x))

    # ints
    def icmp(self, pred, a, b):
        P = self.arith.CmpIPredicate
        p = {"lt": P.slt, "le": P.sle, "eq": P.eq, "ne": P.ne, "ge": P.sge, "gt": P.sgt}[pred]
        if isinstance(a, W64) or isinstance(b, W64):
            return self.arith.cmpi(p, self._i64(a), self._i64(b))
        return self.arith.cmpi(p, self.ints.as_i32(a), self.ints.as_i32(b))

    def isel(self, cond, a, b):
        if isinstance(a, W64) or isinstance(b, W64):
            return W64(self.arith.select(cond, self._i64(a), self._i64(b)))
        return self.ints.IntVal(self.arith.select(cond, self.ints.as_i32(a), self.ints.as_i32(b)))

    def band(self, a, b):
        return self.arith.andi(a, b)

    def wide(self, x):
        if isinstance(x, int):
            return x
        return W64(self._i64(x))

    def narrow(self, x):
        if isinstance(x, int):
            return x
        return self.ints.IntVal(self.arith.trunci(self.i32(), self._i64(x)))

    # control
    def for_range(self, lo, hi, step, body, iter_args):
        ir, arith, scf, ints = self.ir, self.arith, self.scf, self.ints

        def idx(x):
            return arith.index_cast(ir.IndexType.get(), ints.as_i32(x))
        def raw(v):
            if isinstance(v, (ints.IntVal, W64)):
                return v.value
            if isinstance(v, int):
                return ints.as_i32(v)
            return v

        def wrap(v):
            if isinstance(v.type, ir.IntegerType) and ir.IntegerType(v.type).width == 32:
                return ints.IntVal(v)
            if isinstance(v.type, ir.IntegerType) and ir.IntegerType(v.type).width == 64:
                return W64(v)
            return v

        loop = scf.ForOp(idx(lo), idx(hi), idx(step), [raw(v) for v in iter_args])
        with ir.InsertionPoint(loop.body):
            out = body(ints.IntVal(loop.induction_variable), *[wrap(v) for v in loop.inner_iter_args])
            scf.yield_([raw(v) for v in (out or [])])
        return [wrap(v) for v in loop.results] if iter_args else []

    def if_then(self, cond, body):
        if isinstance(cond, bool):
            if cond:
                body()
            return
        branch = self.scf.IfOp(cond)
        with self.ir.InsertionPoint(branch.then_block):
            body()
            self.scf.yield_([])

    def barrier(self):
        if self.named_barrier is None:
            self.nvvm.barrier()
        else:
            from kdagen.codegen.common.barrier import named_barrier_sync
            named_barrier_sync(*self.named_barrier)

    def uniform(self, x):
        return x

    def shfl_xor(self, x, mask):
        from kdagen.codegen.common.shuffle import shfl_xor
        return shfl_xor(x, mask)

    def fresh_tid(self):
        v = self.llvm.inline_asm(self.i32(), [], "mov.u32 $0, %tid.x;", "=r",
                                 has_side_effects=True)
        return self.ints.IntVal(v)

    def pack_bf16x2(self, lo, hi):
        from kdagen.codegen.common.convert import pack_f32x2
        return pack_f32x2(lo, hi, "bf16")

    def mma_bf16(self, a, b, c):
        from kdagen.codegen.common.mma import mma_m16n8k16
        return mma_m16n8k16(list(a), list(b), list(c), "bf16")

    # memory: ptr is an llvm.ptr value (global or shared); index an int-like (i32) or W64
    def _elem(self, elt):
        ir = self.ir
        return {"bf16": ir.BF16Type.get(), "f16": ir.F16Type.get(), "f32": self.f32(),
                "i32": self.i32(), "i64": ir.IntegerType.get_signless(64)}[elt]

    def gep(self, ptr, index, elt="f32"):
        if isinstance(index, int) and index == 0:
            return ptr
        if isinstance(index, W64):
            iv = index.value
        elif isinstance(index, int) and not (-2**31 <= index < 2**31):
            iv = self._i64(index)
        else:
            iv = self.ints.as_i32(index)
        return self.llvm.getelementptr(ptr.type, ptr, [iv], [-2147483648], self._elem(elt), 0)

    def load(self, ptr, index, elt="f32"):
        v = self.llvm.load(self._elem(elt), self.gep(ptr, index, elt))
        if elt in ("bf16", "f16"):
            return self.arith.extf(self.f32(), v)
        return v

    def store(self, ptr, index, value, elt="f32"):
        if elt in ("bf16", "f16"):
            value = self.arith.truncf(self._elem(elt), value)
        self.llvm.store(value, self.gep(ptr, index, elt))


# --------------------------------------------------------------------------------------
# CPU simulator backend
# --------------------------------------------------------------------------------------


class SimError(RuntimeError):
    """A kernel did something that would be wrong on the GPU (race, divergent barrier, OOB)."""


class SimPtr:
    """A pointer into a simulated memory: a flat numpy array plus an element offset."""

    def __init__(self, mem: "SimMemory", offset=0):
        self.mem = mem
        self.offset = offset


class SimMemory:
    """Flat simulated memory. ``track``: remember per element the last writer and readers
    (key = epoch * 4096 + thread; thread 4095 = several readers) for race detection."""

    def __init__(self, name: str, data: np.ndarray, elt: str, track: bool = False):
        self.name = name
        self.data = data.reshape(-1)
        self.elt = elt
        self.track = track
        if track:
            n = self.data.size
            self.w_key = np.full(n, -1, np.int64)
            self.r_key = np.full(n, -1, np.int64)


def _bf16_round(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = r.view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)


class SimBackend:
    """Executes emitter code for one CTA of ``nthreads`` threads, lanes as numpy arrays."""

    name = "sim"

    def __init__(self, nthreads: int, check_races: bool = True):
        self.nt = nthreads
        self.lanes = np.arange(nthreads, dtype=np.int64)
        self.full = np.ones(nthreads, bool)
        self.masks = [self.full]
        self.epoch = 0
        self.check_races = check_races
        self.stats = {"barriers": 0}

    @property
    def mask(self):
        return self.masks[-1]

    def _arr(self, x, dtype):
        a = np.asarray(x, dtype)
        return np.broadcast_to(a, (self.nt,)) if a.ndim == 0 else a

    # float (np.float32 lanes)
    def const_f(self, x):
        return np.float32(x)

    def _f(self, x):
        return np.asarray(x, np.float32)

    def add(self, a, b):
        return self._f(a) + self._f(b)

    def sub(self, a, b):
        return self._f(a) - self._f(b)

    def mul(self, a, b):
        return self._f(a) * self._f(b)

    def div(self, a, b):
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._f(a) / self._f(b)

    def neg(self, a):
        return -self._f(a)

    def maxf(self, a, b):
        return np.maximum(self._f(a), self._f(b))

    def minf(self, a, b):
        return np.minimum(self._f(a), self._f(b))

    def fma(self, a, b, c):
        return (np.asarray(a, np.float64) * np.asarray(b, np.float64)
                + np.asarray(c, np.float64)).astype(np.float32)

    def ex2(self, a):
        with np.errstate(over="ignore", under="ignore"):
            return np.exp2(self._f(a))

    def lg2(self, a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log2(self._f(a))

    def rcp(self, a):
        with np.errstate(divide="ignore"):
            return np.float32(1.0) / self._f(a)

    def sqrt(self, a):
        with np.errstate(invalid="ignore"):
            return np.sqrt(self._f(a))

    def sel(self, cond, a, b):
        return np.where(cond, self._f(a), self._f(b)).astype(np.float32)

    def nonzero(self, x):
        return self._f(x) != 0

    def fle(self, a, b):
        return self._f(a) <= self._f(b)

    def round_to(self, x, elt):
        if elt == "bf16":
            return _bf16_round(x)
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)

    # ints (Python ints or int64 lanes)
    def icmp(self, pred, a, b):
        op = {"lt": np.less, "le": np.less_equal, "eq": np.equal, "ne": np.not_equal,
              "ge": np.greater_equal, "gt": np.greater}[pred]
        r = op(a, b)
        return r

    def isel(self, cond, a, b):
        return np.where(cond, a, b)

    def band(self, a, b):
        return np.logical_and(a, b)

    def wide(self, x):
        return x if isinstance(x, int) else np.asarray(x, np.int64)

    def narrow(self, x):
        return x if isinstance(x, int) else np.asarray(x, np.int64)

    # control
    def for_range(self, lo, hi, step, body, iter_args):
        uniform = all(isinstance(v, (int, np.integer)) or np.ndim(v) == 0 for v in (lo, hi))
        if uniform:
            lo_i, hi_i = int(lo), int(hi)
            args = list(iter_args)
            for i in range(lo_i, hi_i, step):
                out = body(i, *args)
                args = list(out or [])
            return args
        lo_a = self._arr(lo, np.int64)
        hi_a = self._arr(hi, np.int64)
        iters = np.maximum(0, -(-(hi_a - lo_a) // step))
        iters = np.where(self.mask, iters, 0)
        kmax = int(iters.max()) if iters.size else 0
        args = [a for a in iter_args]
        outer = self.mask
        for k in range(kmax):
            active = outer & (k < iters)
            self.masks.append(active)
            try:
                out = body(lo_a + k * step, *args)
            finally:
                self.masks.pop()
            args = [np.where(active, np.asarray(o), np.asarray(a)) for o, a in zip(out or [], args)]
        return args

    def if_then(self, cond, body):
        c = self._arr(cond, bool) & self.mask
        if not c.any():
            return
        self.masks.append(c)
        try:
            body()
        finally:
            self.masks.pop()

    def uniform(self, x):
        if isinstance(x, (int, float)) or np.ndim(x) == 0:
            return x.item() if hasattr(x, "item") else x
        a = np.asarray(x)
        if (a == a[0]).all():
            return int(a[0]) if np.issubdtype(a.dtype, np.integer) else a[0]
        raise SimError("a value that must be uniform differs between threads")

    def barrier(self):
        if not self.mask.all():
            raise SimError("barrier in divergent code (some threads would never arrive)")
        self.epoch += 1
        self.stats["barriers"] += 1

    def shfl_xor(self, x, mask):
        if not self.mask.all():
            raise SimError("shfl.sync with inactive lanes")
        x = self._arr(x, np.float32)
        return x[self.lanes ^ mask]

    def fresh_tid(self):
        return self.lanes

    def pack_bf16x2(self, lo, hi):
        lo = self._arr(np.asarray(lo, np.float32), np.float32)
        hi = self._arr(np.asarray(hi, np.float32), np.float32)
        return np.stack([_bf16_round(lo), _bf16_round(hi)])

    def mma_bf16(self, a, b, c):
        """The warp-collective mma on the PTX fragment layouts (groupID g = lane / 4,
        threadID_in_group t = lane % 4): A reg r half h = A[g + 8(r%2), 2t + h + 8(r/2)],
        B reg r half h = B[2t + h + 8r, g], C reg i = C[g + 8(i/2), 2t + i%2]."""
        if not self.mask.all():
            raise SimError("mma.sync with inactive lanes")
        nw = self.nt // 32
        lane = self.lanes % 32
        warp = self.lanes // 32
        g, t = lane // 4, lane % 4
        A = np.zeros((nw, 16, 16))
        Bm = np.zeros((nw, 16, 8))
        Cm = np.zeros((nw, 16, 8))
        for r in range(4):
            for h in range(2):
                A[warp, g + 8 * (r % 2), 2 * t + h + 8 * (r // 2)] = np.asarray(a[r])[h]
        for r in range(2):
            for h in range(2):
                Bm[warp, 2 * t + h + 8 * r, g] = np.asarray(b[r])[h]
        rows = [g + 8 * (i // 2) for i in range(4)]
        cols = [2 * t + (i % 2) for i in range(4)]
        for i in range(4):
            Cm[warp, rows[i], cols[i]] = self._arr(np.asarray(c[i], np.float32), np.float32)
        D = (np.einsum("wik,wkj->wij", A, Bm) + Cm).astype(np.float32)
        return [D[warp, rows[i], cols[i]] for i in range(4)]

    # memory
    def gep(self, ptr: SimPtr, index, elt="f32"):
        if isinstance(index, int):
            return SimPtr(ptr.mem, ptr.offset + index)
        return SimPtr(ptr.mem, ptr.offset + np.asarray(index, np.int64))

    def _addr(self, ptr: SimPtr, index):
        a = np.asarray(ptr.offset + index, np.int64)
        if a.ndim == 0:
            a = np.full(self.nt, int(a), np.int64)
        m = self.mask
        mem = ptr.mem
        full = m is self.full or m.all()
        if full:
            lo, hi = a.min(), a.max()
            if lo < 0 or hi >= mem.data.size:
                self._oob(mem, a, np.ones(self.nt, bool))
            return a, None
        bad = m & ((a < 0) | (a >= mem.data.size))
        if bad.any():
            self._oob(mem, a, bad)
        return a[m], m

    def _oob(self, mem, a, bad):
        bad = bad & ((a < 0) | (a >= mem.data.size))
        i = int(np.argmax(bad))
        raise SimError(f"out-of-bounds access to {mem.name}[{int(a[i])}] (size {mem.data.size}) "
                       f"by thread {i}")

    _MANY = 4095

    def load(self, ptr: SimPtr, index, elt: str = "f32"):
        a, m = self._addr(ptr, index)
        mem = ptr.mem
        vals = mem.data[a]
        if mem.track and self.check_races:
            lanes = self.lanes if m is None else self.lanes[m]
            ek = self.epoch * 4096
            me = ek + lanes
            key = mem.w_key[a]
            clash = (key >= ek) & (key != me)
            if clash.any():
                j = int(np.argmax(clash))
                raise SimError(f"race on {mem.name}[{int(a[j])}]: thread {int(lanes[j])} reads "
                               f"what thread {int(key[j] - ek)} wrote without a barrier between")
            prev = mem.r_key[a]
            conflict = (prev >= ek) & (prev != me)
            mem.r_key[a] = me
            conflict |= mem.r_key[a] != me          # several lanes read it in this access
            if conflict.any():
                mem.r_key[a[conflict]] = ek + self._MANY
        dt = np.int64 if elt == "i64" else np.float32
        if m is None:
            return vals.astype(dt, copy=False)
        out = np.zeros(self.nt, dt)
        out[m] = vals
        return out

    def store(self, ptr: SimPtr, index, value, elt: str = "f32"):
        a, m = self._addr(ptr, index)
        mem = ptr.mem
        v = np.asarray(value, np.float32)
        if v.ndim == 0:
            v = np.full(self.nt, v, np.float32)
        if m is not None:
            v = v[m]
        if elt in ("bf16", "f16"):
            v = self.round_to(v, elt)
        if mem.track:
            lanes = self.lanes if m is None else self.lanes[m]
            if len(np.unique(a)) != len(a):
                raise SimError(f"two threads store to the same element of {mem.name} in one access")
            if self.check_races:
                ek = self.epoch * 4096
                me = ek + lanes
                rk = mem.r_key[a]
                clash = (rk >= ek) & (rk != me)
                if clash.any():
                    j = int(np.argmax(clash))
                    raise SimError(f"race on {mem.name}[{int(a[j])}]: thread {int(lanes[j])} "
                                   f"overwrites what another thread read without a barrier between")
                wk = mem.w_key[a]
                wclash = (wk >= ek) & (wk != me)
                if wclash.any():
                    j = int(np.argmax(wclash))
                    raise SimError(f"race on {mem.name}[{int(a[j])}]: two threads write it "
                                   f"without a barrier between")
                mem.w_key[a] = me
        mem.data[a] = v
