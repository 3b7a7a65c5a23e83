"""kda program -> GPU kernels: one kernel per scan (grid = one CTA per (sequence, value head)),
plus one small kernel per global op. This module partitions the program (plan.py), chooses each
kernel's lowering path — the portable one, or the chip's native path where the target has one
(sm90_native.py) — sizes its storage against the target's shared memory, and has the path's
emitter (emitter.py) write it; it holds no kernel body of its own. The calling convention the
runtime relies on: emitter.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kdagen.codegen.common.kernel import GpuModuleBuilder
from kdagen.target import Target

from . import register_scan, register_tiles, sm90_native, tuning
from . import tiles as T_
from .chunk_flags import FLAG_FENCES, pair_kernels
from .cost_model import kernel_report, register_tile_estimate
from .emitter import REDUCE_SLOTS_BYTES, GlobalKernelEmitter, TileKernelEmitter
from .options import TENSORMAP_PARAMS, TRANSPOSED_STORE_ORDERS, LowerOptions, product_precision
from .plan import KernelGroup, LoweringError, group_kernels
from .program import Program, read_program, walk
from .schedule import schedule_for_memory
from .storage import StoragePlan, plan_storage, remat_candidates

__all__ = ["LoweredKernel", "lower_program", "LowerOptions", "prepare", "PreparedKernel"]

#: the native lowering paths, each chosen by its ``supports_target`` (a chip without one
#: takes the portable path)
NATIVE_PATHS = (sm90_native,)


@dataclass
class LoweredKernel:
    name: str
    program: str
    kind: str                           # "tile" | "global"
    order: int                          # launch order within the program
    builder: GpuModuleBuilder
    params: list                        # [Param]
    launch: dict                        # grid rule, block, dynamic_shared_memory, storage...
    storage: str                        # "smem" | "global" | "none"
    scratch_bytes_per_cta: int = 0
    path: str = "portable-fma"
    info: dict = field(default_factory=dict)
    #: static cost report (kdagen.codegen.lower.cost_model.kernel_report; None when the
    #: lowering ran without counting)
    cost: dict | None = None

    @property
    def module(self):
        return self.builder.module

    def param_dicts(self) -> list[dict]:
        return [dict(name=p.name, kind=p.kind, elem=p.elem) for p in self.params]


# ------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------


@dataclass
class PreparedKernel:
    """A kernel of a program before emission: its group, plan, storage and emitter."""
    name: str
    group: KernelGroup
    emitter: object
    storage: str
    launch: dict
    plan: StoragePlan | None = None


def prepare(program: Program, target: Target | None, prefix: str,
            opts: LowerOptions) -> list[PreparedKernel]:
    """Partition and plan a program (no MLIR emitted): what both the GPU lowering and the
    CPU simulator run."""
    if opts.path not in ("portable", "native"):
        raise LoweringError(f"path: {opts.path!r} is not a lowering path; use 'portable' or "
                            "'native'")
    product_precision(opts.dot)          # a valid value (else a clear error)
    if opts.chunk_schedule not in ("memory", "program"):
        raise LoweringError(f"chunk_schedule: {opts.chunk_schedule!r} is not a schedule; use "
                            "'memory' or 'program'")
    if opts.scan_a_split not in ("off", "state", "all"):
        raise LoweringError(f"scan_a_split: {opts.scan_a_split!r}; use 'off', 'state' or 'all'")
    if opts.transposed_store_order not in TRANSPOSED_STORE_ORDERS:
        raise LoweringError(f"transposed_store_order: {opts.transposed_store_order!r}; use "
                            f"{', '.join(repr(o) for o in TRANSPOSED_STORE_ORDERS)}")
    if opts.vector_loops not in ("all", "dst", "capable", "off"):
        raise LoweringError(f"vector_loops: {opts.vector_loops!r}; use 'all', 'dst', "
                            "'capable' or 'off'")
    if opts.tensormap_params not in TENSORMAP_PARAMS:
        raise LoweringError(f"tensormap_params: {opts.tensormap_params!r}; use one of "
                            f"{', '.join(map(repr, TENSORMAP_PARAMS))}")
    directions = chunk_flag_directions(opts.chunk_flags)
    if opts.scan_slot_acquire not in ("start", "products", "first_read"):
        raise LoweringError(f"scan_slot_acquire: {opts.scan_slot_acquire!r}; use 'start', "
                            "'products' or 'first_read'")
    if opts.register_tile_warpgroups not in (1, 2):
        raise LoweringError(f"register_tile_warpgroups: {opts.register_tile_warpgroups}; "
                            "use 1 or 2")
    if opts.register_tile_chunks_per_cta not in (1, 2):
        raise LoweringError(f"register_tile_chunks_per_cta: {opts.register_tile_chunks_per_cta}; "
                            "use 1 or 2")
    if opts.register_tile_ctas_per_sm not in (0, 1, 2):
        raise LoweringError(f"register_tile_ctas_per_sm: {opts.register_tile_ctas_per_sm}; "
                            "use 0 (as many as fit), 1 or 2")
    if opts.flag_fence not in FLAG_FENCES:
        raise LoweringError(f"flag_fence: {opts.flag_fence!r}; use "
                            f"{' or '.join(map(repr, FLAG_FENCES))}")
    if opts.overlap_order not in OVERLAP_ORDERS:
        raise LoweringError(f"overlap_order: {opts.overlap_order!r}; use "
                            f"{' or '.join(map(repr, OVERLAP_ORDERS))}")
    try:
        tuning.parse_tune(opts.tune)
    except ValueError as e:
        raise LoweringError(f"tune: {e}") from None
    out = []
    groups = group_kernels(program, opts.split_scans)
    register_plans = _register_scan_plans(program, groups, target, opts)
    storage_of = {}
    for rp in register_plans.values():
        storage_of.update(rp.workspace_storage())
    for g in groups:
        kname = f"{prefix}__k{g.index}_{g.label}"
        rp = register_plans.get(g.index)
        if rp is not None:
            em = register_scan.RegisterScanEmitter(program, g, rp.options, target, rp)
            em.workspace_storage = storage_of
            launch = _register_launch(g, em, rp, parallel=False, depth=rp.depth,
                                      stage_bytes=rp.stage_bytes, precision=rp.precision)
            launch["carry"] = rp.carry(g)
            if rp.tuned:
                launch["tuned"] = dict(rp.tuned)
            out.append(PreparedKernel(kname, g, em, "smem", launch, None))
            continue
        tp = _register_tile_plan(program, g, target, opts)
        if tp is not None:
            em = register_tiles.RegisterTileEmitter(program, g, opts, target, tp)
            em.workspace_storage = storage_of
            launch = _register_launch(g, em, tp, parallel=True, depth=1,
                                      stage_bytes=sum(s.nbytes for s in tp.slots),
                                      precision="bf16+tf32")
            if tp.tuned:
                launch["tuned"] = dict(tp.tuned)
            out.append(PreparedKernel(kname, g, em, "smem", launch, None))
            continue
        if g.kind == "global":
            em = GlobalKernelEmitter(program, g.nodes[0], opts.global_block)
            launch = em.launch()
            launch.update(kind="global", order=g.index, storage="none", scratch_bytes_per_cta=0)
            out.append(PreparedKernel(kname, g, em, "none", launch))
            continue
        nat = native_path(target) if opts.path == "native" else None
        # the tuning table's options of this kernel (before planning: chunk_ctas_per_sm sets
        # the plan's shared-memory budget)
        kopts, tuned = _kernel_options(opts, target, nat.PATH_NAME if nat is not None
                                       else "portable", program, g)
        plan, native, storage, budget, need, keep_lazy = _settled_plan(
            program, g, target, kopts, nat, kname, in_place=False)
        spilling, in_place = storage, False
        if storage != "smem" and kopts.in_place:
            # where buffers spill to the global scratch: results sharing an operand's buffer
            # (storage._share_in_place), with the same values re-evaluated and the same step
            # order, kept when fewer reads go to the global scratch (re-planned from scratch, the
            # remat loop chose other values: kda_bwd's dk kernel +12% instructions in the cost
            # report; fewer bytes spilled can still mean more reads of them)
            # (eager_sums: also with sums of products materialised where made, kept where that
            # reads less again)
            for eager in ((False, True) if kopts.eager_sums else (False,)):
                shared = _plan_group(program, g, target, kopts, nat, kname, keep_lazy, True,
                                     eager)
                if shared[0].global_reads() < plan.global_reads():
                    plan, native, storage, budget, need = shared
                    in_place = True
        if native is not None:
            used = (REDUCE_SLOTS_BYTES + plan.smem_bytes) if storage in ("smem", "hybrid") else 0
            native.base = -(-used // 1024) * 1024
            em = nat.Sm90NativeTileEmitter(program, g, plan, storage, kopts, target, native,
                                           warpgroup_storage=spilling)
            block = em.block_threads
        else:
            em = TileKernelEmitter(program, g, plan, storage, kopts)
            block = kopts.nthreads
        em.workspace_storage = storage_of
        heads = "HV" if program.value_split == 1 else f"HV * {program.value_split}"
        launch = {"grid": [heads, "N", "max_chunks" if g.parallel else "1"],
                  "block": [block, 1, 1], "parallel_chunks": g.parallel,
                  "dynamic_shared_memory": em.smem_bytes, "kind": "tile",
                  "order": g.index, "storage": storage,
                  "scratch_bytes_per_cta": em.scratch_bytes, "tile_bytes": need}
        if in_place:
            launch["shared_in_place"] = True
        if tuned:
            launch["tuned"] = tuned
        if any(scan.results for scan in g.scans):
            # a state carried across chunks in a kernel the segmented runtime cannot chain
            # (kdagen.runtime.segments needs a register scan's "carry")
            launch["carries_state"] = True
        hbm = hbm_bytes_per_token(g)
        if hbm is not None:
            launch["hbm_bytes_per_token"] = hbm
        if native is not None:
            launch.update(path=em.path, tensor_maps=native.tensor_maps(),
                          ring={"depth": native.depth, "stage_bytes": native.stage_bytes,
                                "tma_loads": [s.tensor for s in native.slots]},
                          wgmma_precision="+".join(nat.kernel_precisions(g, opts.dot)))
        out.append(PreparedKernel(kname, g, em, storage, launch, plan))
    if directions:
        _pair_with_flags(out, directions, opts.overlap_order)
    return out


def chunk_flag_directions(option) -> frozenset:
    """The scan directions LowerOptions.chunk_flags pairs: "forward", "all", "off" (and the
    booleans: true = "all")."""
    off, forward, both = frozenset(), frozenset({False}), frozenset({False, True})
    table = {"off": off, False: off, "false": off, "forward": forward, "all": both,
             True: both, "true": both}
    if option not in table:
        raise LoweringError(f"chunk_flags: {option!r}; use 'forward', 'all' or 'off'")
    return table[option]


#: LowerOptions.overlap_order values: which kernel of an overlapped pair is launched first
OVERLAP_ORDERS = ("chunk", "scan")


def _pair_with_flags(prepared: list, directions: frozenset, order: str = "chunk") -> None:
    """Let each register scan that reads the chunk kernel before it only through its TMA ring
    run beside it (kdagen.codegen.lower.chunk_flags): the chunk kernel publishes a flag per
    chunk, the scan waits for it; the launch entries tell the runtime (``overlap_order`` on
    the scan: which of the two it launches first)."""
    pairs = pair_kernels(
        prepared,
        lambda pk: (isinstance(pk.emitter, sm90_native.Sm90NativeTileEmitter)
                    # one CTA per chunk: its flag means the whole chunk is stored
                    or isinstance(pk.emitter, register_tiles.RegisterTileEmitter)
                    and pk.emitter.rplan.v_ctas == 1)
        and pk.group.parallel and len(pk.group.scans) == 1,
        lambda pk: isinstance(pk.emitter, register_scan.RegisterScanEmitter),
        directions)
    for ordinal, (i, j) in enumerate(pairs, start=1):
        prod, cons = prepared[i], prepared[j]
        prod.emitter.publish_flags = True
        cons.emitter.wait_flags = True
        # the flags are zeroed once per call: the k-th pair publishes and waits for k, so
        # the backward's second pair never reads the first pair's flags as its own
        prod.emitter.flag_value = cons.emitter.flag_value = ordinal
        prod.launch["chunk_flags"] = "publish"
        cons.launch["chunk_flags"] = "wait"
        cons.launch["overlaps"] = prod.name
        if order != "chunk":
            cons.launch["overlap_order"] = order


def _settled_plan(program: Program, g, target: Target | None, opts: LowerOptions, nat,
                  kname: str, in_place: bool):
    """:func:`_plan_group`, with values whose buffers land in the global scratch and are cheap
    to recompute re-evaluated where used instead (storage.remat_candidates), planned again
    until no new one appears; its results and the values re-evaluated."""
    keep_lazy = frozenset()
    for _ in range(4):
        res = _plan_group(program, g, target, opts, nat, kname, keep_lazy, in_place)
        if (opts.chunk_schedule == "memory" and g.parallel
                and schedule_for_memory(g.scans[0].body, res[0].buffers)):
            res = _plan_group(program, g, target, opts, nat, kname, keep_lazy, in_place)
        more = remat_candidates(res[0], opts.remat_ops) - keep_lazy
        if not more:
            break
        keep_lazy |= more
    return (*res, keep_lazy)


def _plan_group(program: Program, g, target: Target | None, opts: LowerOptions, nat,
                kname: str, keep_lazy: frozenset, in_place: bool = False,
                eager_sums: bool = False):
    """Storage plan (packed), native layout (or None), storage kind, shared-memory budget
    left for the tile buffers and the bytes they need, for one tile kernel; with
    ``staging_buffers="auto"``, two sets of wgmma staging tiles where the buffers still all
    fit in shared memory with them, else one."""
    choice = opts.staging_buffers
    if choice not in (1, 2, "auto"):
        raise LoweringError(f"staging_buffers={choice!r}: use 1, 2 or 'auto'")
    tried = (1,) if nat is None else (2, 1) if choice == "auto" else (choice,)
    for sets in tried:
        res = _plan_group_with(program, g, target, opts, nat, kname, keep_lazy, in_place,
                               eager_sums, sets)
        if res[2] == "smem":
            break
    return res


def _plan_group_with(program: Program, g, target: Target | None, opts: LowerOptions, nat,
                     kname: str, keep_lazy: frozenset, in_place: bool, eager_sums: bool,
                     staging_sets: int):
    """:func:`_plan_group` with ``staging_sets`` sets of wgmma staging tiles."""
    budget = (target.smem_per_block if target is not None else 227 * 1024) - opts.smem_reserve
    native = None
    if nat is not None:
        max_depth = 2
        shared = nat.chunk_budget(opts.chunk_ctas_per_sm, target) if g.parallel else None
        if shared is not None:      # several CTAs per SM: each loads one chunk, one stage
            budget, max_depth = min(budget, shared - opts.smem_reserve), 1
        precision = nat.wgmma_precision(g, opts.dot)
        single = nat.single_read_operands(g)
        # tiles streamed into the ring are read from it (no fp32 copy); the ring may keep
        # fewer loads than planned for when it must leave room: plan again until both agree
        ring = frozenset(s.node for s in nat.tma_candidates(program, g))
        for _ in range(len(ring) + 1):
            plan = plan_storage(program, g, ring_loads=ring, single_read=single,
                                keep_lazy=keep_lazy, row_pad=_row_pad(opts, nat),
                                pad_all=opts.smem_pad_all, in_place=in_place, eager_sums=eager_sums,
                                scan_operand_reads=opts.scan_operand_reads)
            native = nat.plan_native(program, g, budget - REDUCE_SLOTS_BYTES,
                                     plan.total_bytes, precision, ring,
                                     staging_sets=staging_sets, dot=opts.dot,
                                     max_depth=max_depth)
            kept = frozenset(s.node for s in native.slots)
            if kept == ring:
                break
            ring = kept
        else:
            raise LoweringError(f"{kname}: the native ring and the storage plan do not settle")
        budget -= native.bytes + 1024       # the native region starts 1024-aligned
    else:
        plan = plan_storage(program, g, keep_lazy=keep_lazy, row_pad=_row_pad(opts, None),
                            pad_all=opts.smem_pad_all, in_place=in_place, eager_sums=eager_sums,
                            scan_operand_reads=opts.scan_operand_reads)
    need = REDUCE_SLOTS_BYTES + plan.total_bytes
    storage = opts.storage
    if storage == "auto":
        storage = "smem" if need <= budget else "hybrid"
    if storage == "smem" and need > budget:
        raise LoweringError(f"{kname}: {need} bytes of tile storage exceed the shared-memory "
                            f"budget {budget}")
    plan.pack(storage, budget - REDUCE_SLOTS_BYTES)
    if storage == "hybrid" and plan.global_bytes == 0:
        storage = "smem"            # everything fitted: keep the (within-budget) offsets
    elif storage == "hybrid" and plan.smem_bytes == 0:
        plan.pack("global")
        storage = "global"
    return plan, native, storage, budget, need


def _row_pad(opts: LowerOptions, nat) -> int:
    """Row padding of the shared tile buffers: the option, else the native path's own
    (``SMEM_ROW_PAD``), else 1."""
    if opts.smem_row_pad is not None:
        return opts.smem_row_pad
    return getattr(nat, "SMEM_ROW_PAD", 1)


def _kernel_options(opts: LowerOptions, target: Target | None, path: str, program: Program,
                    g) -> tuple[LowerOptions, dict]:
    """(the options kernel ``g`` is lowered with on lowering path ``path``, the tuning table's
    entries applied to it: kdagen.codegen.lower.tuning)."""
    return tuning.tuned_options(
        opts, target.chip if target is not None else "", path, program.name,
        (int(program.attrs.get("head_k_dim", 0)), int(program.attrs.get("head_v_dim", 0))),
        tuning.kernel_label(g.index, g.label))


#: lowering paths whose tiles live in registers (the cost report says so)
REGISTER_PATHS = (register_scan.PATH_NAME, register_tiles.PATH_NAME)


def _register_launch(g, em, plan, *, parallel: bool, depth: int, stage_bytes: int,
                     precision: str) -> dict:
    """The manifest launch entry of a kernel on a register path (register scan or register
    tiles): shared memory only, its tensor maps and its TMA ring."""
    launch = {"grid": plan.grid, "block": [plan.block_threads, 1, 1],
              "parallel_chunks": parallel, "dynamic_shared_memory": em.smem_bytes,
              "kind": "tile", "order": g.index, "storage": "smem",
              "scratch_bytes_per_cta": 0, "tile_bytes": 0, "path": em.path,
              "tensor_maps": plan.tensor_maps(),
              "ring": {"depth": depth, "stage_bytes": stage_bytes,
                       "tma_loads": [s.tensor for s in plan.slots]},
              "wgmma_precision": precision}
    hbm = hbm_bytes_per_token(g)
    if hbm is not None:
        launch["hbm_bytes_per_token"] = hbm
    return launch


def _register_tile_plan(program: Program, g, target: Target | None, opts: LowerOptions):
    """The register-tile plan of chunk-parallel kernel ``g`` (register_tiles.py) where the
    option asks for it (or the tuning table, for the kernel on the native path) on the native
    sm_90a path and the kernel fits, else None."""
    if (opts.path != "native" or g.kind != "tile" or not g.parallel
            or native_path(target) is not sm90_native):
        return None
    kopts, tuned = _kernel_options(opts, target, sm90_native.PATH_NAME, program, g)
    if not kopts.register_tiles:
        return None
    plan = None
    if kopts.register_tile_warpgroups > 1:
        try:
            plan = register_tiles.match(program, g, target, dot=kopts.dot,
                                        warpgroups=kopts.register_tile_warpgroups,
                                        chunks_per_cta=kopts.register_tile_chunks_per_cta)
        except register_tiles.NoMatch:
            plan = None             # the kernel keeps one warpgroup
    try:
        plan = plan or register_tiles.match(program, g, target, dot=kopts.dot,
                                            chunks_per_cta=kopts.register_tile_chunks_per_cta)
    except register_tiles.NoMatch:
        return None
    if kopts.register_tile_ctas_per_sm == 1:
        plan.smem_bytes = max(plan.smem_bytes, register_tiles.TWO_PER_SM + 1024)
    plan.tuned = dict(tuned)
    return plan


def _register_scan_plans(program: Program, groups: list, target: Target | None,
                         opts: LowerOptions) -> dict:
    """{group index: plan} of the serial kernels that take the register-resident scan
    (register_scan.py): native path, ``opts.register_scan``, the kernel fits, and no other
    kernel reads a workspace whose storage the plan changes."""
    if opts.path != "native" or not opts.register_scan or native_path(target) is not sm90_native:
        return {}
    readers: dict = {}
    for g in groups:
        for n in g.nodes:
            for m in [n, *(walk(n.body) if n.body is not None else [])]:
                if m.op in ("kda.load_chunk", "kda.sum_chunks") and m.operands[0].workspace:
                    readers.setdefault(m.operands[0], set()).add(g.index)
    plans = {}
    for g in groups:
        kopts, tuned = _kernel_options(opts, target, register_scan.PATH_NAME, program, g)
        try:
            rp = register_scan.match(program, g, target,
                                     (target.smem_per_block or 0) - kopts.smem_reserve,
                                     kopts.scan_warpgroups, kopts.scan_k_split,
                                     kopts.scan_tma_stores, kopts.dot,
                                     kopts.scan_slot_barriers)
        except register_scan.NoMatch:
            continue
        rp.options, rp.tuned = kopts, tuned
        if any(readers.get(ws, set()) - {g.index} for ws in rp.workspace_storage()):
            continue
        plans[g.index] = rp
    return plans


def lower_program(module, target: Target, *, name: str | None = None,
                  options: LowerOptions | None = None, cost: bool = True) -> list[LoweredKernel]:
    """Lower a kda program (after kda-stable-reassociate; any scan structure) to GPU kernels
    for ``target``; returns them in launch order. ``cost``: count what each kernel executes
    while emitting it (``LoweredKernel.cost``, kdagen.codegen.lower.cost); the IR is the same
    either way."""
    opts = options or LowerOptions()
    program = read_program(module)
    prefix = name or program.name
    out: list[LoweredKernel] = []
    for pk in prepare(program, target, prefix, opts):
        builder = GpuModuleBuilder(f"{pk.name}_module")
        with builder.context, builder.location:
            params = pk.emitter.params()
            pk.emitter.emit_mlir(builder, pk.name, count_cost=cost)
        warps = (None if pk.group.kind == "global"
                 else getattr(pk.emitter, "consumer_threads", opts.nthreads) // 32)
        report = (kernel_report(pk.emitter.cost, serial=pk.group.kind != "global"
                                and not pk.group.parallel, warps=warps) if cost else None)
        if report is not None and pk.launch.get("tuned"):
            report["tuned"] = dict(pk.launch["tuned"])
        if report is not None and pk.launch.get("path") in REGISTER_PATHS:
            report["registers"] = True      # its tiles live in registers, not per-op buffers
        if report is not None and pk.launch.get("path") == register_tiles.PATH_NAME:
            report["latency_bound"] = register_tile_estimate(report["counts"])
        layouts = [s.attrs["kda.layout_cost"] for s in pk.group.scans
                   if isinstance(s.attrs.get("kda.layout_cost"), dict)]
        if report is not None and layouts:
            report["layouts"] = {k: sum(int(c.get(k, 0)) for c in layouts)
                                 for k in ("conversions", "conversion_bytes",
                                           "init_conversions", "init_bytes")}
            for k in ("register_bytes", "shared_bytes", "registers_per_thread"):
                if any(k in c for c in layouts):
                    report["layouts"][k] = max(int(c.get(k, 0)) for c in layouts)
        if pk.group.kind == "global":
            out.append(LoweredKernel(pk.name, program.name, "global", pk.group.index, builder,
                                     params, pk.launch, "none", 0, "portable", cost=report))
            continue
        plan = pk.plan
        info = ({"buffers": len({id(b) for b in plan.buffers.values()}),
                 "modes": _mode_counts(plan), "scans": len(pk.group.scans)} if plan is not None
                else {"buffers": 0, "modes": {"registers": 1}, "scans": len(pk.group.scans)})
        path = pk.launch.get("path") or ("portable-fma" if opts.dot == "fma" else "portable-mma")
        out.append(LoweredKernel(pk.name, program.name, "tile", pk.group.index, builder, params,
                                 pk.launch, pk.storage, pk.launch["scratch_bytes_per_cta"],
                                 path, info, report))
    return out


def hbm_bytes_per_token(group: KernelGroup) -> float | None:
    """Bytes the kernel moves to/from global memory per token and value head: the sum of
    kda-partition's ``kda.hbm_bytes_per_token`` over its scans, carried into the manifest so
    that ``kdagen bench --kernels`` can set measured times against bytes. None when a scan
    has no count (pipelines without kda-partition)."""
    counts = [s.attrs.get("kda.hbm_bytes_per_token") for s in group.scans]
    if not counts or any(c is None for c in counts):
        return None
    return float(sum(counts))


def native_path(target: Target | None):
    """The target's native lowering path (a module of :data:`NATIVE_PATHS`), or None when it
    has none (yet)."""
    return next((p for p in NATIVE_PATHS if p.supports_target(target)), None)


def _mode_counts(plan: StoragePlan) -> dict:
    out: dict = {}
    for m in plan.modes.values():
        out[m] = out.get(m, 0) + 1
    return out
