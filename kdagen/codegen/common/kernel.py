"""Builds a `gpu.module` holding `gpu.func` kernels with typed parameters.

This is the skeleton every kernel is emitted into: a module marked as a GPU container, one
gpu.module per bundle, and kernels whose parameters are global pointers or scalars.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..._mlir import arith, gpu, ir, llvm

GLOBAL_ADDRESS_SPACE = 1


@dataclass(frozen=True)
class Param:
    """One kernel parameter: ``kind`` is "ptr" (global pointer) or a scalar type name."""
    name: str
    kind: str                 # "ptr", "i32", "i64", "f32"
    elem: str | None = None   # for pointers: the element type the kernel reads/writes

    def mlir_type(self) -> ir.Type:
        if self.kind == "ptr":
            return llvm.PointerType.get(GLOBAL_ADDRESS_SPACE)
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
                entry = func_op.add_entry_block()
            with ir.InsertionPoint(entry):
                yield {p.name: entry.arguments[i] for i, p in enumerate(params)}
                gpu.return_([])

    def verify(self) -> None:
        with self.context:
            self.module.operation.verify()


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
