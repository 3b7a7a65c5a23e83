"""Write lowered programs into a kernel bundle (PTX + cubin + manifest) for the runtime.

``write_bundle(out_dir, programs_with_options, targets)`` builds each program, runs
``kda-stable-reassociate``, lowers it (kernel.py), lowers every kernel to PTX per chip,
assembles it with ptxas (cubin + register/spill report) and writes:

- ``<kernel>.<chip>.ptx`` / ``.cubin`` and one manifest entry per (kernel, chip) in
  ``manifest.json`` (kdagen.bundle format: params in launch order, launch = grid rule, block,
  dynamic shared memory, plus ``kind``, ``order``, ``storage``, ``scratch_bytes_per_cta``);
- ``lowered.json``: per program *variant* (a program with its options) the kernel names in
  launch order, the program arguments (name, role, layout, heads, dtype, trailing shape), the
  workspaces and the options — what ``launch.py`` needs to run the variant with no MLIR.

An existing manifest in ``out_dir`` is kept and extended (entries of the same kernel and chip
are replaced), unless ``replace=True`` (what ``kdagen emit`` does): then the folder ends up
holding exactly the new bundle, the kernel files of the earlier one removed
(:class:`kdagen.bundle.BundleFiles`). The schema of both files: :mod:`kdagen.bundle` (also
written into each bundle as README.md).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from kdagen.bundle import LOWERED, MANIFEST, BundleFiles, KernelEntry, Manifest, read_manifest

__all__ = ["write_bundle", "variant_name", "LOWERED"]


def variant_name(program: str, options: dict, lower: dict | None = None) -> str:
    """A readable, unique name for a program with options (K, V, C, gate, GVA, varlen, the
    matrix-product path when not the default + a hash of everything)."""
    o = dict(options)
    lower = dict(lower or {})
    K = o.get("head_k_dim", 128)
    V = o.get("head_v_dim", 128)
    C = o.get("chunk_size", 64)
    gate = o.get("gate") or ("softplus" if program.startswith("kda") else "gdn_softplus")
    parts = [program, f"K{K}V{V}C{C}", str(gate), f"r{o.get('gva_ratio', 1)}"]
    if o.get("varlen"):
        parts.append("varlen")
    if lower.get("dot", "fma") != "fma":
        parts.append(lower["dot"])
    if lower.get("pipeline") == "chip":
        parts.append("part")
    if lower.get("path", "portable") != "portable":
        parts.append(lower["path"])
    key = json.dumps([o, lower] if lower else o, sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    parts.append(digest)
    return "_".join(parts)


def _normalise(item) -> tuple[str, dict, dict, str | None]:
    """(program, program options, lowering options, variant name or None)."""
    if isinstance(item, dict):
        return (item["program"], dict(item.get("options", {})), dict(item.get("lower", {})),
                item.get("name"))
    if isinstance(item, (tuple, list)):
        program, options = item[0], dict(item[1]) if len(item) > 1 else {}
        lower = dict(item[2]) if len(item) > 2 and isinstance(item[2], dict) else {}
        name = item[3] if len(item) > 3 else (item[2] if len(item) > 2 and isinstance(item[2], str)
                                               else None)
        return program, options, lower, name
    return str(item), {}, {}, None


_NATIVE_PATHS = ("sm90-native",)


def _taken_tag(tag: dict, target) -> dict:
    """The variant-name tag of the lowering ``target`` takes: ``path=native`` is dropped on a
    chip without a native path (its kernels are the portable ones)."""
    if tag.get("path") != "native":
        return tag
    from kdagen.codegen.sm90.native import native_supported
    return tag if native_supported(target) else {k: v for k, v in tag.items() if k != "path"}


def _name_after_path(kernel, program: str, options: dict, tag: dict) -> None:
    """Rename a kernel whose name claims the native path it did not take (the global
    reduction kernels of a native variant) to its portable name, when the rename is safe."""
    if tag.get("path") != "native" or kernel.path in _NATIVE_PATHS:
        return
    old_prefix = variant_name(program, options, tag)
    if not kernel.name.startswith(old_prefix + "__"):
        return
    portable = {k: v for k, v in tag.items() if k != "path"}
    new = variant_name(program, options, portable) + kernel.name[len(old_prefix):]
    rename_kernel(kernel, new)


def rename_kernel(kernel, new: str) -> bool:
    """Rename a lowered kernel (its gpu.func and gpu.module symbols) before it is lowered to
    PTX; returns False (name unchanged) when the old name is referenced elsewhere."""
    from kdagen._mlir import ir
    old = kernel.name
    module = kernel.module
    with kernel.builder.context:
        renamed = []
        for gmod in module.body.operations:
            gop = gmod.operation
            if "sym_name" in gop.attributes and ir.StringAttr(gop.attributes["sym_name"]).value \
                    == f"{old}_module":
                renamed.append((gop, f"{new}_module"))
                for fn in gop.regions[0].blocks[0].operations:
                    fop = fn.operation
                    if "sym_name" in fop.attributes and \
                            ir.StringAttr(fop.attributes["sym_name"]).value == old:
                        renamed.append((fop, new))
        if len(renamed) != 2:
            return False
        for op, name in renamed:
            op.attributes["sym_name"] = ir.StringAttr.get(name)
        if f"@{old}" in str(module):      # referenced by name somewhere else: undo
            for (op, _), old_name in zip(renamed, (f"{old}_module", old)):
                op.attributes["sym_name"] = ir.StringAttr.get(old_name)
            return False
    kernel.name = new
    return True


# What `kdagen emit`, the runtime's compile-on-demand and the API bundles use: the chip's full
# pass pipeline (partitioned chunk-parallel + state kernels, warp-specialisation annotations),
# tensor-core matrix products with ~fp32 accuracy (bf16x3), and the chip's native path where
# kdagen has one (sm_90a: TMA producer + wgmma consumers), the portable path elsewhere.
DEFAULT_LOWERING = {"path": "native", "dot": "bf16x3", "pipeline": "chip"}


def build_lowered_module(program: str, options: dict, pipeline: str = "stable",
                         chip: str | None = None):
    """build_program + the passes before lowering: ``pipeline="stable"``:
    kda-stable-reassociate only (one kernel per scan, chunks in sequence); ``"chip"``: the
    chip's full pipeline (kdagen.passes.pipelines: partition into chunk-parallel + state
    kernels, warp-specialize annotations); or any pipeline text for parse_pipeline."""
    from kdagen._mlir import ir
    from kdagen.ir.programs import build_program
    from kdagen.passes.base import parse_pipeline
    from kdagen.passes.pipeline import run_pipeline
    module = build_program(program, **options)
    with module.context, ir.Location.unknown():
        if pipeline == "stable":
            passes = parse_pipeline("kda-stable-reassociate")
        elif pipeline == "chip":
            from kdagen.passes.pipelines import pipeline_for
            passes = pipeline_for(chip or "sm_90a")
        else:
            passes = parse_pipeline(pipeline)
        run_pipeline(module, passes)
    return module


def write_bundle(out_dir, programs_with_options, targets, *, lower_options=None,
                 assemble: bool = True, verbose: bool = False, pipeline: str = "stable",
                 progress=None, replace: bool = False) -> dict:
    """Lower programs for ``targets`` into the bundle folder ``out_dir``.

    ``programs_with_options``: items ``"kda_fwd"``, ``("kda_fwd", {options})``,
    ``("kda_fwd", {options}, {lowering options})`` (fields of kernel.LowerOptions, e.g.
    ``{"dot": "bf16x3"}``, plus ``"pipeline"`` to override ``pipeline`` for the item), optionally a 4th element ``"variant name"``, or dicts
    ``{"program", "options", "lower", "name"}``. ``lower_options`` applies to every item
    (item values win).
    ``targets``: chip names or `Target`s. Returns the ``lowered.json`` content plus a
    ``"report"`` list (kernel, chip, registers, spills, storage, bytes).

    ``replace``: write a new bundle in place of the folder's earlier one (its kernel files
    not in the new manifest are removed) instead of extending it.

    ``progress``: optional ``progress(event, **info)`` callback: ``"steps"`` (``total``: the
    number of (variant, chip) steps), ``"lowering"`` (``program``, ``variant``, ``chip``, at the
    start of a step), ``"lowered"`` (``count``: kernels of the step), ``"kernel"`` (``row``:
    its report row, after each kernel is written) and ``"step_done"``.

    Kernel names are ``<prefix>__k<i>_<label>`` where the prefix is the variant name with the
    tags of the lowering each kernel actually took: a variant asking for the native path
    (``path=native``) names only the kernels that took it ``..._native_...``; its portable
    kernels (chips without a native path, global reduction kernels) get the name the same
    kernel has in a portable variant.
    """
    from kdagen.codegen import ptxas as ptxas_mod
    from kdagen.codegen.target import Target, get_target
    from kdagen.table import chip_rank
    from kdagen.version import __version__, source_hash

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tgts = [t if isinstance(t, Target) else get_target(t) for t in targets]
    ptxas = None
    version = None
    if assemble:
        try:
            ptxas = ptxas_mod.find_ptxas()
            version = ptxas_mod.ptxas_version(ptxas)
        except ptxas_mod.PtxasNotFound:
            ptxas = None
    files = BundleFiles(out, replace=replace)
    if not replace and (out / MANIFEST).is_file():
        manifest = read_manifest(out)
        manifest.ptxas_version = version or manifest.ptxas_version
    else:
        manifest = Manifest(kdagen_version=__version__, source_hash=source_hash(),
                            ptxas_version=version)
    lowered_path = out / LOWERED
    lowered = json.loads(lowered_path.read_text()) if lowered_path.is_file() and not replace \
        else {"variants": {}}
    with files:
        report = _write_variants(out, files, manifest, lowered, programs_with_options, tgts,
                                 lower_options, ptxas, verbose, pipeline, progress)
        manifest.kernels.sort(key=lambda e: (e.name, chip_rank(e.chip)))
        files.write(LOWERED, json.dumps(lowered, indent=2, sort_keys=True, default=str) + "\n")
        files.write_readme()
        files.write(MANIFEST, manifest.to_json())
    files.commit()
    return {**lowered, "report": report}


def _write_variants(out, files, manifest, lowered, programs_with_options, tgts, lower_options,
                    ptxas, verbose, pipeline, progress) -> list[dict]:
    from kdagen.codegen import ptxas as ptxas_mod
    from kdagen.codegen.to_ptx import lower_to_ptx

    from .kernel import lower_program, workspace_specs
    from .program import read_program

    report = []
    from .kernel import LowerOptions
    base_lower = {}
    if lower_options is not None:
        base_lower = dict(vars(lower_options)) if isinstance(lower_options, LowerOptions) \
            else dict(lower_options)
    items = [_normalise(item) for item in programs_with_options]
    notify = progress or (lambda event, **info: None)
    notify("steps", total=len(items) * len(tgts))
    for program, options, lower, vname in items:
        lower = {**base_lower, **lower}
        item_pipeline = lower.pop("pipeline", pipeline)
        lopts = LowerOptions(**lower)
        tag = {k: v for k, v in lower.items() if getattr(LowerOptions(), k) != v}
        if item_pipeline != "stable":
            tag["pipeline"] = item_pipeline
        named = vname is not None
        vname = vname or variant_name(program, options, tag)
        module = build_lowered_module(program, options, item_pipeline, tgts[0].chip)
        prog = read_program(module)
        spec = {
            "program": program,
            "options": options,
            "attrs": {k: v for k, v in prog.attrs.items()},
            "family": prog.attrs.get("family"),
            "chunk_size": prog.chunk_size,
            "gva_ratio": prog.gva_ratio,
            "varlen": prog.varlen,
            "args": [dict(name=a.name, role=a.role, layout=a.layout, heads=a.heads, dtype=a.elt,
                          tail=list(a.tail), default=a.default) for a in prog.args],
            "workspaces": workspace_specs(prog),
            "kernels": [],
            "chips": {},
            "lower": dict(vars(lopts)),
            "pipeline": item_pipeline,
            "chip_workspaces": {},
        }
        for target in tgts:
            notify("lowering", program=program, variant=vname, chip=target.chip)
            if item_pipeline == "chip" and target is not tgts[0]:
                module = build_lowered_module(program, options, item_pipeline, target.chip)
            spec["chip_workspaces"][target.chip] = workspace_specs(read_program(module))
            prefix = vname if named else variant_name(program, options,
                                                      _taken_tag(tag, target))
            kernels = lower_program(module, target, name=prefix, options=lopts)
            if not named:
                for k in kernels:
                    _name_after_path(k, program, options, tag)
            notify("lowered", count=len(kernels))
            names = []
            for k in kernels:
                k.builder.verify()
                ptx = lower_to_ptx(k.module, target)
                if "__nv_" in ptx:
                    raise RuntimeError(f"{k.name}: PTX calls libdevice ({target.chip})")
                stem = f"{k.name}.{target.chip}"
                files.write(f"{stem}.ptx", ptx)
                entry = KernelEntry(name=k.name, chip=target.chip, path=k.path,
                                    ptx_file=f"{stem}.ptx", params=k.param_dicts(),
                                    launch=dict(k.launch))
                row = dict(kernel=k.name, chip=target.chip, path=k.path, program=program,
                           variant=vname, options=dict(options),
                           short=k.name.split("__", 1)[-1], storage=k.storage,
                           tile_bytes=k.launch.get("tile_bytes", 0),
                           dynamic_shared_memory=k.launch.get("dynamic_shared_memory", 0))
                if ptxas:
                    res = ptxas_mod.assemble(ptx, target.chip, ptxas)
                    if not res.ok:
                        raise RuntimeError(f"ptxas failed for {k.name} on {target.chip}:\n{res.log}")
                    if res.cubin:
                        files.write(f"{stem}.cubin", res.cubin)
                        entry.cubin_file = f"{stem}.cubin"
                    r = res.resources.get(k.name)
                    if r is not None:
                        entry.resources = asdict(r)
                        row.update(registers=r.registers, spill_stores=r.spill_stores,
                                   spill_loads=r.spill_loads, stack_bytes=r.stack_bytes)
                manifest.kernels = [e for e in manifest.kernels
                                    if not (e.name == k.name and e.chip == target.chip)]
                manifest.kernels.append(entry)
                names.append(k.name)
                report.append(row)
                if verbose:
                    print(row, flush=True)
                notify("kernel", row=row)
            spec["chips"][target.chip] = names
            notify("step_done")
            spec["kernels"] = names
        lowered["variants"][vname] = spec
    return report


# The variants the GPU check covers by default (kda/gdn, fwd/bwd, K = V = 64/128, both gate
# forms, GVA, varlen, fp16, without initial state).
TC = {"dot": "bf16x3"}          # tensor cores, operands split in bf16 hi + lo
PART = {"dot": "bf16x3", "pipeline": "chip"}   # + the chip's pipeline: partitioned kernels
NATIVE = {"dot": "bf16x3", "pipeline": "chip", "path": "native"}   # sm_90a: TMA + wgmma + WS
NATIVE_SET = [
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True), NATIVE),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="softplus"), NATIVE),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", dtype="fp16",
                     use_initial_state=False), NATIVE),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), NATIVE),
    ("kda_bwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound"), NATIVE),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True), NATIVE),
    ("gdn_bwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), NATIVE),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus"), NATIVE),
]
DEFAULT_SET = [
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True), PART),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus"), PART),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus"), PART),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus")),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound"), TC),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound"), {"dot": "bf16"}),
    ("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound", gva_ratio=2, varlen=True), TC),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", gva_ratio=2, varlen=True), TC),
    ("kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound", gva_ratio=2, varlen=True)),
    ("kda_fwd", dict(head_k_dim=64, head_v_dim=64, gate="lower_bound", dtype="fp16",
                     use_initial_state=False)),
    ("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound", gva_ratio=2, varlen=True)),
    ("gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")),
    ("kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus", gva_ratio=2, varlen=True)),
    ("gdn_bwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_lower_bound")),
    ("kda_bwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound")),
]


def main(argv=None) -> int:
    """``python -m kdagen.codegen.lower.bundle OUT [--chips sm_90a,...] [--quick]``: write the
    default variant set (DEFAULT_SET) for the GPU check."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--chips", default="sm_90a")
    ap.add_argument("--quick", action="store_true", help="forward variants only")
    ap.add_argument("--set", default="default", choices=["default", "native"],
                    help="default: the portable variants (DEFAULT_SET); native: the sm_90a "
                         "native-path variants (NATIVE_SET)")
    ap.add_argument("--pipeline", default="stable", choices=["stable", "chip"],
                    help="stable: kda-stable-reassociate only; chip: the chip's full pipeline "
                         "(partitioned chunk-parallel + state kernels)")
    args = ap.parse_args(argv)
    chosen = NATIVE_SET if args.set == "native" else DEFAULT_SET
    items = [it for it in chosen if not (args.quick and it[0].endswith("_bwd"))]
    built = []
    for it in items:
        try:
            build_lowered_module(it[0], it[1])
            built.append(it)
        except Exception as exc:  # noqa: BLE001 - e.g. a backward that does not derive yet
            print(f"skipping {it[0]} {it[1]}: {type(exc).__name__}: {exc}")
    res = write_bundle(args.out, built, args.chips.split(","), verbose=True, pipeline=args.pipeline)
    print(f"wrote {len(res['variants'])} variants, {len(res['report'])} kernels to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
