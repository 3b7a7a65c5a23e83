"""What kdagen's compiler registers into its runtime, on import (:mod:`kdagen.ops` imports it).

- ``cpu`` tensors: :class:`InterpreterExecutor`. Builds the program (cached per options), runs
  the ``kda-stable-reassociate`` pipeline, and executes it with :func:`kdagen.interpreter.run`
  in float32 (inputs upcast, outputs cast to the requested dtypes; a state pool output is
  written back into the tensor given under its name among the inputs). A real, correct CPU
  implementation: CI runs opcheck, autograd and torch.compile tests through it.
- compile-on-demand for ``cuda`` tensors (:func:`compile_bundle`): a bundle written by
  :func:`kdagen.bundle_writer.write_bundle` with the default lowering, available where
  the MLIR bindings are importable.

The runtime imports nothing of the compiler; the compiler registers itself here. Importing
this module imports no MLIR: the interpreter, the passes and the lowering are imported when a
program first runs or compiles (a machine without the compiler then gets
:class:`kdagen._mlir.CompilerNotInstalledError` naming the install).
"""
from __future__ import annotations

import functools
import importlib.util
import threading

from kdagen.runtime.compile_hook import Compiler, register_compiler
from kdagen.runtime.executors import Executor, freeze_options, register_executor

__all__ = ["InterpreterExecutor", "stable_program", "compile_bundle", "install"]


@functools.lru_cache(maxsize=64)
def stable_program(program: str, frozen_options: tuple):
    """``build_program(program, **options)`` after ``kda-stable-reassociate`` (cached per
    options; ``frozen_options`` from :func:`kdagen.runtime.executors.freeze_options`)."""
    from kdagen._mlir import ir
    from kdagen.ir.programs import build_program
    from kdagen.passes.registry import parse_pipeline
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
            pools = _pool_outputs(module)
        for name in pools:
            # a state pool: the program wrote rows of the caller's tensor (a float32 copy of
            # it here); put them back, in place
            with torch.no_grad():
                inputs[name].copy_(result[name])
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


def _pool_outputs(module) -> list[str]:
    """The outputs of a program written into the caller's tensor (layout ``pool``)."""
    from kdagen.ir.accessors import arg_specs, program_func
    return [s.name for s in arg_specs(program_func(module))
            if s.role == "output" and s.layout == "pool"]


def compile_bundle(program: str, options, chip: str, out_dir) -> None:
    """Compile ``program`` with ``options`` for ``chip`` into the bundle folder ``out_dir``
    with the default lowering (what ``kdagen emit`` writes)."""
    from kdagen.bundle_writer import DEFAULT_LOWERING, write_bundle
    write_bundle(out_dir, [(program, dict(options))], [chip], lower_options=DEFAULT_LOWERING)


def _mlir_importable() -> bool:
    try:
        return importlib.util.find_spec("numba_cuda_mlir") is not None
    except (ImportError, ValueError):
        return False


def _ptxas_version() -> str | None:
    from kdagen.codegen import ptxas
    return ptxas.ptxas_version()


COMPILER = Compiler(compile=compile_bundle, available=_mlir_importable,
                    toolchain_version=_ptxas_version)


def install() -> None:
    """Register the interpreter for ``cpu`` tensors and compile-on-demand with the runtime."""
    register_executor("cpu", InterpreterExecutor, default=True)
    register_compiler(COMPILER)


install()
