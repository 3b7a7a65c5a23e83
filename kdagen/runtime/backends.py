"""Executors: how a kda program (``kda_fwd``, ``kda_bwd``, ``gdn_fwd``, ``gdn_bwd``) runs on
the device its tensors live on — the runtime's public names, gathered from the modules that
implement them:

- :mod:`kdagen.runtime.executors`: the registry (:func:`register_executor`,
  :func:`get_executor`), :class:`OutSpec`, :func:`recording`;
- :mod:`kdagen.runtime.bundle_executor`: ``cuda`` — :class:`BundleExecutor` (bundles from
  ``KDAGEN_BUNDLE``, the cache, or compiled on demand), :func:`find_variant`,
  :func:`launch_bundle`;
- :mod:`kdagen.runtime.cache`: the on-disk cache of compiled bundles;
- :mod:`kdagen.runtime.compile_hook`: compile-on-demand, which the compiler registers.

``cpu`` is the compiler's: :mod:`kdagen.compiler_hooks` registers the interpreter executor
(and the compile hook) when imported, as :mod:`kdagen.ops` does. This module imports neither
MLIR nor torch (the runtime must work with torch and cuda-bindings alone, docs/ARCHITECTURE.md §2).
"""
from __future__ import annotations

from .bundle_executor import BundleExecutor, BundleNotFoundError, find_variant, launch_bundle
from .cache import CACHE_FORMAT, BundleCache, cache_key, cache_key_fields, cache_root
from .compile_hook import KernelLaunchNotImplemented, compile_bundle, register_compiler
from .executors import (Executor, OutSpec, RecordingExecutor, executors, freeze_options,
                        get_executor, recording, register_executor)

__all__ = [
    "OutSpec",
    "Executor",
    "BundleExecutor",
    "BundleNotFoundError",
    "KernelLaunchNotImplemented",
    "register_executor",
    "register_compiler",
    "get_executor",
    "executors",
    "freeze_options",
    "cache_key",
    "cache_key_fields",
    "cache_root",
    "BundleCache",
    "launch_bundle",
    "compile_bundle",
    "find_variant",
    "RecordingExecutor",
    "recording",
    "CACHE_FORMAT",
]

register_executor("cuda", BundleExecutor, default=True)
