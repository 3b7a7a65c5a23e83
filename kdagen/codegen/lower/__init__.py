"""Lowering of kda-dialect programs (after ``kda-stable-reassociate``) to GPU kernels.

``kernel.lower_program(module, target) -> list[LoweredKernel]`` (launch order). Each LoweredKernel has
the gpu module (``.module``, ``.builder``), kernel ``.name``, ``.params`` (calling convention),
``.launch`` (grid rule, block, dynamic shared memory, storage, scratch bytes per CTA),
``.storage`` ("smem" | "hybrid" | "global" | "none") and ``.path`` ("portable-fma",
"portable-mma", "portable" for global kernels, or a native path such as "sm90-native": see
``kdagen.codegen.lower.sm90_native``; ``LowerOptions.path = "native"`` asks for it).

Files:

- ``program.py``  the kda program read into Python objects (no MLIR while emitting);
- ``plan.py``     kernels (one per scan, one per global op; chunk-parallel grid for scans
                  without carried values) and how the lowering treats each op (from the
                  dialect's effects and kinds);
- ``storage.py``  storage per kernel (value modes const / param / view / lazy / buffer /
                  carried; liveness; first-fit packing; shared memory, global scratch or both);
- ``tiles.py``    tile references (buffers with strides, lazy expressions) and the per-op
                  emitters (element-wise, broadcast/transpose/extract/embed, cumsum,
                  reduce_sum, tril, tril_inv / tril_solve, dot / decay_dot / decay_matmul as
                  register-tiled fp32 FMA contractions);
- ``emitter.py``  the kernel emitters (geometry, loads/stores with varlen / tail / GVA, scans,
                  workspaces, global kernels) and the calling convention (module doc);
- ``kernel.py``   the driver of one program's kernels: partition, choose the path, size the
                  storage, emit (``lower_program``, ``prepare``); ``options.py`` its options;
- ``sm90_native.py``  the sm_90a native path (TMA producer + wgmma consumer warpgroups);
- ``cost.py``     the static cost counter the emitters feed while emitting (events per chunk
                  step and consumer thread, weighted by static trip counts; no IR change);
                  ``cost_model.py`` the latency model turning them into an estimated µs per
                  chunk step / per CTA (``LoweredKernel.cost``, the driver's ``cost`` stage);
- ``backend.py``  the primitives the emitters are written in, dispatched to a backend:
                  ``mlir_backend.py`` (MLIR emission) or ``sim_backend.py`` (a CPU lockstep
                  simulator with race / divergent-barrier / bounds checks), which ``sim.py``
                  runs whole programs on.

The compile driver (``kdagen.driver``) runs it between the passes and PTX; the runtime runs
the bundles (``kdagen.runtime.launch``, no MLIR); ``tools/gpu_check.py`` compares against the
float64 reference on a GPU.
"""
