"""Which kdagen target a CUDA device is."""
from __future__ import annotations

CAPABILITY_TO_CHIP = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120a"}


class UnsupportedDeviceError(RuntimeError):
    pass


def chip_for_capability(major: int, minor: int, device_name: str = "this GPU") -> str:
    try:
        return CAPABILITY_TO_CHIP[(major, minor)]
    except KeyError:
        known = ", ".join(f"sm_{a}{b} ({c})" for (a, b), c in CAPABILITY_TO_CHIP.items())
        raise UnsupportedDeviceError(
            f"{device_name} is sm_{major}{minor}; kdagen generates kernels for {known}") from None


def chip_for_device(device) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    return chip_for_capability(major, minor, torch.cuda.get_device_name(device))
