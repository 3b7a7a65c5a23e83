"""Executors: how a kda program (``kda_fwd``, ``kda_bwd``, ``gdn_fwd``, ``gdn_bwd``) runs on
the device its tensors live on.

The torch ops of :mod:`kdagen.ops` hand an executor a program name, the program options
(:func:`kdagen.ir.programs.program_options`), the inputs named like the program's arguments
(``q``, ``k``, ``v``, ``g``/``g_raw``, ``beta``/``beta_raw``, ``A_log``, ``dt_bias``,
``initial_state``, ``cu_seqlens``, ``scale``, ``do``, ``dht``) and the outputs it wants
(name -> :class:`OutSpec`: shape and dtype). It returns ``{name: tensor}`` on the inputs'
device, in the requested dtypes.

Executors are chosen per device type (:func:`get_executor`); :func:`register_executor`
replaces one (e.g. a test double, or a future ROCm path).

- ``cpu``: :class:`InterpreterExecutor`. Builds the program (cached per options), runs the
  ``kda-stable-reassociate`` pipeline, and executes it with :func:`kdagen.interpreter.run` in
  float32 (inputs upcast, outputs cast to the requested dtypes). A real, correct CPU
  implementation: CI runs opcheck, autograd and torch.compile tests through it.
- ``cuda``: :class:`BundleExecutor`. Finds a kernel bundle for (program, options, chip) —
  ``KDAGEN_BUNDLE`` (or the ``bundle`` argument), else the on-disk cache under
  ``KDAGEN_CACHE_DIR`` keyed by :func:`cache_key`, else compiles one into the cache when the
  MLIR bindings are importable, else raises :class:`BundleNotFoundError` saying how to emit
  one (:func:`compile_bundle`, the hook to ``kdagen.codegen.lower.bundle.write_bundle``) —
  and launches it through :func:`launch_bundle` (the hook to the GPU lowering's launcher,
  ``kdagen.codegen.lower.launch.LoweredProgram``; the variant is found by
  :func:`find_variant`).

This module imports no MLIR at import time (the runtime must work with torch and
cuda-bindings alone, DESIGN.md §1); the interpreter executor imports the compiler lazily.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = [
    "OutSpec",
    "Executor",
    "InterpreterExecutor",
    "BundleExecutor",
    "BundleNotFoundError",
    "KernelLaunchNotImplemented",
    "register_executor",
    "get_executor",
    "executors",
    "freeze_options",
    "cache_key",
    "cache_key_fields",
    "cache_root",
    "BundleCache",
    "stable_program",
    "launch_bundle",
    "compile_bundle",
    "find_variant",
    "RecordingExecutor",
    "recording",
    "CACHE_FORMAT",
]

#: bump when the cache layout or the meaning of a key field changes
CACHE_FORMAT = 1
KEY_FILE = "kdagen-cache-key.json"


@dataclass(frozen=True)
class OutSpec:
    """An output the caller wants: its shape and torch dtype."""
    shape: tuple
    dtype: Any  # torch.dtype (kept untyped so importing this module does not import torch)


def freeze_options(options: Mapping[str, Any]) -> tuple:
    """Program options as a hashable, order-independent tuple of (name, value) pairs."""
    out = []
    for name in sorted(options):
        value = options[name]
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = freeze_options(value)
        out.append((name, value))
    return tuple(out)


# --------------------------------------------------------------------------------------
# executor registry
# --------------------------------------------------------------------------------------


class Executor:
    """Runs a program on one device type. Subclasses implement :meth:`run`."""

    name = "executor"

    def run(self, program: str, options: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, OutSpec]) -> dict:
        raise NotImplementedError


_REGISTRY: dict[str, Callable[[], Executor]] = {}
_INSTANCES: dict[str, Executor] = {}
_REGISTRY_LOCK = threading.Lock()


def register_executor(device_type: str, factory: Callable[[], Executor] | Executor) -> None:
    """Use ``factory()`` (or an executor instance) for tensors on ``device_type``."""
    with _REGISTRY_LOCK:
        if isinstance(factory, Executor):
            inst = factory
            _REGISTRY[device_type] = lambda: inst
        else:
            _REGISTRY[device_type] = factory
        _INSTANCES.pop(device_type, None)


def executors() -> dict[str, Callable[[], Executor]]:
    """device type -> executor factory (a copy)."""
    return dict(_REGISTRY)


def get_executor(device) -> Executor:
    """The executor for a ``torch.device`` (or a device-type string)."""
    device_type = device if isinstance(device, str) else device.type
    with _REGISTRY_LOCK:
        inst = _INSTANCES.get(device_type)
        if inst is None:
            factory = _REGISTRY.get(device_type)
            if factory is None:
                raise RuntimeError(
                    f"kdagen has no executor for device type {device_type!r}; it runs on "
                    f"{sorted(_REGISTRY)} (move the tensors with .to('cuda') or .cpu())")
            inst = _INSTANCES[device_type] = factory()
        return inst


class RecordingExecutor(Executor):
    """Runs nothing: records every (program, options) asked for and returns zeros of the
    requested outputs. Used by :func:`recording` to find the program variants a model needs
    (e.g. to emit one bundle holding all of them)."""

    name = "recording"

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def run(self, program, options, inputs, outputs):
        import torch
        self.calls.append((program, dict(options)))
        device = next((x.device for x in inputs.values() if isinstance(x, torch.Tensor)), "cpu")
        return {n: torch.zeros(s.shape, dtype=s.dtype, device=device) for n, s in outputs.items()}

    def variants(self) -> list[tuple[str, dict]]:
        """The distinct (program, options) recorded, in first-use order."""
        seen, out = set(), []
        for program, options in self.calls:
            key = (program, freeze_options(options))
            if key not in seen:
                seen.add(key)
                out.append((program, options))
        return out


@contextlib.contextmanager
def recording(device_type: str = "cpu"):
    """``with recording() as rec: <run the model on CPU tensors>`` — then
    ``rec.variants()`` lists the programs and options it needs (nothing is computed)."""
    rec = RecordingExecutor()
    old = _REGISTRY.get(device_type)
    register_executor(device_type, rec)
    try:
        yield rec
    finally:
        if old is None:
            with _REGISTRY_LOCK:
                _REGISTRY.pop(device_type, None)
                _INSTANCES.pop(device_type, None)
        else:
            register_executor(device_type, old)


# --------------------------------------------------------------------------------------
# CPU: the interpreter
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def stable_program(program: str, frozen_options: tuple):
    """``build_program(program, **options)`` after ``kda-stable-reassociate`` (cached per
    options; ``frozen_options`` from :func:`freeze_options`)."""
    from kdagen._mlir import ir
    from kdagen.ir.programs import build_program
    from kdagen.passes.base import parse_pipeline
    from kdagen.passes.pipeline import run_pipeline

    options = {k: (list(v) if isinstance(v, tuple) else v) for k, v in frozen_options}
    module = build_program(program, **options)
    # The pass re-derives a backward program from its rewritten primal; creating the new
    # module needs a default location.
    with module.context, ir.Location.unknown():
        run_pipeline(module, parse_pipeline("kda-stable-reassociate"))
    return module


class InterpreterExecutor(Executor):
    """Executes the stabilised program with :func:`kdagen.interpreter.run` in float32."""

    name = "interpreter"

    def __init__(self):
        self._lock = threading.Lock()  # the MLIR module is shared; walk it from one thread

    def run(self, program, options, inputs, outputs):
        import torch
        try:
            from kdagen import interpreter
            module = stable_program(program, freeze_options(options))
        except ModuleNotFoundError as err:
            if (err.name or "").startswith("numba_cuda_mlir"):
                raise type(err)(
                    f"kdagen runs CPU tensors through its interpreter, which is part of the "
                    f"compiler: {err}", name=err.name) from None
            raise
        device = None
        args = {}
        for name, x in inputs.items():
            if x is None:
                continue
            if isinstance(x, torch.Tensor):
                device = device or x.device
                x = x.detach()
                args[name] = x.float() if x.is_floating_point() else x
            else:
                args[name] = x
        with self._lock:
            result = interpreter.run(module, args, dtype=torch.float32)
        out = {}
        for name, spec in outputs.items():
            if name not in result:
                raise RuntimeError(f"program {program} has no output {name!r} "
                                   f"(it returns {sorted(result)})")
            y = result[name]
            if tuple(y.shape) != tuple(spec.shape):
                raise RuntimeError(f"program {program}: output {name!r} has shape {list(y.shape)}, "
                                   f"expected {list(spec.shape)}")
            out[name] = y.to(device=device, dtype=spec.dtype).contiguous()
        return out


# --------------------------------------------------------------------------------------
# CUDA: kernel bundles, the on-disk cache, and the launch hook
# --------------------------------------------------------------------------------------


class BundleNotFoundError(RuntimeError):
    """No kernel bundle for a program on this chip, and none can be compiled here."""


class KernelLaunchNotImplemented(NotImplementedError):
    """The GPU launcher (kdagen.codegen.lower.launch) is not available yet."""


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
        from kdagen.version import source_hash as _sh
        source_hash = _sh()
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
        from kdagen.bundle import read_manifest
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


def _mlir_importable() -> bool:
    try:
        return importlib.util.find_spec("numba_cuda_mlir") is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def _ptxas_version() -> str | None:
    from kdagen.codegen import ptxas
    try:
        return ptxas.ptxas_version()
    except Exception:
        return None


def emit_instructions(chip: str) -> str:
    return (f"emit a kernel bundle on a machine with kdagen's compiler (numba-cuda-mlir): "
            f"`kdagen emit --arch {chip} -o DIR`, copy DIR here and set KDAGEN_BUNDLE=DIR")


def compile_bundle(program: str, options: Mapping[str, Any], chip: str, out_dir: Path) -> None:
    """Compile ``program`` with ``options`` for ``chip`` into the bundle folder ``out_dir``.

    The hook to the GPU lowering of whole programs:
    ``kdagen.codegen.lower.bundle.write_bundle(out_dir, [(program, options)], [chip])``.
    Raises :class:`KernelLaunchNotImplemented` while that lowering is not importable.
    """
    try:
        from kdagen.codegen.lower.bundle import write_bundle
    except ImportError as err:
        raise KernelLaunchNotImplemented(
            f"kdagen cannot compile {program} for {chip} here: the GPU lowering of whole programs "
            f"(kdagen.codegen.lower.bundle.write_bundle) is not available ({err}); "
            f"{emit_instructions(chip)}") from None
    from kdagen.codegen.lower.bundle import DEFAULT_LOWERING
    write_bundle(out_dir, [(program, dict(options))], [chip], lower_options=DEFAULT_LOWERING)


LOWERED = "lowered.json"


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


def find_variant(bundle_dir: str | os.PathLike, program: str, options: Mapping[str, Any],
                 chip: str = "sm_90a") -> str:
    """The name of the variant of ``program`` with ``options`` in a bundle's lowered.json
    (the name ``kdagen.codegen.lower.bundle.variant_name`` gives it, else any variant of the
    program whose resolved options match). Raises :class:`BundleNotFoundError`."""
    path = Path(bundle_dir) / LOWERED
    try:
        variants = json.loads(path.read_text())["variants"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BundleNotFoundError(
            f"bundle {bundle_dir} has no readable {LOWERED} ({type(err).__name__}: {err}), so no "
            f"lowered programs; {emit_instructions(chip)}") from None
    try:
        from kdagen.codegen.lower.bundle import variant_name
        name = variant_name(program, dict(options))
        if name in variants:
            return name
    except ImportError:
        pass
    for name, spec in sorted(variants.items()):
        if spec.get("program") == program and all(
                _option_matches(spec, k, v) for k, v in options.items()):
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
    program's outputs by name, in the kernels' storage dtypes. The hook to the GPU lowering's
    launcher, ``kdagen.codegen.lower.launch.LoweredProgram`` (which maps named tensors to
    kernel parameters and allocates outputs and workspaces). Raises
    :class:`KernelLaunchNotImplemented` while that launcher is not importable. ``cache``
    (a dict) keeps the runner per (bundle, program, options, chip) across calls.
    """
    try:
        from kdagen.codegen.lower.launch import LoweredProgram
    except ImportError as err:
        raise KernelLaunchNotImplemented(
            f"kdagen cannot launch {program} on {device} yet: the GPU launcher "
            f"(kdagen.codegen.lower.launch.LoweredProgram) is not available ({err}). CPU tensors "
            f"run through the interpreter meanwhile.") from None
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
    cache when the MLIR bindings are importable; else :class:`BundleNotFoundError`.
    """

    name = "bundle"

    def __init__(self, bundle: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                 *, mlir_available: Callable[[], bool] = _mlir_importable,
                 compiler: Callable = None, ptxas_version: Callable[[], str | None] = _ptxas_version):
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
        from .loader import KernelLibrary
        with self._lock:
            lib = self._libraries.get(str(path))
            if lib is None:
                lib = self._libraries[str(path)] = KernelLibrary(path)
            return lib

    def run(self, program, options, inputs, outputs):
        import torch
        from .chips import chip_for_device

        device = next(x.device for x in inputs.values() if isinstance(x, torch.Tensor))
        index = device.index if device.index is not None else torch.cuda.current_device()
        chip = chip_for_device(index)
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


register_executor("cpu", InterpreterExecutor)
register_executor("cuda", BundleExecutor)
