"""The chips kdagen generates code for, and what each one has: the one table of chip facts.

A :class:`Target` is frozen data, read by the passes (budgets: shared memory, consumer
warpgroups, workspace precision), the lowering (capabilities: wgmma, TMA, tcgen05,
setmaxnreg; the native path), the PTX lowering (chip name, PTX features) and the runtime
(which chip a device of compute capability (major, minor) is). Code never branches on a chip's
name: it asks for a capability (``target.has_wgmma``) or reads a number, and an emitter that
needs a capability checks it with :meth:`Target.require`.

The target travels on the IR: the pipeline of a chip starts by setting ``kda.target`` on the
module (``kda-bind-target``, :func:`kdagen.ir.dialect.module_target`), and passes read their
budgets from there.

This module imports nothing (the runtime reads it where no compiler is installed).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Target", "TARGETS", "DEFAULT_CHIPS", "CAPABILITIES", "UnknownTargetError",
           "UnsupportedDeviceError", "get_target", "parse_arch_list", "chips_with",
           "chip_for_capability"]


@dataclass(frozen=True)
class Target:
    chip: str                 # full chip name as ptxas and nvvm-attach-target spell it
    capability: tuple         # CUDA compute capability (major, minor) of the devices it runs on
    ptx_features: str         # PTX ISA version the backend emits
    smem_per_block: int       # bytes of shared memory one block may use (opt-in maximum)
    has_wgmma: bool           # warpgroup matrix products (wgmma.mma_async)
    has_tcgen05: bool         # tensor-memory matrix products (tcgen05.mma)
    has_tma: bool             # bulk tensor copies (cp.async.bulk.tensor) and their mbarriers
    has_setmaxnreg: bool      # per-warpgroup register reallocation
    # budgets and per-chip defaults the passes read from the module's target
    consumer_warpgroups: int  # kda-warp-specialize: consumer warpgroups per CTA
    reserved_smem: int        # kda-warp-specialize: shared memory the consumers keep for their tiles
    workspace_dtype: str      # kda-partition: storage type of the workspaces between kernels
    smem_per_sm: int = 0      # bytes of shared memory an SM shares among its resident blocks
    # kda-assign-layouts: the matrix-product atom whose fragments the tile layouts follow
    # ("wgmma": m64nNk8/k16 warpgroup products; "mma_sync": m16n8k8/k16 warp products)
    mma_atom: str = "mma_sync"

    @property
    def sm_number(self) -> int:
        return int(self.chip[3:].rstrip("a"))

    def require(self, capability: str, what: str) -> None:
        """Fail with an actionable message when an emitter that needs ``capability`` (a
        ``has_*`` field) meets a chip without it."""
        if not getattr(self, capability):
            allowed = chips_with(capability)
            raise ValueError(
                f"{what} is only available on {', '.join(allowed) or 'no chip'}, not {self.chip}; "
                "use the portable path (mma.sync + ldmatrix) or emit for a chip that has it")


TARGETS: dict[str, Target] = {
    # Hopper: 227 KB of shared memory, two consumer warpgroups (setmaxnreg 232/40); fp32
    # workspaces (bf16 ones gave dA_log 1.5e-2 against a bar of 8e-3 for kda_bwd K64 on the
    # H200 check; fp32 ones 6.4e-5).
    "sm_90a": Target("sm_90a", (9, 0), "+ptx87", 227 * 1024, has_wgmma=True, has_tcgen05=False,
                     has_tma=True, has_setmaxnreg=True, consumer_warpgroups=2,
                     reserved_smem=64 * 1024, workspace_dtype="fp32", smem_per_sm=228 * 1024,
                     mma_atom="wgmma"),
    # Datacenter Blackwell: the same budget; accumulators may move to TMEM in codegen.
    "sm_100a": Target("sm_100a", (10, 0), "+ptx87", 227 * 1024, has_wgmma=False,
                      has_tcgen05=True, has_tma=True, has_setmaxnreg=True,
                      consumer_warpgroups=2, reserved_smem=64 * 1024, workspace_dtype="fp32",
                      smem_per_sm=228 * 1024),
    # Consumer Blackwell: ~99 KB of shared memory, one consumer warpgroup; fp32 workspaces:
    # with bf16 ones (chosen once so a chunk stage of the state kernel fit beside the state,
    # which now spills to the global scratch either way) the CPU simulator of its kernels put
    # kda_bwd K = 64's dA_log at 8.9e-3 (bar 8e-3; dv 2.7e-3, dg 3.1e-3), "auto" at 8.4e-3, and
    # fp32 ones at sm_100a's errors (dA_log 1.6e-3, every other output at its rounding floor)
    "sm_120a": Target("sm_120a", (12, 0), "+ptx87", 99 * 1024, has_wgmma=False,
                      has_tcgen05=False, has_tma=True, has_setmaxnreg=True,
                      consumer_warpgroups=1, reserved_smem=16 * 1024, workspace_dtype="fp32",
                      smem_per_sm=100 * 1024),
}
DEFAULT_CHIPS = tuple(TARGETS)
CAPABILITIES = tuple(f.name for f in fields(Target) if f.name.startswith("has_"))


class UnknownTargetError(ValueError):
    pass


class UnsupportedDeviceError(RuntimeError):
    pass


def get_target(chip: str) -> Target:
    try:
        return TARGETS[chip]
    except KeyError:
        raise UnknownTargetError(
            f"arch: unknown chip {chip!r}; kdagen targets {', '.join(TARGETS)} "
            "(note the 'a' suffix: the arch-specific feature sets are required)"
        ) from None


def parse_arch_list(text: str) -> list[Target]:
    """Parse ``"sm_90a,sm_120a"`` (or ``"all"``) into targets, rejecting unknown names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UnknownTargetError(f"arch: empty list; choose from {', '.join(TARGETS)}")
    if names == ["all"]:
        names = list(TARGETS)
    return [get_target(n) for n in dict.fromkeys(names)]


def chips_with(capability: str) -> tuple[str, ...]:
    """The chips that have ``capability`` (a ``has_*`` field of :class:`Target`)."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; one of {', '.join(CAPABILITIES)}")
    return tuple(chip for chip, t in TARGETS.items() if getattr(t, capability))


def chip_for_capability(major: int, minor: int, device_name: str = "this GPU") -> str:
    """The chip of a device of compute capability (major, minor)."""
    for chip, t in TARGETS.items():
        if t.capability == (major, minor):
            return chip
    known = ", ".join(f"sm_{a}{b} ({t.chip})" for t in TARGETS.values() for a, b in [t.capability])
    raise UnsupportedDeviceError(
        f"{device_name} is sm_{major}{minor}; kdagen generates kernels for {known}")
