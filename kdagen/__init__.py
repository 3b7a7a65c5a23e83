"""kdagen: chunked gated-delta linear attention (KDA, GDN) kernels generated from a Python DSL.

``kdagen.chunk_kda`` and ``kdagen.chunk_gated_delta_rule`` (FLA drop-ins, :mod:`kdagen.api`)
and the decode ops ``kdagen.fused_recurrent_kda`` / ``fused_recurrent_gated_delta_rule``
(:mod:`kdagen.decode`) are imported on first use, so ``import kdagen`` itself imports neither torch nor MLIR.
Gates: ``kdagen.define_gate`` (a new gate in a few DSL lines), ``kdagen.load_gates(PATH)`` (the
gates of a user's file), ``kdagen.Gate``; pass one as ``gate=`` to either op.
"""
from kdagen.version import __version__

__all__ = ["__version__", "chunk_kda", "chunk_gated_delta_rule", "fused_recurrent_kda",
           "fused_recurrent_gated_delta_rule", "define_gate", "load_gates", "Gate"]

_LAZY = {"chunk_kda": ("kdagen.api", "chunk_kda"),
         "chunk_gated_delta_rule": ("kdagen.api", "chunk_gated_delta_rule"),
         "fused_recurrent_kda": ("kdagen.decode", "fused_recurrent_kda"),
         "fused_recurrent_gated_delta_rule": ("kdagen.decode", "fused_recurrent_gated_delta_rule"),
         "define_gate": ("kdagen.ir.gates", "define_gate"),
         "load_gates": ("kdagen.ir.gates", "load_gate_file"),
         "Gate": ("kdagen.ir.gates", "Gate")}


def __getattr__(name):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'kdagen' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
