"""The ``ptx`` and ``cubin`` stages of many kernels at once, in worker processes.

LLVM's NVPTX backend (tens of seconds for a large kernel) and ptxas run once per kernel and
per chip, independently, so a bundle's kernels are spread over worker processes, largest
first. A worker gets a kernel's gpu-module text, parses it into its own MLIR context, lowers it
(:func:`kdagen.codegen.to_ptx.lower_to_ptx`) and assembles it; what comes back is text and
bytes, so the result does not depend on where it ran (the PTX is byte-identical to an
in-process lowering).

``KDAGEN_COMPILE_JOBS`` sets the number of workers (default: the CPUs this process may use);
1 runs everything in this process. A worker is a ``python -c`` of :func:`_worker_main` that
lives as long as its pool and takes one large kernel after another (importing MLIR costs ~2 s
a process): each job goes in and its result comes out pickled over the worker's pipes, framed
by an 8-byte length.
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kdagen.codegen import ptxas as ptxas_mod

__all__ = ["BackendJob", "BackendResult", "BackendPool", "compile_jobs", "run_backend_jobs",
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


#: a module this large (text bytes) is lowered in a worker process: its LLVM time (seconds)
#: dwarfs a worker's start (~2 s to import MLIR); smaller ones stay in this process
BIG_TEXT = 1_000_000


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


class _Worker:
    """A backend worker process: one job at a time through its pipes, for as long as it lives.
    Not multiprocessing: its spawn would import the caller's ``__main__`` again (a user's
    script, a notebook, stdin) in every worker."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        # stderr to a file: a pipe nobody drains could fill and block the worker
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, env=env)

    def run(self, job: BackendJob) -> BackendResult:
        data = pickle.dumps(job)
        try:
            self._proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self._proc.stdin.flush()
            result = pickle.loads(_read_frame(self._proc.stdout))
        except (OSError, EOFError, pickle.UnpicklingError):
            self._proc.kill()
            self._proc.wait()
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-4000:]
            raise RuntimeError(f"kdagen: the backend worker for {job.name} ({job.chip}) failed "
                               f"(exit {self._proc.returncode}):\n{tail}") from None
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()          # end of jobs: the worker exits
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


def _read_frame(stream) -> bytes:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("no frame")
    (size,) = struct.unpack("<Q", header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("truncated frame")
    return data


_WORKER = "from kdagen.codegen.backend_pool import _worker_main; _worker_main()"


def _worker_main() -> None:
    """Jobs from stdin until it closes, each result (or its exception) back on stdout."""
    stdin = sys.stdin.buffer
    # frames go to a private copy of stdout; anything else printed (by Python or by native
    # code writing to fd 1) goes to stderr instead of corrupting them
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        try:
            job = pickle.loads(_read_frame(stdin))
        except EOFError:
            return
        try:
            result = lower_text(job)
        except Exception as err:       # handed back and raised in the parent
            result = err
        data = pickle.dumps(result)
        stdout.write(struct.pack("<Q", len(data)) + data)
        stdout.flush()


class BackendPool:
    """Backend jobs submitted as their kernels are lowered, so LLVM runs while the next
    program's passes and lowering do: a job of a large module (``BIG_TEXT`` bytes or more) goes
    to a worker process at once (the pool starts with the first); the small ones run in this
    process when the results are collected, beside the workers. One worker, or no large job:
    no process is started. ``collect()`` returns every submitted job's result, in order."""

    def __init__(self, workers: int | None = None):
        self.workers = compile_jobs() if workers is None else max(1, int(workers))
        self._pool = None
        self._items: list = []          # (job, future or None)
        self._idle: "queue.SimpleQueue[_Worker]" = queue.SimpleQueue()
        self._started: list[_Worker] = []
        self._lock = threading.Lock()

    def _run_in_worker(self, job: BackendJob) -> BackendResult:
        # at most ``workers`` threads run this, so at most that many processes start
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            worker = _Worker()
            with self._lock:
                self._started.append(worker)
        result = worker.run(job)        # a failed worker is dead: not handed back
        self._idle.put(worker)
        return result

    def submit(self, jobs) -> None:
        for job in jobs:
            future = None
            if self.workers > 1 and job.ptx is None and len(job.text) >= BIG_TEXT:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self.workers)
                future = self._pool.submit(self._run_in_worker, job)
            self._items.append((job, future))

    def collect(self) -> list[BackendResult]:
        try:
            # this process takes the small jobs while the workers run the large ones
            local = {i: lower_text(job) for i, (job, fut) in enumerate(self._items) if fut is None}
            return [local[i] if fut is None else fut.result()
                    for i, (job, fut) in enumerate(self._items)]
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._lock:
            started, self._started = self._started, []
        for worker in started:
            worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_backend_jobs(jobs: list[BackendJob], workers: int | None = None) -> list[BackendResult]:
    """Results in the order of ``jobs`` (a :class:`BackendPool`, the largest submitted first)."""
    order = sorted(range(len(jobs)), key=lambda i: -(0 if jobs[i].ptx else len(jobs[i].text)))
    with BackendPool(workers) as pool:
        pool.submit([jobs[i] for i in order])
        results = pool.collect()
    out: list[BackendResult | None] = [None] * len(jobs)
    for i, res in zip(order, results):
        out[i] = res
    return out

