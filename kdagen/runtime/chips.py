"""Which kdagen target a CUDA device is (the chip facts: :mod:`kdagen.target`)."""
from __future__ import annotations

from kdagen.target import chip_for_capability

__all__ = ["chip_for_device"]


def chip_for_device(device) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    return chip_for_capability(major, minor, torch.cuda.get_device_name(device))
