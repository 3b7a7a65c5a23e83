"""Values of the register-tile lowering that its rules share: accumulators (`Acc`) and the
operand forms seen through views (`through_views`, `row_scaled`)."""
from __future__ import annotations

from ..common.layouts import wgmma_d_coord

V_BLOCK = 64                 # value columns per CTA (the M extent of a transposed product)
SWIZZLE = 128                # bytes: every shared tile of the path is 128B-swizzled
VIEWS = ("kda.pipeline_wait", "kda.convert_layout", "kda.assume_range")


def through_views(v):
    """The value behind view ops (pipeline_wait, layout conversions, ranges, widening
    converts)."""
    while v.owner is not None and (v.owner.op in VIEWS or (
            v.owner.op == "kda.convert" and v.elt == "f32")):
        v = v.owner.operands[0]
    return v


def _broadcast_vector(v, dims: list):
    """The vector ``v`` broadcasts along ``dims`` (``broadcast(x, dims)``, x one-dimensional),
    seen through views, else None."""
    n = through_views(v).owner
    if (n is not None and n.op == "kda.broadcast" and list(n.attrs.get("dims", ())) == dims
            and len(n.operands[0].shape) == 1):
        return n.operands[0]
    return None


def _row_factor(v):
    """The [C] value broadcast over the columns of ``v`` (``broadcast(x, dims=[1])``), else None."""
    return _broadcast_vector(v, [1])


def column_scaled(v) -> tuple:
    """(ring tile value, [V] column factor) when ``v`` is a ring tile (seen through views)
    times a broadcast of one vector over its rows (``x · broadcast(n, dims=[0])``: the fp16
    checkpoints' column norms, kda-narrow-checkpoints{scale=column}), else (None, None)."""
    v = through_views(v)
    if v.owner is None or v.owner.op != "kda.mul":
        return None, None
    for x, f in (v.owner.operands, reversed(v.owner.operands)):
        factor, x = _broadcast_vector(f, [0]), through_views(x)
        if (factor is not None and len(x.shape) == 2 and x.owner is not None
                and x.owner.op in ("kda.load", "kda.load_chunk")):
            return x, factor
    return None, None


def row_scaled(v) -> tuple:
    """(ring load node, [row factor values]) when ``v`` is a ring tile times broadcasts of
    per-row vectors (``q · broadcast(rq) · broadcast(2^G)``), else (None, [])."""
    factors = []
    v = through_views(v)
    while v.owner is not None and v.owner.op == "kda.mul":
        a, b = v.owner.operands
        fa, fb = _row_factor(a), _row_factor(b)
        if fb is not None:
            factors.append(fb)
            v = through_views(a)
        elif fa is not None:
            factors.append(fa)
            v = through_views(b)
        else:
            return None, []
    n = v.owner
    if n is not None and n.op in ("kda.load", "kda.load_chunk") and len(v.shape) == 2:
        return n, factors
    return None, []


class Acc:
    """A [64, N] wgmma accumulator fragment of the warpgroup. ``transposed``: it holds the
    logical tile's transpose (logical (i, j) at accumulator (j - col0, i)); ``col0`` the first
    logical column the M rows stand for (the CTA's value block). Not transposed, ``col0`` is
    the first logical column of its N (the warpgroup's share where several split a tile)."""

    def __init__(self, values: list, n: int, transposed: bool, col0=0):
        self.values, self.n, self.transposed, self.col0 = values, n, transposed, col0

    def coords(self, warp, lane) -> list:
        """(row, column) of the logical tile per register. A transposed accumulator may hold
        several 64-column value blocks one after another (n/2 registers each)."""
        out = []
        per = self.n // 2
        for r in range(len(self.values)):
            part, i = divmod(r, per)
            m, nn = wgmma_d_coord(warp, lane, i)
            if self.transposed:
                out.append((nn, m + self.col0 + V_BLOCK * part))
            else:
                plain = isinstance(self.col0, int) and self.col0 == 0
                out.append((m, nn if plain else nn + self.col0))
        return out


__all__ = ["Acc", "through_views", "row_scaled", "VIEWS", "V_BLOCK", "SWIZZLE"]
