"""Finding the first kernel's bundle for its GPU test."""
from __future__ import annotations

import os
import tempfile

import pytest


def bundle_for_tests(chip: str) -> str:
    """The first kernel's bundle: $KDAGEN_FIRST_KERNEL_BUNDLE (``kdagen emit --op gate-cumsum``),
    else one emitted now (needs MLIR), else skip."""
    path = os.environ.get("KDAGEN_FIRST_KERNEL_BUNDLE")
    if path:
        return path
    try:
        from kdagen.target import get_target
        from kdagen.emit import emit_bundle
    except ImportError:
        pytest.skip("no KDAGEN_FIRST_KERNEL_BUNDLE and the MLIR package is not importable to "
                    "emit one")
    out = tempfile.mkdtemp(prefix="kdagen-test-bundle-")
    emit_bundle(out, [get_target(chip)])
    return out
