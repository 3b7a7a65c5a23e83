"""Which kdagen target a CUDA device is (the chip facts: :mod:`kdagen.target`)."""
from __future__ import annotations

import functools

from kdagen.target import chip_for_capability

__all__ = ["chip_for_device", "sm_count"]


def chip_for_device(device) -> str:
    import torch
    index = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if index.index is None:
        index = torch.device("cuda", torch.cuda.current_device())
    return _chip_of(index.index)


@functools.lru_cache(maxsize=None)
def _chip_of(index: int) -> str:
    # a device's chip never changes; asked once per kernel launch, it cost host time
    import torch
    major, minor = torch.cuda.get_device_capability(index)
    return chip_for_capability(major, minor, torch.cuda.get_device_name(index))


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """The SMs of CUDA device ``index`` (asked per call: the overlap and segment rules)."""
    import torch
    return int(torch.cuda.get_device_properties(index).multi_processor_count)
