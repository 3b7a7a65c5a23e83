"""The primitive operations the lowering's emitters are written in, dispatched to the active
backend (:func:`use`).

Every emitter (tiles.py, emitter.py) builds kernels only through the functions of this module
(float math, int-likes, memory, structured control flow, barriers, shuffles). Two backends
implement them:

- :class:`~kdagen.codegen.lower.mlir_backend.MlirBackend` emits ``arith`` / ``llvm`` / ``scf`` / ``nvvm`` ops at the current
  insertion point (int-likes are ``ints.IntVal`` for i32 and :class:`W64` for i64; Python ints
  fold);
- :class:`~kdagen.codegen.lower.sim_backend.SimBackend` *executes* the same emitter code on the CPU for one CTA at a time, all
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

__all__ = ["current", "use"]

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


def rsqrt_approx(a):
    """1/sqrt(a) to ~2^-22 relative (MUFU.RSQ): for scales, which need no correct rounding."""
    return current().rsqrt_approx(a)


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


def for_range(lo, hi, step, body, iter_args=None, trips=None):
    """Loop i = lo, lo+step, ... < hi (int-likes, may differ per thread); ``body(i, *args)``
    returns the next iteration arguments; returns the final ones. ``trips``: for the cost
    report only (kdagen.codegen.lower.cost), the iterations of the busiest thread when the
    bounds are not Python ints (``cost.CHUNKS``: the chunk loop); it changes no code."""
    return current().for_range(lo, hi, step, body, list(iter_args or []), trips)


def if_then(cond, body, cold: bool = False):
    """``body`` where ``cond`` holds. ``cold``: a fallback expected not to run (the cost
    report counts it at weight 0); it changes no code."""
    return current().if_then(cond, body, cold)


def barrier():
    return current().barrier()


def barrier_count(flag):
    """A barrier that also counts the threads whose int-like ``flag`` is nonzero (bar.red.popc
    over the same threads as :func:`barrier`): the same int-like on every thread."""
    return current().barrier_count(flag)


def shfl_xor(x, mask: int):
    return current().shfl_xor(x, mask)


def load(ptr, index, elt: str = "f32"):
    """Element ``index`` (int-like, i32 or 64-bit) of type ``elt`` at ``ptr``, as f32 (i64 raw)."""
    return current().load(ptr, index, elt)


def store(ptr, index, value, elt: str = "f32"):
    """Store an f32 value as ``elt`` (rounded to nearest) at element ``index`` of ``ptr``."""
    return current().store(ptr, index, value, elt)


def load_vec(ptr, index, n: int, elt: str = "f32") -> list:
    """Elements ``index`` .. ``index + n - 1`` (``index`` a multiple of ``n``, the pointer
    aligned to ``n`` elements) as a list of f32 values: one vector load."""
    return current().load_vec(ptr, index, n, elt)


def store_vec(ptr, index, values, elt: str = "f32"):
    """Store ``values`` (f32) as ``elt`` at elements ``index`` .. ``index + len - 1`` (aligned as
    for :func:`load_vec`): one vector store."""
    return current().store_vec(ptr, index, list(values), elt)


def gep(ptr, index, elt: str = "f32"):
    return current().gep(ptr, index, elt)


def count(kind: str, n: float = 1) -> None:
    """Record ``n`` events of ``kind`` in the cost report (no code; backends without a cost
    counter ignore it)."""
    cost = getattr(current(), "cost", None)
    if cost is not None:
        cost.event(kind, n)


def uniform(x):
    """A value every thread holds equally, made a plain scalar where the backend can
    (the simulator turns equal lanes into a Python int; MLIR values pass through)."""
    return current().uniform(x)


@contextmanager
def op_scope(label: str):
    """Code emitted for one op of the program (``label``): the MLIR backend gives the ops it
    emits meanwhile that name as their location, so the gpu stage says which program op each
    instruction came from (``tools/emitted_ops.py --by-op``)."""
    with current().op_scope(label):
        yield


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


def tf32_operand(x):
    """x as a TF32 operand register of :func:`mma_tf32` (rounded to nearest, ties away)."""
    return current().tf32_operand(x)


def mma_tf32(a: list, b: list, c: list) -> list:
    """mma.sync.m16n8k8.row.col.f32.tf32.tf32: 4 A and 2 B operand registers
    (:func:`tf32_operand`), 4 f32 accumulators of this lane -> 4 f32. Fragments: A reg r =
    A[g + 8(r%2), t + 4(r/2)], B reg r = B[t + 4r, g], C reg i = C[g + 8(i/2), 2t + i%2]
    (g = lane / 4, t = lane % 4)."""
    return current().mma_tf32(a, b, c)


# derived math (same formulas on both backends)

def exp2_clamped(x, clamp_min, clamp_max=None):
    if clamp_min is not None:
        x = maxf(x, f(clamp_min))
    if clamp_max is not None:
        x = minf(x, f(clamp_max))
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
