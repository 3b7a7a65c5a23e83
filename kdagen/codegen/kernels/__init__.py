"""Kernels assembled directly from the codegen emitters (before the DSL lowering exists)."""
