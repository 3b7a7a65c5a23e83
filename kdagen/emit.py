"""`kdagen emit`: build kernels for each chip, lower to PTX, assemble, and write a bundle.

Two kinds of kernels, both compiled by the driver (:mod:`kdagen.driver`):
- the programs (kda_fwd, kda_bwd, gdn_fwd, gdn_bwd): built from the DSL, run through the
  chip's pipeline and lowered, written by :func:`kdagen.bundle_writer.write_bundle`
  (``emit_programs``);
- the first hand-assembled kernel of the foundation issue, the KDA gate + chunk cumsum, kept as
  the smallest end-to-end check of the emitter → PTX → driver path (``emit_bundle``: the
  driver's ``ptx`` and ``cubin`` stages of its gpu module).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .bundle_writer import DEFAULT_LOWERING, write_bundle
from .codegen import ptxas as ptxas_mod
from .codegen.common.kernel import GpuModuleBuilder
from .codegen.kernels.gate_cumsum import GateCumsumSpec, build_gate_cumsum
from .driver import assemble_ptx, ptx_of
from .head_dims import KEY_DIMS, variant_head_dims
from .ir.gates import get_gate
from .runtime.bundle import MANIFEST, BundleFiles, KernelEntry, Manifest
from .table import chip_rank
from .target import Target
from .version import __version__, source_hash

#: head dims ``--head-dim`` takes: K = V = the dim, except that V stops at the largest value
#: dim the chip's programs take at that K (kdagen.head_dims.variant_head_dims): K = V = 256
#: runs on the K = 256, V = 128 kernels in two value parts (sm_120a: V = 64, four)
SUPPORTED_HEAD_DIMS = KEY_DIMS
OPS = {"kda": ("kda_fwd", "kda_bwd"), "gdn": ("gdn_fwd", "gdn_bwd")}
DEFAULT_GATES = {"kda": "softplus", "gdn": "gdn_softplus"}


@dataclass
class EmittedKernel:
    entry: KernelEntry
    assembled: bool | None          # None: ptxas not available
    log: str


def head_dim_list(head_dim) -> list[int]:
    """``128``, ``"64,128"`` or ``[64, 128]`` -> sorted unique supported head dims."""
    if isinstance(head_dim, str):
        items = [h.strip() for h in head_dim.split(",") if h.strip()]
    elif isinstance(head_dim, int):
        items = [head_dim]
    else:
        items = list(head_dim)
    dims = []
    for h in items:
        try:
            value = int(h)
        except (TypeError, ValueError):
            value = None
        if value not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim: {h} is not supported; choose from "
                             f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} (several: 64,128)")
        dims.append(value)
    if not dims:
        raise ValueError("head_dim: empty list; choose from "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    return sorted(set(dims))


def _kernel_specs(head_dim) -> list[GateCumsumSpec]:
    return [GateCumsumSpec(head_dim=h) for h in head_dim_list(head_dim)]


def emit_bundle(out_dir: str | Path, targets: list[Target], head_dim=128,
                progress=None) -> list[EmittedKernel]:
    """Emit every kernel for every target into ``out_dir`` (in place of the bundle an earlier
    emit left there); returns what was emitted. ``head_dim``: one or several head dims.
    ``progress``: the callback of :func:`kdagen.bundle_writer.write_bundle`."""
    notify = progress or (lambda event, **info: None)
    out = Path(out_dir)
    try:
        ptxas = ptxas_mod.find_ptxas()
        version = ptxas_mod.ptxas_version(ptxas)
    except ptxas_mod.PtxasNotFound:
        ptxas, version = None, None
    manifest = Manifest(kdagen_version=__version__, source_hash=source_hash(), ptxas_version=version)
    emitted: list[EmittedKernel] = []
    specs = _kernel_specs(head_dim)
    with BundleFiles(out, replace=True) as files:
        _emit_specs(files, manifest, emitted, specs, targets, ptxas, notify)
        manifest.kernels.sort(key=lambda e: (e.name, chip_rank(e.chip)))
        files.write_readme()
        files.write(MANIFEST, manifest.to_json())
    files.commit()
    return emitted


def _emit_specs(files, manifest, emitted, specs, targets, ptxas, notify) -> None:
    notify("steps", total=len(specs) * len(targets))
    for spec in specs:
        builder = GpuModuleBuilder()
        build_gate_cumsum(builder, spec)
        builder.verify()
        for target in targets:
            notify("lowering", program=spec.name, variant=spec.name, chip=target.chip)
            notify("lowered", count=1)
            ptx = ptx_of(builder.module, target, spec.name)
            stem = f"{spec.name}.{target.chip}"
            files.write(f"{stem}.ptx", ptx)
            entry = KernelEntry(name=spec.name, chip=target.chip, path="portable",
                                ptx_file=f"{stem}.ptx",
                                params=[asdict(p) for p in spec.params()], launch=spec.launch())
            assembled, log = None, "ptxas not found: PTX only"
            result = assemble_ptx(ptx, target.chip, ptxas)
            if result is not None:
                assembled, log = result.ok, result.log
                if result.cubin:
                    files.write(f"{stem}.cubin", result.cubin)
                    entry.cubin_file = f"{stem}.cubin"
                if spec.name in result.resources:
                    entry.resources = asdict(result.resources[spec.name])
            manifest.kernels.append(entry)
            emitted.append(EmittedKernel(entry, assembled, log))
            notify("kernel", row=dict(kernel=spec.name, chip=target.chip, path=entry.path,
                                      **gate_cumsum_names(spec.name), **_resource_cells(entry)))
            notify("step_done")


def gate_cumsum_names(name: str) -> dict:
    """Table cells of a gate+cumsum kernel: program, short kernel name, options, variant."""
    program, _, rest = name.partition("_K")
    head_dim = int(rest.split("_")[0]) if rest.split("_")[0].isdigit() else None
    options = dict(head_k_dim=head_dim, head_v_dim=head_dim) if head_dim else {}
    return dict(program=program, short="K" + rest if rest else name, options=options,
                variant=name)


def _resource_cells(entry: KernelEntry) -> dict:
    res = entry.resources or {}
    return {k: res[k] for k in ("registers", "spill_stores", "spill_loads", "stack_bytes")
            if k in res}


#: the value splits kdagen.decode.value_split chooses from at the built head dims (a decode
#: step's CTAs per sequence and head: 4 for few sequences, 2 for many)
DECODE_VALUE_SPLITS = (2, 4)
#: the state pools a decode bundle's kernels index themselves: fp32 or bf16 rows, each
#: [K, V] or value-first [V, K] (the decode program options state_dtype, state_v_first)
DECODE_POOL_STORAGE = ({}, dict(state_dtype="bf16"), dict(state_v_first=True),
                       dict(state_dtype="bf16", state_v_first=True))


def program_variants(ops: list[str], head_dim, gate, decode: bool = False,
                     residuals: bool = True, target=None) -> list[tuple[str, dict]]:
    """(program, options) for each requested op: forward and backward (with ``residuals`` also
    training's save_residuals pair; and with ``decode`` the
    op's decode program, plain and on each DECODE_POOL_STORAGE state pool, at each of
    DECODE_VALUE_SPLITS), at kdagen.head_dims.variant_head_dims of each head dim of
    ``head_dim`` (one or several) for ``target`` (None: the largest value dims). ``gate``: None (each op's default gate), a
    gate name, or several (a list or comma-separated): each gate's programs go to the ops of
    its family, so one bundle holds kernels for several gates. A user's gate carries its
    digest (``gate_digest``): the bundle's kernels are then tied to that version of it."""
    dims = head_dim_list(head_dim)
    for op in ops:
        if op not in OPS:
            raise ValueError(f"op: unknown op {op!r}; choose from {', '.join(OPS)} or all")
    names = gate.split(",") if isinstance(gate, str) else list(gate or [])
    names = [n.strip() for n in names if n.strip()]
    if not names:
        chosen = [(op, get_gate(DEFAULT_GATES[op])) for op in ops]
    else:
        chosen = []
        for name in names:
            gobj = get_gate(name)
            if gobj.family not in ops:
                raise ValueError(f"gate: {name!r} is a {gobj.family.upper()} gate; emit it with "
                                 f"--op {gobj.family} or --op all (see `kdagen list` for the "
                                 f"gates of each op)")
            chosen.append((gobj.family, gobj))
    out = []
    for op, gobj in chosen:
        for dim in dims:
            K, V = variant_head_dims(dim, target)
            options = dict(head_k_dim=K, head_v_dim=V, gate=gobj.name)
            if not gobj.builtin:
                options["gate_digest"] = gobj.digest
            out.extend((program, dict(options)) for program in OPS[op])
            if residuals:
                out.extend((program, dict(options, save_residuals=True)) for program in OPS[op])
            if decode:
                for parts in DECODE_VALUE_SPLITS:
                    split = dict(options, value_split=parts)
                    out.append((f"{op}_decode", split))
                    for stored in DECODE_POOL_STORAGE:
                        out.append((f"{op}_decode", dict(split, state_pool=True, **stored)))
    return out


def emit_programs(out_dir: str | Path, targets: list[Target], ops: list[str], head_dim=128,
                  gate=None, verbose: bool = False,
                  path: str = "native", progress=None, replace: bool = True,
                  dump_dir=None, timing: dict | None = None, decode: bool = False,
                  residuals: bool = True, lower: dict | None = None) -> list[dict]:
    """Lower the programs of ``ops`` for every target into the bundle ``out_dir``; returns the
    per-kernel report rows (kernel, chip, path, program, variant, registers, spills, shared
    memory). ``path``: "native" (the chip's own path where kdagen has one, else portable) or
    "portable" (mma.sync + FMA, valid on every chip). ``head_dim``: one or several (one
    variant per program and head dim). ``replace``: the new bundle takes the place of the
    folder's earlier one (its stale kernel files removed); else it is extended.
    ``progress``, ``dump_dir`` (every stage of every compilation): see
    :func:`kdagen.bundle_writer.write_bundle`; ``timing`` (a dict) receives its seconds per
    stage. ``lower``: lowering options over the defaults (``kdagen emit --lower``)."""
    lowering = dict(DEFAULT_LOWERING, path=path, **(lower or {}))
    # chips whose programs take other head dims (sm_120a at K = 256: V = 64) go into the
    # bundle in a pass of their own
    groups: dict = {}
    for t in targets:
        groups.setdefault(tuple(variant_head_dims(d, t) for d in head_dim_list(head_dim)),
                          []).append(t)
    report = []
    for i, chips in enumerate(groups.values()):
        result = write_bundle(out_dir, program_variants(ops, head_dim, gate, decode, residuals,
                                                        chips[0]),
                              chips, verbose=verbose, lower_options=lowering,
                              progress=progress, replace=replace and i == 0,
                              dump_dir=dump_dir)
        report.extend(result["report"])
        if timing is not None:
            for k, v in result["timing"].items():
                timing[k] = timing.get(k, 0) + v if isinstance(v, float) else v
    return report
