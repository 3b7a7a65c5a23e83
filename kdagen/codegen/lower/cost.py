"""Static cost counting of a lowered kernel: what one consumer thread executes, per chunk step.

One job: a :class:`CostCounter` is fed by the lowering while it emits a kernel and tallies
*events* (loads and stores by memory space, barriers, mbarrier waits, wgmma issues and waits,
special functions, loop iterations, ...), each weighted by the static trip counts of the loops
around it. It never emits or changes IR: it is plain Python bookkeeping next to the emission
(``tests/test_cost.py`` checks that the PTX is byte-identical with and without it). Turning the
counts into time is :mod:`kdagen.codegen.lower.cost_model`.

Who feeds it:

- the MLIR backend of the lowering's primitives (``mlir_backend.MlirBackend(cost=...)``):
  every load/store (``ld.global``/``ld.shared``/``st.global``/``st.shared``, the space read
  from the pointer type), ``bar.sync``, ``fma``, ``ex2``, ``lg2``, ``rcp``, ``sqrt``, ``div``,
  f32 ALU ops, shuffles, ``mma.sync``, bf16 packs, and each ``scf.for`` it builds
  (:meth:`CostCounter.loop`);
- the kernel emitters (``emitter.py``, ``sm90_native.py``) for what they emit themselves:
  the chunk-step region, the producer role, mbarrier waits/arrives, TMA copies, wgmma
  issues/commits/waits, the bf16 staging stores of wgmma operands, proxy fences.

Conventions:

- **Per consumer thread.** Counts are those of the thread with the most work (thread 0: an
  element loop ``for e = tid; e < n; e += nthreads`` runs ``ceil(n / nthreads)`` times for it);
  both sides of a branch are counted as executed (an upper bound). Code the producer
  warpgroup runs (``with counter.role("producer")``) is counted apart.
- **Regions.** Events inside the dynamic chunk loop (a loop given ``trips=CHUNKS``, or the
  body of a chunk-parallel kernel's one chunk, ``with counter.chunk_step()``) go to the
  ``step`` region with weight 1: they are *per chunk step*. Everything else (prologue:
  geometry, initial state; epilogue: final state) goes to the ``kernel`` region, once per CTA.
- **Trip counts.** A loop's trip count is exact when its bounds are Python ints, else the
  ``trips`` the emitter passes (e.g. ``ceil(n / nthreads)`` for an element loop starting at the
  thread index, the average of a triangular loop). A loop with neither is counted once and
  flagged (``unknown_trip_loops``; :attr:`CostCounter.unknown`).
- **Serial rounds** (the unit of the latency model, PERF.md §2.3): a loop iteration whose own
  body (not counting nested loops) issues a global load is one ``global_rounds``; one that
  issues shared loads but no global load is one ``shared_rounds``. Straight-line code outside
  loops counts one round per barrier-delimited stretch that issues such loads. Loads of one
  round are independent of each other, so they are taken to overlap; the next round waits for
  them (the stores in between may alias, so nothing is hoisted across them).

Counts are of the IR the lowering emits, before LLVM and ptxas optimise it.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["CostCounter", "NullCounter", "CHUNKS", "EVENTS", "INSTRUCTION_EVENTS", "op_breakdown"]

#: ``trips`` marker of the dynamic chunk loop: its body is the per-chunk-step region
CHUNKS = "chunks"

#: every event kind a counter records, with its meaning
EVENTS = {
    "global_rounds": "loop iterations (or straight-line stretches) with a global load",
    "shared_rounds": "loop iterations (or stretches) with shared loads and no global load",
    "loop_iters": "loop iterations",
    "unknown_trip_loops": "loops without a static trip count (counted once)",
    "ld.global": "global loads (incl. the global tile scratch)",
    "st.global": "global stores",
    "ld.shared": "shared loads",
    "st.shared": "shared stores",
    "st.shared.staging": "bf16x2 stores of wgmma operands into the staging tiles",
    "bar.sync": "CTA / named barriers",
    "mbarrier.wait": "mbarrier phase waits (try_wait loops)",
    "mbarrier.arrive": "mbarrier arrivals",
    "fence.proxy.async": "generic-to-async proxy fences",
    "fence.gpu": "fence.acq_rel.gpu (a chunk's stores ordered before its ready flag)",
    "flag.publish": "chunk-ready flags released (st.release.gpu; lower.chunk_flags)",
    "flag.wait": "chunk-ready flag waits (ld.acquire.gpu until set) before a chunk's loads",
    "tma.load": "TMA tensor copies issued",
    "tma.store": "TMA tensor stores issued (shared to global)",
    "ring.refill_bytes": "bytes a chunk step waits for because its ring has one stage (the "
                         "step's loads start only once the previous step has freed it; with "
                         "slot barriers, the slots freed at the step's end that the next step "
                         "waits for at its start)",
    "wgmma": "wgmma.mma_async instructions",
    "wgmma.commit": "wgmma commit groups",
    "wgmma.wait": "wgmma wait_group",
    "mma.sync": "mma.sync instructions",
    "fma": "fp32 fused multiply-adds",
    "alu.f32": "fp32 add/sub/mul/neg/min/max",
    "div": "fp32 divisions",
    "ex2": "ex2.approx",
    "lg2": "lg2.approx",
    "rcp": "rcp.approx",
    "rsqrt": "rsqrt.approx",
    "sqrt": "sqrt.rn",
    "cvt.bf16x2": "f32 pairs packed to bf16x2",
    "cvt.tf32": "f32 rounded to TF32 (cvt.rna) for a register wgmma operand",
    "shfl": "warp shuffles",
    "strided.global": "element accesses of a thread's 4-element group that could not be one "
                      "vector access (a transposed or hi/lo-split global operand): a warp's "
                      "accesses lie 16 bytes apart, 4x the sectors per instruction "
                      "(LowerOptions.vector_loops)",
    "strided.smem": "the same in shared memory: bank conflicts",
    "bytes.global": "bytes the global loads and stores move (LDG/STG: the global tile scratch, "
                    "lazy reads of inputs, output stores; TMA copies not included)",
}


@dataclass
class _Frame:
    weight: float          # executions of this frame's body per region entry (trip products)
    loop: bool             # a loop body (else a region's straight-line code)
    glob: bool = False     # a global load issued directly here since the last flush
    shared: bool = False   # a shared load issued directly here since the last flush


class CostCounter:
    """Event counts of one kernel, by (role, region); see the module doc."""

    def __init__(self):
        self.counts: dict[tuple[str, str], Counter] = {}
        self.unknown: list[str] = []
        self._role = "consumer"
        self._region = "kernel"
        self._frames = [_Frame(1.0, False)]
        # consumer counts per kda op of the program (:meth:`op`), all regions together
        self.by_op: dict[str, Counter] = {}
        self._op: str | None = None

    # -- feeding -------------------------------------------------------------------------
    def event(self, kind: str, n: float = 1) -> None:
        """``n`` occurrences of ``kind`` at the current point (weighted by enclosing trips)."""
        if kind not in EVENTS:
            raise ValueError(f"unknown cost event {kind!r}")
        c = self.counts.setdefault((self._role, self._region), Counter())
        c[kind] += n * self._frames[-1].weight
        if self._op is not None and self._role == "consumer":
            self.by_op.setdefault(self._op, Counter())[kind] += n * self._frames[-1].weight

    @contextmanager
    def op(self, label: str):
        """Events emitted for one op of the program (``label``), also tallied per op
        (:attr:`by_op`); nested calls keep the outermost label."""
        if self._op is not None:
            yield
            return
        self._op = label
        try:
            yield
        finally:
            self._op = None

    def load(self, space: str, n: float = 1, nbytes: int = 0) -> None:
        """A load from ``space`` ("global" or "shared"): counted and marked for the rounds;
        ``nbytes``: what one load moves (tallied as ``bytes.global`` for global ones)."""
        self.event(f"ld.{space}", n)
        if space == "global":
            self._frames[-1].glob = True
            if nbytes:
                self.event("bytes.global", n * nbytes)
        else:
            self._frames[-1].shared = True

    def store(self, space: str, n: float = 1, nbytes: int = 0) -> None:
        self.event(f"st.{space}", n)
        if space == "global" and nbytes:
            self.event("bytes.global", n * nbytes)

    def barrier(self) -> None:
        """A barrier: counted; ends a straight-line round."""
        self.event("bar.sync")
        if not self._frames[-1].loop:
            self._flush(self._frames[-1])

    @contextmanager
    def loop(self, trips=None, what: str = "loop"):
        """The body of a loop of ``trips`` iterations (None: unknown, counted once and
        flagged; :data:`CHUNKS`: the chunk loop, whose body is the per-step region)."""
        if trips == CHUNKS:
            with self.chunk_step():
                yield
            return
        if trips is None:
            self.event("unknown_trip_loops")
            self.unknown.append(f"{self._role}/{self._region}: {what}")
            trips = 1
        trips = max(float(trips), 0.0)
        self.event("loop_iters", trips)
        frame = _Frame(self._frames[-1].weight * trips, True)
        self._frames.append(frame)
        try:
            yield
        finally:
            self._frames.pop()
            self._flush(frame)

    @contextmanager
    def cold(self):
        """Code emitted but expected not to run (a fallback behind a uniform branch): its
        events are counted at weight 0."""
        frame = _Frame(0.0, True)
        self._frames.append(frame)
        try:
            yield
        finally:
            self._frames.pop()

    @contextmanager
    def chunk_step(self):
        """The per-chunk-step region (one chunk of the scan), weight 1."""
        saved, saved_frames = self._region, self._frames
        self._region, self._frames = "step", [_Frame(1.0, False)]
        try:
            yield
        finally:
            self._flush(self._frames[0])
            self._region, self._frames = saved, saved_frames

    @contextmanager
    def role(self, name: str):
        """Code run by another role (e.g. the TMA producer thread), counted apart."""
        saved, saved_frames = self._role, self._frames
        self._role, self._frames = name, [_Frame(1.0, False)]
        try:
            yield
        finally:
            self._flush(self._frames[0])
            self._role, self._frames = saved, saved_frames

    def _flush(self, frame: _Frame) -> None:
        c = self.counts.setdefault((self._role, self._region), Counter())
        if frame.glob:
            c["global_rounds"] += frame.weight
        elif frame.shared:
            c["shared_rounds"] += frame.weight
        frame.glob = frame.shared = False

    # -- reading -------------------------------------------------------------------------
    def get(self, role: str = "consumer", region: str = "step") -> dict:
        """Counts of one role and region (numbers rounded to 0.1)."""
        return _clean(self.counts.get((role, region), Counter()))

    def has_step(self, role: str = "consumer") -> bool:
        return (role, "step") in self.counts

    def per_cta(self, role: str = "consumer") -> dict:
        """Counts of one chunk-parallel CTA (prologue + its one chunk)."""
        total = Counter()
        for (r, _), c in self.counts.items():
            if r == role:
                total.update(c)
        return _clean(total)

    def roles(self) -> list[str]:
        return sorted({r for r, _ in self.counts})


#: events that are instructions a thread issues (what :func:`op_breakdown` ranks ops by)
INSTRUCTION_EVENTS = ("ld.global", "st.global", "ld.shared", "st.shared", "st.shared.staging",
                      "bar.sync", "wgmma", "mma.sync", "fma", "alu.f32", "ex2", "lg2", "rcp",
                      "rsqrt", "sqrt", "div", "shfl", "cvt.bf16x2", "cvt.tf32")


def op_breakdown(counter: CostCounter, top: int | None = None) -> list[dict]:
    """The consumer's counts per program op, the ops with the most instructions first:
    ``[{"op": label, "instructions": n, "counts": {...}}]`` (``top``: keep that many)."""
    rows = []
    for label, c in counter.by_op.items():
        counts = _clean(c)
        n = sum(counts.get(k, 0) for k in INSTRUCTION_EVENTS)
        if n:
            rows.append({"op": label, "instructions": round(n, 1), "counts": counts})
    rows.sort(key=lambda r: -r["instructions"])
    return rows[:top] if top else rows


class NullCounter(CostCounter):
    """A counter that records nothing (lowering without a cost report)."""

    def event(self, kind: str, n: float = 1) -> None:
        pass

    def load(self, space: str, n: float = 1, nbytes: int = 0) -> None:
        pass

    def store(self, space: str, n: float = 1, nbytes: int = 0) -> None:
        pass

    def _flush(self, frame: _Frame) -> None:
        pass


def _clean(c: Counter) -> dict:
    out = {}
    for k in sorted(c):
        v = round(float(c[k]), 1)
        if v:
            out[k] = int(v) if v == int(v) else v
    return out
