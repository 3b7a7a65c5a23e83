"""kdagen: chunked gated-delta linear attention (KDA, GDN) kernels generated from a Python DSL.

``kdagen.chunk_kda`` and ``kdagen.chunk_gated_delta_rule`` (FLA drop-ins, :mod:`kdagen.api`)
are imported on first use, so ``import kdagen`` itself imports neither torch nor MLIR.
"""
from kdagen.version import __version__

__all__ = ["__version__", "chunk_kda", "chunk_gated_delta_rule"]

_LAZY = {"chunk_kda": "kdagen.api", "chunk_gated_delta_rule": "kdagen.api"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kdagen' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
