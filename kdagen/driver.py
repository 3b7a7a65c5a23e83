"""The compile driver: one program variant compiled for one chip, in named stages.

Stages, in order (each one's output kept, as text, and dumpable)::

    kda        the program as the DSL built it (kda dialect)
    <pass>     the module after each pass of the pipeline, by the pass's name
               (kda-bind-target, verify, kda-stable-reassociate, kda-partition, ...)
    gpu        the kernels lowered to gpu + nvvm + llvm dialects (one gpu.module each)
    cost       the static cost report the lowering counted while emitting them (per chunk
               step or per CTA, with the latency model's estimate: kdagen.codegen.lower.cost,
               cost_model); text only, the kernels are unchanged
    ptx        their PTX
    cubin      ptxas's assembly of the PTX (the stage's text is ptxas's report)

Every entry point compiles through here: ``kdagen emit`` and the bundles it writes
(:mod:`kdagen.bundle_writer`), compile-on-demand (:mod:`kdagen.compiler_hooks`) and
``kdagen show --stage``. The ``gpu``/``ptx``/``cubin`` stages of a hand-built gpu module (the
gate+cumsum kernel) are :func:`ptx_of` and :func:`assemble_ptx`.

``pipeline``: ``"chip"`` (the chip's pipeline, :func:`kdagen.passes.pipelines.pipeline_for`:
it binds the target on the module first), ``"stable"`` (``kda-stable-reassociate`` only: one
kernel per scan, chunks in sequence), or any pipeline text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kdagen._mlir import ir
from kdagen.codegen import ptxas as ptxas_mod
from kdagen.codegen import sass as sass_mod
from kdagen.codegen import to_ptx
from kdagen.codegen.backend_pool import BackendJob, BackendPool, LibdeviceCallError
from kdagen.codegen.lower.cost_model import (SASS_NS_PER_INSTRUCTION, format_reports,
                                             sass_estimate)
from kdagen.codegen.lower import register_tiles
from kdagen.codegen.lower.kernel import lower_program
from kdagen.codegen.lower.options import LowerOptions
from kdagen.codegen.to_ptx import lower_to_ptx
from kdagen.ir.dialect import print_module
from kdagen.ir.programs import build_program
from kdagen.passes.base import ModulePass
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.pipelines import PIPELINES, pipeline_for
from kdagen.passes.registry import parse_pipeline
from kdagen.target import Target, get_target

__all__ = ["Compilation", "DEFAULT_LOWERING", "BACKEND_STAGES", "build_module", "pipeline_passes",
           "standin_lowering",
           "ptx_of", "assemble_ptx", "run_backends", "submit_backend", "finish_backends",
           "LibdeviceCallError"]

# What `kdagen emit`, the runtime's compile-on-demand and the API bundles use: the chip's full
# pass pipeline (partitioned chunk-parallel + state kernels, warp-specialisation annotations),
# tensor-core matrix products ("auto": TF32 operands, bf16x3 for the backward's adjoint decay
# products, whose differences the gate-parameter gradients sum; kdagen.codegen.lower.options.
# product_precision), and the chip's native path where kdagen has one (sm_90a: TMA producer +
# wgmma consumers), the portable path elsewhere.
DEFAULT_LOWERING = {"path": "native", "dot": "auto", "pipeline": "chip"}


def standin_lowering(chip: str, host: str = "sm_90a") -> dict:
    """The lowering (with ``"pipeline"``) that compiles, for ``host``, the kernels ``chip``
    would run: ``chip``'s own pipeline (its budgets, consumer warpgroups and workspace
    precisions, bound by kda-bind-target), the portable path (what a chip without a native
    path takes) and ``chip``'s shared-memory budget (``smem_reserve`` takes the difference).
    So a GPU of ``host`` checks what ``chip`` would run (``tools/check_bundle.py --set
    standin``); the plans match ``chip``'s own compile (tests/test_standin.py)."""
    guest, machine = get_target(chip), get_target(host)
    if guest.smem_per_block > machine.smem_per_block:
        raise ValueError(f"{chip} has more shared memory per block than {host}: its kernels "
                         f"cannot stand in on {host}")
    reserve = LowerOptions().smem_reserve + machine.smem_per_block - guest.smem_per_block
    return {"pipeline": ",".join(PIPELINES[chip]), "path": "portable",
            "dot": DEFAULT_LOWERING["dot"], "smem_reserve": reserve}


#: the stages after the passes
BACKEND_STAGES = ("gpu", "cost", "ptx", "cubin")


def pipeline_passes(pipeline: str, chip: str) -> list[ModulePass]:
    """The passes of ``pipeline`` for ``chip``: "chip" (the chip's pipeline), "stable", pipeline
    text, or "chip+PASS{KEY=VALUE,...}[+...]": the chip's pipeline with those passes' options
    set (an ablation of one pass option; every pass named must be in the chip's pipeline)."""
    if pipeline == "chip":
        return pipeline_for(chip)
    if pipeline.startswith("chip+"):
        passes = pipeline_for(chip)
        for override in parse_pipeline(pipeline[len("chip+"):].replace("+", ",")):
            at = [i for i, p in enumerate(passes) if p.name == override.name]
            if not at:
                raise ValueError(f"pipeline {pipeline!r}: {override.name!r} is not a pass of "
                                 f"{chip}'s pipeline ({', '.join(p.name for p in passes)})")
            for i in at:
                passes[i] = override
        return passes
    return parse_pipeline("kda-stable-reassociate" if pipeline == "stable" else pipeline)


def validate_pipeline(text: str, chip: str = "sm_90a") -> str:
    """``text`` if it names a pipeline :func:`pipeline_passes` builds for ``chip`` ("stable",
    "chip", "chip+PASS{KEY=VALUE}", pipeline text), else ValueError saying why."""
    if text not in ("stable", "chip"):
        pipeline_passes(text, chip)         # raises with the parser's message
    return text


def pipeline_argument(text: str) -> str:
    """The ``--pipeline`` argument of the bundle tools (an argparse ``type``): "stable", "chip"
    or "chip+PASS{KEY=VALUE}", checked against sm_90a's pipeline."""
    import argparse
    if text not in ("stable", "chip") and not text.startswith("chip+"):
        raise argparse.ArgumentTypeError(f"{text!r}: use stable, chip or chip+PASS{{KEY=VALUE}}")
    try:
        return validate_pipeline(text)
    except Exception as exc:   # noqa: BLE001 - the parser's message names the problem
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_module(program: str, options: dict, pipeline: str = "stable", chip: str = "sm_90a"):
    """The program after the passes of ``pipeline`` (the module that the lowering takes)."""
    return Compilation(program, options, chip, pipeline=pipeline, keep_stages=False).run_passes().module


def ptx_of(kernel_module, target: Target, name: str) -> str:
    """The ``ptx`` stage of one gpu module (verified libdevice-free)."""
    ptx = lower_to_ptx(kernel_module, target)
    if "__nv_" in ptx:
        raise LibdeviceCallError(f"{name}: PTX calls libdevice ({target.chip})")
    return ptx


def assemble_ptx(ptx: str, chip: str, ptxas: str | None) -> ptxas_mod.AssembleResult | None:
    """The ``cubin`` stage: ptxas on the PTX (None without ptxas)."""
    return ptxas_mod.assemble(ptx, chip, ptxas) if ptxas else None


@dataclass
class Stage:
    name: str
    text: str


@dataclass
class Compilation:
    """``program`` with ``options`` compiled for ``chip``, stage by stage.

    ``run(until)`` runs the stages up to ``until`` (a stage name; a pass name means its last
    occurrence in the pipeline) and keeps each one's output in :attr:`stages`
    (:meth:`output`, :meth:`dump`). ``module``: a module that already went through the
    pipeline (its front stages are then not run again). ``name_kernels(kernels)``: called
    after lowering, before the ``gpu`` stage is recorded (a bundle renames kernels there).
    ``ptxas``: the ptxas to assemble with (None: found on the machine; False: none).
    """
    program: str
    options: dict
    chip: str
    pipeline: str = "chip"
    lower: dict = field(default_factory=dict)
    name: str | None = None
    module: object = None
    ptxas: object = None
    keep_stages: bool = True
    name_kernels: object = None
    # pass instrumentation, as run_pipeline takes it
    dump_before: tuple = ()
    dump_after: tuple = ()
    time_passes: bool = False

    stages: list = field(default_factory=list, init=False)
    kernels: list = field(default_factory=list, init=False)
    ptx: dict = field(default_factory=dict, init=False)
    assembled: dict = field(default_factory=dict, init=False)
    _sass: dict = field(default_factory=dict, init=False)     # kernel -> its SASS mix (or None)
    pass_run: object = field(default=None, init=False)
    backend_seconds: dict = field(default_factory=dict, init=False)   # kernel -> (LLVM s, ptxas s)
    seconds: dict = field(default_factory=dict, init=False)   # "passes", "lowering": wall seconds
    _done: str | None = field(default=None, init=False)

    def __post_init__(self):
        self.target = get_target(self.chip)
        self.options = dict(self.options)
        self.lower = dict(self.lower)
        self._prebuilt = self.module is not None       # the front stages ran elsewhere
        self._passes = [] if self._prebuilt else pipeline_passes(self.pipeline, self.chip)

    @property
    def lower_options(self) -> LowerOptions:
        return LowerOptions(**{k: v for k, v in self.lower.items() if k != "pipeline"})

    # -- stage names ---------------------------------------------------------------------
    def stage_names(self) -> list[str]:
        front = [] if self._prebuilt else ["kda", *(p.name for p in self._passes)]
        return front + list(BACKEND_STAGES)

    def pass_names(self) -> list[str]:
        return [p.name for p in self._passes]

    # -- running -------------------------------------------------------------------------
    def run(self, until: str = "cubin") -> "Compilation":
        names = self.stage_names()
        if until not in names:
            raise ValueError(f"stage {until!r}: not a stage of this compilation; stages: "
                             f"{', '.join(dict.fromkeys(names))}")
        if self.module is None:
            self._front(until)
        if until in BACKEND_STAGES:
            self._gpu()
            if until == "cubin":
                run_backends([self])
            elif until != "gpu":
                self._cost()
                if until == "ptx":
                    self._ptx()
        return self

    def run_passes(self) -> "Compilation":
        """The front stages: the program and the whole pipeline (:attr:`module` after them)."""
        if self.module is None:
            self._front(self.stage_names()[-len(BACKEND_STAGES) - 1])
        return self

    def run_backend(self) -> "Compilation":
        """The ``cost``, ``ptx`` and ``cubin`` stages of the kernels that ``run("gpu")``
        lowered (kernels in parallel worker processes where that pays, :func:`run_backends`)."""
        run_backends([self])
        return self

    def _front(self, until: str) -> None:
        start = time.perf_counter()
        try:
            self._front_stages(until)
        finally:
            self.seconds["passes"] = self.seconds.get("passes", 0.0) + time.perf_counter() - start

    def _front_stages(self, until: str) -> None:
        self.module = build_program(self.program, **self.options)
        self._record("kda", lambda: print_module(self.module))
        passes = self._passes
        if until not in ("kda", *BACKEND_STAGES):
            names = self.pass_names()
            passes = passes[:len(names) - names[::-1].index(until)]
        elif until == "kda":
            passes = []
        # a pass that re-derives a backward creates modules: a default location is needed
        with self.module.context, ir.Location.unknown():
            self.pass_run = run_pipeline(
                self.module, passes, dump_before=tuple(self.dump_before),
                dump_after=tuple(self.dump_after), time_passes=self.time_passes,
                on_stage=lambda name, module: self._record(name, lambda: print_module(module)))

    def _gpu(self) -> None:
        opts = self.lower_options
        start = time.perf_counter()
        self.kernels = lower_program(self.module, self.target, name=self.name, options=opts)
        self.seconds["lowering"] = time.perf_counter() - start
        if self.name_kernels is not None:
            self.name_kernels(self.kernels)
        self._record("gpu", lambda: _join((k.name, str(k.module)) for k in self.kernels))

    def _cost(self) -> None:
        self._record("cost", lambda: format_reports(
            ((k.name, k.cost) for k in self.kernels if k.cost is not None),
            {k.name: k.launch.get("hbm_bytes_per_token") for k in self.kernels}))

    def _ptx(self) -> None:
        for k in self.kernels:
            k.builder.verify()
            self.ptx[k.name] = ptx_of(k.module, self.target, k.name)
        self._record("ptx", lambda: _join(self.ptx.items()))

    def _ptxas_exe(self) -> str | None:
        exe = self.ptxas
        if exe is None:
            try:
                exe = ptxas_mod.find_ptxas()
            except ptxas_mod.PtxasNotFound:
                exe = False
        return exe or None

    def _cubin(self) -> None:
        exe = self._ptxas_exe()
        for k in self.kernels:
            res = assemble_ptx(self.ptx[k.name], self.chip, exe)
            if res is not None:
                self.assembled[k.name] = res
        self._record_cubin()

    def _record_cubin(self) -> None:
        self._record("cubin", lambda: _join((n, r.log + self._sass_lines(n, r))
                                            for n, r in self.assembled.items())
                     if self.assembled else "// ptxas not found: no cubin\n")

    def sass_mix(self, name: str) -> dict | None:
        """Assembled kernel ``name``'s SASS instruction mix (kdagen.codegen.sass), disassembled
        once per compilation; None without a cubin or nvdisasm."""
        if name not in self._sass:
            res = self.assembled.get(name)
            mixes = (sass_mod.instruction_mix(res.cubin)
                     if res is not None and res.cubin is not None else None)
            self._sass[name] = (mixes or {}).get(name)
        return self._sass[name]

    def _sass_lines(self, name: str, res) -> str:
        """The kernel's SASS instruction mix (where nvdisasm is found) and, for a
        register-tile kernel, the SASS fit's estimate per CTA."""
        if res.cubin is None:
            return ""
        mix = self.sass_mix(name)
        if mix is None:
            return ("// SASS: nvdisasm not found (pip install nvidia-cuda-nvdisasm)\n"
                    if sass_mod.find_nvdisasm() is None else "")
        text = sass_mod.format_mix(mix)
        path = next((k.path for k in self.kernels if k.name == name), None)
        if path == register_tiles.PATH_NAME:
            spill = sum(r.spills for r in res.resources.values())
            est = sass_estimate(mix["instructions"], spill)
            text += (f"// SASS ESTIMATE (fit, not a measurement): {est['us']:g} us per CTA "
                     f"({mix['instructions']} instructions x {SASS_NS_PER_INSTRUCTION} ns)"
                     + ("; it spills: outside the fit, ~3x slower measured" if spill else "")
                     + "\n")
        return text

    def backend_jobs(self) -> list[BackendJob]:
        """The ``ptx`` + ``cubin`` work of each lowered kernel (:func:`run_backends`)."""
        exe = self._ptxas_exe()
        jobs = []
        for k in self.kernels:
            k.builder.verify()
            text = str(k.module)
            jobs.append(BackendJob(k.name, self.chip, text, exe,
                                   ptx=to_ptx.memo_lookup(text, self.target)))
        return jobs

    def accept_backend(self, jobs, results) -> None:
        """Take the results of :meth:`backend_jobs` (in order) as the ``ptx``/``cubin`` stages."""
        self.backend_seconds = {}
        for job, res in zip(jobs, results):
            if job.ptx is None:
                to_ptx.memo_store(job.text, self.target, res.ptx)
            self.ptx[job.name] = res.ptx
            if res.assembled is not None:
                self.assembled[job.name] = res.assembled
            self.backend_seconds[job.name] = (res.llvm_s, res.ptxas_s)
        self._record("ptx", lambda: _join(self.ptx.items()))
        self._record_cubin()

    def _record(self, name: str, text) -> None:
        if self.keep_stages:
            self.stages.append(Stage(name, text()))

    # -- outputs -------------------------------------------------------------------------
    def output(self, stage: str) -> str:
        """The kept output of ``stage`` (of its last occurrence)."""
        for s in reversed(self.stages):
            if s.name == stage:
                return s.text
        raise KeyError(f"stage {stage!r} was not run or not kept")

    def dump(self, folder) -> list[Path]:
        """Write every kept stage to ``folder`` as ``<NN>-<stage>.<mlir|ptx|txt>``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, s in enumerate(self.stages):
            ext = {"ptx": "ptx", "cubin": "txt", "cost": "txt"}.get(s.name, "mlir")
            path = out / f"{i:02d}-{s.name}.{ext}"
            path.write_text(s.text)
            paths.append(path)
        return paths


def run_backends(compilations, workers: int | None = None) -> None:
    """The ``cost``, ``ptx`` and ``cubin`` stages of several compilations (each after
    ``run("gpu")``), their kernels pooled over worker processes
    (:mod:`kdagen.codegen.backend_pool`; ``workers``: default ``$KDAGEN_COMPILE_JOBS`` or the
    CPUs). Each compilation's ``backend_seconds`` then holds (LLVM, ptxas) seconds per kernel."""
    with BackendPool(workers) as pool:
        submitted = [submit_backend(comp, pool) for comp in compilations]
        finish_backends(pool, submitted)


def submit_backend(comp: "Compilation", pool: BackendPool):
    """Start ``comp``'s ``cost``/``ptx``/``cubin`` stages on ``pool`` (right after its
    ``run("gpu")``, so they overlap the next compilation's front stages); returns the handle
    :func:`finish_backends` takes."""
    comp._cost()
    jobs = comp.backend_jobs()
    pool.submit(jobs)
    return comp, jobs


def finish_backends(pool: BackendPool, submitted) -> None:
    """Wait for the submitted compilations' backends and record their stages."""
    results = pool.collect()
    at = 0
    for comp, jobs in submitted:
        comp.accept_backend(jobs, results[at:at + len(jobs)])
        at += len(jobs)


def _join(items) -> str:
    """Per-kernel texts of a stage, each under a header line."""
    return "".join(f"// ----- kernel {name} -----\n{text.rstrip()}\n" for name, text in items)
