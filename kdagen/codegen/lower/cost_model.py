"""A latency model over the static cost counts (:mod:`kdagen.codegen.lower.cost`): an
**estimate** of the time of one chunk step (state-scan kernels) or of one CTA (chunk-parallel
kernels), and the cost report recorded per kernel (bundle manifest ``cost``, ``kdagen show
--stage cost``, ``kdagen emit --verbose``).

The model, per consumer thread (the one warpgroup whose chain decides the time)::

    cycles = global_rounds * GLOBAL_ROUND_CYCLES + shared_rounds * SHARED_ROUND_CYCLES
             + wgmma * WGMMA_CYCLES + ring_refill_us * CLOCK_GHZ * 1000
    us     = cycles / (CLOCK_GHZ * 1000)        ring_refill_us = ring.refill_bytes / RING_REFILL

with ``us_low`` / ``us_high`` taking the hoisted and the HBM latency of a global round instead.
The constants are the H200 figures of the team's PERF.md (§2.3, §6; probes in its
perf-tools: ``m.cu``, ``m2.cu``, ``scan_step_wgmma_bf16.cu``), re-run on an H200 on 2026-12-01
where noted:

- ``CLOCK_GHZ = 1.98``: the H200's maximum SM clock (nvidia-smi ``clocks.max.sm`` 1980 MHz;
  ``m.cu`` measured 1.980 GHz against the global timer), which cycle counts are converted with;
- ``GLOBAL_ROUND_CYCLES = 307``: PERF.md §2.3, one iteration of a 128-thread strided loop that
  loads from L2 and stores through a pointer that may alias the load: the lowering's tile
  loops read the L2-resident tile scratch and workspaces that way. Re-run: ``m2.cu``'s
  "ping-pong scratch" loop (each round reads, through L2, what the threads wrote the round
  before) 308 cycles; ``m.cu``'s "L2 may-alias" loop prints 50 (it re-reads the same 32 KB:
  L1 hits), so the 307 is the figure of the first;
- ``GLOBAL_ROUND_HBM_CYCLES = 720``: the may-alias loop reading HBM (PERF.md §2.3; re-run
  ``m.cu`` 700-712) — ``us_high``;
- ``GLOBAL_ROUND_HOISTED_CYCLES = 153``: the loop with ``__restrict__`` + unrolling, loads
  hoisted over the stores (PERF.md §2.3; re-run ``m.cu`` "HBM restrict+unroll" 146-147, from
  L2 16-17) — ``us_low``;
- ``SHARED_ROUND_CYCLES = 39``: the loop reading and writing shared memory (PERF.md §2.3;
  re-run ``m.cu`` "smem ld->st" 39);
- ``WGMMA_CYCLES = 109``: one scan step of 12 bf16 wgmma instructions (8 m64n64k16 + 4
  m64n128k16, two dependent groups, a wait after each) took 0.66 µs on one warpgroup (PERF.md
  §6): 0.66 µs × 1980 MHz / 12 ≈ 109 cycles per instruction, its share of the wait included.

- ``RING_REFILL_GB_S = 91``: how fast a one-stage TMA ring refills (``ring.refill_bytes``, the
  register scans whose stage does not fit twice): the kda backward's reverse step waits at its
  'full' barrier for 37% of its warp samples, 1.36 of 3.67 us, for 123 KB
  (bench/results/h200_ncu_hotspots_kda_bwd_k3.txt, 2026-12-04), ~91 GB/s into one SM.

A round's loads are taken to overlap: ``m2.cu`` (re-run) reads 64 independent scratch values
per iteration in 2320 cycles, ~7.5 round latencies rather than 64.

Not priced (counted and reported, but no measurement backs a cost): barriers, mbarrier
waits, fp32 ALU and special-function issue, stores, the producer warpgroup (it runs ahead in
the ring), and whether a round's loads hit L2 or HBM (the point estimate prices all as L2). So it
under-estimates: for the kda_fwd K = 128 state scan on sm_90a it gives 105.8 µs per chunk
step where the H200 measures 172.4 µs (0.61×; ``bench/results/cost_kda_fwd_k128_sm90a.txt``).
Use it to compare lowerings and to see where a step's time goes, not as a timing.

**Chunk-parallel kernels** (unit CTA, one CTA per SM) are not latency-bound that way: the model
above gives 2.8-18.5 µs per CTA where the H200 takes 18-146 (6-11x). Their time follows what
the SM's four schedulers issue, fitted (least squares, no intercept) to the ten chunk-parallel
kernels of kda/gdn fwd/bwd at B1_T8k_H16 (``bench/results/h200_chunk_schedule_*``: µs per CTA =
kernel µs / (2048 CTAs / 132 SMs))::

    cycles = instructions * warps / SCHEDULERS * ISSUE_CYCLES        (per consumer thread)
             + bar.sync * BARRIER_CYCLES + global_rounds * THROUGHPUT_ROUND_CYCLES

``ISSUE_CYCLES = 4.93`` (each scheduler issues one instruction every ~5 cycles: the thread-loop
code has little independent work per warp), ``BARRIER_CYCLES = 590`` (the drain of each op's
loop), ``THROUGHPUT_ROUND_CYCLES = 423``. Errors of the fit: -22% .. +22% (gdn_bwd's dq kernel
-22%, kda_fwd's output kernel +22%, the other eight within 12%). Reported as the ``throughput``
estimate beside the latency one. The terms are collinear (kernels with more ops have both
more instructions and more barriers), so read the split with care: removing barriers from
element-wise ops (``elide_barriers``) saved far less than 590 cycles each on the H200
(kda_bwd's dk kernel, 133 -> 121 per CTA: 2166 -> 2151 µs, ~0.1 µs per barrier and CTA).

**Register-tile kernels** (``sm90-register-tile``: one warpgroup per CTA, one or two CTAs per
SM) are latency-bound instead: each warp issues its own dependent chain with at most one other
warp per scheduler to switch to. On the H100 (B1_T8k_H16, stop 55) a CTA took 6.7-9.4 ns per
instruction of its consumer thread (kernel µs / waves of CTAs over the SMs / the static
instruction count: GDN's prologue 8.0 and output kernel 9.4 at two CTAs per SM, KDA's
prologue 6.7 and output kernel 8.7 at one), so the report prices them at
``REGISTER_TILE_NS_PER_INSTRUCTION = 8.2`` per instruction (``register_tile_estimate``).
GDN's backward dq kernel on the general rules took 19 ns per instruction (1408 µs, 217 KB,
one CTA per SM): something the count does not see (its shared-memory staging, its 12-byte
spill) costs there, which the estimate does not price.

A second resident CTA per SM (``LowerOptions.chunk_ctas_per_sm=2``) does not hide these
terms: on the H200 (B1_T8k_H16, ``bench/results/h200_stop44_ab_chunk_ctas.log``) every
chunk-parallel kernel whose buffers then spilled more to the global scratch got slower
(kda_fwd's prologue 439 -> 477 µs, kda_bwd's dk kernel 1663 -> 1955), and the one that
spilled least (gdn_fwd's output kernel in 92 KB, 6 -> 12 global rounds per CTA)
gained 12% (261 -> 230 µs), not the ~2x that overlapping latency-bound CTAs would give: the
thread-loop code is close to issue-bound, so the model keeps pricing one CTA at a time.
"""
from __future__ import annotations

from .cost import CostCounter, op_breakdown

#: ops listed in a report's breakdown (those with the most instructions)
BY_OP_TOP = 12
#: the counts each op's row of the breakdown shows
BY_OP_COLUMNS = ("ld.global", "st.global", "ld.shared", "st.shared", "bar.sync", "fma",
                 "alu.f32", "ex2", "mma.sync", "wgmma", "bytes.global")

__all__ = ["CLOCK_GHZ", "GLOBAL_ROUND_CYCLES", "GLOBAL_ROUND_HBM_CYCLES",
           "GLOBAL_ROUND_HOISTED_CYCLES", "SHARED_ROUND_CYCLES", "WGMMA_CYCLES",
           "RING_REFILL_GB_S", "SCHEDULERS", "ISSUE_CYCLES", "BARRIER_CYCLES",
           "THROUGHPUT_ROUND_CYCLES", "REGISTER_TILE_NS_PER_INSTRUCTION", "SASS_NS_PER_INSTRUCTION",
           "sass_estimate", "estimate",
           "throughput_estimate", "register_tile_estimate",
           "kernel_report", "format_report", "format_reports", "REPORT_EVENTS"]

CLOCK_GHZ = 1.98
GLOBAL_ROUND_CYCLES = 307
GLOBAL_ROUND_HBM_CYCLES = 720
GLOBAL_ROUND_HOISTED_CYCLES = 153
SHARED_ROUND_CYCLES = 39
WGMMA_CYCLES = 109
RING_REFILL_GB_S = 91.0
SCHEDULERS = 4
ISSUE_CYCLES = 4.93
BARRIER_CYCLES = 590
THROUGHPUT_ROUND_CYCLES = 423
REGISTER_TILE_NS_PER_INSTRUCTION = 8.2
#: ns per CTA per SASS instruction of a register-tile kernel (its SASS listing is what each
#: thread executes: fully unrolled). H100, B1_T32k_H16, µs per CTA = kernel µs / waves of CTAs
#: over the SMs it had, against the SASS count (kdagen.codegen.sass): gdn_fwd's prologue 2.6
#: (785 µs, 3672 instructions, two warpgroups, 100 SMs beside the scan), gdn_bwd's recompute
#: prologue 2.4 (747 µs, 3776), its dq kernel on register tiles 2.2 (stop 56: 1554 µs, 8808),
#: gdn_fwd's output kernel 2.7 (490 µs, 2920, two CTAs per SM: per CTA slot). The static
#: count priced at REGISTER_TILE_NS_PER_INSTRUCTION had the dq kernel at 19 ns per
#: instruction, 2.3x off. A kernel that spills is outside the fit: gdn_bwd's dk kernel on
#: register tiles (1400 bytes of spill) ran 7.2 ns per SASS instruction (7506 µs, 16928)
SASS_NS_PER_INSTRUCTION = 2.5
#: counts that are not instructions (rounds, loop trips, bytes) or count a subset of another
NOT_INSTRUCTIONS = frozenset({"global_rounds", "shared_rounds", "loop_iters", "ring.refill_bytes",
                              "st.shared.staging", "unknown_trip_loops", "bytes.global",
                              # annotations of accesses ld/st.* count already
                              "strided.global", "strided.smem"})

#: the events shown in the text report, in this order (others are in the manifest only)
REPORT_EVENTS = ("global_rounds", "shared_rounds", "loop_iters", "ld.global", "st.global",
                 "ld.shared", "st.shared", "st.shared.staging", "bar.sync", "mbarrier.wait",
                 "wgmma", "wgmma.wait", "mma.sync", "fma", "ex2", "unknown_trip_loops")


def estimate(counts: dict) -> dict:
    """The model's estimate for one unit of ``counts`` (see the module doc)."""
    g = counts.get("global_rounds", 0)
    to_us = 1.0 / (CLOCK_GHZ * 1000.0)
    refill_us = counts.get("ring.refill_bytes", 0) / (RING_REFILL_GB_S * 1e3)
    rest = (counts.get("shared_rounds", 0) * SHARED_ROUND_CYCLES
            + counts.get("wgmma", 0) * WGMMA_CYCLES + refill_us / to_us)
    cycles = g * GLOBAL_ROUND_CYCLES + rest
    return {"us": round(cycles * to_us, 2),
            "us_low": round((g * GLOBAL_ROUND_HOISTED_CYCLES + rest) * to_us, 2),
            "us_high": round((g * GLOBAL_ROUND_HBM_CYCLES + rest) * to_us, 2),
            "cycles": round(cycles),
            "terms_us": {"global_rounds": round(g * GLOBAL_ROUND_CYCLES * to_us, 2),
                         "shared_rounds": round(counts.get("shared_rounds", 0)
                                                * SHARED_ROUND_CYCLES * to_us, 2),
                         "wgmma": round(counts.get("wgmma", 0) * WGMMA_CYCLES * to_us, 2),
                         "ring_refill": round(refill_us, 2)},
            "is_estimate": True,
            "model": "kdagen.codegen.lower.cost_model (H200 latencies, 1.98 GHz)"}


def throughput_estimate(counts: dict, warps: int) -> dict:
    """The chunk-parallel kernels' fit (see the module doc) for one CTA of ``warps`` consumer
    warps whose threads each execute ``counts``."""
    instructions = sum(v for k, v in counts.items()
                       if k not in NOT_INSTRUCTIONS and isinstance(v, (int, float)))
    to_us = 1.0 / (CLOCK_GHZ * 1000.0)
    issue = instructions * warps / SCHEDULERS * ISSUE_CYCLES
    barriers = counts.get("bar.sync", 0) * BARRIER_CYCLES
    rounds = counts.get("global_rounds", 0) * THROUGHPUT_ROUND_CYCLES
    return {"us": round((issue + barriers + rounds) * to_us, 2), "instructions": instructions,
            "warps": warps,
            "terms_us": {"issue": round(issue * to_us, 2), "barriers": round(barriers * to_us, 2),
                         "global_rounds": round(rounds * to_us, 2)},
            "is_estimate": True,
            "model": "kdagen.codegen.lower.cost_model throughput fit (10 H200 kernels, +-22%)"}


def register_tile_estimate(counts: dict) -> dict:
    """The register-tile kernels' fit (see the module doc): µs per CTA from the consumer
    thread's instruction count."""
    instructions = sum(v for k, v in counts.items()
                       if k not in NOT_INSTRUCTIONS and isinstance(v, (int, float)))
    return {"us": round(instructions * REGISTER_TILE_NS_PER_INSTRUCTION / 1000.0, 2),
            "instructions": instructions, "is_estimate": True,
            "model": "kdagen.codegen.lower.cost_model register-tile fit (4 H100 kernels, "
                     "6.7-9.4 ns per instruction)"}


def sass_estimate(instructions: int, spill_bytes: int = 0) -> dict:
    """The register-tile kernels' SASS fit (SASS_NS_PER_INSTRUCTION): µs per CTA from the
    assembled kernel's instruction count; ``spill_bytes`` > 0 marks it outside the fit."""
    return {"us": round(instructions * SASS_NS_PER_INSTRUCTION / 1000.0, 2),
            "instructions": instructions, "is_estimate": True, "spills": spill_bytes > 0,
            "model": "kdagen.codegen.lower.cost_model SASS fit (4 H100 register-tile kernels, "
                     "2.2-2.7 ns per SASS instruction; a spilling kernel ran 7.2)"}


def kernel_report(counter: CostCounter, serial: bool, warps: int | None = None) -> dict:
    """The cost report of one kernel: counts per unit (``chunk step`` for a kernel with a
    chunk loop, ``CTA`` otherwise) of a consumer thread, the prologue/epilogue (once per CTA),
    the producer's counts per unit, the flagged loops and the estimate."""
    if serial and counter.has_step():
        unit, counts, once = "chunk step", counter.get("consumer", "step"), \
            counter.get("consumer", "kernel")
        producer = counter.get("producer", "step")
    else:
        unit, counts, once = "CTA", counter.per_cta("consumer"), {}
        producer = counter.per_cta("producer")
    out = {"unit": unit, "per": "consumer thread (the busiest: thread 0)", "counts": counts,
           "estimate": estimate(counts)}
    if unit == "CTA" and warps:
        out["throughput"] = throughput_estimate(counts, warps)
        if counts.get("bytes.global"):
            # thread 0's bytes for every consumer thread: what the CTA's LDG/STG move between
            # L1 and L2 if every access is coalesced (ncu's "L2 theoretical sectors global")
            out["global_bytes_per_cta"] = int(counts["bytes.global"] * warps * 32)
    if once:
        out["once_per_cta"] = once
    if producer:
        out["producer"] = producer
    if counter.unknown:
        out["unknown_trip_loops"] = list(dict.fromkeys(counter.unknown))
    ops = op_breakdown(counter, top=BY_OP_TOP)
    if ops:
        out["by_op"] = ops
    return out


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


def format_report(name: str, report: dict) -> str:
    """One kernel's report as text (the ``cost`` stage)."""
    c, e = report["counts"], report["estimate"]
    lines = [f"per {report['unit']}, per {report['per']}"]
    if report.get("tuned"):
        lines.append("  lowered with the tuning table's (kdagen.codegen.lower.tuning) "
                     + ", ".join(f"{k}={v}" for k, v in report["tuned"].items()))
    if report.get("layouts"):
        lay = report["layouts"]
        lines.append(f"  layouts (kda-assign-layouts): per chunk {lay['conversions']} "
                     f"conversions, {lay['conversion_bytes']} bytes through shared memory; once "
                     f"per CTA {lay.get('init_conversions', 0)}, {lay.get('init_bytes', 0)} bytes "
                     + ("(the layout pass's plan; this register lowering places its own tiles: "
                        "the counts below)" if report.get("registers") else
                        "(what a register-tile lowering pays; this one keeps every tile in its "
                        "own buffers)"))
        if "register_bytes" in lay:
            per = (f" ({lay['registers_per_thread']} per consumer thread of the planned "
                   "warpgroups)" if "registers_per_thread" in lay else "")
            lines.append(f"  layouts: at most {lay['register_bytes']} bytes of "
                         f"tiles live in registers at once{per}, {lay['shared_bytes']} in shared "
                         "memory, before any split of V over CTAs")
    for k in REPORT_EVENTS:
        if k in c:
            lines.append(f"  {k:20s} {_num(c[k]):>10s}")
    other = [k for k in c if k not in REPORT_EVENTS]
    if other:
        lines.append("  other: " + ", ".join(f"{k} {_num(c[k])}" for k in other))
    if report.get("once_per_cta"):
        o = report["once_per_cta"]
        lines.append("  once per CTA (outside the chunk loop): " + ", ".join(
            f"{k} {_num(o[k])}" for k in REPORT_EVENTS if k in o))
    if report.get("producer"):
        p = report["producer"]
        lines.append("  producer thread: " + ", ".join(f"{k} {_num(v)}" for k, v in p.items()))
    for u in report.get("unknown_trip_loops", []):
        lines.append(f"  unknown trip count (counted once): {u}")
    if report.get("by_op"):
        lines.append("  where the instructions go (per consumer thread, prologue and chunk "
                     "step together; ops with the most first):")
        lines.append(f"    {'op':44s} {'instr':>8s} " + " ".join(f"{k:>9s}" for k in BY_OP_COLUMNS))
        for row in report["by_op"]:
            c = row["counts"]
            lines.append(f"    {row['op'][:44]:44s} {_num(row['instructions']):>8s} "
                         + " ".join(f"{_num(c.get(k, 0)):>9s}" for k in BY_OP_COLUMNS))
    t = e["terms_us"]
    lines.append(f"  ESTIMATE (static model, not a measurement): {e['us']:g} us per "
                 f"{report['unit']} (global rounds {t['global_rounds']:g} + shared rounds "
                 f"{t['shared_rounds']:g} + wgmma {t['wgmma']:g}"
                 + (f" + ring refill {t['ring_refill']:g}" if t.get("ring_refill") else "")
                 + f"); range {e['us_low']:g} "
                 f"(hoisted) .. {e['us_high']:g} (HBM)")
    if report.get("global_bytes_per_cta"):
        lines.append(f"  global traffic (LDG/STG, L1<->L2): {report['global_bytes_per_cta'] / 1024:.0f}"
                     " KiB per CTA (thread 0's bytes.global x the consumer threads; TMA copies not "
                     "included)")
    if report.get("throughput"):
        th = report["throughput"]
        t = th["terms_us"]
        lines.append(f"  THROUGHPUT ESTIMATE (fit, +-22%): {th['us']:g} us per CTA (issue "
                     f"{t['issue']:g}: {th['instructions']:g} instructions x {th['warps']} warps"
                     f" + barriers {t['barriers']:g} + global rounds {t['global_rounds']:g})")
    if report.get("latency_bound"):
        lb = report["latency_bound"]
        lines.append(f"  REGISTER-TILE ESTIMATE (fit, 6.7-9.4 ns per instruction): {lb['us']:g} us "
                     f"per CTA ({lb['instructions']:g} instructions of a latency-bound chain; "
                     "one or two CTAs per SM)")
    return f"{name}\n" + "\n".join(lines)


def format_reports(items, hbm_per_token: dict | None = None) -> str:
    """``(name, report)`` pairs as the ``cost`` stage's text; ``hbm_per_token``: {kernel:
    bytes each moves per token and value head (kda-partition's count)}, summed in a closing
    line (the program's bytes: at B1_T32k_H16 GDN's forward moves 7446 per token, whose
    overlapped prologue and scan ran at 2.6 TB/s of the H100's 3.35 by this count)."""
    head = ("// static cost per kernel (kdagen.codegen.lower.cost); the us figures are an "
            "ESTIMATE of kdagen.codegen.lower.cost_model, not measurements\n")
    text = head + "".join(f"// ----- kernel {format_report(n, r)}\n" for n, r in items)
    sized = {k: v for k, v in (hbm_per_token or {}).items() if v}
    if sized:
        parts = ", ".join(f"{k.rsplit('__', 1)[-1]} {v:g}" for k, v in sized.items())
        text += (f"// HBM bytes per token and value head (kda-partition's count of each kernel's "
                 f"loads and stores): {sum(sized.values()):g} ({parts})\n")
    return text
