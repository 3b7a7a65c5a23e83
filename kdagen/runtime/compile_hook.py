"""Compile-on-demand as a hook: the compiler registers itself here; the runtime only calls it.

The runtime runs bundles where no compiler is installed (docs/ARCHITECTURE.md §2), so it imports nothing
of the compiler. :mod:`kdagen.compiler_hooks` (imported by :mod:`kdagen.ops`) registers a
:class:`Compiler` with :func:`register_compiler`; :func:`compile_bundle` calls it, or raises
:class:`KernelLaunchNotImplemented` saying how to emit a bundle elsewhere when none is
registered.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Compiler", "register_compiler", "registered_compiler", "compile_bundle",
           "compiler_available", "toolchain_version", "KernelLaunchNotImplemented",
           "emit_instructions"]


class KernelLaunchNotImplemented(NotImplementedError):
    """No compiler is registered to build a bundle here (or no launcher can run one)."""


@dataclass(frozen=True)
class Compiler:
    """What the compiler gives the runtime.

    ``compile(program, options, chip, out_dir)`` writes a bundle of ``program`` with
    ``options`` for ``chip`` into the folder ``out_dir``; ``available()`` says whether it can
    run on this machine (its MLIR bindings importable); ``toolchain_version()`` is the
    assembler's version (ptxas) that compiled bundles depend on (part of the cache key), or
    None."""
    compile: Callable[[str, Mapping[str, Any], str, os.PathLike], None]
    available: Callable[[], bool]
    toolchain_version: Callable[[], str | None]


_COMPILER: Compiler | None = None


def register_compiler(compiler: Compiler | None) -> None:
    """Install the compile-on-demand hook (None removes it)."""
    global _COMPILER
    _COMPILER = compiler
    toolchain_version.cache_clear()


def registered_compiler() -> Compiler | None:
    return _COMPILER


def compiler_available() -> bool:
    """Whether a registered compiler can build bundles here."""
    return _COMPILER is not None and bool(_COMPILER.available())


@functools.lru_cache(maxsize=1)
def toolchain_version() -> str | None:
    """The registered compiler's assembler version (None without a compiler or assembler)."""
    if _COMPILER is None:
        return None
    try:
        return _COMPILER.toolchain_version()
    except Exception:
        return None


def emit_instructions(chip: str) -> str:
    return (f"emit a kernel bundle on a machine with kdagen's compiler (numba-cuda-mlir): "
            f"`kdagen emit --arch {chip} -o DIR`, copy DIR here and set KDAGEN_BUNDLE=DIR")


def compile_bundle(program: str, options: Mapping[str, Any], chip: str, out_dir) -> None:
    """Compile ``program`` with ``options`` for ``chip`` into the bundle folder ``out_dir``
    through the registered compiler. Raises :class:`KernelLaunchNotImplemented` when none is
    registered."""
    if _COMPILER is None:
        raise KernelLaunchNotImplemented(
            f"kdagen cannot compile {program} for {chip} here: no compiler is registered with "
            f"the runtime (kdagen.runtime.compile_hook.register_compiler; importing "
            f"kdagen.compiler_hooks registers kdagen's own); {emit_instructions(chip)}")
    _COMPILER.compile(program, dict(options), chip, out_dir)
