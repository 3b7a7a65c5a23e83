"""Float64 torch references for chunked gated-delta attention (KDA and GDN).

docs/MATH.md §1 is the spec. Everything here computes in float64 (inputs of any floating dtype
are cast with ``.to(torch.float64)``, which keeps the autograd graph), returns float64, runs on
any device, and is differentiable by autograd.

Layers:

- input transforms: :func:`l2norm`, :func:`beta_sigmoid`, :func:`kda_gate_softplus`,
  :func:`kda_gate_lower_bound`, :func:`gdn_gate_softplus`, :func:`gdn_gate_lower_bound`;
- cores on already-transformed inputs: :func:`recurrent_gated_delta` (the per-token
  recurrence, the ground truth) and :func:`chunked_gated_delta` (the chunk form kernels use);
- FLA-mirroring entry points: :func:`chunk_kda`, :func:`chunk_gated_delta_rule`;
- test helpers: :func:`reference_grads`, :func:`rel_err`.

The gate ``g`` is a natural-log decay: per channel ``[B, T, HV, K]`` (KDA) or per head
``[B, T, HV]`` (GDN); the cores detect which by ``g.ndim``.

Gate ranges are enforced as the kernels enforce them (:mod:`kdagen.ir.gate_ranges`): the gate
functions clamp the raw gate to ±2^100 and their result to the gate's declared range
(softplus: ``[-16·softplus(20), 0]``; lower bound: ``[lb, 0]``), and the entry points clamp a
precomputed ``g`` to ``[lower_bound, 0]`` with ``safe_gate`` (else ``[-128·ln 2, 0]``). For any
input in the declared ranges this changes nothing; outside them (a raw gate of ±inf, a
precomputed g below its promised bound) kernels and reference agree and stay finite. The
gradient of a clamp is zero outside its range (``torch.clamp``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from kdagen.ir.gate_ranges import GATE_FLOOR, RAW_GATE_BOUND, softplus_range
from kdagen.validation import check_fla_kwargs, validate_inputs

__all__ = [
    "l2norm",
    "beta_sigmoid",
    "kda_gate_softplus",
    "kda_gate_lower_bound",
    "gdn_gate_softplus",
    "gdn_gate_lower_bound",
    "clamp_gate",
    "clamp_raw_gate",
    "recurrent_gated_delta",
    "chunked_gated_delta",
    "chunk_kda",
    "chunk_gated_delta_rule",
    "reference_grads",
    "rel_err",
]

F64 = torch.float64

def _f64(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.to(F64)


# --------------------------------------------------------------------------------------
# input transforms
# --------------------------------------------------------------------------------------


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x**2) + eps)`` over the last dim (float64)."""
    x = x.to(F64)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def beta_sigmoid(beta_raw: torch.Tensor, allow_neg_eigval: bool = False) -> torch.Tensor:
    """``sigmoid(beta_raw)``, or ``2 * sigmoid(beta_raw)`` (range (0, 2)) with ``allow_neg_eigval``."""
    b = _sigmoid(beta_raw.to(F64))
    return 2.0 * b if allow_neg_eigval else b


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    # exp(-softplus(-x)): autograd then gives sigma(x) * sigma(-x), exact for a saturated
    # gate, where torch.sigmoid's backward y * (1 - y) cancels (1 - y ~ 1e-10 keeps ~6 digits).
    return torch.exp(-_softplus(-x))


def _softplus(x: torch.Tensor) -> torch.Tensor:
    # log(1 + e^x) without a linearisation threshold (F.softplus switches to x above 20).
    return torch.logaddexp(x, torch.zeros_like(x))


def _kda_bias(dt_bias: torch.Tensor, HV: int, K: int) -> torch.Tensor:
    return dt_bias.to(F64).reshape(HV, K)


def clamp_raw_gate(g_raw: torch.Tensor) -> torch.Tensor:
    """A raw gate input clamped to ±2^100 (float64), as the kernels clamp it."""
    return g_raw.to(F64).clamp(-RAW_GATE_BOUND, RAW_GATE_BOUND)


def clamp_gate(g: torch.Tensor, lo: float | None = None, hi: float = 0.0) -> torch.Tensor:
    """A log gate clamped to its enforced range ``[lo, hi]`` (``lo=None``: the floor
    ``-128·ln 2`` of a gate with no lower bound), as the kernels clamp it."""
    return g.to(F64).clamp(GATE_FLOOR if lo is None else float(lo), float(hi))


_SOFTPLUS_LO = softplus_range()[0]        # -16 · softplus(20): the declared range of the
                                          # softplus gate with its default options


def kda_gate_softplus(g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """KDA softplus gate: ``g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h, :])``, clamped to
    its declared range ``[-16·softplus(20), 0]`` (raw input clamped to ±2^100 first).

    ``g_raw`` ``[..., HV, K]``, ``A_log`` ``[HV]``, ``dt_bias`` ``[HV, K]`` or ``[HV * K]``.
    """
    HV, K = g_raw.shape[-2:]
    x = clamp_raw_gate(g_raw) + _kda_bias(dt_bias, HV, K)
    return clamp_gate(-torch.exp(A_log.to(F64)).unsqueeze(-1) * _softplus(x), _SOFTPLUS_LO)


def kda_gate_lower_bound(
    g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float
) -> torch.Tensor:
    """KDA lower-bound gate: ``g = lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h, :]))`` in [lb, 0)."""
    HV, K = g_raw.shape[-2:]
    x = clamp_raw_gate(g_raw) + _kda_bias(dt_bias, HV, K)
    lb = float(lower_bound)
    return clamp_gate(lb * _sigmoid(torch.exp(A_log.to(F64)).unsqueeze(-1) * x), lb)


def gdn_gate_softplus(g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """GDN softplus gate (scalar per head): ``g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h])``,
    clamped as :func:`kda_gate_softplus`.

    ``g_raw`` ``[..., HV]``, ``A_log`` ``[HV]``, ``dt_bias`` ``[HV]``.
    """
    x = clamp_raw_gate(g_raw) + dt_bias.to(F64)
    return clamp_gate(-torch.exp(A_log.to(F64)) * _softplus(x), _SOFTPLUS_LO)


def gdn_gate_lower_bound(
    g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float
) -> torch.Tensor:
    """GDN lower-bound gate: ``g = lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h]))``."""
    x = clamp_raw_gate(g_raw) + dt_bias.to(F64)
    lb = float(lower_bound)
    return clamp_gate(lb * _sigmoid(torch.exp(A_log.to(F64)) * x), lb)


# --------------------------------------------------------------------------------------
# cores
# --------------------------------------------------------------------------------------


def _prepare_core(q, k, v, g, beta, initial_state, cu_seqlens):
    """Validate (layout only), cast to float64, expand q/k to HV heads, make g 4-D."""
    op = "kda" if getattr(g, "ndim", 0) == 4 else "gdn"
    q, k, v, g, beta = (x.to(F64) if isinstance(x, torch.Tensor) else x for x in (q, k, v, g, beta))
    sizes = validate_inputs(
        op, q, k, v, g, beta,
        initial_state=initial_state, cu_seqlens=cu_seqlens, require_contiguous=False,
    )
    if sizes.group > 1:
        q = q.repeat_interleave(sizes.group, dim=2)
        k = k.repeat_interleave(sizes.group, dim=2)
    if op == "gdn":
        g = g.unsqueeze(-1)  # [B, T, HV, 1] broadcasts against K
    h0 = _f64(initial_state)
    offsets = None if cu_seqlens is None else [int(c) for c in cu_seqlens.tolist()]
    return sizes, q, k, v, g, beta, h0, offsets


def _split_run(core, sizes, q, k, v, g, beta, h0, offsets, output_final_state, **kw):
    """Run ``core`` on the whole batch, or once per sequence of a varlen batch."""
    if offsets is None:
        o, ht = core(q, k, v, g, beta, h0, **kw)
        return o, (ht if output_final_state else None)
    outs, finals = [], []
    for n in range(len(offsets) - 1):
        s, e = offsets[n], offsets[n + 1]
        h0n = None if h0 is None else h0[n : n + 1]
        o, ht = core(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], h0n, **kw)
        outs.append(o)
        finals.append(ht)
    o = torch.cat(outs, dim=1)
    return o, (torch.cat(finals, dim=0) if output_final_state else None)


def _zero_state(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    B, _, HV, K = q.shape
    return torch.zeros(B, HV, K, v.shape[-1], dtype=F64, device=q.device)


def _recurrent_core(q, k, v, g, beta, h0, *, scale):
    # q, k [B, T, HV, K]; v [B, T, HV, V]; g [B, T, HV, K or 1]; beta [B, T, HV]; h0 [B, HV, K, V]
    S = _zero_state(q, v) if h0 is None else h0
    decay = torch.exp(g).unsqueeze(-1)  # [B, T, HV, K|1, 1]
    kb = k * beta.unsqueeze(-1)
    outs = []
    for t in range(q.shape[1]):
        S = S * decay[:, t]                                        # decay first
        kt = k[:, t].unsqueeze(-2)                                 # [B, HV, 1, K]
        e = v[:, t] - torch.matmul(kt, S).squeeze(-2)              # v - S^T k
        S = S + kb[:, t].unsqueeze(-1) * e.unsqueeze(-2)           # + beta k (x) e
        outs.append(torch.matmul(q[:, t].unsqueeze(-2), S).squeeze(-2) * scale)  # S^T q
    if outs:
        o = torch.stack(outs, dim=1)
    else:
        o = torch.zeros(q.shape[0], 0, *v.shape[2:], dtype=F64, device=q.device)
    return o, S


def recurrent_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The per-token gated delta rule (docs/MATH.md §1) in float64 on transformed inputs.

    For every token (S ∈ R^{K×V}, S₀ = initial_state or 0)::

        S   = diag(exp(g_t)) S          # GDN: exp(g_t) S  (decay before the delta-rule error)
        e   = v_t - Sᵀ k_t
        S   = S + beta_t k_t ⊗ e
        o_t = scale Sᵀ q_t              # the updated S

    ``g`` is the natural-log gate, ``[B, T, HV, K]`` (KDA) or ``[B, T, HV]`` (GDN). GVA: value
    head h uses q/k head ``h // (HV // H)``. Varlen via ``cu_seqlens`` (B == 1): the state
    restarts from ``initial_state[n]`` at each sequence. Returns ``(o [B, T, HV, V],
    final_state [N, HV, K, V] or None)``, both float64. Vectorised over batch and heads; loops
    over tokens only.
    """
    sizes, q, k, v, g, beta, h0, offsets = _prepare_core(q, k, v, g, beta, initial_state, cu_seqlens)
    return _split_run(
        _recurrent_core, sizes, q, k, v, g, beta, h0, offsets, output_final_state, scale=float(scale)
    )


def _chunk_core(q, k, v, g, beta, h0, *, scale, chunk_size):
    # layout [B, HV, T, *]
    q, k, v, g = (x.transpose(1, 2) for x in (q, k, v, g))
    beta = beta.transpose(1, 2)
    T = q.shape[2]
    per_channel = g.shape[-1] != 1
    B, HV, _, K = q.shape
    S = torch.zeros(B, HV, K, v.shape[-1], dtype=F64, device=q.device) if h0 is None else h0
    outs = []
    for s in range(0, T, chunk_size):
        e = min(s + chunk_size, T)
        c = e - s
        qc, kc, vc, bc = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], beta[:, :, s:e]
        G = torch.cumsum(g[:, :, s:e], dim=2)                     # Γ, [B, HV, c, K|1], ≤ 0
        incl = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # j <= i
        # relative decays exp(Γ_i − Γ_j), masked to j <= i before the exp (no inf anywhere)
        diff = G.unsqueeze(-2) - G.unsqueeze(-3)                    # [B, HV, i, j, K|1]
        m = incl.unsqueeze(-1)
        zero = torch.zeros((), dtype=F64, device=q.device)
        E = torch.where(m, torch.exp(torch.where(m, diff, zero)), zero)
        if per_channel:
            kk = torch.einsum("bhid,bhjd,bhijd->bhij", kc, kc, E)
            qk = torch.einsum("bhid,bhjd,bhijd->bhij", qc, kc, E)
        else:
            E2 = E.squeeze(-1)
            kk = torch.matmul(kc, kc.transpose(-1, -2)) * E2
            qk = torch.matmul(qc, kc.transpose(-1, -2)) * E2
        Akk = torch.tril(bc.unsqueeze(-1) * kk, diagonal=-1)        # j < i
        Aqk = qk * scale                                             # j <= i (E is masked)
        L = torch.eye(c, dtype=F64, device=q.device) + Akk
        eG = torch.exp(G)
        # T = (I + Akk)^-1 diag(beta);  w = T (k ⊙ exp Γ),  u = T v
        w = torch.linalg.solve_triangular(L, bc.unsqueeze(-1) * (kc * eG), upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(L, bc.unsqueeze(-1) * vc, upper=False, unitriangular=True)
        vn = u - torch.matmul(w, S)                                  # v'
        outs.append(torch.matmul(qc * eG, S) * scale + torch.matmul(Aqk, vn))
        GC = G[:, :, -1]                                             # Γ_C, [B, HV, K|1]
        kr = kc * torch.exp(GC.unsqueeze(-2) - G)                    # k ⊙ exp(Γ_C − Γ)
        S = torch.exp(GC).unsqueeze(-1) * S + torch.matmul(kr.transpose(-1, -2), vn)
    if outs:
        o = torch.cat(outs, dim=2).transpose(1, 2)
    else:
        o = torch.zeros(q.shape[0], 0, q.shape[1], v.shape[-1], dtype=F64, device=q.device)
    return o, S


def chunked_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunk form of docs/MATH.md §1 in float64; same arguments and results as
    :func:`recurrent_gated_delta` plus ``chunk_size`` (any positive int).

    Per chunk of C tokens (the last one may be shorter; chunks restart at every sequence start
    of a varlen batch), with Γ the inclusive within-chunk cumsum of g and Γ_C its last row::

        Akk[i,j] = β_i Σ_d k_id k_jd exp(Γ_id − Γ_jd)     (j < i)
        T  = (I + Akk)⁻¹ diag(β);   w = T (k ⊙ exp Γ);   u = T v
        Aqk[i,j] = scale Σ_d q_id k_jd exp(Γ_id − Γ_jd)    (j ≤ i)
        v' = u − w S;   o = scale (q ⊙ exp Γ) S + Aqk v'
        S ← diag(exp Γ_C) S + (k ⊙ exp(Γ_C − Γ))ᵀ v'

    Pairwise decays are only formed as ``exp(Γ_i − Γ_j)`` with ``j ≤ i`` (masked before the exp),
    so the result stays exact in float64 under strong decay.
    """
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size}")
    sizes, q, k, v, g, beta, h0, offsets = _prepare_core(q, k, v, g, beta, initial_state, cu_seqlens)
    return _split_run(
        _chunk_core, sizes, q, k, v, g, beta, h0, offsets, output_final_state,
        scale=float(scale), chunk_size=int(chunk_size),
    )


# --------------------------------------------------------------------------------------
# FLA-mirroring entry points
# --------------------------------------------------------------------------------------


def _run(op, q, k, v, g, beta, *, scale, initial_state, output_final_state,
         use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
         allow_neg_eigval, safe_gate, lower_bound, cu_seqlens, A_log, dt_bias, chunk_size,
         gate=None, gate_params=None, gate_options=None):
    if gate is not None:
        return _run_gated(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                          use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                          allow_neg_eigval=allow_neg_eigval, cu_seqlens=cu_seqlens,
                          chunk_size=chunk_size, gate=gate,
                          gate_params={**({"A_log": A_log} if A_log is not None else {}),
                                       **({"dt_bias": dt_bias} if dt_bias is not None else {}),
                                       **dict(gate_params or {})},
                          gate_options=gate_options)
    sizes = validate_inputs(
        op, q, k, v, g, beta,
        initial_state=initial_state, cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias,
        use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate, lower_bound=lower_bound,
        require_contiguous=False,
    )
    if scale is None:
        scale = sizes.K ** -0.5
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if use_beta_sigmoid_in_kernel:
        beta = beta_sigmoid(beta, allow_neg_eigval)
    if use_gate_in_kernel:
        if op == "kda":
            g = (kda_gate_lower_bound(g, A_log, dt_bias, lower_bound) if safe_gate
                 else kda_gate_softplus(g, A_log, dt_bias))
        else:
            g = (gdn_gate_lower_bound(g, A_log, dt_bias, lower_bound) if safe_gate
                 else gdn_gate_softplus(g, A_log, dt_bias))
    else:
        # a precomputed log gate: the promise g >= lower_bound (safe_gate) is enforced, as the
        # kernels enforce it; without one, the floor -128 ln 2 (see kdagen.ir.gate_ranges)
        g = clamp_gate(g, lower_bound if safe_gate else None)
    if chunk_size is None:
        return recurrent_gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens)
    return chunked_gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                               chunk_size=chunk_size)


def _run_gated(op, q, k, v, g, beta, *, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, cu_seqlens,
               chunk_size, gate, gate_params, gate_options):
    """Any gate (:class:`kdagen.ir.gates.Gate` or a registered name) evaluated in float64 by
    :meth:`Gate.torch` (clamps included, as the kernels apply them)."""
    from kdagen.ir.gates import get_gate
    gobj = get_gate(gate)
    sizes = validate_inputs(op, q, k, v, g, beta, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, require_contiguous=False)
    if scale is None:
        scale = sizes.K ** -0.5
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if use_beta_sigmoid_in_kernel:
        beta = beta_sigmoid(beta, allow_neg_eigval)
    g = gobj.torch(g.to(F64), {n: x.to(F64) for n, x in dict(gate_params or {}).items()},
                   **dict(gate_options or {}))
    if chunk_size is None:
        return recurrent_gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens)
    return chunked_gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                               chunk_size=chunk_size)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    gate: Any = None,
    gate_params: dict | None = None,
    gate_options: dict | None = None,
    **fla_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float64 reference of FLA's ``chunk_kda`` (same argument names and defaults).

    - ``g``: the log gate ``[B, T, HV, K]``; with ``use_gate_in_kernel`` the raw gate, turned
      into ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` or, with ``safe_gate``,
      ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))``. ``A_log`` ``[HV]`` and
      ``dt_bias`` ``[HV, K]``/``[HV * K]`` are then required. As in FLA, ``lower_bound`` is
      ignored without ``safe_gate``; with ``safe_gate`` and a precomputed ``g`` it is a
      promise (checked to lie in [-5, 0)) that is enforced: g is clamped to ``[lower_bound, 0]``
      (without it to ``[-128·ln 2, 0]``), as the kernels do (module docstring).
    - ``beta``: ``[B, T, HV]``; with ``use_beta_sigmoid_in_kernel`` the raw beta, turned into
      ``sigmoid(beta)`` (``2 * sigmoid(beta)`` with ``allow_neg_eigval``).
    - ``use_qk_l2norm_in_kernel``: L2-normalise q and k (eps 1e-6 inside the sqrt).
    - ``scale`` defaults to ``K ** -0.5``.
    - ``chunk_size``: ``None`` runs the per-token recurrence, an int the chunked reference.
    - ``gate``: any gate (a name or a :class:`kdagen.ir.gates.Gate`); g is its raw input,
      ``gate_params`` (and ``A_log``/``dt_bias``) its parameters, ``gate_options`` its options,
      evaluated by :meth:`Gate.torch` (``use_gate_in_kernel``/``safe_gate`` are then unused).
    - FLA-only tuning keywords (``chunk_indices``, ``cu_seqlens_cpu``, ``disable_recompute``)
      are accepted and ignored; any other unknown keyword is a ``TypeError``.

    Returns ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)`` in float64.
    """
    check_fla_kwargs("chunk_kda", fla_kwargs)
    return _run(
        "kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
        cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
        gate=gate, gate_params=gate_params, gate_options=gate_options,
    )


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int | None = None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    gate: Any = None,
    gate_params: dict | None = None,
    gate_options: dict | None = None,
    **fla_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float64 reference of FLA's ``chunk_gated_delta_rule`` (GDN, scalar gate per head).

    The positional arguments and their defaults are FLA's: ``g`` is the log gate
    ``[B, T, HV]``. kdagen's extra keyword-only arguments take raw inputs instead:

    - ``use_gate_in_kernel``: ``g`` is the raw gate ``[B, T, HV]``, turned into
      ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` or, with ``safe_gate``,
      ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))``; ``A_log`` and ``dt_bias``
      (both ``[HV]``) are then required, ``lower_bound`` ∈ [-5, 0) with ``safe_gate``.
    - ``use_beta_sigmoid_in_kernel``: ``beta`` is raw, turned into ``sigmoid(beta)``
      (``2 * sigmoid(beta)`` with ``allow_neg_eigval``).
    - ``gate``/``gate_params``/``gate_options``: any GDN gate, as in :func:`chunk_kda`.

    Gates are clamped to their enforced ranges as in :func:`chunk_kda` (module docstring).
    ``chunk_size=None`` runs the per-token recurrence, an int the chunked reference. Returns
    ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)`` in float64.
    """
    check_fla_kwargs("chunk_gated_delta_rule", fla_kwargs)
    return _run(
        "gdn", q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
        cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
        gate=gate, gate_params=gate_params, gate_options=gate_options,
    )


# --------------------------------------------------------------------------------------
# helpers for comparing a kernel against the reference
# --------------------------------------------------------------------------------------


def reference_grads(
    fn: Callable[..., Any],
    inputs: dict[str, Any],
    do: torch.Tensor,
    dht: torch.Tensor | None = None,
) -> dict[str, torch.Tensor | None]:
    """Float64 gradients of ``fn(**inputs)`` for the output cotangents ``do`` (and ``dht``).

    Every floating-point tensor in ``inputs`` (q, k, v, g, beta, A_log, dt_bias,
    initial_state, ...) is detached, cast to float64 and made a leaf requiring grad; other
    entries (flags, ``scale``, ``cu_seqlens``, ...) are passed through unchanged. ``fn`` must
    return ``(o, final_state)`` (or just ``o``); the loss is ``<o, do> + <final_state, dht>``.

    Returns ``{name: grad}`` for every floating input, plus ``"o"`` and ``"final_state"``
    (the float64 outputs, detached) — input names never collide with these. A grad is
    ``None`` when the input does not influence the outputs (e.g. ``A_log`` without
    ``use_gate_in_kernel``).
    """
    leaves: dict[str, torch.Tensor] = {}
    call: dict[str, Any] = {}
    for name, x in inputs.items():
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            leaf = x.detach().to(F64).requires_grad_(True)
            leaves[name] = leaf
            call[name] = leaf
        else:
            call[name] = x
    with torch.enable_grad():
        out = fn(**call)
        o, ht = (out if isinstance(out, tuple) else (out, None))[:2]
        loss = (o * do.detach().to(o)).sum()
        if dht is not None:
            if ht is None:
                raise ValueError("dht given but fn returned no final state (pass output_final_state=True)")
            loss = loss + (ht * dht.detach().to(ht)).sum()
        names = list(leaves)
        grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    result: dict[str, torch.Tensor | None] = dict(zip(names, grads))
    result["o"] = o.detach()
    result["final_state"] = None if ht is None else ht.detach()
    return result


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out − ref‖₂ / ‖ref‖₂`` in float64 (docs/MATH.md §3's metric).

    Returns ``inf`` when ``out`` (or ``ref``) holds NaN/Inf, and the absolute ``‖out‖₂`` when
    ``ref`` is exactly zero (so an all-zero match gives 0.0). Shapes must be equal.
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"rel_err: shapes differ, out {list(out.shape)} vs ref {list(ref.shape)}")
    a = out.detach().to(F64).to(ref.device)
    b = ref.detach().to(F64)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den > 0 else num
