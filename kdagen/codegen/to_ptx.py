"""The upstream MLIR lowering from gpu + nvvm + llvm dialects to PTX (docs/ARCHITECTURE.md §6).

The stages are data: an ordered list of pass-pipeline pieces, the chip filled in per target.
`lower_to_ptx` runs them on a clone of the module and returns the PTX text of the gpu.module.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict

from .._mlir import gpu, ir, passmanager
from kdagen.target import Target

from .common.kernel import TENSORMAP_ARGS_ATTR, mark_tensormap_params

LOWERING_STAGES: tuple[str, ...] = (
    "gpu-kernel-outlining",
    "convert-scf-to-cf",
    "nvvm-attach-target{{chip={chip} features={features} O=3}}",
    "gpu.module(convert-gpu-to-nvvm)",
    "convert-vector-to-llvm",
    "expand-strided-metadata",
    "finalize-memref-to-llvm",
    "gpu-to-llvm",
    "convert-to-llvm",
    "reconcile-unrealized-casts",
    "gpu-module-to-binary{{format=isa}}",
)

#: stages that only convert ops of these dialects: skipped for a module without any (each
#: walks the whole module; on the largest kernels they were ~15% of the lowering's time)
STAGE_DIALECTS: dict[str, tuple[str, ...]] = {
    "convert-vector-to-llvm": ("vector.",),
    "expand-strided-metadata": ("memref.",),
    "finalize-memref-to-llvm": ("memref.",),
}


GPU_TO_NVVM_STAGE = "gpu.module(convert-gpu-to-nvvm)"


def _split_after(pipeline: str, stage: str) -> tuple[str, str]:
    """``builtin.module(a,b,c)`` split after ``stage`` into two such pipelines."""
    inner = pipeline[len("builtin.module("):-1]
    at = inner.index(stage) + len(stage)
    return f"builtin.module({inner[:at]})", f"builtin.module({inner[at + 1:]})"


class LoweringError(RuntimeError):
    pass


def lowering_pipeline(target: Target, text: str | None = None) -> str:
    """The pass pipeline for ``target``; given the module's ``text``, without the stages of
    dialects it does not use (:data:`STAGE_DIALECTS`)."""
    def needed(stage: str) -> bool:
        dialects = STAGE_DIALECTS.get(stage)
        return text is None or dialects is None or any(d in text for d in dialects)
    stages = ",".join(s.format(chip=target.chip, features=target.ptx_features)
                      for s in LOWERING_STAGES if needed(s))
    return f"builtin.module({stages})"


#: PTX of modules lowered in this process, by (pipeline, module text) digest: the same kernel
#: lowered twice (several emits of one variant, tests) costs LLVM's NVPTX backend once (tens of
#: seconds for a large kernel). ``KDAGEN_PTX_MEMO=0`` turns it off (determinism checks).
_MEMO: "OrderedDict[str, str]" = OrderedDict()
MEMO_ENTRIES = 256


def _memo_key(text: str, target: Target) -> str:
    return hashlib.sha256(f"{lowering_pipeline(target)}\n{text}".encode()).hexdigest()


def memo_lookup(text: str, target: Target) -> str | None:
    """The PTX of a module text lowered in this process before (None if not, or memo off)."""
    if os.environ.get("KDAGEN_PTX_MEMO", "1") == "0":
        return None
    key = _memo_key(text, target)
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key]
    return None


def memo_store(text: str, target: Target, ptx: str) -> None:
    """Remember PTX lowered elsewhere (a worker process) for a module text."""
    if os.environ.get("KDAGEN_PTX_MEMO", "1") == "0":
        return
    _MEMO[_memo_key(text, target)] = ptx
    while len(_MEMO) > MEMO_ENTRIES:
        _MEMO.popitem(last=False)


def lower_to_ptx(module: ir.Module, target: Target) -> str:
    """Lower a GPU container module for ``target`` and return the PTX of its gpu.module."""
    with module.context:
        text = str(module)
        pipeline = lowering_pipeline(target, text)
        use_memo = os.environ.get("KDAGEN_PTX_MEMO", "1") != "0"
        key = _memo_key(text, target)
        if use_memo and key in _MEMO:
            _MEMO.move_to_end(key)
            return _MEMO[key]
        work = ir.Module.parse(text)
        try:
            if TENSORMAP_ARGS_ATTR in text:
                # grid-constant tensor maps: marked between the kernels' conversion to
                # llvm.func and the rest (common.kernel.mark_tensormap_params)
                head, tail = _split_after(pipeline, GPU_TO_NVVM_STAGE)
                passmanager.PassManager.parse(head).run(work.operation)
                mark_tensormap_params(work)
                passmanager.PassManager.parse(tail).run(work.operation)
            else:
                passmanager.PassManager.parse(pipeline).run(work.operation)
        except ir.MLIRError as err:
            raise LoweringError(f"lowering to PTX for {target.chip} failed: {err}") from err
        binaries = [op for op in work.body.operations if op.operation.name == "gpu.binary"]
        if len(binaries) != 1:
            raise LoweringError(f"expected one gpu.binary after lowering, found {len(binaries)}")
        objects = binaries[0].attributes["objects"]
        ptx = gpu.ObjectAttr(objects[0]).object
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    if use_memo:
        _MEMO[key] = ptx
        while len(_MEMO) > MEMO_ENTRIES:
            _MEMO.popitem(last=False)
    return ptx
