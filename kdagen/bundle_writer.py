"""Write compiled programs into a kernel bundle (PTX + cubin + manifest) for the runtime.

``write_bundle(out_dir, programs_with_options, targets)`` compiles each program variant for
each chip through the driver (:class:`kdagen.driver.Compilation`: the program, the passes, the
lowering, PTX, ptxas) and writes:

- ``<kernel>.<chip>.ptx`` / ``.cubin`` and one manifest entry per (kernel, chip) in
  ``manifest.json`` (params in launch order, launch = grid rule, block, dynamic shared memory,
  plus ``kind``, ``order``, ``storage``, ``scratch_bytes_per_cta``, ``hbm_bytes_per_token``
  of partitioned kernels; ``cost``: the lowering's static cost report,
  :mod:`kdagen.codegen.lower.cost_model`);
- ``lowered.json``: per program *variant* (a program with its options) the kernel names in
  launch order, the program arguments (name, role, layout, heads, dtype, trailing shape), the
  workspaces and the options — what :mod:`kdagen.runtime.launch` needs to run the variant
  with no MLIR.

An existing manifest in ``out_dir`` is kept and extended (entries of the same kernel and chip
are replaced), unless ``replace=True`` (what ``kdagen emit`` does): then the folder ends up
holding exactly the new bundle, the kernel files of the earlier one removed
(:class:`kdagen.runtime.bundle.BundleFiles`). The schema of both files:
:mod:`kdagen.runtime.bundle` (also written into each bundle as README.md).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from kdagen._mlir import ir
from kdagen.codegen import ptxas as ptxas_mod
from kdagen.codegen.lower.emitter import workspace_specs
from kdagen.codegen.lower.kernel import native_path
from kdagen.codegen.lower.options import LowerOptions
from kdagen.codegen.lower.program import read_program
from kdagen.codegen.backend_pool import BackendPool, compile_jobs
from kdagen.driver import DEFAULT_LOWERING, Compilation, finish_backends, submit_backend
from kdagen.runtime.bundle import (LOWERED, MANIFEST, BundleFiles, KernelEntry, Manifest,
                                   read_manifest, variant_name)
from kdagen.table import chip_rank
from kdagen.target import Target, get_target
from kdagen.version import __version__, source_hash

__all__ = ["write_bundle", "rename_kernel", "DEFAULT_LOWERING"]


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
    return tag if native_path(target) else {k: v for k, v in tag.items() if k != "path"}


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


def write_bundle(out_dir, programs_with_options, targets, *, lower_options=None,
                 assemble: bool = True, verbose: bool = False, pipeline: str = "stable",
                 progress=None, replace: bool = False, dump_dir=None) -> dict:
    """Lower programs for ``targets`` into the bundle folder ``out_dir``.

    ``programs_with_options``: items ``"kda_fwd"``, ``("kda_fwd", {options})``,
    ``("kda_fwd", {options}, {lowering options})`` (fields of kdagen.codegen.lower.options.LowerOptions, e.g.
    ``{"dot": "bf16x3"}``, plus ``"pipeline"`` to override ``pipeline`` for the item), optionally a 4th element ``"variant name"``, or dicts
    ``{"program", "options", "lower", "name"}``. ``lower_options`` applies to every item
    (item values win).
    ``targets``: chip names or `Target`s. Returns the ``lowered.json`` content plus a
    ``"report"`` list (kernel, chip, registers, spills, storage, bytes) and ``"timing"``
    (seconds: ``passes``, ``lowering`` (to gpu/nvvm), ``llvm`` and ``ptxas`` summed over
    kernels (in ``workers`` processes, started as each kernel is lowered, so they overlap the
    front stages), ``backend_wall`` (the wait for them after the last lowering), ``total``).

    ``replace``: write a new bundle in place of the folder's earlier one (its kernel files
    not in the new manifest are removed) instead of extending it.

    ``dump_dir``: also write every stage of every (variant, chip) compilation there
    (``<dump_dir>/<variant>.<chip>/<NN>-<stage>.mlir|.ptx|.txt``, :mod:`kdagen.driver`).

    ``progress``: optional ``progress(event, **info)`` callback: ``"steps"`` (``total``: the
    number of (variant, chip) steps), ``"lowering"`` (``program``, ``variant``, ``chip``, at the
    start of a step's passes and lowering), ``"backend"`` (``count``: every kernel's PTX and
    cubin now run, in worker processes), then per step ``"lowered"`` (``count``: kernels of the
    step), ``"kernel"`` (``row``: its report row, with ``llvm_s``/``ptxas_s``, after each
    kernel is written) and ``"step_done"``.

    Kernel names are ``<prefix>__k<i>_<label>`` where the prefix is the variant name with the
    tags of the lowering each kernel actually took: a variant asking for the native path
    (``path=native``) names only the kernels that took it ``..._native_...``; its portable
    kernels (chips without a native path, global reduction kernels) get the name the same
    kernel has in a portable variant.
    """
    wall = time.perf_counter()
    timing = dict(passes=0.0, lowering=0.0, llvm=0.0, ptxas=0.0, backend_wall=0.0,
                  workers=compile_jobs())
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
    with files, BackendPool() as pool:
        report = _write_variants(out, files, manifest, lowered, programs_with_options, tgts,
                                 lower_options, ptxas, verbose, pipeline, progress, dump_dir,
                                 timing, pool)
        manifest.kernels.sort(key=lambda e: (e.name, chip_rank(e.chip)))
        files.write(LOWERED, json.dumps(lowered, indent=2, sort_keys=True, default=str) + "\n")
        files.write_readme()
        files.write(MANIFEST, manifest.to_json())
    files.commit()
    timing["total"] = time.perf_counter() - wall
    return {**lowered, "report": report, "timing": timing}


def _write_variants(out, files, manifest, lowered, programs_with_options, tgts, lower_options,
                    ptxas, verbose, pipeline, progress, dump_dir, timing, pool) -> list[dict]:
    report = []
    base_lower = {}
    if lower_options is not None:
        base_lower = dict(vars(lower_options)) if isinstance(lower_options, LowerOptions) \
            else dict(lower_options)
    items = [_normalise(item) for item in programs_with_options]
    notify = progress or (lambda event, **info: None)
    notify("steps", total=len(items) * len(tgts))
    pending = []       # (compilation, target, program, options, variant, spec) after lowering
    submitted = []     # their backends, started on the pool as each one is lowered
    for program, options, lower, vname in items:
        lower = {**base_lower, **lower}
        item_pipeline = lower.pop("pipeline", pipeline)
        lopts = LowerOptions(**lower)
        tag = {k: v for k, v in lower.items() if getattr(LowerOptions(), k) != v}
        if item_pipeline != "stable":
            tag["pipeline"] = item_pipeline
        named = vname is not None
        vname = vname or variant_name(program, options, tag)
        spec = None
        shared = None        # a pipeline that does not depend on the chip runs once

        def name_kernels(kernels):
            for k in kernels:
                _name_after_path(k, program, options, tag)

        for target in tgts:
            notify("lowering", program=program, variant=vname, chip=target.chip)
            prefix = vname if named else variant_name(program, options,
                                                      _taken_tag(tag, target))
            comp = Compilation(program, options, target.chip, pipeline=item_pipeline,
                               lower=lower, name=prefix, module=shared, ptxas=ptxas or False,
                               keep_stages=dump_dir is not None,
                               name_kernels=None if named else name_kernels)
            comp.run("gpu")
            prog = read_program(comp.module)
            if spec is None:
                spec = _variant_spec(program, options, prog, lopts, item_pipeline)
            if not str(item_pipeline).startswith("chip"):     # a chip pipeline binds the chip
                shared = comp.module
            spec["chip_workspaces"][target.chip] = workspace_specs(prog)
            pending.append((comp, target, program, options, vname, spec))
            submitted.append(submit_backend(comp, pool))
        lowered["variants"][vname] = spec
    # every kernel's PTX and cubin at once: LLVM and ptxas spread over worker processes
    notify("backend", count=sum(len(p[0].kernels) for p in pending))
    start = time.perf_counter()
    finish_backends(pool, submitted)
    timing["backend_wall"] = time.perf_counter() - start
    for comp, *_ in pending:
        timing["passes"] += comp.seconds.get("passes", 0.0)
        timing["lowering"] += comp.seconds.get("lowering", 0.0)
        timing["llvm"] += sum(s[0] for s in comp.backend_seconds.values())
        timing["ptxas"] += sum(s[1] for s in comp.backend_seconds.values())
    for comp, target, program, options, vname, spec in pending:
        notify("lowered", count=len(comp.kernels))
        names = []
        for k in comp.kernels:
            stem = f"{k.name}.{target.chip}"
            files.write(f"{stem}.ptx", comp.ptx[k.name])
            entry = KernelEntry(name=k.name, chip=target.chip, path=k.path,
                                ptx_file=f"{stem}.ptx", params=k.param_dicts(),
                                launch=dict(k.launch), cost=k.cost)
            row = dict(kernel=k.name, chip=target.chip, path=k.path, program=program,
                       variant=vname, options=dict(options),
                       short=k.name.split("__", 1)[-1], storage=k.storage,
                       tile_bytes=k.launch.get("tile_bytes", 0),
                       dynamic_shared_memory=k.launch.get("dynamic_shared_memory", 0))
            if k.cost is not None:
                row.update(cost_us=k.cost["estimate"]["us"], cost_unit=k.cost["unit"])
            if k.name in comp.backend_seconds:
                row.update(llvm_s=round(comp.backend_seconds[k.name][0], 2),
                           ptxas_s=round(comp.backend_seconds[k.name][1], 2))
            res = comp.assembled.get(k.name)
            if res is not None:
                if not res.ok:
                    raise RuntimeError(f"ptxas failed for {k.name} on {target.chip}:\n{res.log}")
                sass = None
                if res.cubin:
                    files.write(f"{stem}.cubin", res.cubin)
                    entry.cubin_file = f"{stem}.cubin"
                    mix = comp.sass_mix(k.name)    # None without nvdisasm
                    if mix is not None:
                        sass = mix["instructions"]
                r = res.resources.get(k.name)
                if r is not None:
                    entry.resources = asdict(r)
                    row.update(registers=r.registers, spill_stores=r.spill_stores,
                               spill_loads=r.spill_loads, stack_bytes=r.stack_bytes)
                    if sass is not None:
                        # the SASS listing's length (kdagen.codegen.sass): what each thread of
                        # a fully unrolled (register-tile) kernel executes
                        entry.resources["sass_instructions"] = sass
                        row.update(sass_instructions=sass)
            manifest.kernels = [e for e in manifest.kernels
                                if not (e.name == k.name and e.chip == target.chip)]
            manifest.kernels.append(entry)
            names.append(k.name)
            report.append(row)
            if verbose:
                print(row, flush=True)
            notify("kernel", row=row)
        if dump_dir is not None:
            comp.dump(Path(dump_dir) / f"{vname}.{target.chip}")
        spec["chips"][target.chip] = names
        notify("step_done")
        spec["kernels"] = names
    return report


def _variant_spec(program: str, options: dict, prog, lopts: LowerOptions, pipeline: str) -> dict:
    """The lowered.json entry of a variant (its kernels and chips filled in as they come)."""
    return {
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
        "pipeline": pipeline,
        "chip_workspaces": {},
    }
