"""`kdagen check`: assemble every PTX of a bundle with ptxas for its chip."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .bundle import read_manifest
from .codegen import ptxas as ptxas_mod


@dataclass
class CheckResult:
    kernel: str
    chip: str
    ok: bool
    detail: str


def check_bundle(bundle_dir: str | Path) -> list[CheckResult]:
    """Raises PtxasNotFound when ptxas is missing, BundleError when the bundle is unreadable."""
    exe = ptxas_mod.find_ptxas()
    bundle = Path(bundle_dir)
    results = []
    for entry in read_manifest(bundle).kernels:
        ptx_path = bundle / entry.ptx_file
        if not ptx_path.is_file():
            results.append(CheckResult(entry.name, entry.chip, False, f"missing {entry.ptx_file}"))
            continue
        res = ptxas_mod.assemble(ptx_path.read_text(), entry.chip, exe)
        info = res.resources.get(entry.name)
        if not res.ok:
            detail = res.log.strip().splitlines()[-1] if res.log.strip() else "ptxas failed"
        elif info is None:
            res.ok, detail = False, f"kernel {entry.name} not found in the PTX"
        else:
            detail = f"{info.registers} registers, {info.spills} spill bytes"
        results.append(CheckResult(entry.name, entry.chip, res.ok, detail))
    return results
