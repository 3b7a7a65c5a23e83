"""Lowering of kda-dialect programs to GPU kernels (see kernel.py for the design)."""
