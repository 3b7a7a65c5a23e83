"""TMA tensor maps for kernels of the native paths (host side; imports no MLIR).

A kernel that loads a tensor with ``cp.async.bulk.tensor`` takes the device address of a
128-byte ``CUtensorMap`` as a parameter; the manifest says, per such parameter, which tensor,
how many of its leading dimensions form the row dimension (``flatten``), the element type and
the box (torch order, after flattening). This module encodes the map with
``cuTensorMapEncodeTiled`` (the entry's ``swizzle`` and ``view``, zero fill out of bounds) and puts it in device memory
with an asynchronous copy from pinned memory on the current stream: no host synchronisation, and
a CUDA graph captures the copy. Maps are cached per (device, address, shape, box), so a training
step that reuses its buffers encodes nothing after the first call.
"""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass

ELEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
DATA_TYPES = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
              "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
CACHE_ENTRIES = 1024

_cache: OrderedDict = OrderedDict()          # key -> (device copy, its pinned source)
_bytes_cache: OrderedDict = OrderedDict()    # key -> the encoded 128 bytes
#: maps made (encoded) and device copies made since the process started, for benchmarks: a
#: count that grows every call means the launcher meets new tensor addresses every call
_counts = {"encoded": 0, "copied": 0}
_lock = threading.Lock()


def counts() -> dict:
    """{"encoded": maps encoded, "copied": maps copied to the device} so far (a copy)."""
    return dict(_counts)


class TensorMapError(ValueError):
    """A tensor the kernel's TMA copies cannot describe (the message names it and the fix)."""


def map_shape(shape: tuple, flatten: int) -> tuple:
    """The tensor's shape as the map sees it: the first ``flatten`` dims merged into rows."""
    rows = 1
    for d in shape[:flatten]:
        rows *= int(d)
    return (rows, *(int(d) for d in shape[flatten:]))


SWIZZLES = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
            64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}


#: tensor-map views a kernel may ask for (manifest ``tensor_maps[param]["view"]``)
VIEWS = ("interleave8_rows",)


def view_dims(shape: tuple, box: tuple, view: str | None) -> tuple:
    """(shape, element strides, box), torch order, of the map of a contiguous tensor of
    ``shape`` (after `map_shape`) seen through ``view``.

    ``interleave8_rows``: the box's second-to-last dimension (R rows, a multiple of 8) is split
    into (R/8, 4, 2) with row strides (8, 1, 4), so shared row 8j + 2t + e receives tensor row
    8j + t + 4e — the column order of `kdagen.codegen.common.layouts.interleave8`, applied to the
    rows of a wgmma B operand (TMA cannot permute the contiguous dimension, but it can walk
    overlapping strides)."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    if view is None:
        return tuple(shape), tuple(strides), tuple(box)
    if view != "interleave8_rows":
        raise TensorMapError(f"tensor map: unknown view {view!r}; one of {VIEWS}")
    if len(shape) < 2 or shape[-2] % 8 or box[-2] != shape[-2]:
        raise TensorMapError(f"tensor map: interleave8_rows needs whole tiles of rows that are a "
                             f"multiple of 8 (shape {shape}, box {box})")
    rows, row = shape[-2], strides[-2]
    return ((*shape[:-2], rows // 8, 4, 2, shape[-1]),
            (*strides[:-2], 8 * row, row, 4 * row, 1),
            (*box[:-2], rows // 8, 4, 2, box[-1]))


def encode_args(shape: tuple, dtype: str, box: tuple, swizzle: int = 0,
                strides: tuple | None = None) -> dict:
    """``cuTensorMapEncodeTiled`` arguments (dimension lists innermost first) for a tensor of
    ``shape`` with element ``strides`` (torch order; default contiguous) and a ``box`` of the
    same rank, landing in shared memory with ``swizzle`` (0, 32, 64 or 128 bytes)."""
    if len(shape) != len(box):
        raise TensorMapError(f"tensor map: rank of shape {shape} and box {box} differ")
    if not 1 <= len(shape) <= 5:
        raise TensorMapError(f"tensor map: rank {len(shape)} is outside 1..5")
    eb = ELEM_BYTES[dtype]
    if box[-1] * eb % 16:
        raise TensorMapError(f"tensor map: box row of {box[-1] * eb} bytes is not a multiple of 16")
    if strides is None:
        strides, acc = [], 1
        for d in reversed(shape):
            strides.insert(0, acc)
            acc *= d
    if strides[-1] != 1:
        raise TensorMapError("tensor map: the innermost dimension must be contiguous")
    byte_strides = [strides[i] * eb for i in reversed(range(len(shape) - 1))]  # innermost first
    if any(s % 16 for s in byte_strides):
        raise TensorMapError(f"tensor map: row strides {byte_strides} bytes are not multiples of 16")
    return {
        "tensorDataType": DATA_TYPES[dtype],
        "tensorRank": len(shape),
        "globalDim": list(reversed(shape)),
        "globalStrides": byte_strides,
        "boxDim": list(reversed(box)),
        "elementStrides": [1] * len(shape),
        "interleave": "CU_TENSOR_MAP_INTERLEAVE_NONE",
        "swizzle": SWIZZLES[swizzle],
        "l2Promotion": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
        "oobFill": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
    }


def encode_on_host(args: dict, data_ptr: int) -> bytes:
    """The 128 bytes of the CUtensorMap that ``cuTensorMapEncodeTiled`` makes from ``args``."""
    from cuda.bindings import driver as cu

    from .driver import check
    tmap = check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, args["tensorDataType"]), cu.cuuint32_t(int(args["tensorRank"])),
        data_ptr,
        [cu.cuuint64_t(int(x)) for x in args["globalDim"]],
        [cu.cuuint64_t(int(x)) for x in args["globalStrides"]],
        [cu.cuuint32_t(int(x)) for x in args["boxDim"]],
        [cu.cuuint32_t(int(x)) for x in args["elementStrides"]],
        getattr(cu.CUtensorMapInterleave, args["interleave"]),
        getattr(cu.CUtensorMapSwizzle, args["swizzle"]),
        getattr(cu.CUtensorMapL2promotion, args["l2Promotion"]),
        getattr(cu.CUtensorMapFloatOOBfill, args["oobFill"])), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)


@dataclass(frozen=True)
class MapSpec:
    """A manifest ``tensor_maps`` entry, parsed once (the launcher keeps one per kernel
    parameter, so a launch does not re-read the dict)."""
    dtype: str
    flatten: int
    box: tuple
    swizzle: int = 0
    view: str | None = None
    transposed: bool = False
    #: 2: the tensor (f32) holds each [rows, cols] tile as two tiles of ``dtype`` (16-bit)
    #: in the same bytes, one after the other (a bf16x3 operand's hi and lo parts): the map
    #: sees [.., 2·rows, cols] of ``dtype``
    parts: int = 1

    def __post_init__(self):
        # a launch hashes a dozen entries (map cache keys): hash the fields once
        object.__setattr__(self, "_hash", hash((self.dtype, self.flatten, self.box,
                                                self.swizzle, self.view, self.transposed,
                                                self.parts)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, spec: dict) -> "MapSpec":
        return cls(spec["dtype"], int(spec["flatten"]), tuple(int(b) for b in spec["box"]),
                   int(spec.get("swizzle", 0)), spec.get("view"), bool(spec.get("transposed")),
                   int(spec.get("parts", 1)))


def device_tensor_map(tensor, spec: dict, name: str = "tensor"):
    """A device uint8[128] tensor holding the map of ``tensor`` for the manifest entry ``spec``
    ({"tensor", "dtype", "flatten", "box"}). ``tensor`` must be contiguous, 16-byte aligned and
    of the entry's element type (the launcher guarantees it)."""
    return tensor_map(tensor, MapSpec.of(spec), name)


def map_dims(shape: tuple, element_size: int, spec: MapSpec, name: str) -> tuple:
    """The dims the map of a contiguous tensor of ``shape`` (elements of ``element_size``
    bytes) sees under ``spec``: flattened, transposed, two 16-bit parts per f32 element."""
    dims = map_shape(tuple(shape), spec.flatten)
    if spec.transposed:                  # tiles stored transposed: the last two dims swap
        dims = (*dims[:-2], dims[-1], dims[-2])
    if spec.parts != 1:
        if spec.parts != 2 or element_size != 2 * ELEM_BYTES[spec.dtype]:
            raise TensorMapError(f"{name}: a map of {spec.parts} {spec.dtype} parts per element "
                                 f"of a {8 * element_size}-bit tensor; the kernel's workspace "
                                 "contract is two 16-bit parts of an f32 tensor")
        dims = (*dims[:-2], 2 * dims[-2], dims[-1])
    return dims


def _map_key(tensor, spec: MapSpec, name: str) -> tuple:
    """The cache key of ``tensor``'s map: (device, address, shape, element size, entry), read
    straight off the tensor (a launch looks up a dozen maps: the map's dims are worked out
    only when one is made)."""
    if not tensor.is_contiguous():
        raise TensorMapError(f"{name}: TMA needs a contiguous tensor; call .contiguous() first")
    return (tensor.get_device(), tensor.data_ptr(), tensor.shape, tensor.element_size(), spec)


def _encode(key: tuple, name: str) -> bytes:
    _, ptr, shape, element_size, spec = key
    dims = map_dims(shape, element_size, spec, name)
    _counts["encoded"] += 1
    if ptr % 16:
        raise TensorMapError(f"{name}: TMA needs a 16-byte aligned tensor (data_ptr "
                             f"{ptr:#x}); pass a fresh tensor or .clone() it")
    dims, strides, box = view_dims(dims, spec.box, spec.view)
    return encode_on_host(encode_args(dims, spec.dtype, box, spec.swizzle, strides), ptr)


def _remember(cache: OrderedDict, key: tuple, value) -> None:
    with _lock:
        cache[key] = value
        while len(cache) > CACHE_ENTRIES:
            cache.popitem(last=False)


def _cached(cache: OrderedDict, key: tuple):
    with _lock:
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
        return hit


def tensor_map(tensor, spec: MapSpec, name: str = "tensor"):
    """`device_tensor_map` for a parsed entry: a dict lookup when the map is cached (the
    alignment check runs only when a map is made: the address is part of the key)."""
    key = _map_key(tensor, spec, name)
    hit = _cached(_cache, key)
    if hit is not None:
        return hit[0]
    import torch
    raw = _bytes_of(key, name)
    host = torch.frombuffer(bytearray(raw), dtype=torch.uint8).pin_memory()
    dev = host.to(tensor.device, non_blocking=True)
    _counts["copied"] += 1
    _remember(_cache, key, (dev, host))   # the pinned source lives as long as the copy may run
    return dev


def tensor_map_bytes(tensor, spec: MapSpec, name: str = "tensor") -> bytes:
    """The 128 bytes of the map itself, for a kernel that takes it by value (a grid-constant
    parameter: nothing to copy to the device). Encoded once per (device, address, shape,
    entry)."""
    return _bytes_of(_map_key(tensor, spec, name), name)


def _bytes_of(key: tuple, name: str) -> bytes:
    """The encoded map of ``key``, encoded once (both ways of passing a map share it)."""
    raw = _cached(_bytes_cache, key)
    if raw is None:
        raw = _encode(key, name)
        _remember(_bytes_cache, key, raw)
    return raw


__all__ = ["device_tensor_map", "tensor_map", "tensor_map_bytes", "MapSpec", "counts", "encode_args", "view_dims", "VIEWS", "encode_on_host", "map_shape", "map_dims", "TensorMapError"]
