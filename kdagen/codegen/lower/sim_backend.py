"""The CPU simulator backend of the lowering's primitives (backend.py): executes the emitter
code for one CTA at a time, all threads in lockstep as numpy arrays (one lane per thread) with an
active-lane mask for divergent loops and branches, and checks barriers in divergent code,
shuffles with inactive lanes, out-of-bounds accesses and shared-scratch races (:class:`SimError`).
"""
from __future__ import annotations

import contextlib

import numpy as np

__all__ = ["SimBackend", "SimPtr", "SimMemory", "SimError", "BankCounter"]


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


def tf32_round(x):
    """``cvt.rna.tf32.f32`` on arrays: round to nearest (ties away from zero) on the 10-bit
    mantissa; inf/nan pass through."""
    a = np.ascontiguousarray(np.asarray(x, np.float32))
    bits = a.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where(finite, rounded, bits).view(np.float32)


def _bf16_round(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = r.view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)


class BankCounter:
    """Shared-memory bank conflicts of simulated accesses, by op label (``label``, set by the
    emitter's op scopes: :func:`kdagen.codegen.lower.sim.simulate`'s ``banks``). Per warp and
    access: one request, and as many wavefronts as the 32 four-byte banks need passes (the
    most distinct words any one bank serves; lanes reading the same word share it). Shared
    tile buffers are fp32, so an element index is a word index."""

    BANKS = 32

    def __init__(self):
        self.label: str | None = None
        # label -> {"ld": [requests, wavefronts], "st": [...]}
        self.by_op: dict[str, dict[str, list]] = {}

    def record(self, kind: str, lanes: np.ndarray, words: np.ndarray) -> None:
        warp = lanes // 32
        key = np.unique(warp * (1 << 40) + words)
        kw, word = key >> 40, key & ((1 << 40) - 1)
        nw = int(kw.max()) + 1
        per_bank = np.bincount(kw * self.BANKS + word % self.BANKS,
                               minlength=nw * self.BANKS).reshape(nw, self.BANKS)
        active = np.unique(warp)
        tally = self.by_op.setdefault(self.label or "(kernel)", {}).setdefault(kind, [0, 0])
        tally[0] += len(active)
        tally[1] += int(per_bank.max(axis=1)[active].sum())

    def record_vec(self, kind: str, lanes: np.ndarray, words: np.ndarray, n: int) -> None:
        """A vector access of ``n`` consecutive words per lane (``words``: each lane's first):
        the shared memory serves a warp's 8- or 16-byte accesses 128 bytes at a time, so the
        lanes go in phases of 32 / n (quarter warps for 16 bytes), each taking as many
        wavefronts as its most loaded bank needs; one request per warp."""
        per_phase = max(1, self.BANKS // n)
        warp = lanes // 32
        phase = (lanes % 32) // per_phase
        group = warp * 64 + phase
        tally = self.by_op.setdefault(self.label or "(kernel)", {}).setdefault(kind, [0, 0])
        tally[0] += len(np.unique(warp))
        for g in np.unique(group):
            sel = group == g
            w = np.unique((words[sel][:, None] + np.arange(n)[None, :]).reshape(-1))
            tally[1] += int(np.bincount(w % self.BANKS, minlength=self.BANKS).max())

    def totals(self) -> dict:
        out = {"ld": [0, 0], "st": [0, 0]}
        for kinds in self.by_op.values():
            for kind, (req, wave) in kinds.items():
                out[kind][0] += req
                out[kind][1] += wave
        return out


class SimBackend:
    """Executes emitter code for one CTA of ``nthreads`` threads, lanes as numpy arrays."""

    name = "sim"

    def __init__(self, nthreads: int, check_races: bool = True,
                 banks: BankCounter | None = None):
        self.banks = banks
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

    def rsqrt_approx(self, a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.float32(1.0) / np.sqrt(self._f(a))

    def sel(self, cond, a, b):
        return np.where(cond, self._f(a), self._f(b)).astype(np.float32)

    def nonzero(self, x):
        return self._f(x) != 0

    def fle(self, a, b):
        return self._f(a) <= self._f(b)

    def round_to(self, x, elt):
        if elt == "tf32":
            return tf32_round(x)
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
    def for_range(self, lo, hi, step, body, iter_args, trips=None):
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

    def if_then(self, cond, body, cold=False):
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

    def barrier_count(self, flag):
        self.barrier()
        flag = np.broadcast_to(np.asarray(flag), self.lanes.shape)
        return np.full(self.lanes.shape, int(np.count_nonzero(flag)), np.int64)

    def shfl_xor(self, x, mask):
        # a shuffle needs every lane of each warp that runs it: whole warps may sit out
        m = self.mask.reshape(-1, 32) if self.mask.size % 32 == 0 else self.mask[None]
        if not (m.all(axis=1) | ~m.any(axis=1)).all():
            raise SimError("shfl.sync with inactive lanes in a warp that runs it")
        x = self._arr(x, np.float32)
        return x[self.lanes ^ mask]

    def op_scope(self, label: str):
        return contextlib.nullcontext()

    def fresh_tid(self):
        return self.lanes

    def pack_bf16x2(self, lo, hi):
        lo = self._arr(np.asarray(lo, np.float32), np.float32)
        hi = self._arr(np.asarray(hi, np.float32), np.float32)
        return np.stack([_bf16_round(lo), _bf16_round(hi)])

    def tf32_operand(self, x):
        return tf32_round(self._arr(np.asarray(x, np.float32), np.float32))

    def mma_tf32(self, a, b, c):
        """The warp-collective TF32 m16n8k8 (fragments as in backend.mma_tf32)."""
        def fill(A, Bm, warp, g, t):
            for r in range(4):
                A[warp, g + 8 * (r % 2), t + 4 * (r // 2)] = np.asarray(a[r])
            for r in range(2):
                Bm[warp, t + 4 * r, g] = np.asarray(b[r])
        return self._warp_mma(8, fill, c)

    def mma_bf16(self, a, b, c):
        """The warp-collective mma on the PTX fragment layouts (groupID g = lane / 4,
        threadID_in_group t = lane % 4): A reg r half h = A[g + 8(r%2), 2t + h + 8(r/2)],
        B reg r half h = B[2t + h + 8r, g], C reg i = C[g + 8(i/2), 2t + i%2]."""
        def fill(A, Bm, warp, g, t):
            for r in range(4):
                for h in range(2):
                    A[warp, g + 8 * (r % 2), 2 * t + h + 8 * (r // 2)] = np.asarray(a[r])[h]
            for r in range(2):
                for h in range(2):
                    Bm[warp, 2 * t + h + 8 * r, g] = np.asarray(b[r])[h]
        return self._warp_mma(16, fill, c)

    def _warp_mma(self, k: int, fill, c):
        """D = A·B + C per warp for an m16n8k``k`` atom whose A [16, k] and B [k, 8] fragments
        ``fill(A, B, warp, g, t)`` scatters from the lanes; C/D reg i = C[g + 8(i/2), 2t + i%2]."""
        nw = self.nt // 32
        per_warp = self.mask.reshape(nw, 32)
        if not (per_warp.all(axis=1) | ~per_warp.any(axis=1)).all():
            # warp-collective: a warp runs it whole or not at all (inactive warps' results
            # are computed from whatever their lanes hold, and never stored)
            raise SimError("mma.sync in a partially active warp")
        lane = self.lanes % 32
        warp = self.lanes // 32
        g, t = lane // 4, lane % 4
        A = np.zeros((nw, 16, k))
        Bm = np.zeros((nw, k, 8))
        Cm = np.zeros((nw, 16, 8))
        fill(A, Bm, warp, g, t)
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

    def _count_banks(self, kind: str, mem, a, m) -> None:
        if self.banks is not None and mem.name == "smem":
            self.banks.record(kind, self.lanes if m is None else self.lanes[m], a)

    def load(self, ptr: SimPtr, index, elt: str = "f32"):
        a, m = self._addr(ptr, index)
        mem = ptr.mem
        self._count_banks("ld", mem, a, m)
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
        dt = np.int64 if elt in ("i32", "i64") else np.float32
        if m is None:
            return vals.astype(dt, copy=False)
        out = np.zeros(self.nt, dt)
        out[m] = vals
        return out

    def load_vec(self, ptr: SimPtr, index, n: int, elt: str = "f32"):
        self._check_vec_aligned(ptr, index, n)
        with self._vector_banks("ld", ptr, index, n):
            return [self.load(ptr, index + k, elt) for k in range(n)]

    def store_vec(self, ptr: SimPtr, index, values, elt: str = "f32"):
        self._check_vec_aligned(ptr, index, len(values))
        with self._vector_banks("st", ptr, index, len(values)):
            for k, v in enumerate(values):
                self.store(ptr, index + k, v, elt)

    @contextlib.contextmanager
    def _vector_banks(self, kind: str, ptr: SimPtr, index, n: int):
        """Count a vector access once, as one (:meth:`BankCounter.record_vec`), not as the
        ``n`` element accesses it is simulated with."""
        banks = self.banks
        if banks is None or ptr.mem.name != "smem":
            yield
            return
        a, m = self._addr(ptr, index)
        banks.record_vec(kind, self.lanes if m is None else self.lanes[m], np.asarray(a), n)
        self.banks = None
        try:
            yield
        finally:
            self.banks = banks

    def _check_vec_aligned(self, ptr: SimPtr, index, n: int) -> None:
        """A vector access must start on a multiple of its width (the GPU faults otherwise)."""
        a, _ = self._addr(ptr, index)
        if np.any(np.asarray(a) % n):
            raise SimError(f"misaligned {n}-element vector access to {ptr.mem.name}")

    def store(self, ptr: SimPtr, index, value, elt: str = "f32"):
        a, m = self._addr(ptr, index)
        mem = ptr.mem
        self._count_banks("st", mem, a, m)
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
