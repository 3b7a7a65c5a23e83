"""The ``ptx`` and ``cubin`` stages of many kernels at once, in worker processes.

LLVM's NVPTX backend (tens of seconds for a large kernel) and ptxas run once per kernel and
per chip, independently, so a bundle's kernels are spread over worker processes, largest
first. A worker gets a kernel's gpu-module text, parses it into its own MLIR context, lowers it
(:func:`kdagen.codegen.to_ptx.lower_to_ptx`) and assembles it; what comes back is text and
bytes, so the result does not depend on where it ran (the PTX is byte-identical to an
in-process lowering).

``KDAGEN_COMPILE_JOBS`` sets the number of workers (default: the CPUs this process may use);
1 runs everything in this process.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from kdagen.codegen import ptxas as ptxas_mod

__all__ = ["BackendJob", "BackendResult", "compile_jobs", "run_backend_jobs",
           "LibdeviceCallError"]


class LibdeviceCallError(RuntimeError):
    """The PTX calls libdevice (``__nv_*``), which ptxas cannot resolve."""


@dataclass(frozen=True)
class BackendJob:
    """One kernel's backend: its gpu-module text, chip, name, and the ptxas to assemble with
    (None: PTX only)."""
    name: str
    chip: str
    text: str
    ptxas: str | None = None
    ptx: str | None = None      # already lowered (this process' memo): only ptxas runs


@dataclass
class BackendResult:
    ptx: str
    assembled: ptxas_mod.AssembleResult | None
    llvm_s: float       # seconds in the MLIR -> PTX lowering (LLVM's NVPTX backend)
    ptxas_s: float      # seconds in ptxas


#: module text (bytes) the jobs other than the largest must hold for a pool to pay off
POOL_MIN_TEXT = 2_000_000


def compile_jobs() -> int:
    """The number of worker processes: ``$KDAGEN_COMPILE_JOBS``, else the usable CPUs."""
    env = os.environ.get("KDAGEN_COMPILE_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"KDAGEN_COMPILE_JOBS={env!r}: expected a positive integer") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def lower_text(job: BackendJob) -> BackendResult:
    """One job, in this process."""
    from kdagen._mlir import ir
    from kdagen.codegen.to_ptx import lower_to_ptx
    from kdagen.target import get_target

    t0 = time.perf_counter()
    ptx = job.ptx
    if ptx is None:
        context = ir.Context()
        module = ir.Module.parse(job.text, context=context)
        ptx = lower_to_ptx(module, get_target(job.chip))
    if "__nv_" in ptx:
        raise LibdeviceCallError(f"{job.name}: PTX calls libdevice ({job.chip})")
    t1 = time.perf_counter()
    assembled = ptxas_mod.assemble(ptx, job.chip, job.ptxas) if job.ptxas else None
    return BackendResult(ptx, assembled, t1 - t0, time.perf_counter() - t1)


def run_backend_jobs(jobs: list[BackendJob], workers: int | None = None) -> list[BackendResult]:
    """Results in the order of ``jobs``. With more than one worker and job, the jobs run in a
    pool of spawned processes, the largest modules first (the makespan is set by the largest
    kernel, so it should start first)."""
    workers = compile_jobs() if workers is None else max(1, int(workers))
    sizes = sorted((len(j.text) for j in jobs if j.ptx is None), reverse=True)
    # a worker process costs ~2 s to start (MLIR import): worth it only beside a big job
    if workers == 1 or len(sizes) <= 1 or sum(sizes[1:]) < POOL_MIN_TEXT:
        return [lower_text(job) for job in jobs]
    order = sorted(range(len(jobs)), key=lambda i: -(0 if jobs[i].ptx else len(jobs[i].text)))
    results: list[BackendResult | None] = [None] * len(jobs)
    context = multiprocessing.get_context("spawn")     # no fork of a process holding MLIR state
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = {i: pool.submit(lower_text, jobs[i]) for i in order}
        for i, fut in futures.items():
            results[i] = fut.result()
    return results
