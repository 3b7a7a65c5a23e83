"""DSL constructors and VJP rules of the bounded decay products ``kda.decay_dot`` and
``kda.decay_matmul`` (semantics in :mod:`kdagen.ir.dialect`).

With ``E[i, j, d] = 2^(P[i, d] − Q[j, d])`` masked to ``j ≤ i + diagonal``:

    decay_dot(A, B, P, Q)[i, j]            = Σ_d A[i, d] B[j, d] E[i, j, d]
    decay_matmul(W, X, P, Q)[i, d]         = Σ_j W[i, j] X[j, d] E[i, j, d]
    decay_matmul(W, X, P, Q, transpose)[j, d] = Σ_i W[i, j] X[i, d] E[i, j, d]

The three are closed under differentiation — each adjoint is one of them with the same P, Q
and mask — and the adjoint of an exponent is ``±ln2 · operand ⊙ its adjoint``. So a program
whose exponentials were made relative by ``kda-stable-reassociate`` differentiates into a
backward whose exponents carry the same proven bounds, and the gate gradient comes out as
``ln2 · (A ⊙ dA − B ⊙ dB)``: every term O(1), no catastrophic cancellation.
"""
from __future__ import annotations

from kdagen._mlir import ir
from kdagen.ir import dsl
from kdagen.ir.autodiff import vjp_rule
from kdagen.ir.dsl import LN2, Tile

# Attributes that describe E (mask, block size, proven bound) and travel to every adjoint.
_CARRIED = ("subblock", "exact_diagonal", "exp_bound", "exp_proof", "clamp_min")


def _attrs(attrs: dict, **extra) -> dict:
    out = {"diagonal": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(attrs["diagonal"])),
           "subblock": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(attrs.get("subblock", 1))),
           "exact_diagonal": ir.BoolAttr.get(bool(attrs.get("exact_diagonal", False)))}
    if "exp_bound" in attrs:
        out["exp_bound"] = ir.FloatAttr.get(ir.F64Type.get(), float(attrs["exp_bound"]))
    if "exp_proof" in attrs:
        out["exp_proof"] = ir.StringAttr.get(str(attrs["exp_proof"]))
    if "clamp_min" in attrs:
        out["clamp_min"] = ir.FloatAttr.get(ir.F64Type.get(), float(attrs["clamp_min"]))
    for key, value in extra.items():
        out[key] = ir.BoolAttr.get(bool(value))
    return out


def decay_dot(a: Tile, b: Tile, p: Tile, q: Tile, attrs: dict, name=None) -> Tile:
    shape = (a.shape[0], b.shape[0])
    return dsl._op1("decay_dot", dsl.tile_type(shape, a.dtype), [a, b, p, q], _attrs(attrs), name)


def decay_matmul(w: Tile, x: Tile, p: Tile, q: Tile, attrs: dict, transpose: bool, name=None) -> Tile:
    rows = w.shape[1] if transpose else w.shape[0]
    shape = (rows, x.shape[1])
    return dsl._op1("decay_matmul", dsl.tile_type(shape, x.dtype), [w, x, p, q],
                    _attrs(attrs, transpose=transpose), name)


@vjp_rule("kda.decay_dot")
def _vjp_decay_dot(ins, outs, d, need, _attrs):
    a, b, p, q = ins
    dm = d[0]
    da = decay_matmul(dm, b, p, q, _attrs, transpose=False) if (need[0] or need[2]) else None
    db = decay_matmul(dm, a, p, q, _attrs, transpose=True) if (need[1] or need[3]) else None
    dp = a * da * LN2 if need[2] else None
    dq = -(b * db * LN2) if need[3] else None
    return [da if need[0] else None, db if need[1] else None, dp, dq]


@vjp_rule("kda.decay_matmul")
def _vjp_decay_matmul(ins, outs, d, need, _attrs):
    w, x, p, q = ins
    dout, out = d[0], outs[0]
    if not _attrs.get("transpose"):
        dw = decay_dot(dout, x, p, q, _attrs) if need[0] else None
        dx = decay_matmul(w, dout, p, q, _attrs, transpose=True) if (need[1] or need[3]) else None
        dp = out * dout * LN2 if need[2] else None
        dq = -(x * dx * LN2) if need[3] else None
    else:
        dw = decay_dot(x, dout, p, q, _attrs) if need[0] else None
        dx = decay_matmul(w, dout, p, q, _attrs, transpose=False) if (need[1] or need[2]) else None
        dp = x * dx * LN2 if need[2] else None
        dq = -(out * dout * LN2) if need[3] else None
    return [dw, dx if need[1] else None, dp, dq]
