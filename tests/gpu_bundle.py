"""Bundles for the GPU tests: finding the first kernel's bundle, writing the variants a test
file uses into one bundle, and the skip/xfail around kernel calls."""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def kernels_or_skip():
    """Around a GPU call: no bundle -> skip (saying how to emit one); no launcher -> xfail."""
    from kdagen.runtime.backends import BundleNotFoundError, KernelLaunchNotImplemented
    try:
        yield
    except KernelLaunchNotImplemented as err:
        pytest.xfail(f"GPU launcher not available yet: {err}")
    except BundleNotFoundError as err:
        pytest.skip(f"no kernel bundle: {err}")


def write_variants_bundle(variants, out_dir: str, chip: str = "sm_90a") -> None:
    """Lower every (program, options) of a GPU test file into one bundle (on a machine with
    the compiler, no GPU needed); the tests then run with KDAGEN_BUNDLE=out_dir."""
    import time

    from kdagen.bundle_writer import DEFAULT_LOWERING, write_bundle

    for program, options in variants:
        start = time.time()
        write_bundle(out_dir, [(program, options)], [chip], lower_options=DEFAULT_LOWERING)
        print(f"{program} {options} ({time.time() - start:.1f} s)", flush=True)
    print(f"wrote {len(variants)} variants for {chip} to {out_dir}; run the tests with "
          f"KDAGEN_BUNDLE={out_dir}")
