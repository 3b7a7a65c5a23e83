"""Developer tools outside the product package: the emitter test kernels and the GPU checks.

Run from the repository root: ``python -m tools.testkernels OUT --arch sm_90a`` (emitter test
kernels, needs the compiler), ``python -m tools.emitter_check OUT`` and
``python -m tools.gpu_check BUNDLE`` (on the GPU machine: torch + cuda-bindings only).
"""
