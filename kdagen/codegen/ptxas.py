"""Assembling PTX with ptxas and reading its resource report (registers, spills, shared memory)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass


class PtxasNotFound(RuntimeError):
    pass


@dataclass
class KernelResources:
    kernel: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass
class AssembleResult:
    ok: bool
    log: str
    resources: dict[str, KernelResources]
    cubin: bytes | None


FALLBACK_LOCATIONS = ("/usr/local/cuda/bin/ptxas", "/usr/local/bin/ptxas")


def find_ptxas() -> str:
    """Locate ptxas: $KDAGEN_PTXAS, then PATH, then the usual CUDA install folders."""
    candidates = [os.environ.get("KDAGEN_PTXAS"), shutil.which("ptxas"), *FALLBACK_LOCATIONS]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise PtxasNotFound(
        "ptxas not found: install the CUDA toolkit (ptxas 12.8 or newer for sm_100a/sm_120a), "
        "put it on PATH, or point KDAGEN_PTXAS at it"
    )


def ptxas_version(ptxas: str | None = None) -> str:
    out = subprocess.run([ptxas or find_ptxas(), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1]


_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_resource_report(log: str) -> dict[str, KernelResources]:
    """Parse ``ptxas -v`` output into per-kernel resources."""
    result: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    for line in log.splitlines():
        if m := _FUNCTION.search(line):
            current = result.setdefault(m.group(1), KernelResources(m.group(1)))
            continue
        if current is None:
            continue
        if m := _SPILLS.search(line):
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, m.groups())
        if m := _USED.search(line):
            current.registers = int(m.group(1))
            if m := _SMEM.search(line):
                current.shared_bytes = int(m.group(1))
    return result


def assemble(ptx: str, chip: str, ptxas: str | None = None) -> AssembleResult:
    """Run ``ptxas -v -arch=<chip>`` on PTX text; returns the log, resources and cubin bytes."""
    exe = ptxas or find_ptxas()
    with tempfile.TemporaryDirectory(prefix="kdagen-ptxas-") as tmp:
        src, out = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([exe, "-v", f"-arch={chip}", src, "-o", out],
                              capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        cubin = None
        if proc.returncode == 0 and os.path.exists(out):
            with open(out, "rb") as f:
                cubin = f.read()
    return AssembleResult(proc.returncode == 0, log, parse_resource_report(log), cubin)
