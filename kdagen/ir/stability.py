"""The stability report: every exponential of a stabilised program, its proven bound and why.

``kda-stable-reassociate`` leaves on each ``kda.exp2`` and each decay product
(``kda.decay_dot`` / ``kda.decay_matmul``, whose exponentials are inside the op) the proven
bound of the exponent (``exp_bound``: |argument| ≤ it), how it was proven (``exp_proof``), and
the guard it needed (``clamp_min``: an argument that may underflow is clamped at −126, changing
the value by < 2^−126; ``clamp_max``: an argument that may overflow is saturated at +126,
proven to reach only the clamp of the gate's enforced range). This module reads them back as
rows a researcher reads (``kdagen stability``): a new gate's report says which exponentials its
declared range bounds and how.
"""
from __future__ import annotations

from dataclasses import dataclass

from kdagen._mlir import ir
from kdagen.ir.accessors import program_func

__all__ = ["ExpRow", "stability_rows", "EXP_OPS"]

EXP_OPS = ("kda.exp2", "kda.decay_dot", "kda.decay_matmul")


@dataclass(frozen=True)
class ExpRow:
    kernel: str          # the kernel the op runs in (kda.kernel of its top-level op), or "-"
    op: str              # exp2 / decay_dot / decay_matmul
    value: str           # the result's name (the DSL's local name where it had one)
    shape: str           # e.g. 64x128
    bound: float         # proven |exponent| <= bound
    guard: str           # clamp below / saturate above / none
    proof: str           # exp_proof


def _float(op, name):
    return float(ir.FloatAttr(op.attributes[name]).value) if name in op.attributes else None


def _loc_name(op) -> str | None:
    if "name" in op.attributes:
        return ir.StringAttr(op.attributes["name"]).value
    loc = str(op.location)
    if loc.startswith('loc("') and '"' in loc[5:]:
        return loc[5:loc.index('"', 5)]
    return None


def _value_name(op) -> str:
    """The result's name, else what it exponentiates (``2^(name)`` or ``2^(op of name)``)."""
    name = _loc_name(op)
    if name:
        return name
    if not len(op.operands):
        return "?"
    arg = op.operands[0]
    owner = None if isinstance(arg, ir.BlockArgument) else arg.owner
    owner = getattr(owner, "operation", owner)
    if owner is None:
        return "2^(argument)"
    inner = _loc_name(owner)
    if inner:
        return f"2^({inner})"
    sources = [n for n in (_loc_name(getattr(v.owner, "operation", v.owner))
                           for v in owner.operands if not isinstance(v, ir.BlockArgument)) if n]
    return f"2^({owner.name.split('.', 1)[-1]} of {', '.join(sources) or '...'})"


def _operands(op) -> str:
    """``(a, b)``: the names of a decay product's two factors."""
    names = []
    for v in list(op.operands)[:2]:
        owner = None if isinstance(v, ir.BlockArgument) else getattr(v.owner, "operation", v.owner)
        names.append((_loc_name(owner) if owner is not None else None) or "?")
    return f"({', '.join(names)})"


def _shape(op) -> str:
    if not len(op.results):
        return "-"
    t = op.results[0].type
    try:
        shape = ir.RankedTensorType(t).shape
    except (ValueError, TypeError):
        return "-"
    return "x".join(str(d) for d in shape) or "scalar"


def _guard(op) -> str:
    parts = []
    lo, hi = _float(op, "clamp_min"), _float(op, "clamp_max")
    if lo is not None:
        parts.append(f"clamped below at {lo:g}")
    if hi is not None:
        parts.append(f"saturated at {hi:g}")
    return "; ".join(parts) or "none"


def stability_rows(module) -> list[ExpRow]:
    """One row per exponential op of ``module`` (after ``kda-stable-reassociate``; before it
    the rows have no bound and say so), in program order, labelled by kernel."""
    fn = program_func(module)
    rows: list[ExpRow] = []

    def visit(op, kernel):
        o = op.operation
        if "kda.kernel" in o.attributes:
            kernel = ir.StringAttr(o.attributes["kda.kernel"]).value
        if o.name in EXP_OPS:
            bound = _float(o, "exp_bound")
            proof = (ir.StringAttr(o.attributes["exp_proof"]).value if "exp_proof" in o.attributes
                     else "not proven: run kda-stable-reassociate first")
            value = _value_name(o) if o.name == "kda.exp2" else (_loc_name(o) or _operands(o))
            rows.append(ExpRow(kernel, o.name.split(".", 1)[1], value, _shape(o),
                               float("inf") if bound is None else bound, _guard(o), proof))
        for region in o.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner, kernel)

    for block in fn.regions[0].blocks:
        for op in block.operations:
            visit(op, "-")
    return rows
