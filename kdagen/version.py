"""kdagen's version and a hash of its own source (part of every cache key and bundle manifest)."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"

PACKAGE_ROOT = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """SHA-256 over every .py file of the package (path and bytes), in a fixed order."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(PACKAGE_ROOT)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
