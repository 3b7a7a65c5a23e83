"""Per-kernel lowering options measured faster than the defaults: the tuning table.

One value of a lowering option does not suit every kernel. ``load_batch`` (loads a thread
issues before using them, LowerOptions.load_batch) is the case measured so far: at 2 instead
of 8 the backward's dk/dv/dg kernel (k4) of kda_bwd runs faster and, at K = V = 64, no longer
spills, while every other kernel of the program runs slower (the dq kernel k2 +10%, the
forward's output kernel +29% at K = 128). The static cost model predicts the opposite for k4
(its loads overlap less), so the choice is a measurement, recorded here with its evidence, not
a rule. An entry may also rest on ptxas alone (a kernel that spills registers at the
default and not with the entry), saying so.

An entry names the chip, the lowering path (``sm90-native``, ``sm90-register-scan``,
``portable``), the program, its head dims (K, V) and the kernel (``k<index>_<label>`` as
`kdagen.codegen.lower.kernel.prepare` names it); it applies to every gate and option set of
that program, and only to options the caller left at their defaults (an explicit value, e.g.
an ablation's ``--load-batch``, wins). ``LowerOptions.tuned = False`` turns the table off.

``LowerOptions.tune`` adds entries of its own for an A/B (``PROGRAM.KERNEL:KEY=VALUE+...``):
they apply after the table's, over any option, on whichever chip and path.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .options import LowerOptions

__all__ = ["TunedKernel", "TUNED", "tuned_options", "kernel_label", "parse_tune"]


@dataclass(frozen=True)
class TunedKernel:
    chip: str
    path: str                 # the lowering path the kernel takes (its launch's "path")
    program: str
    head_dims: tuple          # (K, V)
    kernel: str               # k<index>_<label>
    options: tuple            # ((name, value), ...) of LowerOptions fields
    evidence: str             # where it was measured, and by how much it won


TUNED: tuple[TunedKernel, ...] = (
    TunedKernel("sm_90a", "sm90-native", "kda_bwd", (128, 128), "k4_scan4", (("load_batch", 2),),
                "H100, B1_T8k_H16, one process: 1866 -> 1707 us "
                "(bench/results/h100_stop41_load_batch_k128.log)"),
    TunedKernel("sm_90a", "sm90-native", "kda_bwd", (64, 64), "k4_scan4", (("load_batch", 2),),
                "H100, B1_T8k_H16, one process: 763 -> 743 us, and its 8-byte spill gone "
                "(bench/results/h100_stop41_load_batch_k64.log)"),
    # two CTAs per SM measured slower for every other chunk-parallel kernel of the four
    # programs (kda_bwd's dk kernel 1663 -> 1955 us: what no longer fits half the shared memory
    # goes to the global scratch); GDN's forward output kernel spills least there (92 KB,
    # 6 -> 12 global round trips per CTA)
    TunedKernel("sm_90a", "sm90-native", "gdn_fwd", (128, 128), "k2_scan2",
                (("chunk_ctas_per_sm", 2),),
                "H200, B1_T8k_H16, one process: 261 -> 230 us; GPU check 574 ok with every "
                "chunk kernel at 2 CTAs (bench/results/h200_stop44_ab_chunk_ctas.log, "
                "h200_stop44_gpu_check_native_chunk_ctas2.log)"),
    # four consumer warpgroups at 96 registers spill 172 bytes per thread (ptxas), which the
    # extra warps more than pay for; two warpgroups (the K > 128 default) spill nothing but
    # leave each scheduler one warp of this issue-bound kernel
    TunedKernel("sm_90a", "sm90-native", "kda_bwd", (256, 128), "k4_scan4",
                (("chunk_warpgroups", 4), ("load_batch", 2)),
                "H100, B1_T8k_H16, one process: 6199 -> 4169 us per value part, with a "
                "172-byte register spill (bench/results/h100_stop45_ab_k256_chunk_options.log); "
                "load_batch 2 alone: 60 bytes spilled at 8, none at 2 "
                "(bench/results/cpu_ptxas_k256_kda_bwd_load_batch.log)"),
    # slot barriers help GDN's TF32 reverse scan, whose refill the step's products did not hide;
    # KDA's bf16x3 reverse scan (three times the tensor work per step) was even or slower:
    # 4.30 -> 4.23 us per step at B1_T8k_H16, 3.69 -> 3.81 at B1_T32k_H4
    TunedKernel("sm_90a", "sm90-register-scan", "gdn_bwd", (128, 128), "k3_scan3",
                (("scan_slot_barriers", True),),
                "H100, one process, reverse scan: B1_T8k_H16 3.99 -> 3.11 us per step, "
                "B1_T32k_H4 3.43 -> 2.74 (fwd+bwd 4.87 -> 4.58 ms); GPU check 1148 ok with "
                "slot barriers in both backward programs (bench/results/h100_stop53_slots_1.log, "
                "h100_stop53_check_slotsp.log)"),
    # both reverse dS scans on two consumer warpgroups per CTA, one CTA per head
    # (scan_warpgroups=2: 16 CTAs at H = 16 instead of 32): alone the scan is slower (GDN
    # 3.04 -> 4.38 us per step, KDA 4.25 -> 6.93 at B1_T32k_H16: both warpgroups share the
    # SM's tensor cores), but the dq kernel beside it gets the 16 SMs back and the pair ends
    # sooner; even at B8_T4k_H32, where the scan's grid fills the GPU anyway
    TunedKernel("sm_90a", "sm90-register-scan", "gdn_bwd", (128, 128), "k3_scan3",
                (("scan_warpgroups", 2),),
                "H100, one process, fwd+bwd: B1_T32k_H16 10.331 -> 10.076 ms, B1_T8k_H16 "
                "2.738 -> 2.658, B8_T4k_H32 21.355 -> 21.371; GPU check of the backward "
                "variants 200 ok (bench/results/h100_stop58_ab_gdn32.log, h100_stop58_ab_sw.log, "
                "h100_stop58_check_sw_full.log)"),
    TunedKernel("sm_90a", "sm90-register-scan", "kda_bwd", (128, 128), "k3_scan3",
                (("scan_warpgroups", 2),),
                "H100, one process, fwd+bwd: B1_T32k_H16 13.274 -> 13.071 ms, B1_T8k_H16 "
                "3.453 -> 3.444, B8_T4k_H32 26.513 -> 26.519; GPU check 200 ok "
                "(bench/results/h100_stop58_ab_kda32.log, h100_stop58_ab_sw.log, "
                "h100_stop58_check_sw_full.log)"),
    # the register-tile lowering (register_tiles.py): GDN's forward output kernel on it. The
    # prologue measured faster alone (224 -> 162 us) but the forward slower (0.511 -> 0.559
    # ms): at two CTAs per SM (76 KB) it leaves no SM free for the scan beside it (199 KB),
    # which then waits for the prologue to drain. KDA's forward kernels measured 2.6x slower
    # there (one CTA per head for the per-channel decay products)
    TunedKernel("sm_90a", "sm90-native", "gdn_fwd", (128, 128), "k2_scan2",
                (("register_tiles", True),),
                "H100, B1_T8k_H16, one process: 204 -> 139 us (stop 54's kernel), 203 -> 141 "
                "(this one); GPU check 60 + 12 ok (bench/results/h100_stop55_rt_ab.log, "
                "h100_stop55_rt2_ab.log, h100_stop55_check_rt.log, h100_stop55_check_def.log)"),
    # GDN's prologues (the forward's, and the backward's recompute) on register tiles with two
    # consumer warpgroups, padded to one CTA per SM: at two CTAs per SM they leave no SM empty
    # for the scan beside them (chunk flags), which then waits for their grid to drain
    # (B1_T8k_H16: forward 0.445 -> 0.749 ms); at one, as fast alone and the scan overlaps
    TunedKernel("sm_90a", "sm90-native", "gdn_fwd", (128, 128), "k0_scan0",
                (("register_tiles", True), ("register_tile_warpgroups", 2),
                 ("register_tile_ctas_per_sm", 1)),
                "H100, B1_T32k_H16, one process: forward 1.646 -> 1.483 ms (prologue 879 -> 779 "
                "us alone); GPU check 60 ok (bench/results/h100_stop56_cand32.log, "
                "h100_stop56_check_cand.log)"),
    TunedKernel("sm_90a", "sm90-native", "gdn_bwd", (128, 128), "k0_scan0",
                (("register_tiles", True), ("register_tile_warpgroups", 2),
                 ("register_tile_ctas_per_sm", 1)),
                "H100, B1_T32k_H16, one process: the backward's recompute prologue 810 -> 749 "
                "us alone, beside its scan 1219 -> 1148 us (bench/results/h100_stop56_cand32.log, "
                "h100_stop56_timeline32.log); GPU check 60 ok (h100_stop56_check_cand.log)"),
    # not here: gdn_bwd's dq kernel (k2) on register tiles (two warpgroups, one CTA per SM,
    # register_tile_sums=native, which passes the GPU check). Alone it is faster (H100,
    # B1_T32k_H16: 2115 -> 1557 us), but beside the reverse scan it ran 3410 us (the native
    # one 2709) and the call got slower: fwd+bwd 10.081 -> 10.530 ms with the two-warpgroup
    # scan, 10.988 with the one-warpgroup scan (bench/results/h100_stop59_ab_v2.log,
    # h100_stop59_timeline_v2.log). Nor load_batch=2 on gdn_bwd's dk kernel (4764 -> 4799 us)
    # or scan_operand_reads=2 on kda_bwd's (5568 -> 5724; h100_stop59_ab_gk4lb2.log,
    # h100_stop59_ab_kk4sor.log)
    TunedKernel("sm_90a", "sm90-native", "gdn_bwd", (256, 128), "k4_scan4",
                (("chunk_warpgroups", 4), ("load_batch", 2)),
                "H100, B1_T8k_H16, one process: 3894 -> 3009 us per value part, no spill "
                "(bench/results/h100_stop45_call3_ab.log; every other GDN kernel at K = 256 "
                "was slower on four warpgroups)"),
)

_DEFAULTS = {f.name: f.default for f in fields(LowerOptions)}


def kernel_label(index: int, label: str) -> str:
    return f"k{index}_{label}"


def tuned_options(opts: LowerOptions, chip: str, path: str, program: str, head_dims: tuple,
                  kernel: str) -> tuple[LowerOptions, dict]:
    """(the options kernel ``kernel`` of ``program`` is lowered with on ``chip`` by lowering
    path ``path``, the entries of the table applied to it): ``opts`` with the table's options
    where the caller left them at their defaults."""
    applied = {}
    for entry in TUNED if opts.tuned else ():
        if (entry.chip, entry.path, entry.program, tuple(entry.head_dims), entry.kernel) != \
                (chip, path, program, tuple(head_dims), kernel):
            continue
        for name, value in entry.options:
            if getattr(opts, name) == _DEFAULTS[name]:
                applied[name] = value
    applied.update(parse_tune(opts.tune).get((program, kernel), {}))
    return (replace(opts, **applied) if applied else opts), applied


def parse_tune(text: str) -> dict:
    """``LowerOptions.tune`` -> {(program, kernel): {option: value}}: comma-separated entries
    ``PROGRAM.KERNEL:KEY=VALUE+KEY=VALUE`` (values parsed as ``--lower`` parses them). Raises
    ValueError naming the entry that does not read so."""
    from .options import parse_lower_option
    out: dict = {}
    for entry in filter(None, (t.strip() for t in (text or "").split(","))):
        where, sep, settings = entry.partition(":")
        program, dot, kernel = where.strip().partition(".")
        if not sep or not dot or not program or not kernel.startswith("k") \
                or not settings.strip():
            raise ValueError(f"{entry!r} is not PROGRAM.KERNEL:KEY=VALUE+... "
                             "(e.g. gdn_bwd.k2_scan2:register_tiles=true)")
        values = out.setdefault((program, kernel.strip()), {})
        for item in settings.split("+"):
            key, value = parse_lower_option(item)
            if key in ("tune", "tuned"):
                raise ValueError(f"{entry!r}: {key} cannot be tuned per kernel")
            values[key] = value
    return out
