"""Load kernels of a bundle onto a device and launch them on torch's current stream.

A `KernelLibrary` reads a bundle's manifest once; kernels are loaded lazily, per (device,
context), from the cubin for the device's exact chip when the bundle has one, else from PTX
(the driver JIT-compiles it). Modules stay cached for the life of the process.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .bundle import BundleError, KernelEntry, read_manifest
from . import driver
from .chips import chip_for_device

_DEFAULT_SHARED_LIMIT = 48 * 1024


@dataclass
class LoadedKernel:
    entry: KernelEntry
    function: object
    load_seconds: float

    def __post_init__(self):
        self.kinds = [p["kind"] for p in self.entry.params]
        self.block = tuple(int(b) for b in self.entry.launch["block"])
        self.shared = int(self.entry.launch.get("dynamic_shared_memory", 0))
        self.pack = driver.ParamPack(self.kinds)

    def launch(self, grid, args: list, stream=None) -> None:
        import torch
        kinds = self.kinds
        if len(args) != len(kinds):
            raise TypeError(f"kernel {self.entry.name}: expected {len(kinds)} arguments "
                            f"({', '.join(p['name'] for p in self.entry.params)}), got {len(args)}")
        values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        stream = stream if stream is not None else torch.cuda.current_stream()
        driver.launch(self.function, tuple(int(g) for g in grid), self.block, self.shared,
                      stream.cuda_stream, kinds, values, self.entry.name, pack=self.pack)


_bound = threading.local()


def _context(index: int) -> int:
    """The handle of torch's (primary) context on device ``index``, made current on this thread.

    Driver contexts are current per thread, and the autograd engine runs a backward on its own
    thread: that thread has none bound until its first CUDA runtime call, and with no gradient
    memsets our kernel load can be the first (cuModuleLoadData then fails with
    CUDA_ERROR_INVALID_CONTEXT). So the binding is remembered per thread, not per process; the
    lookup per launch stays a dict hit."""
    contexts = getattr(_bound, "contexts", None)
    if contexts is None:
        contexts = _bound.contexts = {}
    ctx = contexts.get(index)
    if ctx is None:
        ctx = contexts[index] = int(driver.current_context(index))
    return ctx


class KernelLibrary:
    def __init__(self, bundle_dir: str | Path):
        self.bundle_dir = Path(bundle_dir)
        self.manifest = read_manifest(self.bundle_dir)
        self._loaded: dict[tuple, LoadedKernel] = {}
        self._lock = threading.Lock()

    def entry(self, name: str, chip: str) -> KernelEntry:
        for entry in self.manifest.kernels:
            if entry.name == name and entry.chip == chip:
                return entry
        have = sorted({(e.name, e.chip) for e in self.manifest.kernels})
        raise BundleError(f"bundle {self.bundle_dir} has no kernel {name} for {chip} "
                          f"(it has: {have}); re-emit it with `kdagen emit --arch {chip}`")

    def get(self, name: str, device) -> LoadedKernel:
        import torch
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        ctx = _context(index)
        key = (index, ctx, name)
        with self._lock:
            if key not in self._loaded:
                self._loaded[key] = self._load(self.entry(name, chip_for_device(index)))
            return self._loaded[key]

    def _load(self, entry: KernelEntry) -> LoadedKernel:
        start = time.perf_counter()
        if entry.cubin_file and (self.bundle_dir / entry.cubin_file).is_file():
            image = (self.bundle_dir / entry.cubin_file).read_bytes()
        else:
            image = (self.bundle_dir / entry.ptx_file).read_bytes() + b"\0"
        module = driver.load_module(image, entry.name)
        function = driver.get_function(module, entry.name)
        shared = int(entry.launch.get("dynamic_shared_memory", 0))
        if shared > _DEFAULT_SHARED_LIMIT:
            driver.set_max_dynamic_shared(function, shared, entry.name)
        return LoadedKernel(entry, function, time.perf_counter() - start)
