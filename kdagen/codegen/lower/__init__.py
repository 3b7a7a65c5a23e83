"""Lowering of kda-dialect programs (after ``kda-stable-reassociate``) to GPU kernels.

``lower_program(module, target) -> list[LoweredKernel]`` (launch order). Each LoweredKernel has
the gpu module (``.module``, ``.builder``), kernel ``.name``, ``.params`` (calling convention),
``.launch`` (grid rule, block, dynamic shared memory, storage, scratch bytes per CTA),
``.storage`` ("smem" | "hybrid" | "global" | "none") and ``.path`` ("portable-fma",
"portable-mma", "portable" for global kernels, or a native path such as "sm90-native": see
``kdagen.codegen.sm90.native``; ``LowerOptions.path = "native"`` asks for it).

Files:

- ``program.py``  the kda program read into Python objects (no MLIR while emitting);
- ``plan.py``     kernels (one per scan, one per global op; chunk-parallel grid for scans
                  without carried values) and storage (value modes const / param / view /
                  lazy / buffer / carried; liveness; first-fit packing; shared memory,
                  global scratch or both);
- ``tiles.py``    tile references (buffers with strides, lazy expressions) and the per-op
                  emitters (element-wise, broadcast/transpose/extract/embed, cumsum,
                  reduce_sum, tril, tril_inv / tril_solve, dot / decay_dot / decay_matmul as
                  register-tiled fp32 FMA contractions);
- ``kernel.py``   the kernel driver (geometry, loads/stores with varlen / tail / GVA, scans,
                  workspaces, global kernels) and the calling convention (module doc);
- ``backend.py``  the primitives the emitters are written in: MLIR emission, or a CPU lockstep
                  simulator with race / divergent-barrier / bounds checks (``sim.py``);
- ``bundle.py``   ``write_bundle(out_dir, programs_with_options, targets)`` (PTX + cubin +
                  manifest + lowered.json); ``launch.py`` runs a variant from a bundle with
                  torch tensors (no MLIR); ``gpu_check.py`` compares against the float64
                  reference on a GPU.

This package's ``__init__`` imports nothing heavy, so that ``launch`` and ``gpu_check`` work on
machines without MLIR.
"""
from __future__ import annotations

__all__ = ["lower_program", "LoweredKernel", "LowerOptions"]


def lower_program(module, target, **kwargs):
    """See :func:`kdagen.codegen.lower.kernel.lower_program`."""
    from .kernel import lower_program as _lower
    return _lower(module, target, **kwargs)


def __getattr__(name):
    if name in ("LoweredKernel", "LowerOptions"):
        from . import kernel
        return getattr(kernel, name)
    raise AttributeError(name)
