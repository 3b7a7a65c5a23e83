"""TMA: ``cp.async.bulk.tensor`` tile copies between global and shared memory, and their host
contract (which ``cuTensorMapEncodeTiled`` arguments the runtime must use).

Available on sm_90a, sm_100a and sm_120a (the emitters check the chip).

**Tensor-map contract.** The kernel does not build tensor maps: the host encodes one
``CUtensorMap`` (128 bytes) per tensor with ``cuTensorMapEncodeTiled`` using exactly the arguments
`TensorMapContract.encode_args` returns and hands it to the kernel in one of two ways (the
lowering option ``tensormap_params``): the 128 bytes themselves as a ``__grid_constant__``
parameter (`Param(name, "tmap")`, ``.param .align 64 .b8 name[128]``: no device copy), or the
address of a 64-byte-aligned *device global* buffer the host copied them into before the launch
(`Param(name, "ptr")`, ``.param .u64``); `tensormap_pointer` gives the kernel a generic address
either way. A copied map must not change while a launch that uses it is in flight. Copies
complete on an mbarrier (``complete_tx::bytes``): the issuing thread first calls
``barrier.mbarrier_arrive_expect_tx(bar, bytes)`` with the total bytes of the phase's copies.

Shared layout: a box of inner extent ``swizzle`` bytes lands as [rows, swizzle bytes] rows in
shared memory, XOR-swizzled on address bits — the panel of a `layouts.SmemLayout` with that
swizzle. A tile wider than the swizzle span is `SmemLayout.num_panels` boxes (one copy each).
Rows past the tensor's extent (the tail chunk of a sequence) are filled with zeros by the TMA unit
(OOB fill NONE = zeros), so the kernel needs no masking on loads.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..._mlir import ir, llvm, nvvm
from ..common.ints import as_i32, ival
from ..common.layouts import SmemLayout
from ..common.smem import ELEM_BYTES, SmemRegion, SmemTile
from ...runtime.tensormap import SWIZZLES, encode_args
from ...target import Target


@dataclass(frozen=True)
class TensorMapContract:
    """The host side of a family of TMA copies of one tensor.

    ``box`` is in torch dimension order (outermost first), like the tensor's shape: loading a
    [C, 64] panel of a [B, T, H, D] tensor is ``box = (1, C, 1, 64)``.
    """
    dtype: str
    box: tuple
    swizzle: int

    def __post_init__(self):
        eb = ELEM_BYTES[self.dtype]
        if not 1 <= len(self.box) <= 5:
            raise ValueError(f"TMA tensors have rank 1..5, got box {self.box}")
        if any(not 1 <= b <= 256 for b in self.box):
            raise ValueError(f"TMA box extents must be 1..256, got {self.box}")
        inner = self.box[-1] * eb
        if inner % 16:
            raise ValueError(f"TMA box inner extent must be a multiple of 16 bytes, got {inner}")
        if self.swizzle and inner > self.swizzle:
            raise ValueError(f"TMA box inner extent {inner} B exceeds the {self.swizzle}B swizzle span")
        if self.swizzle not in SWIZZLES:
            raise ValueError(f"swizzle must be one of {tuple(SWIZZLES)}")

    @property
    def rank(self) -> int:
        return len(self.box)

    @property
    def box_bytes(self) -> int:
        n = ELEM_BYTES[self.dtype]
        for b in self.box:
            n *= b
        return n

    def encode_args(self, shape: tuple, strides: tuple | None = None) -> dict:
        """Arguments of ``cuTensorMapEncodeTiled`` for a tensor of ``shape`` (torch order) with
        element ``strides`` (torch order; default contiguous). Dimension lists are innermost first,
        as the driver API wants; the global address is the tensor's data pointer (16-byte aligned).
        """
        if len(shape) != self.rank:
            raise ValueError(f"tensor rank {len(shape)} != box rank {self.rank}")
        return encode_args(shape, self.dtype, self.box, self.swizzle, strides)


def tile_contract(layout: SmemLayout, dtype: str, rank: int, row_dim: int) -> TensorMapContract:
    """The tensor-map contract for loading a `SmemLayout` tile whose rows run along tensor
    dimension ``row_dim`` (torch order) and whose columns are the innermost dimension; every other
    dimension has box extent 1. E.g. a [C, D] chunk of [B, T, H, D]: ``rank=4, row_dim=1``."""
    if ELEM_BYTES[dtype] != layout.elem_bytes:
        raise ValueError("element size of dtype and layout differ")
    if not 0 <= row_dim < rank - 1:
        raise ValueError("row_dim must be an outer dimension")
    if not layout.swizzle and layout.pad_bytes:
        raise ValueError("TMA cannot write a padded layout; use a swizzled SmemLayout")
    box = [1] * rank
    box[row_dim] = layout.rows
    box[-1] = layout.panel_cols
    return TensorMapContract(dtype, tuple(box), layout.swizzle)


def tensormap_pointer(target: Target, param: ir.Value) -> ir.Value:
    """Generic pointer to the tensor map from its kernel parameter: a global address
    (`Param` kind "ptr", cast) or a grid-constant map (kind "tmap", already generic)."""
    target.require("has_tma", "TMA (cp.async.bulk.tensor)")
    if llvm.PointerType(param.type).address_space == 0:
        return param
    return llvm.addrspacecast(llvm.PointerType.get(0), param)


def prefetch_tensormap(target: Target, tmap: ir.Value) -> None:
    """``prefetch.tensormap``: warm the descriptor cache (one thread, early in the kernel)."""
    target.require("has_tma", "TMA (cp.async.bulk.tensor)")
    nvvm.prefetch(tmap, tensormap=True)


def tma_load(target: Target, dst: ir.Value, tmap: ir.Value, coords_inner_first: list,
             bar: SmemRegion) -> None:
    """``cp.async.bulk.tensor.{r}d.shared::cta.global.tile.mbarrier::complete_tx::bytes``.

    ``dst``: shared pointer (llvm.ptr<3>) of the box; ``coords_inner_first``: element coordinates
    of the box origin, innermost dimension first (i32 int-likes). Issue from one thread.
    The ``.shared::cta`` destination form (PTX 8.6+) is used: the ``.shared::cluster`` form made
    ptxas for sm_120a keep an 8-byte stack frame and extra address conversions.
    """
    target.require("has_tma", "TMA (cp.async.bulk.tensor)")
    if not 1 <= len(coords_inner_first) <= 5:
        raise ValueError("TMA copies have 1..5 coordinates")
    nvvm.cp_async_bulk_tensor_shared_cluster_global(
        dst, tmap, [as_i32(c) for c in coords_inner_first], bar.ptr(), [], is_cta_only=True)


def tma_load_tile(target: Target, tile: SmemTile, tmap: ir.Value, coords: list,
                  bar: SmemRegion) -> int:
    """Load ``tile`` (one copy per swizzle panel) from the tensor whose map follows
    `tile_contract`; ``coords`` in torch order, the last one the first column. Returns the bytes
    the copies will deliver (add them to the mbarrier's expected transaction count)."""
    lay = tile.layout
    for p in range(lay.num_panels):
        inner = ival(coords[-1]) + p * lay.panel_cols
        dst = tile.ptr(0, p * lay.panel_cols) if lay.swizzle else tile.ptr(0, 0)
        tma_load(target, dst, tmap, [inner] + list(reversed(coords[:-1])), bar)
    return lay.size_bytes


def tma_store(target: Target, src: ir.Value, tmap: ir.Value, coords_inner_first: list,
              predicate: ir.Value | None = None) -> None:
    """``cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group``: copy the box at shared
    pointer ``src`` to the tensor at ``coords_inner_first`` (innermost first). Issue from one
    thread after every writer of the box ran `barrier.fence_proxy_async_shared` and the threads
    synchronised; then `tma_store_commit`, and `tma_store_wait` before the box is rewritten.
    ``predicate`` (i1): issue only where true (one thread, without a branch)."""
    target.require("has_tma", "TMA (cp.async.bulk.tensor)")
    if not 1 <= len(coords_inner_first) <= 5:
        raise ValueError("TMA copies have 1..5 coordinates")
    nvvm.cp_async_bulk_tensor_global_shared_cta(tmap, src, [as_i32(c) for c in coords_inner_first],
                                                predicate=predicate)


def tma_store_commit(target: Target) -> None:
    target.require("has_tma", "TMA (cp.async.bulk.tensor)")
    nvvm.cp_async_bulk_commit_group()


def tma_store_wait(target: Target, pending: int = 0, read_only: bool = True) -> None:
    """Wait until at most ``pending`` bulk store groups are in flight (``.read``: only until their
    shared-memory source has been read, enough to reuse the tile)."""
    target.require("has_tma", "TMA (cp.async.bulk.tensor)")
    nvvm.cp_async_bulk_wait_group(pending, read=read_only or None)
