"""Builds a `gpu.module` holding `gpu.func` kernels with typed parameters.

This is the skeleton every kernel is emitted into: a module marked as a GPU container, one
gpu.module per bundle, and kernels whose parameters are global pointers or scalars.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..._mlir import arith, gpu, ir, llvm

GLOBAL_ADDRESS_SPACE = 1
GENERIC_ADDRESS_SPACE = 0
#: the gpu.func attribute listing its ``tmap`` parameters; `mark_tensormap_params` turns them
#: into grid constants once the kernel is an llvm.func (the NVVM dialect accepts
#: ``nvvm.grid_constant`` only there, and convert-gpu-to-nvvm drops ``llvm.byval``)
TENSORMAP_ARGS_ATTR = "kdagen.tensormap_args"
TENSORMAP_BYTES = 128


@dataclass(frozen=True)
class Param:
    """One kernel parameter: ``kind`` is "ptr" (global pointer), "tmap" (a 128-byte
    ``CUtensorMap`` passed by value, a ``__grid_constant__`` parameter: the kernel sees a generic
    pointer to it) or a scalar type name."""
    name: str
    kind: str                 # "ptr", "tmap", "i32", "i64", "f32"
    elem: str | None = None   # for pointers: the element type the kernel reads/writes

    def mlir_type(self) -> ir.Type:
        if self.kind == "ptr":
            return llvm.PointerType.get(GLOBAL_ADDRESS_SPACE)
        if self.kind == "tmap":
            return llvm.PointerType.get(GENERIC_ADDRESS_SPACE)
        return scalar_type(self.kind)


def scalar_type(name: str) -> ir.Type:
    table = {
        "i32": lambda: ir.IntegerType.get_signless(32),
        "i64": lambda: ir.IntegerType.get_signless(64),
        "f32": ir.F32Type.get,
        "f16": ir.F16Type.get,
        "bf16": ir.BF16Type.get,
        "f64": ir.F64Type.get,
    }
    try:
        return table[name]()
    except KeyError:
        raise ValueError(f"unknown scalar type {name!r}; known: {', '.join(table)}") from None


class GpuModuleBuilder:
    """Owns an MLIR context and a module with one ``gpu.module``; kernels are added to it."""

    def __init__(self, name: str = "kdagen_kernels"):
        self.context = ir.Context()
        self.location = ir.Location.unknown(self.context)
        with self.context, self.location:
            self.module = ir.Module.create()
            self.module.operation.attributes["gpu.container_module"] = ir.UnitAttr.get()
            with ir.InsertionPoint(self.module.body):
                self.gpu_module = gpu.GPUModuleOp(name)
                self.gpu_module.bodyRegion.blocks.append()

    @contextmanager
    def kernel(self, name: str, params: list[Param], block_size: tuple[int, int, int]):
        """Open a kernel body; yields a dict of parameter values by name."""
        with self.context, self.location:
            with ir.InsertionPoint(self.gpu_module.bodyRegion.blocks[0]):
                ftype = ir.FunctionType.get([p.mlir_type() for p in params], [])
                func_op = gpu.GPUFuncOp(ftype, sym_name=name, kernel=True,
                                        known_block_size=list(block_size))
                tmaps = [i for i, p in enumerate(params) if p.kind == "tmap"]
                if tmaps:
                    func_op.attributes[TENSORMAP_ARGS_ATTR] = ir.DenseI32ArrayAttr.get(tmaps)
                entry = func_op.add_entry_block()
            with ir.InsertionPoint(entry):
                yield {p.name: entry.arguments[i] for i, p in enumerate(params)}
                gpu.return_([])

    def verify(self) -> None:
        with self.context:
            self.module.operation.verify()


def mark_tensormap_params(module: ir.Module) -> None:
    """Make the ``tmap`` parameters of every kernel of ``module`` (after convert-gpu-to-nvvm:
    llvm.func kernels) 128-byte ``byval`` grid constants, 64-byte aligned: NVPTX then declares
    them ``.param .align 64 .b8 name[128]`` and hands the kernel their generic address."""
    storage = ir.Type.parse(f"!llvm.array<{TENSORMAP_BYTES // 8} x i64>")
    align = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 64)

    def visit(op) -> None:
        if op.name == "llvm.func" and TENSORMAP_ARGS_ATTR in op.attributes:
            marked = set(ir.DenseI32ArrayAttr(op.attributes[TENSORMAP_ARGS_ATTR]))
            count = len(op.regions[0].blocks[0].arguments)
            old = op.attributes["arg_attrs"] if "arg_attrs" in op.attributes else None
            attrs = []
            for i in range(count):
                entry = {a.name: a.attr for a in ir.DictAttr(old[i])} if old is not None else {}
                if i in marked:
                    entry.update({"llvm.byval": ir.TypeAttr.get(storage), "llvm.align": align,
                                  "nvvm.grid_constant": ir.UnitAttr.get()})
                attrs.append(ir.DictAttr.get(entry))
            op.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
            del op.attributes[TENSORMAP_ARGS_ATTR]
            return
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner.operation)

    visit(module.operation)


# --- small value helpers used by emitters (must be called inside an insertion point) ---

def const_i32(value: int) -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(32), value)


def const_f32(value: float) -> ir.Value:
    return arith.constant(ir.F32Type.get(), float(value))


def to_i64(value: ir.Value) -> ir.Value:
    """Widen an index or i32 value to i64 (address arithmetic is done in 64 bits)."""
    i64 = ir.IntegerType.get_signless(64)
    if isinstance(value.type, ir.IndexType):
        return arith.index_cast(i64, value)
    if ir.IntegerType(value.type).width == 64:
        return value
    return arith.extsi(i64, value)


def to_index(value: ir.Value) -> ir.Value:
    if isinstance(value.type, ir.IndexType):
        return value
    return arith.index_cast(ir.IndexType.get(), value)
