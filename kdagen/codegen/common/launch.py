"""Launch bounds of a kernel: ``.minnctapersm`` / ``.maxnreg`` (occupancy and register budget).

ptxas honours ``setmaxnreg`` only when it knows the register count at kernel entry, i.e. when
the kernel has ``.maxntid`` (the builder's block size) *and* ``.minnctapersm`` or ``.maxnreg``;
otherwise it reports "(C7508) 'setmaxnreg' ignored". Warp-specialised kernels therefore call
``set_launch_bounds(builder, name, min_blocks_per_sm=1)``.
"""
from __future__ import annotations

from ..._mlir import ir
from .kernel import GpuModuleBuilder


def find_kernel(builder: GpuModuleBuilder, name: str):
    for op in builder.gpu_module.bodyRegion.blocks[0].operations:
        if op.operation.name == "gpu.func" and ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
            return op
    raise KeyError(f"no kernel named {name!r} in the gpu.module")


def set_launch_bounds(builder: GpuModuleBuilder, name: str, min_blocks_per_sm: int | None = None,
                      max_registers: int | None = None) -> None:
    """Attach ``nvvm.minctasm`` / ``nvvm.maxnreg`` to kernel ``name`` (lowered to the PTX
    ``.minnctapersm`` / ``.maxnreg`` directives)."""
    func = find_kernel(builder, name)
    i32 = lambda v: ir.IntegerAttr.get(ir.IntegerType.get_signless(32), v)  # noqa: E731
    with builder.context:
        if min_blocks_per_sm is not None:
            func.operation.attributes["nvvm.minctasm"] = i32(min_blocks_per_sm)
        if max_registers is not None:
            if max_registers % 8 and max_registers != 255:
                raise ValueError("max_registers should be a multiple of 8 (or 255)")
            func.operation.attributes["nvvm.maxnreg"] = i32(max_registers)
