"""Reading the parts of a kda module: its program function, the program's arguments, and the
target it is compiled for (``kda.target`` on the builtin module, like Triton's ``ttg.target``).

What the interpreter, the passes, the autodiff and the lowering all read, kept in the IR layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from kdagen._mlir import ir
from kdagen.target import Target, get_target

from .dialect import py_attr

__all__ = ["program_func", "ArgSpec", "arg_specs", "type_info", "TARGET_ATTR", "set_target",
           "module_target"]

#: the builtin-module attribute naming the chip a module is compiled for
TARGET_ATTR = "kda.target"


def type_info(t):
    """(shape tuple, element type string) of a tensor/memref type, or (None, str) otherwise."""
    if isinstance(t, (ir.RankedTensorType, ir.MemRefType)):
        return tuple(t.shape), str(t.element_type)
    return None, str(t)


def program_func(module):
    """The program ``func.func`` of a module (the one with ``kda.program``, else the first)."""
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    if not funcs:
        raise ValueError("module has no func.func")
    for f in funcs:
        if "kda.program" in f.attributes:
            return f
    return funcs[0]


@dataclass
class ArgSpec:
    index: int
    name: str
    role: str
    layout: str
    heads: str | None
    shape: tuple | None
    elt: str
    attrs: dict


def arg_specs(fn) -> list[ArgSpec]:
    """Per-argument metadata of a program function (from its ``kda.*`` argument attributes)."""
    out = []
    arg_attrs = fn.arg_attrs if "arg_attrs" in fn.attributes else None
    for i, a in enumerate(fn.arguments):
        d = py_attr(arg_attrs[i]) if arg_attrs is not None else {}
        shape, elt = type_info(a.type)
        out.append(ArgSpec(i, d.get("kda.name", f"arg{i}"), d.get("kda.role", "input"),
                           d.get("kda.layout", "token"), d.get("kda.heads"), shape, elt, d))
    return out


def set_target(module, chip: str) -> Target:
    """Record on ``module`` the chip it is compiled for (``kda.target = "sm_90a"``)."""
    target = get_target(chip)
    with module.context:
        module.operation.attributes[TARGET_ATTR] = ir.StringAttr.get(target.chip)
    return target


def module_target(module) -> Target | None:
    """The target recorded on ``module``, or None when it has none (a pass test's module)."""
    attrs = module.operation.attributes
    if TARGET_ATTR not in attrs:
        return None
    return get_target(ir.StringAttr(attrs[TARGET_ATTR]).value)
