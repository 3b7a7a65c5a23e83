"""Running programs from kernel bundles on CUDA devices.

:class:`BundleExecutor` finds a kernel bundle for (program, options, chip) — ``KDAGEN_BUNDLE``
(or the ``bundle`` argument), else the on-disk cache under ``KDAGEN_CACHE_DIR`` keyed by
:func:`~kdagen.runtime.cache.cache_key`, else compiles one into the cache through the
registered compiler (:mod:`kdagen.runtime.compile_hook`), else raises
:class:`BundleNotFoundError` saying how to emit one — and launches it with
:func:`launch_bundle` (the launcher :class:`kdagen.runtime.launch.LoweredProgram`; the variant
is found by :func:`find_variant`).

This module imports neither torch nor MLIR at import time.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from . import chips
from .bundle import LOWERED, variant_name
from .cache import BundleCache, cache_key, cache_key_fields
from .compile_hook import (KernelLaunchNotImplemented, compile_bundle, compiler_available,
                           emit_instructions, toolchain_version)
from .executors import Executor, freeze_options
from .loader import KernelLibrary

__all__ = ["BundleExecutor", "BundleNotFoundError", "find_variant", "launch_bundle"]


class BundleNotFoundError(RuntimeError):
    """No kernel bundle for a program on this chip, and none can be compiled here."""


def _option_matches(spec: Mapping[str, Any], name: str, value: Any) -> bool:
    """Whether a bundle variant (an entry of lowered.json) was built with option ``name`` =
    ``value``: from its program attributes (resolved options, defaults included), else from
    the options it was emitted with."""
    attrs = spec.get("attrs") or {}
    if name == "lower_bound":
        have = (attrs.get("gate_options") or {}).get("lower_bound", (spec.get("options") or {}).get(name))
    elif name in attrs:
        have = attrs[name]
    else:
        have = (spec.get("options") or {}).get(name)
    if isinstance(value, float) or isinstance(have, float):
        try:
            return have is not None and float(have) == float(value)
        except (TypeError, ValueError):
            return False
    return have == value


#: options that change a variant's arguments (its calling convention): a variant built with
#: one of them on is found only when the call asks for it
CONVENTION_OPTIONS = ("output_token_states", "state_pool")


def _convention_matches(spec: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
    attrs = spec.get("attrs") or {}
    return all(bool(attrs.get(k, False)) == bool(options.get(k, False))
               for k in CONVENTION_OPTIONS)


def _unrequested(spec: Mapping[str, Any], options: Mapping[str, Any]) -> str | None:
    """An option the variant was built with that the call leaves out, where leaving it out
    means another program (the API names these only when they differ from the default:
    kdagen.ops.program_options, kdagen.decode): its name, else None. Without this check a
    call without lower_bound took a variant built with lower_bound = -5 (a gate clamp) from a
    bundle that held both: FLA's test_chunk D = 100 case on the H200, dh0 6.2e-2."""
    emitted = spec.get("options") or {}
    attrs = spec.get("attrs") or {}
    if "lower_bound" not in options and (
            emitted.get("lower_bound") is not None
            or (attrs.get("gate_options") or {}).get("lower_bound") is not None):
        return "lower_bound"
    dtype = emitted.get("dtype", attrs.get("dtype", "bf16"))
    defaults = {"gate_dtype": (None, dtype), "beta_dtype": (None, dtype), "value_split": (1,),
                "output_chunk_states": (False,), "gate_digest": (None,),
                "save_residuals": (False,), "state_dtype": (None, "fp32"),
                "state_v_first": (False,)}
    for name, same in defaults.items():
        if name not in options and name in emitted and emitted[name] not in same:
            return name
    return None


def find_variant(bundle_dir: str | os.PathLike, program: str, options: Mapping[str, Any],
                 chip: str = "sm_90a") -> str:
    """The name of the variant of ``program`` with ``options`` in a bundle's lowered.json
    (the name :func:`kdagen.runtime.bundle.variant_name` gives it, else any variant of the
    program whose resolved options match, :data:`CONVENTION_OPTIONS` both ways, built with no
    option the call leaves at its default: :func:`_unrequested`). Raises
    :class:`BundleNotFoundError`."""
    path = Path(bundle_dir) / LOWERED
    try:
        variants = json.loads(path.read_text())["variants"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BundleNotFoundError(
            f"bundle {bundle_dir} has no readable {LOWERED} ({type(err).__name__}: {err}), so no "
            f"lowered programs; {emit_instructions(chip)}") from None
    name = variant_name(program, dict(options))
    if name in variants:
        return name
    for name, spec in sorted(variants.items()):
        if spec.get("program") == program and _convention_matches(spec, options) and all(
                _option_matches(spec, k, v) for k, v in options.items()) and (
                _unrequested(spec, options) is None):
            return name
    have = sorted(f"{n}" for n, sp in variants.items() if sp.get("program") == program)
    raise BundleNotFoundError(
        f"bundle {bundle_dir} has no variant of {program} with options "
        f"{dict(freeze_options(options))} (its {program} variants: {have or 'none'}); "
        f"{emit_instructions(chip)}")


def launch_bundle(library, bundle_dir: str | os.PathLike, program: str,
                  options: Mapping[str, Any], tensors: Mapping[str, Any], device,
                  chip: str, *, cache: dict | None = None) -> dict:
    """Run ``program`` with ``options`` from the bundle ``bundle_dir`` (kernels loaded through
    ``library``, a :class:`KernelLibrary`) on torch's current stream of ``device``.

    ``tensors`` maps the program's input names to tensors (``scale`` to a float); returns the
    program's outputs by name, in the kernels' storage dtypes, through the launcher
    :class:`kdagen.runtime.launch.LoweredProgram` (which maps named tensors to kernel
    parameters and allocates outputs and workspaces). Raises
    :class:`KernelLaunchNotImplemented` when the launcher cannot be imported here. ``cache``
    (a dict) keeps the runner per (bundle, program, options, chip) across calls.
    """
    try:
        from .launch import LoweredProgram      # imports torch: deferred to the first launch
    except ImportError as err:
        raise KernelLaunchNotImplemented(
            f"kdagen cannot launch {program} on {device}: the GPU launcher "
            f"(kdagen.runtime.launch.LoweredProgram) is not available ({err}).") from None
    key = (str(bundle_dir), program, freeze_options(options), chip)
    runner = None if cache is None else cache.get(key)
    if runner is None:
        variant = find_variant(bundle_dir, program, options, chip)
        runner = LoweredProgram(bundle_dir, variant, library=library)
        if cache is not None:
            cache[key] = runner
    return runner(device=device, poison=False, **tensors)


class BundleExecutor(Executor):
    """Runs programs from kernel bundles on CUDA devices.

    Lookup order for (program, options, chip): ``bundle`` (constructor argument) or
    ``$KDAGEN_BUNDLE`` — a folder emitted by ``kdagen emit``; then the cache
    (:class:`BundleCache` under ``cache_dir``/``$KDAGEN_CACHE_DIR``); then compile into the
    cache when a registered compiler can run here; else :class:`BundleNotFoundError`.
    ``mlir_available``, ``compiler`` and ``ptxas_version`` replace the registered compiler's
    (tests).
    """

    name = "bundle"

    def __init__(self, bundle: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                 *, mlir_available: Callable[[], bool] = compiler_available,
                 compiler: Callable = None,
                 ptxas_version: Callable[[], str | None] = toolchain_version):
        self.bundle = bundle
        self.cache = BundleCache(cache_dir)
        self._mlir_available = mlir_available
        self._compile = compiler or compile_bundle
        self._ptxas_version = ptxas_version
        self._libraries: dict[str, Any] = {}
        self._paths: dict[tuple, Path] = {}      # resolved bundle folder per call signature
        self._runners: dict[tuple, Any] = {}     # launcher per (bundle, program, options, chip)
        self._lock = threading.Lock()

    # -- finding a bundle (no device needed: chip and device name are arguments) ---------
    def bundle_dir(self, program: str, options: Mapping[str, Any], chip: str, device_name: str) -> Path:
        """The bundle folder for a call (memoised per program, options, chip, device name and
        $KDAGEN_BUNDLE, so the disk is looked at once)."""
        memo = (program, freeze_options(options), chip, device_name, self.bundle,
                os.environ.get("KDAGEN_BUNDLE"))
        path = self._paths.get(memo)
        if path is None:
            path = self._paths[memo] = self._find_bundle(program, options, chip, device_name)
        return path

    def _find_bundle(self, program, options, chip, device_name) -> Path:
        explicit = self.bundle if self.bundle is not None else os.environ.get("KDAGEN_BUNDLE")
        if explicit:
            path = Path(explicit)
            if not (path / "manifest.json").is_file():
                raise BundleNotFoundError(
                    f"KDAGEN_BUNDLE={path}: no manifest.json there; {emit_instructions(chip)}")
            return path
        fields = cache_key_fields(program, options, chip, device_name, self._ptxas_version())
        key = cache_key(program, options, chip, device_name, fields["ptxas_version"],
                        fields["source_hash"])
        hit = self.cache.lookup(program, key, fields)
        if hit is not None:
            return hit
        if not self._mlir_available():
            raise BundleNotFoundError(
                f"no kernel bundle for {program} on {chip} ({device_name}) with options "
                f"{dict(freeze_options(options))}, none in the cache {self.cache.root}, and the "
                f"compiler's MLIR bindings (numba-cuda-mlir) are not installed here to build one; "
                f"{emit_instructions(chip)}")
        return self.cache.store(program, key, fields,
                                lambda tmp: self._compile(program, options, chip, tmp))

    def library(self, path: Path):
        with self._lock:
            lib = self._libraries.get(str(path))
            if lib is None:
                lib = self._libraries[str(path)] = KernelLibrary(path)
            return lib

    def run(self, program, options, inputs, outputs):
        import torch

        device = next(x.device for x in inputs.values() if isinstance(x, torch.Tensor))
        index = device.index if device.index is not None else torch.cuda.current_device()
        chip = chips.chip_for_device(index)
        path = self.bundle_dir(program, options, chip, torch.cuda.get_device_name(index))
        tensors = {k: v for k, v in inputs.items() if v is not None}
        # The launcher converts inputs to the kernels' storage types (q, k, v, g, beta, o in
        # options["dtype"], states and per-head parameters in float32) and allocates the
        # outputs; they are cast here (on the stream, no host sync) to the requested dtypes.
        written = launch_bundle(self.library(path), path, program, options, tensors, device, chip,
                                cache=self._runners)
        missing = sorted(set(outputs) - set(written))
        if missing:
            raise RuntimeError(f"kdagen: the kernels of {program} returned no {missing}")
        return {name: written[name].to(spec.dtype) for name, spec in outputs.items()}
