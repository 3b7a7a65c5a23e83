"""The one place that imports the MLIR Python bindings.

kdagen uses the upstream MLIR bindings shipped inside ``numba-cuda-mlir`` (docs/ARCHITECTURE.md §6).
Every other module imports ``ir``, ``passmanager``, the dialects, ... from here, so moving
to another carrier of the bindings is a change to this file alone.

The bindings are the compiler's dependency, not the runtime's: ``pip install kdagen`` runs
kernel bundles with torch and cuda-bindings alone, ``pip install 'kdagen[compiler]'`` adds
them. Without them, importing this module raises :class:`CompilerNotInstalledError` naming
that install (instead of a bare ``No module named 'numba_cuda_mlir'``).
"""

COMPILER_PACKAGE = "numba-cuda-mlir==0.6.0"
INSTALL_HINT = (f"install kdagen's compiler with `pip install 'kdagen[compiler]'` "
                f"(or `pip install {COMPILER_PACKAGE}`)")


class CompilerNotInstalledError(ModuleNotFoundError):
    """kdagen's compiler (the MLIR bindings of numba-cuda-mlir) is not installed."""


try:
    from numba_cuda_mlir._mlir import ir, passmanager, rewrite  # noqa: F401
    from numba_cuda_mlir._mlir.dialects import (  # noqa: F401
        arith,
        func,
        gpu,
        irdl,
        llvm,
        math,
        memref,
        nvgpu,
        nvvm,
        scf,
        vector,
    )
except ModuleNotFoundError as err:
    if not (err.name or "").startswith("numba_cuda_mlir"):
        raise
    raise CompilerNotInstalledError(
        f"this needs kdagen's compiler (the MLIR bindings of {COMPILER_PACKAGE}), which is not "
        f"installed: {INSTALL_HINT}. Kernel bundles emitted elsewhere run without it "
        f"(KDAGEN_BUNDLE=DIR).", name="numba_cuda_mlir") from None
