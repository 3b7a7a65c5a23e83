"""Head dims the kernels are not built for: zero channels up to the next size they are.

The chunked kernels are built for K in ``ops.SUPPORTED_KEY_DIMS`` and V in
``ops.SUPPORTED_VALUE_DIMS`` (chosen independently). Any other K up to the largest key dim
(and V up to the largest value dim; a larger V runs in parts, :func:`value_parts`) runs at the
next built size, with
zeros in the extra key channels of q, k (and of KDA's gate and its per-channel parameters)
and in the extra value channels of v and of the initial state. That changes no result and no
gradient: a zero key channel adds nothing to q·kᵀ, k·kᵀ or an L2 norm and gives the state a
row that stays zero whatever its decay (k is zero there and so is the initial row), a zero
value channel gives o and the state a column that stays zero, and the gate of a zero row
receives a zero gradient, so nothing leaks into A_log either. The outputs are cut back to K,
V; autograd cuts the gradients (``torch.nn.functional.pad``'s backward). The cost is the
padded size's work (K = 60 runs at 64, K = 100 at 128, K = 32 at 64). Used by the chunked
API (kdagen.api) and the decode API (kdagen.decode, where a state pool of such dims goes
through torch's gather and scatter: the kernels index only pools of the built dims).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kdagen.validation import KdagenInputError

__all__ = ["HeadPad", "plan", "UNPADDED", "value_parts", "next_built"]


def next_built(n: int, built: tuple) -> int | None:
    fits = [d for d in sorted(built) if d >= n]
    return fits[0] if fits else None


def value_parts(V: int, built: tuple) -> list[tuple[int, int]]:
    """[start, end) of the value columns each call takes when V is larger than every built
    size: parts of the largest (the last one shorter, padded by :func:`plan`). The delta rule
    never mixes value columns, so the APIs run one call per part (kdagen.api, kdagen.decode)."""
    part = max(built)
    return [(a, min(a + part, V)) for a in range(0, V, part)]


def plan(K: int, V: int, key_built: tuple, value_built: tuple | None = None) -> "HeadPad":
    """The padding that runs head dims K, V on kernels built for key dims ``key_built`` and
    value dims ``value_built`` (default: the key dims); a clear error naming the argument when
    one is larger than every built size."""
    value_built = key_built if value_built is None else value_built
    for name, what, n, built in (("q", "K", K, key_built), ("v", "V", V, value_built)):
        if next_built(n, built) is None:
            largest = max(built)
            raise KdagenInputError(
                f"{name}: head dim {what} = {n} is not supported; kdagen's kernels take "
                f"{what} up to {largest} (any size up to it: the kernels for "
                f"{sorted(built)} run it with zero-padded channels); split the head into "
                f"heads of at most {largest}")
    return HeadPad(K, V, next_built(K, key_built), next_built(V, value_built))


@dataclass(frozen=True)
class HeadPad:
    K: int
    V: int
    Kp: int       # the built key dim the call runs at
    Vp: int       # the built value dim

    @property
    def active(self) -> bool:
        return (self.K, self.V) != (self.Kp, self.Vp)

    def keys(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """A tensor whose last dim is K (q, k, KDA's g, a per-channel gate parameter)."""
        if x is None or self.Kp == self.K:
            return x
        return F.pad(x, (0, self.Kp - self.K))

    def operands(self, family: str, q, k, v, g) -> tuple:
        """q, k, v and the gate of a call (the gate has key channels for KDA only)."""
        return (self.keys(q), self.keys(k), self.values(v),
                self.keys(g) if family == "kda" else g)

    def values(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """A tensor whose last dim is V (v)."""
        if x is None or self.Vp == self.V:
            return x
        return F.pad(x, (0, self.Vp - self.V))

    def state(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """A state ``[..., K, V]``."""
        if x is None or not self.active:
            return x
        return F.pad(x, (0, self.Vp - self.V, 0, self.Kp - self.K))

    def out(self, o: torch.Tensor | None) -> torch.Tensor | None:
        """An output ``[..., Vp]`` cut back to V (contiguous, as the kernels return it)."""
        if o is None or self.Vp == self.V:
            return o
        return o[..., :self.V].contiguous()

    def out_state(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """A state ``[..., Kp, Vp]`` cut back to ``[..., K, V]`` (an op's empty placeholder
        for a state it was not asked for passes through)."""
        if x is None or not self.active or x.ndim < 2:
            return x
        return x[..., :self.K, :self.V].contiguous()


#: the plan of a call that runs at its own head dims (every method passes its tensors through)
UNPADDED = HeadPad(0, 0, 0, 0)
