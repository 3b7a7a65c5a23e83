"""Generic passes: binding the target, verification and MLIR's own canonicalization."""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir, passmanager
from ..ir.accessors import module_target, set_target
from ..target import TARGETS
from .base import ModulePass, PassError, register_pass


@register_pass
@dataclass
class BindTargetPass(ModulePass):
    """Record the chip on the module (``kda.target``): the first step of a chip's pipeline;
    the passes after it read their budgets from the module's target."""
    name = "kda-bind-target"
    summary = "set the module's target chip (kda.target), which later passes read"
    chip: str = "sm_90a"
    option_choices = {"chip": tuple(TARGETS)}

    def run(self, module: ir.Module) -> None:
        bound = module_target(module)
        if bound is not None and bound.chip != self.chip:
            raise PassError(f"kda-bind-target: the module is already compiled for {bound.chip}, "
                            f"not {self.chip}")
        set_target(module, self.chip)


@register_pass
@dataclass
class VerifyPass(ModulePass):
    """Run MLIR's verifier (and the kda dialect's shape rules when present)."""
    name = "verify"
    summary = "verify the module"

    def run(self, module: ir.Module) -> None:
        with module.context:
            if not module.operation.verify():
                raise PassError("module does not verify")
        try:
            from ..ir.dialect import verify_kda
        except ImportError:
            return
        verify_kda(module)


@register_pass
@dataclass
class CanonicalizePass(ModulePass):
    """MLIR's canonicalizer followed by common-subexpression elimination."""
    name = "canonicalize"
    summary = "fold constants, remove dead ops, merge duplicate ops"
    cse: bool = True

    def run(self, module: ir.Module) -> None:
        pipeline = "builtin.module(canonicalize" + (",cse" if self.cse else "") + ")"
        with module.context:
            passmanager.PassManager.parse(pipeline).run(module.operation)
