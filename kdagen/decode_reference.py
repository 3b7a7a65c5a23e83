"""Float64 reference of a decode step over a state pool (what inference engines call).

An engine keeps one recurrent state per live sequence in a pool ``[slots, HV, K, V]`` and, at
every decode step, advances each sequence by a few tokens (1 for plain decode, up to 8 for a
speculative verify step). ``ssm_state_indices`` says which slot each sequence uses:

- ``[N]``: sequence n reads its state from slot ``idx[n]`` and writes its state after its
  last token back to the same slot (in place);
- ``[N, T]``: the state after token t goes to slot ``idx[n, t]`` (one state per draft token,
  so a verify step can keep any prefix); the initial state is read from slot
  ``idx[n, a - 1]``, ``a = num_accepted_tokens[n]`` (1 without ``num_accepted_tokens``):
  the state after the last token accepted at the previous step;
- a negative read slot skips the sequence: its outputs are left as they were and no slot is
  written; a negative write slot drops that token's state (padding).

The recurrence is :func:`kdagen.reference.recurrent_gated_delta`'s, on transformed inputs (g
the natural-log gate, beta the final beta, q/k as used). Kernels for this step are checked
against it.
"""
from __future__ import annotations

import torch

from kdagen.reference import F64, _recurrent_core

__all__ = ["decode_pool_step"]


def _token_ranges(B: int, T: int, cu_seqlens) -> list[tuple[int, int, int]]:
    """(batch row, first token, end token) per sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    if B != 1:
        raise ValueError(f"cu_seqlens: varlen inputs need batch size 1, got {B}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: must rise from 0 to T = {T}, got {cu}")
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def decode_pool_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, *, state_pool: torch.Tensor,
                     ssm_state_indices: torch.Tensor, scale: float | None = None,
                     num_accepted_tokens: torch.Tensor | None = None,
                     cu_seqlens: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step in float64 (module docstring).

    ``q``, ``k`` ``[B, T, H, K]``; ``v`` ``[B, T, HV, V]``; ``g`` ``[B, T, HV, K]`` (KDA) or
    ``[B, T, HV]`` (GDN); ``beta`` ``[B, T, HV]``; B sequences of T tokens, or with
    ``cu_seqlens`` (B = 1) sequence n the tokens ``cu_seqlens[n]:cu_seqlens[n + 1]``.
    ``out``: the output buffer (rows of skipped sequences keep its values; zeros if None).
    Returns ``(o [B, T, HV, V], new pool)``, both float64 copies (the inputs are not
    modified).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"v: value heads HV = {HV} must be a multiple of the q/k heads H = {H}")
    if tuple(state_pool.shape[1:]) != (HV, K, V):
        raise ValueError(f"state_pool: expected [slots, {HV}, {K}, {V}], got "
                         f"{list(state_pool.shape)}")
    seqs = _token_ranges(B, T, cu_seqlens)
    idx = ssm_state_indices.to("cpu", torch.int64)
    if idx.dim() not in (1, 2) or idx.shape[0] != len(seqs):
        raise ValueError(f"ssm_state_indices: expected [N] or [N, T] with N = {len(seqs)} "
                         f"sequences, got {list(idx.shape)}")
    if idx.dim() == 1 and num_accepted_tokens is not None:
        raise ValueError("num_accepted_tokens: needs ssm_state_indices of shape [N, T]")
    slots = state_pool.shape[0]
    if int(idx.max()) >= slots:
        raise ValueError(f"ssm_state_indices: slot {int(idx.max())} is outside the pool of "
                         f"{slots} slots")
    scale = K ** -0.5 if scale is None else float(scale)
    group = HV // H
    q = q.to(F64).repeat_interleave(group, dim=2)
    k = k.to(F64).repeat_interleave(group, dim=2)
    v, beta = v.to(F64), beta.to(F64)
    g = g.to(F64) if g.dim() == 4 else g.to(F64).unsqueeze(-1)
    o = torch.zeros(B, T, HV, V, dtype=F64) if out is None else out.to(F64).clone()
    pool = state_pool.to(F64).clone()
    accepted = (None if num_accepted_tokens is None
                else num_accepted_tokens.to("cpu", torch.int64))
    for n, (b, s, e) in enumerate(seqs):
        if e == s:
            continue
        if idx.dim() == 1:
            read = int(idx[n])
        else:
            a = 1 if accepted is None else int(accepted[n])
            if not 1 <= a <= idx.shape[1]:
                raise ValueError(f"num_accepted_tokens[{n}] = {a}: must lie in "
                                 f"[1, {idx.shape[1]}]")
            read = int(idx[n, a - 1])
        if read < 0:
            continue                                   # skipped sequence
        S = pool[read].unsqueeze(0)                    # [1, HV, K, V]
        for t in range(s, e):
            one = [x[b:b + 1, t:t + 1] for x in (q, k, v, g, beta)]
            o_t, S = _recurrent_core(*one, S, scale=scale)  # the reference's token update
            o[b, t] = o_t[0, 0]
            if idx.dim() == 2:
                if t - s >= idx.shape[1]:
                    raise ValueError(f"ssm_state_indices: sequence {n} has {e - s} tokens, "
                                     f"more than its {idx.shape[1]} slots")
                write = int(idx[n, t - s])
                if write >= 0:
                    pool[write] = S[0]
        if idx.dim() == 1:
            pool[read] = S[0]
    return o, pool
