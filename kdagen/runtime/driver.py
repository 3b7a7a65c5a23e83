"""Thin, checked wrappers over the CUDA driver API (cuda-bindings). Imports no MLIR.

Every driver call goes through `check`, which raises `DriverError` naming the call, the kernel
(when there is one) and the driver's own error name and text.
"""
from __future__ import annotations

import ctypes
import threading


class DriverError(RuntimeError):
    pass


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as err:  # pragma: no cover - cuda-bindings is a hard dependency
        raise DriverError("cuda-bindings is not installed: pip install cuda-bindings") from err
    return driver


def check(result, call: str, kernel: str | None = None):
    """Unpack a cuda-bindings result tuple ``(CUresult, *values)``, raising on any error."""
    driver = _driver()
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(status)
        _, text = driver.cuGetErrorString(status)
        where = f" for kernel {kernel}" if kernel else ""
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
        raise DriverError(f"{call} failed{where}: {name}: {text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def current_context(device_index: int):
    """The context torch uses on ``device_index`` (its primary context), made current."""
    import torch
    driver = _driver()
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.cuda.current_stream()  # forces torch to create and bind its context
        ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            dev = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
            ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def load_module(image: bytes, what: str):
    """cuModuleLoadData on a cubin or NUL-terminated PTX image."""
    driver = _driver()
    return check(driver.cuModuleLoadData(image), "cuModuleLoadData", what)


def get_function(module, name: str):
    driver = _driver()
    return check(driver.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction", name)


def set_max_dynamic_shared(function, nbytes: int, name: str) -> None:
    driver = _driver()
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(driver.cuFuncSetAttribute(function, attr, nbytes), "cuFuncSetAttribute", name)


_CTYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}


#: a grid-constant tensor map: its 128 bytes by value (codegen.common.kernel.Param kind "tmap")
TensorMapParam = ctypes.c_uint8 * 128


def _param(kind: str, value):
    if kind == "tmap":
        return TensorMapParam.from_buffer_copy(value)
    return _CTYPES[kind](value)


def pack_params(kinds: list[str], values: list) -> tuple[ctypes.Array, list]:
    """Build the ``void*[]`` array cuLaunchKernel expects; returns it and the storage to keep alive."""
    storage = [_param(kind, value) for kind, value in zip(kinds, values)]
    pointers = (ctypes.c_void_p * len(storage))(*[ctypes.addressof(s) for s in storage])
    return pointers, storage


class ParamPack:
    """One kernel's ``void*[]`` parameter array, built once and refilled at each launch:
    :func:`pack_params` built a ctypes value per parameter and the array per launch (~18 us
    of host time per launch on the H100, a fwd+bwd's eight launches 150 us). cuLaunchKernel
    copies the parameters before it returns, so the storage is free again after it; a lock
    keeps two threads (the autograd engine's and the caller's) from filling it at once."""

    def __init__(self, kinds):
        self.kinds = tuple(kinds)
        self.storage = [TensorMapParam() if k == "tmap" else _CTYPES[k]() for k in self.kinds]
        self.pointers = (ctypes.c_void_p * max(1, len(self.storage)))(
            *[ctypes.addressof(s) for s in self.storage])
        self.address = ctypes.addressof(self.pointers)
        self.lock = threading.Lock()

    def fill(self, values) -> int:
        """Write ``values`` into the storage (call with ``lock`` held); the array's address."""
        for slot, kind, value in zip(self.storage, self.kinds, values):
            if kind == "tmap":
                ctypes.memmove(slot, bytes(value), 128)
            else:
                slot.value = value
        return self.address


def launch(function, grid, block, shared_bytes: int, stream_handle: int, kinds, values, name: str,
           pack: ParamPack | None = None):
    """cuLaunchKernel with ``values`` as parameters of types ``kinds``; ``pack``: the kernel's
    preallocated parameter array (refilled), else one built for this launch."""
    driver = _driver()
    if pack is None:
        pointers, _keepalive = pack_params(kinds, values)
        check(driver.cuLaunchKernel(function, *grid, *block, shared_bytes, stream_handle,
                                    ctypes.addressof(pointers), 0), "cuLaunchKernel", name)
        return
    with pack.lock:
        address = pack.fill(values)
        check(driver.cuLaunchKernel(function, *grid, *block, shared_bytes, stream_handle,
                                    address, 0), "cuLaunchKernel", name)
