"""Backward programs derived from forward programs, keeping the primal alongside.

``derive_backward(fwd)`` returns a module holding the backward program (first, with
``kda.program``) and a copy of the forward it was derived from (``kda.primal``), so that a
pass that rewrites the forward (``kda-stable-reassociate``) can re-derive the backward after
the rewrite, also from a printed-and-parsed backward module.
"""
from __future__ import annotations

from kdagen._mlir import ir
from kdagen.ir.accessors import program_func
from kdagen.ir import decay  # noqa: F401  (VJP rules of the decay ops)
from kdagen.ir.autodiff import autodiff

PRIMAL_ATTR = "kda.primal"
PRIMAL_SUFFIX = "_primal"


def primal_func(module: ir.Module):
    """The primal forward kept in a backward module, or None."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and PRIMAL_ATTR in op.attributes:
            return op
    return None


def forward_module(module: ir.Module) -> ir.Module:
    """A module holding only the forward program: the primal of a backward module, or the
    module's own program."""
    primal = primal_func(module)
    with module.context, ir.Location.unknown():
        out = ir.Module.create()
        source = primal if primal is not None else program_func(module)
        copy = source.operation.clone(ip=ir.InsertionPoint(out.body))
        if PRIMAL_ATTR in copy.attributes:
            del copy.attributes[PRIMAL_ATTR]
            name = ir.StringAttr(copy.attributes["sym_name"]).value
            copy.attributes["sym_name"] = ir.StringAttr.get(name.removesuffix(PRIMAL_SUFFIX))
    return out


def derive_backward(forward: ir.Module, name: str | None = None) -> ir.Module:
    """The backward of ``forward``'s program, with the forward kept as its primal."""
    backward = autodiff(forward, name=name)
    with forward.context, ir.Location.unknown():
        fwd = program_func(forward)
        primal = fwd.operation.clone(ip=ir.InsertionPoint(backward.body))
        primal.attributes[PRIMAL_ATTR] = ir.UnitAttr.get()
        primal.attributes["sym_name"] = ir.StringAttr.get(fwd.name.value + PRIMAL_SUFFIX)
    return backward


def replace_contents(module: ir.Module, new: ir.Module) -> None:
    """Make ``module`` hold ``new``'s ops (passes rewrite modules in place)."""
    with module.context, ir.Location.unknown():
        for op in list(module.body.operations):
            op.operation.erase()
        for op in list(new.body.operations):
            op.operation.clone(ip=ir.InsertionPoint(module.body))
