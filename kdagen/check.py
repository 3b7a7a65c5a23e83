"""`kdagen check`: assemble every PTX of a bundle with ptxas for its chip."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .runtime.bundle import read_manifest
from .codegen import ptxas as ptxas_mod


@dataclass
class CheckResult:
    kernel: str
    chip: str
    ok: bool
    detail: str


def check_bundle(bundle_dir: str | Path, progress=None) -> list[CheckResult]:
    """Raises PtxasNotFound when ptxas is missing, BundleError when the bundle is unreadable.

    Kernels are checked chip by chip (sm_90a, sm_100a, sm_120a). ``progress``: optional
    ``progress(event, **info)`` callback, the protocol of ``write_bundle``'s: ``"steps"``
    (``total`` kernels), then per kernel ``"lowering"`` (``program``, ``chip``), ``"lowered"``
    (``count=1``), ``"kernel"`` (``row``: kernel, chip, ok, detail) and ``"step_done"``."""
    from .table import chip_rank
    notify = progress or (lambda event, **info: None)
    exe = ptxas_mod.find_ptxas()
    bundle = Path(bundle_dir)
    results = []
    entries = sorted(read_manifest(bundle).kernels, key=lambda e: chip_rank(e.chip))
    notify("steps", total=len(entries))
    for entry in entries:
        notify("lowering", program=entry.name, chip=entry.chip)
        notify("lowered", count=1)
        results.append(_check_one(bundle, entry, exe))
        r = results[-1]
        notify("kernel", row=dict(kernel=r.kernel, chip=r.chip, ok=r.ok, detail=r.detail))
        notify("step_done")
    return results


def _check_one(bundle: Path, entry, exe) -> CheckResult:
    ptx_path = bundle / entry.ptx_file
    if not ptx_path.is_file():
        return CheckResult(entry.name, entry.chip, False, f"missing {entry.ptx_file}")
    res = ptxas_mod.assemble(ptx_path.read_text(), entry.chip, exe)
    info = res.resources.get(entry.name)
    if not res.ok:
        detail = res.log.strip().splitlines()[-1] if res.log.strip() else "ptxas failed"
    elif info is None:
        res.ok, detail = False, f"kernel {entry.name} not found in the PTX"
    else:
        detail = f"{info.registers} registers, {info.spills} spill bytes"
    return CheckResult(entry.name, entry.chip, res.ok, detail)
