"""Finding a kernel bundle for GPU tests: $KDAGEN_BUNDLE, else emit one now (needs MLIR)."""
from __future__ import annotations

import os
import tempfile

import pytest


def bundle_for_tests(chip: str) -> str:
    path = os.environ.get("KDAGEN_BUNDLE")
    if path:
        return path
    try:
        from kdagen.codegen.target import get_target
        from kdagen.emit import emit_bundle
    except ImportError:
        pytest.skip("no KDAGEN_BUNDLE and the MLIR package is not importable to emit one")
    out = tempfile.mkdtemp(prefix="kdagen-test-bundle-")
    emit_bundle(out, [get_target(chip)])
    return out
