"""Elementwise math for gate functions: one spelling for DSL tiles and for torch tensors.

A gate body (:mod:`kdagen.ir.gates`) is written once with these functions and Python's
operators. Called with DSL tiles (inside a program) they emit ``kda`` ops; called with torch
tensors they compute the same function in torch, which is how :meth:`Gate.torch` gives a float64
reference of any gate, autograd included, on a machine without the compiler. Importing this
module imports neither MLIR nor torch (the DSL is imported on the first tile, torch on the
first tensor), so a gate file imports on a GPU machine that only runs bundles.

The torch forms are the numerically careful ones of :mod:`kdagen.reference`: ``softplus`` has
no linearisation threshold and ``sigmoid`` is ``exp(-softplus(-x))``, whose derivative stays
exact where the gate saturates.
"""
from __future__ import annotations

import math

__all__ = ["exp", "exp2", "log", "log2", "sigmoid", "softplus", "sqrt", "rsqrt", "where",
           "clamp", "assume_range", "is_torch"]


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "dtype")


def _torch():
    import torch
    return torch


def _dsl():
    from kdagen.ir import dsl
    return dsl


def _any_torch(*xs) -> bool:
    return any(is_torch(x) for x in xs)


def _torch_softplus(x):
    torch = _torch()
    return torch.logaddexp(x, torch.zeros_like(x))


def exp(x, name=None):
    """Natural exponential (in kernels ``exp2(x·log2 e)``)."""
    if is_torch(x):
        return _torch().exp(x)
    return _dsl().exp(x, name=name)


def exp2(x, name=None):
    if is_torch(x):
        return _torch().exp2(x)
    return _dsl().exp2(x, name=name)


def log(x, name=None):
    """Natural logarithm (in kernels ``log2(x)·ln 2``)."""
    if is_torch(x):
        return _torch().log(x)
    return _dsl().log(x, name=name)


def log2(x, name=None):
    if is_torch(x):
        return _torch().log2(x)
    return _dsl().log2(x, name=name)


def sigmoid(x, name=None):
    if is_torch(x):
        return _torch().exp(-_torch_softplus(-x))
    return _dsl().sigmoid(x, name=name)


def softplus(x, name=None):
    """``log(1 + e^x)``."""
    if is_torch(x):
        return _torch_softplus(x)
    return _dsl().softplus(x, name=name)


def sqrt(x, name=None):
    if is_torch(x):
        return _torch().sqrt(x)
    return _dsl().sqrt(x, name=name)


def rsqrt(x, name=None):
    if is_torch(x):
        return _torch().rsqrt(x)
    return _dsl().rsqrt(x, name=name)


def where(cond, a, b, name=None):
    """``cond ? a : b``."""
    if _any_torch(cond, a, b):
        torch = _torch()
        ref = next(t for t in (a, b, cond) if is_torch(t))
        dtype = ref.dtype if ref.is_floating_point() else torch.float64
        as_t = lambda t: t if is_torch(t) else torch.tensor(t, dtype=dtype, device=ref.device)
        return torch.where(as_t(cond), as_t(a), as_t(b))
    return _dsl().where(cond, a, b, name=name)


def clamp(x, lo: float, hi: float, name=None):
    """``min(max(x, lo), hi)``; its gradient is zero outside ``[lo, hi]`` (torch.clamp's rule)."""
    if is_torch(x):
        return x.clamp(float(lo), float(hi))
    return _dsl().clamp(x, lo, hi, name=name)


def assume_range(x, lo: float, hi: float, name=None):
    """A declaration ``lo <= x <= hi`` for the exponent-range analysis; on torch tensors the
    identity (the declaration is the caller's promise)."""
    if is_torch(x):
        return x
    return _dsl().assume_range(x, lo, hi, name=name)


# constants a gate body may want without importing math itself
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
