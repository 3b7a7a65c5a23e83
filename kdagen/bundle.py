"""Kernel bundles: a folder with ``manifest.json`` and one ``.ptx`` (and ``.cubin``) per kernel.

The manifest is what the runtime needs to launch a kernel without MLIR: per kernel its name,
chip, the code path taken, the parameter list, the launch rule, block size and dynamic shared
memory, and the ptxas resource report. Files are written atomically (temp file + rename) so a
reader never sees a half-written bundle file.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class BundleError(RuntimeError):
    pass


@dataclass
class KernelEntry:
    name: str
    chip: str
    path: str                       # which lowering path produced it ("portable", "sm90-native", ...)
    ptx_file: str
    params: list[dict]
    launch: dict
    cubin_file: str | None = None
    resources: dict | None = None


@dataclass
class Manifest:
    kdagen_version: str
    source_hash: str
    ptxas_version: str | None
    kernels: list[KernelEntry] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        data = json.loads(text)
        if data.get("format_version") != FORMAT_VERSION:
            raise BundleError(f"manifest format {data.get('format_version')} is not supported "
                              f"(this kdagen reads format {FORMAT_VERSION}); re-emit the bundle")
        kernels = [KernelEntry(**k) for k in data.pop("kernels")]
        return cls(kernels=kernels, **data)


def write_atomic(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_manifest(bundle_dir: str | os.PathLike) -> Manifest:
    path = Path(bundle_dir) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle_dir}: no {MANIFEST} found; emit a bundle with "
                          f"`kdagen emit -o {bundle_dir}`")
    return Manifest.from_json(path.read_text())
