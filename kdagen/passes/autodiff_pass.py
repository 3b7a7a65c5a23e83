"""``kda-autodiff``: replace a forward program by its derived backward (primal kept)."""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from .base import ModulePass, PassError, register_pass


@register_pass
@dataclass
class AutodiffPass(ModulePass):
    name = "kda-autodiff"
    summary = "derive the backward program by reverse-mode differentiation of the kda IR"
    program: str = ""          # name of the backward program (default: <fwd>_bwd)

    def run(self, module: ir.Module) -> None:
        from ..ir.derive import derive_backward, primal_func, replace_contents
        if primal_func(module) is not None:
            raise PassError("kda-autodiff: the module is already a backward program")
        replace_contents(module, derive_backward(module, name=self.program or None))
