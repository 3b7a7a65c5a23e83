"""Shared-memory tiles: dynamic shared memory, allocation, addressing, typed access, copies.

One extern ``.shared`` array per gpu.module (`declare_dynamic_smem`) is the dynamic shared memory
of every kernel in it; a kernel carves it with a `SmemAllocator` (compile-time offsets, so the
launch contract's dynamic shared-memory size is ``allocator.size_bytes``). A `SmemTile` is a
`SmemLayout` (layouts.py: row-major with padding, or the TMA/wgmma XOR swizzle) at an offset;
all its addressing goes through the layout's pure-Python ``byte_offset``, which the CPU tests
check for bank conflicts and the warp simulator uses.

Global side: a `GlobalView` is a strided 2D window [rows, cols] of a global tensor (a [C, D]
chunk of a [B, T, H, D] tensor is one, see `bthd_tile`), with an optional count of valid rows
(the tail chunk): rows past it read as zero and are not written.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..._mlir import arith, ir, llvm, nvvm, scf
from .ints import IntVal, as_i32, ival
from .kernel import GLOBAL_ADDRESS_SPACE, GpuModuleBuilder, scalar_type
from .layouts import SmemLayout

SHARED_ADDRESS_SPACE = 3
DYNAMIC_SMEM_SYMBOL = "__kdagen_dyn_smem"
DYNAMIC_SMEM_ALIGN = 1024
_DYNAMIC_INDEX = -2147483648
ELEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i64": 8, "f64": 8}


def i32_type() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def i64_type() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def shared_ptr_type() -> ir.Type:
    return llvm.PointerType.get(SHARED_ADDRESS_SPACE)


def global_ptr_type() -> ir.Type:
    return llvm.PointerType.get(GLOBAL_ADDRESS_SPACE)


def vector_type(nbytes: int) -> ir.Type:
    """The integer vector used for an ``nbytes``-wide access (4, 8 or 16 bytes)."""
    if nbytes == 4:
        return i32_type()
    if nbytes in (8, 16):
        return ir.VectorType.get([nbytes // 4], i32_type())
    raise ValueError(f"vector accesses are 4, 8 or 16 bytes, not {nbytes}")


def declare_dynamic_smem(builder: GpuModuleBuilder) -> None:
    """Declare ``extern .shared .align 1024 .b8 __kdagen_dyn_smem[]`` once in the gpu.module."""
    block = builder.gpu_module.bodyRegion.blocks[0]
    for op in block.operations:
        if op.operation.name == "llvm.mlir.global" and \
                ir.StringAttr(op.operation.attributes["sym_name"]).value == DYNAMIC_SMEM_SYMBOL:
            return
    with builder.context, builder.location:
        ops = list(block.operations)
        ip = ir.InsertionPoint(ops[0]) if ops else ir.InsertionPoint(block)
        with ip:
            llvm.GlobalOp(ir.Type.parse("!llvm.array<0 x i8>"), DYNAMIC_SMEM_SYMBOL,
                          ir.Attribute.parse("#llvm.linkage<external>"),
                          addr_space=SHARED_ADDRESS_SPACE, alignment=DYNAMIC_SMEM_ALIGN)


def byte_gep(base: ir.Value, offset, ptr_type: ir.Type) -> ir.Value:
    """``base + offset`` bytes (offset an int, IntVal or i32/i64 value)."""
    if isinstance(offset, int) and offset == 0:
        return base
    if isinstance(offset, int):
        return llvm.getelementptr(ptr_type, base, [], [offset], ir.IntegerType.get_signless(8), 0)
    value = offset.value if isinstance(offset, IntVal) else offset
    return llvm.getelementptr(ptr_type, base, [value], [_DYNAMIC_INDEX],
                              ir.IntegerType.get_signless(8), 0)


class SmemAllocator:
    """Compile-time carving of the dynamic shared memory of one kernel.

    Use inside a kernel body: ``smem = SmemAllocator(builder)``; ``smem.tile(layout)``,
    ``smem.raw(nbytes)``, ``smem.mbarriers(n)``. ``smem.size_bytes`` is the dynamic shared memory
    the launch must request (and, above 48 KB, opt into with cuFuncSetAttribute).
    """

    def __init__(self, builder: GpuModuleBuilder, limit_bytes: int | None = None):
        declare_dynamic_smem(builder)
        self.base = llvm.mlir_addressof(shared_ptr_type(), DYNAMIC_SMEM_SYMBOL)
        self.size_bytes = 0
        self.limit_bytes = limit_bytes

    def _carve(self, nbytes: int, align: int) -> int:
        offset = -(-self.size_bytes // align) * align
        self.size_bytes = offset + nbytes
        if self.limit_bytes is not None and self.size_bytes > self.limit_bytes:
            raise ValueError(f"shared memory: {self.size_bytes} bytes exceed the target's "
                             f"{self.limit_bytes} bytes per block; use smaller tiles or fewer stages")
        return offset

    def tile(self, layout: SmemLayout) -> "SmemTile":
        return SmemTile(self.base, self._carve(layout.size_bytes, layout.alignment), layout)

    def raw(self, nbytes: int, align: int = 16) -> "SmemRegion":
        return SmemRegion(self.base, self._carve(nbytes, align), nbytes)

    def mbarriers(self, count: int) -> list["SmemRegion"]:
        region = self.raw(8 * count, 8)
        return [SmemRegion(self.base, region.offset + 8 * i, 8) for i in range(count)]


@dataclass
class SmemRegion:
    """``nbytes`` of shared memory at a static ``offset`` from the dynamic smem base."""
    base: ir.Value
    offset: int
    nbytes: int

    def ptr(self, byte_offset=0) -> ir.Value:
        return byte_gep(self.base, ival(byte_offset) + self.offset, shared_ptr_type())

    def addr32(self, byte_offset=0) -> IntVal:
        """The 32-bit shared-window address (for descriptors and TMA/mbarrier operands)."""
        return shared_addr32(self.ptr(byte_offset))

    def load(self, type_name: str, byte_offset=0) -> ir.Value:
        return llvm.load(scalar_type(type_name), self.ptr(byte_offset))

    def store(self, value: ir.Value, byte_offset=0) -> None:
        llvm.store(value, self.ptr(byte_offset))


def shared_addr32(ptr: ir.Value) -> IntVal:
    return IntVal(llvm.ptrtoint(i32_type(), ptr))


@dataclass
class SmemTile:
    """A `SmemLayout` placed at a static offset in dynamic shared memory."""
    base: ir.Value
    offset: int
    layout: SmemLayout

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def cols(self) -> int:
        return self.layout.cols

    def byte_offset(self, row, col):
        """Byte offset from the dynamic smem base (int-like: folds when row/col are ints)."""
        return self.layout.byte_offset(row, col) + self.offset

    def ptr(self, row, col) -> ir.Value:
        return byte_gep(self.base, self.byte_offset(row, col), shared_ptr_type())

    def addr32(self, row=0, col=0) -> IntVal:
        return shared_addr32(self.ptr(row, col))

    def load(self, row, col, elem: str) -> ir.Value:
        return llvm.load(scalar_type(elem), self.ptr(row, col))

    def store(self, value: ir.Value, row, col) -> None:
        llvm.store(value, self.ptr(row, col))

    def load_vec(self, row, col, nbytes: int = 16) -> ir.Value:
        """``nbytes`` contiguous bytes starting at (row, col) as i32 / vector<Nxi32>."""
        return llvm.load(vector_type(nbytes), self.ptr(row, col), alignment=nbytes)

    def store_vec(self, value: ir.Value, row, col, nbytes: int = 16) -> None:
        llvm.store(value, self.ptr(row, col), alignment=nbytes)


# ------------------------------------------------------------------------------------------
# Global views and cooperative copies
# ------------------------------------------------------------------------------------------

def _i64(x) -> ir.Value:
    if isinstance(x, int):
        return arith.constant(i64_type(), x)
    value = x.value if isinstance(x, IntVal) else x
    if isinstance(value.type, ir.IndexType):
        return arith.index_cast(i64_type(), value)
    if ir.IntegerType(value.type).width == 64:
        return value
    return arith.extui(i64_type(), value)


@dataclass
class GlobalView:
    """Element (r, c) of a [rows, cols] window lives at ``origin + r·row_stride + c`` elements.

    ``origin`` is a global pointer already offset to element (0, 0) of the window; ``row_stride``
    is in elements (int or i32/i64 value); rows >= ``rows_valid`` (int-like, optional) are out of
    range: loads give zero and stores are skipped.
    """
    origin: ir.Value
    elem: str
    row_stride: object
    rows_valid: object = None

    @property
    def elem_bytes(self) -> int:
        return ELEM_BYTES[self.elem]

    def ptr(self, row, col) -> ir.Value:
        if isinstance(row, int) and isinstance(col, int) and isinstance(self.row_stride, int):
            index = arith.constant(i64_type(), row * self.row_stride + col)
        else:
            index = arith.addi(arith.muli(_i64(row), _i64(self.row_stride)), _i64(col))
        return llvm.getelementptr(global_ptr_type(), self.origin, [index], [_DYNAMIC_INDEX],
                                  scalar_type(self.elem), 0)

    def row_in_range(self, row) -> ir.Value | None:
        if self.rows_valid is None:
            return None
        return arith.cmpi(arith.CmpIPredicate.slt, as_i32(row), as_i32(self.rows_valid))


def offset_ptr(base: ir.Value, elements, elem: str) -> ir.Value:
    """``base + elements`` (an i64-safe element offset) as a global pointer."""
    return llvm.getelementptr(global_ptr_type(), base, [_i64(elements)], [_DYNAMIC_INDEX],
                              scalar_type(elem), 0)


def bthd_tile(base: ir.Value, elem: str, b, t0, h, T, H: int, D: int) -> GlobalView:
    """The [C, D] window of rows t0.. of batch b, head h of a contiguous [B, T, H, D] tensor.

    Offsets are computed in 64 bits (B·T·H·D may exceed 2^31); ``rows_valid = T - t0`` masks the
    tail chunk.
    """
    row = arith.addi(arith.muli(_i64(b), _i64(T)), _i64(t0))
    origin = arith.muli(arith.addi(arith.muli(row, _i64(H)), _i64(h)), _i64(D))
    rows_valid = ival(T) - ival(t0)
    return GlobalView(offset_ptr(base, origin, elem), elem, H * D, rows_valid)


def _chunk_schedule(rows: int, cols: int, elem_bytes: int, nthreads: int, chunk_bytes: int):
    per_row = cols * elem_bytes // chunk_bytes
    if (cols * elem_bytes) % chunk_bytes:
        raise ValueError(f"rows of {cols * elem_bytes} bytes are not a multiple of {chunk_bytes}")
    total = rows * per_row
    if total % nthreads:
        raise ValueError(f"{total} chunks of {chunk_bytes} bytes do not divide over {nthreads} "
                         "threads; change the thread count or the tile")
    return per_row, total // nthreads


def copy_global_to_shared(tile: SmemTile, src: GlobalView, tid, nthreads: int,
                          use_cp_async: bool = False, chunk_bytes: int = 16) -> None:
    """Cooperative copy of ``src`` [tile.rows, tile.cols] into ``tile`` by ``nthreads`` threads.

    Thread ``tid`` moves chunks ``tid + j·nthreads`` (16 bytes each, consecutive threads take
    consecutive chunks of a row: coalesced global reads). With ``use_cp_async`` the copies are
    ``cp.async.cg`` (zero-filled for rows past ``rows_valid``); the caller commits and waits
    (`cp_async_commit`, `cp_async_wait`) and then synchronises the threads. Otherwise plain
    vector loads/stores (rows past ``rows_valid`` store zeros); the caller synchronises.
    """
    if src.elem_bytes != tile.layout.elem_bytes:
        raise ValueError("copy_global_to_shared: element sizes differ")
    per_row, per_thread = _chunk_schedule(tile.rows, tile.cols, src.elem_bytes, nthreads, chunk_bytes)
    elems_per_chunk = chunk_bytes // src.elem_bytes
    tid = ival(tid)
    for j in range(per_thread):
        chunk = tid + j * nthreads
        row, col = chunk // per_row, (chunk % per_row) * elems_per_chunk
        valid = src.row_in_range(row)
        src_row = row if valid is None else IntVal(arith.select(valid, as_i32(row), as_i32(0)))
        gptr = src.ptr(src_row, col)
        if use_cp_async:
            size = None
            if valid is not None:
                size = arith.select(valid, as_i32(chunk_bytes), as_i32(0))
            nvvm.cp_async_shared_global(tile.ptr(row, col), gptr, chunk_bytes,
                                        nvvm.LoadCacheModifierKind.CG if chunk_bytes == 16
                                        else nvvm.LoadCacheModifierKind.CA, cp_size=size)
        else:
            value = llvm.load(vector_type(chunk_bytes), gptr, alignment=chunk_bytes)
            if valid is not None:
                zero = arith.constant(vector_type(chunk_bytes),
                                      ir.DenseElementsAttr.get_splat(vector_type(chunk_bytes),
                                                                     ir.IntegerAttr.get(i32_type(), 0))
                                      if chunk_bytes > 4 else ir.IntegerAttr.get(i32_type(), 0))
                value = arith.select(valid, value, zero)
            tile.store_vec(value, row, col, chunk_bytes)


def copy_shared_to_global(tile: SmemTile, dst: GlobalView, tid, nthreads: int,
                          chunk_bytes: int = 16) -> None:
    """Cooperative vectorised store of ``tile`` to ``dst`` (rows past ``rows_valid`` skipped).
    The caller synchronises before (the tile must be complete)."""
    per_row, per_thread = _chunk_schedule(tile.rows, tile.cols, dst.elem_bytes, nthreads, chunk_bytes)
    elems_per_chunk = chunk_bytes // dst.elem_bytes
    tid = ival(tid)
    for j in range(per_thread):
        chunk = tid + j * nthreads
        row, col = chunk // per_row, (chunk % per_row) * elems_per_chunk
        valid = dst.row_in_range(row)
        if valid is None:
            llvm.store(tile.load_vec(row, col, chunk_bytes), dst.ptr(row, col), alignment=chunk_bytes)
            continue
        branch = scf.IfOp(valid)
        with ir.InsertionPoint(branch.then_block):
            llvm.store(tile.load_vec(row, col, chunk_bytes), dst.ptr(row, col), alignment=chunk_bytes)
            scf.yield_([])


def cp_async_commit() -> None:
    nvvm.cp_async_commit_group()


def cp_async_wait(pending: int = 0) -> None:
    """Wait until at most ``pending`` committed cp.async groups of this thread are in flight."""
    nvvm.cp_async_wait_group(pending)
