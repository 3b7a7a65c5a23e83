"""The options of the program lowering (``lower`` in bundles and ``kdagen emit``)."""
from __future__ import annotations

from dataclasses import dataclass

from kdagen.ir.precision import PRECISIONS, auto_precision

__all__ = ["LowerOptions", "product_precision", "TENSORMAP_PARAMS", "tensormap_param_kind",
           "parse_lower_option"]

#: LowerOptions.transposed_store_order values
TRANSPOSED_STORE_ORDERS = ("stored", "stored_vec", "logical")
#: LowerOptions.tensormap_params values -> the kernel parameter kind (codegen.common.kernel.Param)
TENSORMAP_PARAMS = {"global": "ptr", "grid_constant": "tmap"}


def tensormap_param_kind(opts) -> str:
    """The `Param` kind of a TMA kernel's tensor-map parameters under ``opts``."""
    return TENSORMAP_PARAMS[opts.tensormap_params]


def product_precision(dot: str, op: str | None = None, chosen: str | None = None) -> str:
    """The operand precision of a matrix op ``op`` (an op name; None: a plain kda.dot) under
    the lowering option ``dot``: with "auto", ``chosen`` (the op's ``kda.precision``, written
    by kda-assign-precision) or else kdagen.ir.precision.auto_precision; any other value
    overrides every product."""
    if dot == "auto":
        return chosen or auto_precision(op)
    if dot not in PRECISIONS:           # kdagen.ir.precision: what each one means
        raise ValueError(f"dot: {dot!r} is not a matrix-product precision; use one of "
                         f"auto, {', '.join(PRECISIONS)}")
    return dot


@dataclass
class LowerOptions:
    nthreads: int = 128
    split_scans: bool = True            # one kernel per scan (False: one per segment)
    storage: str = "auto"               # "auto" | "smem" | "global"
    smem_reserve: int = 1024            # bytes of the target's budget kept free
    global_block: int = 256
    # matrix products: "fma" (fp32 FMA on the CUDA cores), "tf32" (mma.sync m16n8k8 / wgmma
    # on TF32-rounded operands), "bf16x3" (operands split into bf16 hi + lo, three products:
    # ~fp32 accuracy), "bf16" (bf16-rounded operands), "auto" (per op: product_precision;
    # what kdagen.driver.DEFAULT_LOWERING ships).
    # Tensor cores take kda.dot and kda.decay_dot with a subblock that is a multiple of 16.
    dot: str = "fma"
    # "portable" (valid on every chip) or "native": the chip's own path where kdagen has one
    # (sm_90a: warp-specialised TMA producer + wgmma consumer, kdagen.codegen.lower.sm90_native);
    # chips without a native path take the portable one (LoweredKernel.path says which)
    path: str = "portable"
    # on the native sm_90a path, serial scans that fit take the register-resident lowering
    # (state in wgmma accumulators across chunks; kdagen.codegen.lower.register_scan)
    register_scan: bool = True
    # on the native sm_90a path, chunk-parallel kernels whose ops all have a register-tile rule
    # take the register-tile lowering (tiles in wgmma accumulators, ring tiles in shared memory,
    # no per-op buffers; kdagen.codegen.lower.register_tiles): True every kernel that fits,
    # False none, None (the default) the kernels the tuning table puts there (measured faster)
    register_tiles: bool | None = None
    # resident CTAs per SM of a register-tile kernel: 0 as many as its shared memory allows,
    # 1 its dynamic shared memory padded past half the SM's, so that an SM it leaves is empty
    # (a prologue at two CTAs per SM kept the 199 KB scan beside it off the SMs: GDN forward
    # 0.511 -> 0.559 ms on the H100; not yet measured at 1)
    register_tile_ctas_per_sm: int = 0
    # consumer warpgroups of a register-tile kernel: 1, or 2 (one CTA per head, each warpgroup
    # a 64-column value block of the transposed products and half the columns of the others;
    # V = 128 and only the rules that split so, else the kernel keeps one). The path is
    # latency-bound at one warpgroup (cost_model: 6.7-9.4 ns per instruction); not yet measured
    register_tile_warpgroups: int = 1
    # chunks per CTA of a register-tile kernel: 1, or 2 (CTA z takes chunks 2z and 2z + 1;
    # both chunks' TMA copies are issued at its start into bytes of their own, so the second
    # chunk's inputs land while the first computes: the copy latency a CTA of one chunk waits
    # out at its start, with no other CTA on the SM to hide it, is paid once per two chunks).
    # Where the second set of ring tiles does not fit, the kernel keeps one chunk per CTA.
    # Measured (H100, B1_T32k_H16 fwd+bwd, both GDN prologues at 2): alone the recompute
    # prologue 746 -> 698 us, the forward's 786 -> 794, but beside their scans both slower
    # (1146 -> 1229, 1013 -> 1104 us) and the call 10.081 -> 10.379 ms; GPU check (quick) 60 ok
    # (bench/results/h100_stop59_ab_v2.log, h100_stop59_timeline_v2.log). GDN's forward
    # output kernel at 2 goes from two CTAs per SM to one: 495 -> 722 us
    # (h100_stop59_ab_fsw_c2o.log). Off by default
    register_tile_chunks_per_cta: int = 1
    # the register-tile lowering's gate cumsum ([C] vectors) and row sums of tile expressions
    # (the L2 norms): "own" (its shuffle scan and two-thread row halves) or "native" (the tile
    # lowering's ordered emitters, tiles.emit_cumsum_warp and emit_reduce_sum: the same sums
    # in the same order as a native kernel's, to the bit). The backward's chunk kernels each
    # compute the gate cumsum and the norms again, and dG's near-cancelling terms amplify any
    # disagreement (docs/MATH.md §3): gdn_bwd's dq kernel (stop 57) and dk kernel (stop 58)
    # on register tiles beside native ones failed the steep-gate dA_log check (2.1e-2,
    # 2.26e-2). With "native" the dq kernel passes (H100, GPU check of gdn_*: 206 ok, the
    # steep-gate dA_log 2.04e-3 against 2.1e-2 with "own"; bench/results/
    # h100_stop59_check_dq1ns_full.log); "own" stays the default, as no register-tile kernel
    # that needs it is on by default (the dq kernel on register tiles measured slower end to
    # end: tuning.py)
    register_tile_sums: str = "own"
    # consumer warpgroups per CTA of a register scan (64 value columns each; the rest of V goes
    # to more CTAs per head)
    scan_warpgroups: int = 1
    # consumer warpgroups sharing one value block of a register scan, each owning K/scan_k_split
    # rows of the state (products split over them; partial sums meet in shared memory); taken
    # where the scan allows it (register_scan._plan_k_split), 1 = off. Off by default: on the
    # H200 (kda B1_T8k_H16) 2 is slower, 3.05 vs 2.41 us per forward step and 5.01 vs 4.26 per
    # reverse step — both warpgroups share the SM's tensor cores (one warpgroup's TF32 step is
    # already at their throughput), so the split only adds the exchange. "auto": 2 where one
    # warpgroup would hold more than 128 state rows (K = 256: its 256 x 64 fp32 slice is 128
    # registers per thread, and the scans spilled 336-600 bytes at 232; split, none spill),
    # else 1 (register_scan.k_split_for)
    scan_k_split: int | str = "auto"
    # checkpoints of a register scan's carried value through a shared staging tile and TMA
    # stores (register_scan.StoreSlot); False: per-thread global stores (ablation)
    scan_tma_stores: bool = True
    # a register scan whose ring has one stage (the reverse scans: a stage does not fit twice)
    # gets a full and an empty barrier per slot, so each slot's refill for the next chunk
    # starts when this step's last read of it completes, not when the step ends (the cost
    # model's exposed refill, 1.36 of kda_bwd's 4.02 us per reverse step)
    scan_slot_barriers: bool = False
    # the chunk kernels' wgmma chains start with scale-d 0 on undefined accumulators instead
    # of accumulating onto zeros: no zero copies between the wgmma fence and the first wgmma
    # (where ptxas inserts a warpgroup.arrive, C7519) and 32-64 fewer movs per chain; not yet
    # GPU-run
    wgmma_fresh_acc: bool = False
    # where a step with slot barriers waits for a slot's load: "products" (the element-wise
    # slots and the first product's at the step's start, the later products' slots together
    # before the first of them, so a step begins while the slots it reads late still load),
    # "start" (every slot at the step's start) or "first_read" (each before its first read:
    # ptxas spilled 92 bytes in kda_bwd's reverse scan and 4 in gdn_bwd's). The cost model
    # puts kda_bwd's reverse step at 2.94 us with "products", 3.66 with "start" (4.02 without
    # slot barriers); not yet measured
    scan_slot_acquire: str = "products"
    # a register scan that reads the chunk-parallel kernel before it only through its TMA ring
    # runs beside it: the chunk kernel publishes a flag per chunk once its stores are out, the
    # scan's TMA producer waits for it (kdagen.codegen.lower.chunk_flags), and the runtime
    # launches the scan on a second stream when its CTAs leave the chunk kernel most SMs.
    # "forward": the pairs whose scan walks the chunks forwards (the forward's state scan, the
    # backward's recompute scan); "all": the backward's reverse scan beside the dq kernel as
    # well; "off" (or false). "all" by default. Stop 51's "all" slowed the reverse scans run
    # in order 4.23 -> 5.60 us per step: ptxas serialised their wgmma (C7518) once the flag
    # waits put the wait it inserts on a divergent path; the scans now wait where ptxas would
    # (scan_group_wait). With that, on the H100 (one process): in order 4.29 vs 4.23 us per
    # reverse step (KDA B1_T8k_H16), B8_T4k_H32 (scans in order) unchanged, B1_T32k_H16
    # fwd+bwd KDA 14.34 -> 13.24 ms and GDN 11.89 -> 10.77 against "forward"; GPU check 574 ok
    # (bench/results/h100_stop52_ab_wait_*)
    chunk_flags: str | bool = "all"
    # who runs the gpu-scope release fence before a chunk kernel's CTA publishes its chunk flag
    # (chunk_flags.publish_chunk_ready): "each" (every thread, then a barrier) or "one" (a
    # barrier, then the publishing thread: the cooperative-groups grid-sync pattern). In
    # Nsight Compute the register-tile dq kernel alone (H100, gdn B1_T8k_H16) spent 5.8% of
    # its warp-stall samples in the per-thread fences (ERRBAR;
    # bench/results/h100_stop60_ncu_dq2_hotspots.txt). "one" by default: on the H100 (one
    # process) gdn B1_T32k_H16 fwd 1.490 -> 1.462 ms, fwd+bwd 10.113 -> 10.086, the pairs beside
    # their scans 1142 -> 1130, 1012 -> 989 and 2737 -> 2707 us; B8_T4k_H32 and kda even; GPU
    # check 574 ok (h100_stop60_ab_ff1.log, h100_stop60_timeline_ff1.log,
    # h100_stop60_check_ff1_full.log)
    flag_fence: str = "one"
    # which kernel of an overlapped pair (chunk_flags) is launched first: "chunk" (the chunk
    # kernel, then its scan on a high-priority side stream) or "scan" (the scan first, so its
    # CTAs hold their SMs before the chunk kernel's grid fills the rest). A chunk kernel at two
    # CTAs per SM never leaves an SM empty while its grid runs, so a scan launched after it
    # waits for the grid to drain (stop 55: GDN forward 0.511 -> 0.559 ms with the prologue on
    # register tiles); launched first, the scan's SMs are lost to the chunk kernel instead
    overlap_order: str = "chunk"
    # extra tuning entries for an A/B (kdagen.codegen.lower.tuning), applied after the table's
    # and over any option: "PROGRAM.KERNEL:KEY=VALUE+KEY=VALUE,PROGRAM.KERNEL:...", e.g.
    # "gdn_bwd.k2_scan2:register_tiles=true+register_tile_warpgroups=2"
    tune: str = ""
    # emission order of a register scan's step: "program" keeps the IR order; "early" issues
    # each product as soon as its operands allow (register_scan.schedule_step). "program" by
    # default: on the H200 (kda B1_T8k_H16) "early" measured 1.90 vs 1.74 us per forward step
    # and 3.82 vs 3.79 per reverse step — one warpgroup's TF32 products already keep the
    # tensor cores busy, so overlapping them gains nothing and the reads hoisted before the
    # first product delay it
    scan_schedule: str = "program"
    # a register scan's step stores the carried value's checkpoints (and computes them: the
    # fp16 checkpoints' column scale) before it waits for the chunk's ring tiles, which those
    # stores do not read, so that their work overlaps copies still landing (else after it)
    scan_checkpoints_first: bool = False
    # which of a register scan's products take their register A operand as two TF32 parts,
    # hi = tf32(x) and lo = tf32(x - hi), two wgmma per k block on the same B (~22 bits of A
    # instead of 11, twice those products' tensor time): "state" (A is the carried state),
    # "all", or "off". Off: on the H100 (kda B1_T8k_H16, scan_k_split=2, where nothing spills)
    # "state" took the lower-bound gate's weak-decay dA_log only from 3.11e-3 to 2.48e-3 and the
    # scans from 209 to 340 us (fwd) and 491 to 648 us (reverse)
    # (bench/results/h100_stop45_call3_checks.log, h100_stop45_call3_ab.log; docs/MATH.md §3)
    scan_a_split: str = "off"
    # bf16x3 register scans: k16 blocks whose A parts are packed before each wgmma fence
    # (0: all of a product's). 4: packing all 8 blocks of a 128-deep product first spilled
    # 16 bytes in kda_bwd's reverse scan (ptxas, sm_90a); 2 or 4 blocks per fence, none
    scan_a_group: int = 4
    # commit and wait for a bf16x3 product's earlier fence groups before packing the next
    # group's A (False: one commit per product; ptxas then inserts the wait itself, and with a
    # flag-waiting producer in the kernel serialises all its wgmma, C7518)
    scan_group_wait: bool = True
    # chunk-kernel stores of a workspace tile its reader wants transposed
    # (MemRef.transposed): "stored" walks the stored order (coalesced global stores; the
    # tile, or what it is computed from, is read down its columns), "stored_vec" too, a thread
    # taking 4 stored rows from one 16-byte read along a tile row (tiles.foreach_transposed:
    # a warp's reads of an unpadded ring tile down a column all hit one bank, 32-way, the dq
    # kernel's 39% of excess shared wavefronts on the H100), "logical" the tile's own order
    # (ablation). stored_vec by default: on the H100 (kda B1_T8k_H16, with smem_pad_all) the
    # dq kernel 786 -> 722 us, the forward's prologue 289 -> 276
    # (bench/results/h100_stop50_ab_banks_b1t8k.log)
    transposed_store_order: str = "stored_vec"
    # cumsums and reductions of the tile lowering sum in an order set by the tile's shape
    # alone (tiles.emit_cumsum, emit_reduce_sum), so kernels with different thread counts that
    # each compute the gate's cumsum or a row's norm get the same bits: the gate gradient's
    # near-cancelling sums amplify any difference between kernels (tools.rounding_attribution,
    # KDA K = 64 steep gate: dA_log 2.8e-4 with every kernel's gate cumsum rounded alike,
    # 6.3e-2 with one kernel's alone). In the simulator at the native kernels' thread counts
    # it takes KDA K = 64 steep-gate dA_log from 1.56e-3 to 5.5e-4 (correlated 1.62e-3 to
    # 8.7e-4), but K = 128 "B1_T1000 weak" from 7.2e-4 to 1.2e-3: dA_log sits at the TF32
    # products' noise (the float32 program: 4e-7), and reordering moves it either way; with
    # kda-assign-precision's bf16x3 state path (KDA's backward prologue, dq kernel and both
    # scans) every case of the K = 64 and K = 128 check sets meets its goal in the simulator
    # (K = 128 weak 4.1e-5, steep 5.3e-4), and on the H100 every KDA gate-parameter gradient
    # of the GPU check is <= 7.9e-4 (docs/MATH.md §3). Bitwise equal at 128-512 threads
    # (tests/test_tile_emitters_sim.py)
    ordered_sums: bool = True
    # consumer warpgroups of a chunk-parallel kernel on the native sm_90a path (1, 2, 4 or
    # "auto": 4 where tile buffers spill to the global scratch, else 2; sm90_native.
    # chunk_warpgroups): the tile loops run on all of their threads (more warps per scheduler
    # to hide latency) and each warpgroup computes a slice of every wgmma product's N columns
    chunk_warpgroups: int | str = "auto"
    # the unit-lower inverse (kda.tril_inv): "blocked-fma" (16x16 diagonal blocks in
    # registers, merged by block products in fp32 FMA over all threads), "blocked" (the merge
    # in the op's kda.precision, one warp's tensor-core contraction per block: ~15 us faster
    # per prologue kernel on the H200) or "columns" (forward substitution, one thread per
    # column; ablation). "blocked" was the default until FLA's test_chunk D = 100 steep-gate
    # case failed; that failure was the runtime taking a lower_bound-clamped variant
    # (bench/results/h200_fla_compat_variant_lookup_bug.log), and with the lookup fixed both
    # merges pass FLA's matrix alike (h200_fla_compat_after_lookup_fix_{tf32,fp32}_merge.log).
    # The backward's GPU check with the TF32 merge, correlated steep gate included, matches
    # the fp32 merge's (h200_chk_tf32_merge_{bwd,residuals2}.log: the same one known GDN
    # dA_log failure, 9.48e-3, every other error within 1.22x of the fp32 merge's), so it is
    # the default again
    tril_inv: str = "blocked"
    # element loops and row folds of the tile lowering issue the loads of this many elements
    # (rows) before using them (kdagen.codegen.lower.tiles.foreach_batched / fold_batched)
    load_batch: int = 8
    # element-wise loops (materialisations, tile stores) that give a thread 4 consecutive
    # elements at a time, each memory operand read or written with one 16-byte access where
    # its layout allows (tiles.vector_width): "all" (H100, kda B1_T8k_H16: the dk kernel
    # 1752 -> 1601 us, bench/results/h100_stop49_ab_vec3_b1t8k.log), "dst" (only where the
    # destination takes vector accesses: a hi/lo-split or transposed workspace's element
    # stores then stay coalesced, likely the bwd prologue's +2-4% under "all"), "capable"
    # (that and every read of the source), "off" (ablation); "dst" and "capable" not yet
    # measured
    vector_loops: str = "all"
    # a cumsum's lazy operand that reads more than this many product results per element is
    # materialised first (one vector-wide element loop), so the column scan reads one buffer
    # (storage.plan_storage); 0 = never. Off until measured on the GPU: at 2, kda_bwd's dk
    # kernel takes 6088 instead of 6312 instructions per thread in the cost report (ld.global
    # 293 -> 217) and its dq kernel 3739 instead of 3717
    scan_operand_reads: int = 0
    # tile values whose buffers would land in the global scratch are re-evaluated at each
    # consumer when their expression takes at most this many instructions from what stays
    # stored (kdagen.codegen.lower.storage.remat_candidates); 0 = always materialise
    remat_ops: int = 8
    # elements padding each row of a 2-D shared-memory tile buffer (storage.buffer_strides):
    # 1 gives an odd pitch (a warp reading down a column hits 32 banks), 4 a pitch of 4 mod 32
    # (an mma fragment's 8 rows x 4 columns hit 32 banks); tools/smem_banks.py counts both.
    # None: the lowering path's own (sm90_native.SMEM_ROW_PAD; 1 on the portable path)
    smem_row_pad: int | None = None
    # every 2-D tile buffer takes smem_row_pad, not only those a product reads or writes: the
    # rest keep an odd pitch (129) that serves reads down a column, but their rows are not
    # 16-byte aligned, so the vector loops read and write them 4 bytes at a time, 16 bytes
    # apart across a warp (4-way bank conflicts: tools.smem_banks, the cost report's strided.smem).
    # On by default: kda B1_T8k_H16 on the H100, with stored_vec, fwd 0.804 -> 0.772 ms and
    # fwd+bwd 4.099 -> 4.002 (bench/results/h100_stop50_ab_banks_b1t8k.log); a pad of 8 (a
    # pitch of 8 mod 32, what bf16 fragment pairs want) was slower (4.103: more tiles spill to
    # the global scratch, and the TF32 gathers conflict)
    smem_pad_all: bool = True
    # order of a chunk-parallel kernel's step: "memory" re-orders it so products are consumed
    # soon after they are made (kdagen.codegen.lower.schedule: fewer tile buffers live at
    # once, less spilled to the global scratch); "program" keeps the IR order (ablation)
    chunk_schedule: str = "memory"
    # resident CTAs per SM a chunk-parallel kernel on the native sm_90a path is planned for: 1
    # (its tiles take the whole block budget, ~220 KB) or 2 (tile buffers, ring and staging
    # within half an SM's shared memory, a one-stage ring -- each CTA loads one chunk, so a
    # second stage is never filled -- two consumer warpgroups for "auto", what no longer fits
    # moved to the global scratch): one CTA's TMA loads, barrier waits and global round trips
    # then overlap the other's work (sm90_native.chunk_budget)
    chunk_ctas_per_sm: int = 1
    # element-wise ops (materialisations, tile stores) get a barrier only where a later op
    # reads or overwrites what they touched (TileKernelEmitter.hazard); False: a barrier
    # after every op (ablation)
    elide_barriers: bool = True
    # where a kernel's tile buffers would spill to the global scratch: an element-wise result
    # takes the buffer of an operand it reads last, at the same index
    # (storage._share_in_place), if that brings them into shared memory
    in_place: bool = True
    # where a kernel's buffers spill: its in-place plan is also tried with every sum whose
    # terms read a matrix product's result materialised where it is made
    # (storage._sums_a_product), so the product dies in the partial sum that takes its buffer
    # instead of living until its sum tree's root; kept where less is read from the global
    # scratch. Off: on the H100 (B1_T8k_H16, bench/results/h100_stop39_staging_eager_ab.json)
    # the dk kernels were slower with it (kda 2296 -> 2398 us, gdn 1653 -> 1772) although
    # they read 28-29% less from the global scratch: the extra partial sums cost more issue
    # than the reads saved (the throughput fit predicted +6-8%)
    eager_sums: bool = False
    # staging tiles of a wgmma product on the sm_90a native path (sm90_native.dot_wgmma):
    # 1 = each K slice is staged, then the product waits for its wgmma and a barrier frees the
    # tiles (two barriers per slice); 2 = the slices alternate between two sets of tiles, so
    # the next slice is staged while the previous one's wgmma runs (one barrier per slice;
    # twice the staging memory, which a kernel near its shared-memory budget pays in tile
    # buffers moved to the global scratch); "auto": 2 where the kernel's tile buffers still
    # all fit in shared memory with the second set, else 1. 1 by default: on the H100
    # (B1_T8k_H16, bench/results/h100_stop39_staging_eager_ab.json) 2 gained at most 1-3% in
    # a kernel (the dk kernels 2266 -> 2235 / 1653 -> 1630 us, spilling 16 bytes) and cost the
    # dq kernels, pushed into the global scratch, 12-14%; "auto" measured as 1 end to end
    # (kda fwd+bwd 5.279 vs 5.284 ms, gdn 4.529 vs 4.531)
    staging_buffers: int | str = 1
    # how a TMA kernel receives its tensor maps (codegen.sm90.tma): "global" (the address of a
    # device copy the runtime makes from pinned memory, cached per tensor address) or
    # "grid_constant" (the 128 bytes by value, a __grid_constant__ parameter: the runtime only
    # encodes, no pinned allocation or host-to-device copy per new address). "global" until the
    # GPU has run "grid_constant" (it assembles for sm_90a; not yet run on a GPU)
    tensormap_params: str = "global"
    # per-kernel options measured faster than these defaults (kdagen.codegen.lower.tuning,
    # each entry with its measurement) replace them where left at the default; False: off
    tuned: bool = True


def parse_lower_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of a :class:`LowerOptions` field (``kdagen emit/show --lower``,
    ``tools/check_bundle --lower``), VALUE parsed by the field's type: a bool as
    true/false, a number where the field takes one (``load_batch=2``; also in fields that take
    a word or a number: ``chunk_warpgroups=2``, ``chunk_warpgroups=auto``), ``none`` where it
    may be None. Raises ValueError naming the fields."""
    from dataclasses import fields
    key, sep, value = text.partition("=")
    field = {f.name: f for f in fields(LowerOptions)}.get(key.strip())
    if not sep or field is None or not value.strip():
        raise ValueError(f"{text!r} is not KEY=VALUE of a lowering option; the keys: "
                         f"{', '.join(f.name for f in fields(LowerOptions))}")
    key, value, kind = key.strip(), value.strip(), str(field.type)
    if "None" in kind and value.lower() == "none":
        return key, None
    if kind in ("bool", "bool | None"):
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{key}: {value!r} is not true or false")
        return key, value.lower() in ("true", "1", "yes")
    if "None" in kind and value.lower() == "none":
        return key, None
    if "int" in kind and value.lstrip("-").isdigit():
        return key, int(value)
    if "str" in kind:
        return key, value
    raise ValueError(f"{key}: {value!r} is not a number")
