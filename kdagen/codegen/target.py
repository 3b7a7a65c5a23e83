"""The chips kdagen generates code for.

A `Target` is frozen data: shared passes read its numbers (shared-memory budget, ...) but never
branch on its name; arch-specific emitters under ``codegen/sm*`` check it with `require_chip`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    chip: str                 # full chip name as ptxas and nvvm-attach-target spell it
    ptx_features: str         # PTX ISA version the backend emits
    smem_per_block: int       # bytes of shared memory one block may use (opt-in maximum)
    has_wgmma: bool
    has_tcgen05: bool
    has_tma: bool

    @property
    def sm_number(self) -> int:
        return int(self.chip[3:].rstrip("a"))


TARGETS: dict[str, Target] = {
    "sm_90a": Target("sm_90a", "+ptx87", 227 * 1024, has_wgmma=True, has_tcgen05=False, has_tma=True),
    "sm_100a": Target("sm_100a", "+ptx87", 227 * 1024, has_wgmma=False, has_tcgen05=True, has_tma=True),
    "sm_120a": Target("sm_120a", "+ptx87", 99 * 1024, has_wgmma=False, has_tcgen05=False, has_tma=True),
}
DEFAULT_CHIPS = tuple(TARGETS)


class UnknownTargetError(ValueError):
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


def require_chip(target: Target, allowed: tuple[str, ...], what: str) -> None:
    """Fail with an actionable message when an arch-specific emitter meets the wrong chip."""
    if target.chip not in allowed:
        raise ValueError(
            f"{what} is only available on {', '.join(allowed)}, not {target.chip}; "
            "use the portable path (mma.sync + ldmatrix) or emit for a chip that has it"
        )
