"""The on-disk cache of compiled bundles: keys and atomic entries (``KDAGEN_CACHE_DIR``)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from kdagen.version import source_hash as kdagen_source_hash

from .bundle import read_manifest
from .executors import freeze_options

__all__ = ["CACHE_FORMAT", "cache_root", "cache_key_fields", "cache_key", "BundleCache"]

#: bump when the cache layout or the meaning of a key field changes
CACHE_FORMAT = 1
KEY_FILE = "kdagen-cache-key.json"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$KDAGEN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kdagen``, else
    ``~/.cache/kdagen``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("KDAGEN_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "kdagen" if xdg else Path.home() / ".cache" / "kdagen"


def cache_key_fields(program: str, options: Mapping[str, Any], chip: str, device_name: str,
                     ptxas_version: str | None, source_hash: str | None = None) -> dict:
    """Everything a compiled bundle depends on, as a JSON-able dict."""
    if source_hash is None:
        source_hash = kdagen_source_hash()
    opts = {k: (list(v) if isinstance(v, tuple) else v) for k, v in freeze_options(options)}
    return {
        "format": CACHE_FORMAT,
        "source_hash": source_hash,
        "program": program,
        "options": opts,
        "chip": chip,
        "device_name": device_name,
        "ptxas_version": ptxas_version or "none",
    }


def cache_key(program: str, options: Mapping[str, Any], chip: str, device_name: str,
              ptxas_version: str | None, source_hash: str | None = None) -> str:
    """sha256 (hex, 32 chars) of the canonical JSON of :func:`cache_key_fields`: kdagen's
    source hash, the program, its options, the chip (``sm_90a``), the device name
    (``NVIDIA H200``) and the ptxas version."""
    fields = cache_key_fields(program, options, chip, device_name, ptxas_version, source_hash)
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class BundleCache:
    """Compiled bundles under ``root/<program>/<key>/`` (a bundle folder plus
    ``kdagen-cache-key.json`` with the key's fields).

    Entries are written atomically: built in a temporary sibling folder and renamed into
    place, so a reader sees a complete entry or none. An entry that does not read back
    (missing/corrupt manifest or key file, fields that do not match, missing kernel files)
    is ignored — :meth:`lookup` returns None — and replaced by the next :meth:`store`.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = cache_root(root)

    def path(self, program: str, key: str) -> Path:
        return self.root / program / key

    def lookup(self, program: str, key: str, fields: Mapping[str, Any] | None = None) -> Path | None:
        entry = self.path(program, key)
        if not entry.is_dir():
            return None
        problem = self._check(entry, fields)
        if problem:
            warnings.warn(f"kdagen: ignoring corrupt cache entry {entry}: {problem}", RuntimeWarning,
                          stacklevel=2)
            return None
        return entry

    @staticmethod
    def _check(entry: Path, fields: Mapping[str, Any] | None) -> str | None:
        try:
            stored = json.loads((entry / KEY_FILE).read_text())
        except (OSError, ValueError) as err:
            return f"unreadable {KEY_FILE} ({err})"
        if fields is not None and stored != json.loads(json.dumps(dict(fields), default=str)):
            return f"{KEY_FILE} does not match the key"
        try:
            manifest = read_manifest(entry)
        except Exception as err:  # BundleError, JSON errors, wrong fields
            return f"unreadable manifest ({type(err).__name__}: {err})"
        if fields is not None and manifest.source_hash != fields.get("source_hash"):
            return "manifest source hash does not match kdagen's"
        for k in manifest.kernels:
            if not (entry / k.ptx_file).is_file() and not (k.cubin_file and (entry / k.cubin_file).is_file()):
                return f"kernel file {k.ptx_file} is missing"
        return None

    def store(self, program: str, key: str, fields: Mapping[str, Any],
              build: Callable[[Path], None]) -> Path:
        """Run ``build(tmp_dir)`` (it writes a bundle there) and move the result into place
        atomically; returns the entry's path. A valid entry written meanwhile by another
        process wins; a corrupt one is replaced."""
        final = self.path(program, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".tmp", dir=final.parent))
        try:
            build(tmp)
            (tmp / KEY_FILE).write_text(json.dumps(dict(fields), sort_keys=True, indent=2, default=str) + "\n")
            problem = self._check(tmp, fields)
            if problem:
                raise RuntimeError(f"kdagen: the compiled bundle for {program} is incomplete: {problem}")
            for _ in range(3):
                try:
                    os.rename(tmp, final)
                    return final
                except OSError:
                    if self._check(final, fields) is None:
                        return final                       # someone else stored it first
                    # a corrupt entry: move it aside, then try again
                    trash = final.parent / f".{key}.corrupt.{uuid.uuid4().hex[:8]}"
                    try:
                        os.rename(final, trash)
                    except OSError:
                        pass
                    shutil.rmtree(trash, ignore_errors=True)
            raise RuntimeError(f"kdagen: could not move the compiled bundle into {final}")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
