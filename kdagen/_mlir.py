"""The one place that imports the MLIR Python bindings.

kdagen uses the upstream MLIR bindings shipped inside ``numba-cuda-mlir`` (DESIGN.md §2).
Every other module imports ``ir``, ``passmanager``, the dialects, ... from here, so moving
to another carrier of the bindings is a change to this file alone.
"""
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
