"""The per-kernel table of ``kdagen bench --kernels``: pure arithmetic and formatting, no GPU.

One row per kernel launched by a kdagen call, built from the kernel's manifest entry
(:mod:`kdagen.runtime.bundle`), the grid it was launched with and its measured times (the
timing itself lives in :mod:`kdagen.benchmark`):

- ``grid`` (x, y, z as launched), ``threads`` per CTA, ``registers`` per thread (ptxas's
  report; None without ptxas), ``smem_bytes`` (dynamic + static shared memory per CTA);
- ``ctas_per_sm``: how many CTAs fit on one SM at once (:func:`ctas_per_sm`, limits of
  :func:`sm_limits`);
- ``us``: median µs per call; ``us_per_step``: for state scans (one CTA per head and
  sequence, chunks in sequence), µs / chunks of the longest sequence;
- ``bytes``: the manifest's ``hbm_bytes_per_token`` × tokens × value heads; ``floor_us``:
  those bytes at the H200's peak HBM bandwidth; ``pct_floor``: floor_us / us × 100;
- ``l2_bytes``: the static count of what the kernel's LDG/STG move between L1 and L2 (the
  cost report's ``global_bytes_per_cta``: the global tile scratch, lazy input reads, output
  stores; TMA copies not included) × the CTAs launched. ncu's ideal global sectors of kda_bwd's
  dq and dk kernels on the H100 were within 3% of it; the dk kernel's 3.2 GB per call there
  are what bounds it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kdagen.target import TARGETS

# The H200's peak HBM3e bandwidth. The per-kernel floor uses the peak (how far a kernel is
# from the memory system's limit); the end-to-end table of kdagen.benchmark uses an
# achievable copy rate (4.25 TB/s) instead.
PEAK_HBM_BYTES_PER_S = 4.8e12


@dataclass(frozen=True)
class SmLimits:
    """What one SM holds at once (the occupancy limits)."""
    regs_per_sm: int
    reg_partitions: int          # the register file is split evenly over the SM's warp schedulers
    reg_unit_per_warp: int       # registers are given to a warp in units of this many
    max_regs_per_thread: int
    smem_per_sm: int
    smem_per_block: int          # the opt-in maximum of one CTA
    smem_reserved_per_cta: int   # the driver keeps this much per resident CTA
    smem_unit: int               # shared memory is given to a CTA in units of this many bytes
    threads_per_sm: int
    ctas_per_sm: int


def sm_limits(chip: str = "sm_90a") -> SmLimits:
    """H100/H200 (sm_90) occupancy limits: 65536 registers, 2048 threads and 32 CTAs per SM;
    shared memory: the per-CTA maximum from the chip table (kdagen/target.py, 227 KB on
    sm_90a) plus the 1 KB the driver reserves per CTA makes the SM's 228 KB. The allocation
    units (256 registers per warp from one of 4 scheduler partitions, 128 bytes of shared
    memory) are those of NVIDIA's occupancy model. Numbers other than the per-CTA shared
    memory are Hopper's for every ``chip`` (the chip table has no field for them)."""
    target = TARGETS.get(chip)
    smem_per_block = target.smem_per_block if target is not None else 227 * 1024
    reserved = 1024
    return SmLimits(regs_per_sm=65536, reg_partitions=4, reg_unit_per_warp=256,
                    max_regs_per_thread=255, smem_per_sm=smem_per_block + reserved,
                    smem_per_block=smem_per_block, smem_reserved_per_cta=reserved,
                    smem_unit=128, threads_per_sm=2048, ctas_per_sm=32)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def ctas_per_sm(threads: int, registers: int, smem_bytes: int,
                limits: SmLimits | None = None) -> int:
    """CTAs of one kernel resident on an SM at once: the least of the thread, register,
    shared-memory and CTA-count limits (0: the CTA does not fit at all)."""
    lim = limits or sm_limits()
    warps = -(-threads // 32)
    if warps == 0 or registers > lim.max_regs_per_thread or smem_bytes > lim.smem_per_block:
        return 0
    by_threads = lim.threads_per_sm // (warps * 32)
    by_regs = _ctas_by_registers(warps, registers, lim)
    per_cta = _round_up(smem_bytes, lim.smem_unit) + lim.smem_reserved_per_cta
    by_smem = lim.smem_per_sm // per_cta if per_cta else lim.ctas_per_sm
    return max(0, min(lim.ctas_per_sm, by_threads, by_regs, by_smem))


def _ctas_by_registers(warps: int, registers: int, lim: SmLimits) -> int:
    # A warp gets registers × 32 rounded up to the allocation unit, from the register file of
    # one scheduler partition, so warps fit per partition, not per SM: 200 registers (6400
    # per warp) fit 2 warps in each 16384-register partition, 8 per SM, not 65536 / 6400 = 10.
    per_warp = _round_up(max(registers, 1) * 32, lim.reg_unit_per_warp)
    per_partition = lim.regs_per_sm // lim.reg_partitions
    # a launch is refused when the CTA's warps, spread over all partitions, exceed the file
    if per_warp * _round_up(warps, lim.reg_partitions) > lim.regs_per_sm:
        return 0
    return (per_partition // per_warp) * lim.reg_partitions // warps


def is_serial(launch: dict) -> bool:
    """Whether a kernel is a state scan: a tile kernel with one CTA per (value head,
    sequence) that walks the chunks in sequence (``parallel_chunks`` false; older manifests:
    grid z rule 1). Global reduction kernels also have grid z = 1 but no chunk loop."""
    if launch.get("kind", "tile") != "tile":
        return False
    if "parallel_chunks" in launch:
        return not launch["parallel_chunks"]
    return str(launch["grid"][2]) == "1"


def us_per_chunk_step(us: float, longest_tokens: int, chunk: int) -> float:
    """µs of a state scan per chunk step: its CTAs walk the chunks of their sequence one by
    one, so the longest sequence (ceil(tokens / chunk) chunks) sets the time."""
    return us / max(1, math.ceil(longest_tokens / chunk))


def bytes_moved(hbm_bytes_per_token: float, tokens: int, value_heads: int) -> float:
    """Bytes a kernel moves through HBM in one call (the IR's per-token, per-value-head count
    × tokens × value heads; per-sequence state loads and stores are not counted)."""
    return hbm_bytes_per_token * tokens * value_heads


def bandwidth_floor_us(nbytes: float, bytes_per_s: float = PEAK_HBM_BYTES_PER_S) -> float:
    """The time moving ``nbytes`` takes at ``bytes_per_s``: no kernel moving them is faster."""
    return 1e6 * nbytes / bytes_per_s


def pct_of_floor(floor_us: float, measured_us: float) -> float:
    """The floor as a percentage of the measured time (100: at the bandwidth limit)."""
    return 100.0 * floor_us / measured_us


#: the lowering path whose kernels are fully unrolled (their SASS listing is what a thread
#: executes): kdagen.codegen.lower.register_tiles.PATH_NAME
REGISTER_TILE_PATH = "sm90-register-tile"


def kernel_row(entry: dict, grid, times_us: list[float], *, tokens: int, value_heads: int,
               longest_tokens: int, chunk: int = 64, limits: SmLimits | None = None,
               sequences: int | None = None, sms: int | None = None) -> dict:
    """One row of the table: ``entry`` is the kernel's manifest entry (a dict, as in
    manifest.json), ``grid`` the grid it was launched with, ``times_us`` its µs per call over
    the repetitions; ``tokens``, ``value_heads`` and ``longest_tokens`` (tokens of the longest
    sequence) describe the problem; ``sequences`` its sequences: a serial kernel launched over
    more (a call run as segments, kdagen.runtime.segments, grid[1] = sequences · P) walked
    ``longest_tokens / P`` tokens, which its µs per step counts. ``sms``: the device's SMs,
    for a register-tile kernel's ns per SASS instruction (its µs over its waves of CTAs, per
    instruction of its SASS listing, which is what each of its threads executes: the unit of
    kdagen.codegen.lower.cost_model.SASS_NS_PER_INSTRUCTION; other kernels loop)."""
    launch = entry["launch"]
    limits = limits or sm_limits(entry.get("chip") or "sm_90a")
    threads = math.prod(launch["block"])
    resources = entry.get("resources") or {}
    registers = resources.get("registers")       # None: the bundle was emitted without ptxas
    smem = int(launch.get("dynamic_shared_memory", 0)) + int(resources.get("shared_bytes") or 0)
    us = statistics.median(times_us)
    row = {"kernel": entry["name"], "chip": entry.get("chip"), "grid": [int(g) for g in grid],
           "threads": threads, "registers": registers, "smem_bytes": smem,
           "ctas_per_sm": (None if registers is None
                           else ctas_per_sm(threads, registers, smem, limits)),
           "us": us, "reps": len(times_us), "us_per_step": None,
           "bytes": None, "floor_us": None, "pct_floor": None,
           "l2_bytes": l2_bytes(entry, grid),
           "sass": resources.get("sass_instructions"), "ns_per_sass": None}
    if is_serial(launch):
        walked = longest_tokens
        launched = int(grid[1]) if len(grid) > 1 else 0
        if sequences and launched > sequences and launched % sequences == 0:
            walked = longest_tokens // (launched // sequences)
        row["us_per_step"] = us_per_chunk_step(us, walked, chunk)
    elif (entry.get("path") == REGISTER_TILE_PATH and row["sass"] and sms
          and row["ctas_per_sm"] and us > 0):
        waves = math.ceil(math.prod(int(g) for g in grid) / (sms * row["ctas_per_sm"]))
        row["ns_per_sass"] = 1000.0 * us / waves / row["sass"]
    per_token = launch.get("hbm_bytes_per_token")    # None: the program was not partitioned
    if per_token is not None:
        row["bytes"] = bytes_moved(per_token, tokens, value_heads)
        row["floor_us"] = bandwidth_floor_us(row["bytes"])
        row["pct_floor"] = pct_of_floor(row["floor_us"], us) if us > 0 else None
    return row


def l2_bytes(entry: dict, grid) -> float | None:
    """The kernel's static LDG/STG bytes per CTA (its cost report's ``global_bytes_per_cta``)
    × the CTAs of ``grid``; None where the bundle carries no such count."""
    per_cta = (entry.get("cost") or {}).get("global_bytes_per_cta")
    return None if per_cta is None else float(per_cta) * math.prod(int(g) for g in grid)


def group_launches(calls: list[list[tuple]]) -> list[tuple]:
    """Per-call launch lists ``[(name, grid, entry, µs), ...]`` -> one ``(name, grid, entry,
    [µs per call])`` per launch, in the order of the first call. A launch is matched across
    calls by kernel name, grid and how many times that name came before it in the call (a
    program may launch one kernel twice)."""
    order: list[tuple] = []
    found: dict[tuple, tuple] = {}
    for launches in calls:
        seen: dict[str, int] = {}
        for name, grid, entry, us in launches:
            key = (name, tuple(grid), seen.get(name, 0))
            seen[name] = key[2] + 1
            if key not in found:
                found[key] = (name, tuple(grid), entry, [])
                order.append(key)
            found[key][3].append(us)
    return [found[key] for key in order]


# (header, row key, format, right-aligned) of the printed table; the JSON rows keep every
# key unformatted
_COLUMNS = [
    ("impl", "impl", "{}", False), ("op", "op", "{}", False), ("config", "config", "{}", False),
    ("mode", "mode", "{}", False), ("kernel", "kernel", "{}", False), ("grid", "grid", "{}", True),
    ("threads", "threads", "{}", True), ("CTA/SM", "ctas_per_sm", "{}", True),
    ("regs", "registers", "{}", True), ("smem B", "smem_bytes", "{}", True),
    ("us", "us", "{:.1f}", True), ("us/step", "us_per_step", "{:.2f}", True),
    ("MB", "bytes", "{:.1f}", True), ("% floor", "pct_floor", "{:.1f}", True),
    ("L2 MB", "l2_bytes", "{:.1f}", True), ("SASS", "sass", "{}", True),
    ("ns/SASS", "ns_per_sass", "{:.2f}", True),
]


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key == "kernel":             # the variant prefix is the same on every row of a call
        return value.split("__", 1)[-1]
    if key == "grid":
        return ",".join(str(g) for g in value)
    if key in ("bytes", "l2_bytes"):
        return fmt.format(value / 1e6)
    return fmt.format(value)


def format_kernel_table(rows: list[dict]) -> str:
    """The rows as aligned text columns (text left-aligned, numbers right-aligned)."""
    header = [h for h, _, _, _ in _COLUMNS]
    body = [[_cell(r, key, fmt) for _, key, fmt, _ in _COLUMNS] for r in rows]
    widths = [max(len(c) for c in col) for col in zip(header, *body)]
    lines = []
    for cells in [header, *body]:
        lines.append("  ".join(c.rjust(w) if right else c.ljust(w)
                               for c, w, (_, _, _, right) in zip(cells, widths, _COLUMNS)).rstrip())
    return "\n".join(lines)
