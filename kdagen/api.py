"""kdagen's Python API: drop-ins for FLA's ``chunk_kda`` and ``chunk_gated_delta_rule``.

Both validate their arguments (:func:`kdagen.validation.validate_inputs`; every error is a
:class:`~kdagen.validation.KdagenInputError` naming the argument), map FLA's flags to program
options and call the torch ops of :mod:`kdagen.ops`, which carry autograd (gradients for q, k,
v, g, beta, A_log, dt_bias, initial_state, and through the final state) and run on the
executor of the tensors' device: the kernels on CUDA, the interpreter on CPU
(:mod:`kdagen.runtime.backends`). Both work under ``torch.compile(fullgraph=True)``.

Supported: q, k, v in bfloat16, float16 or float32 (all three alike; g and beta in the same
dtype or float32), head dims K, V in {64, 128}, contiguous tensors on one device,
``initial_state`` float32 (or float64) ``[N, HV, K, V]``, GVA (HV a multiple of H), varlen
(B = 1 with ``cu_seqlens``).
"""
from __future__ import annotations

from typing import Any

import torch

from kdagen import ops
from kdagen.validation import KdagenInputError, check_fla_kwargs, validate_inputs

__all__ = ["chunk_kda", "chunk_gated_delta_rule"]

def _read_values(q: torch.Tensor, cu_seqlens) -> bool:
    """Whether validation may read cu_seqlens' values: only for CPU tensors outside tracing
    (reading a CUDA tensor would synchronise with the device)."""
    if cu_seqlens is None:
        return False
    if torch.compiler.is_compiling():
        return False
    from torch._subclasses.fake_tensor import is_fake
    return cu_seqlens.device.type == "cpu" and not is_fake(cu_seqlens)


def _lower_bound(lower_bound, safe_gate: bool):
    if not safe_gate or lower_bound is None:
        return None
    if isinstance(lower_bound, torch.Tensor):  # validated to have one element
        return float(lower_bound.item())
    return float(lower_bound)


def _call(family, q, k, v, g, beta, *, scale, initial_state, output_final_state,
          use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
          safe_gate, lower_bound, cu_seqlens, A_log, dt_bias):
    sizes = validate_inputs(
        family, q, k, v, g, beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
        A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate,
        lower_bound=lower_bound, allowed_dtypes=ops.SUPPORTED_DTYPES,
        supported_head_dims=ops.SUPPORTED_HEAD_DIMS, require_contiguous=True,
        check_values=_read_values(q, cu_seqlens))
    if scale is None:
        scale = sizes.K ** -0.5
    elif isinstance(scale, torch.Tensor):
        raise KdagenInputError("scale: expected a Python float, got a tensor; pass float(scale)")
    if use_gate_in_kernel:
        if family == "kda":
            dt_bias = dt_bias.reshape(sizes.HV, sizes.K)   # [HV * K] -> [HV, K] (a view)
    else:
        A_log = dt_bias = None                               # unused, as in FLA
    op = ops.kda_fwd if family == "kda" else ops.gdn_fwd
    o, ht = op(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, float(scale),
               bool(output_final_state), bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
               bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(safe_gate),
               _lower_bound(lower_bound, safe_gate))
    return o, (ht if output_final_state else None)


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
    **fla_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi Delta Attention, chunked: FLA's ``chunk_kda`` (same arguments and results).

    - q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; beta ``[B, T, HV]``.
    - ``g`` ``[B, T, HV, K]``: the natural-log gate; with ``use_gate_in_kernel`` the raw gate,
      turned into ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` or, with ``safe_gate``,
      ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))`` (lower_bound in [-5, 0)).
      ``A_log`` ``[HV]`` and ``dt_bias`` ``[HV, K]``/``[HV * K]`` are then required; without
      ``use_gate_in_kernel`` they are ignored. With ``safe_gate`` and a precomputed g,
      ``lower_bound`` is a promise that g >= lower_bound (the kernels rely on it).
    - ``use_beta_sigmoid_in_kernel``: beta is raw, turned into ``sigmoid(beta)``
      (``2 * sigmoid(beta)`` with ``allow_neg_eigval``; ignored otherwise).
    - ``use_qk_l2norm_in_kernel``: L2-normalise q and k (eps 1e-6 inside the sqrt).
    - ``scale`` defaults to ``K ** -0.5``; ``initial_state`` ``[N, HV, K, V]``;
      ``cu_seqlens`` ``[N + 1]`` int32/int64 with B = 1 (varlen).
    - FLA's tuning keywords ``chunk_indices``, ``cu_seqlens_cpu``, ``disable_recompute`` are
      accepted and ignored.

    Returns ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype, final_state float32
    ``[N, HV, K, V]`` with ``output_final_state``, else None. Differentiable in q, k, v, g,
    beta, A_log, dt_bias and initial_state.
    """
    check_fla_kwargs("chunk_kda", fla_kwargs)
    return _call("kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                 cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias)


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
    *,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    **fla_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet, chunked: FLA's ``chunk_gated_delta_rule`` (same positional arguments).

    ``g`` ``[B, T, HV]`` is the natural-log gate per head, ``beta`` ``[B, T, HV]`` the
    (already activated) beta. kdagen's keyword-only extras take raw inputs instead, as
    :func:`chunk_kda` does: ``use_gate_in_kernel`` (with ``A_log`` ``[HV]``, ``dt_bias``
    ``[HV]``, optionally ``safe_gate`` + ``lower_bound``) and ``use_beta_sigmoid_in_kernel``
    (+ ``allow_neg_eigval``).

    Returns ``(o [B, T, HV, V] in v's dtype, final_state float32 [N, HV, K, V] or None)``.
    """
    check_fla_kwargs("chunk_gated_delta_rule", fla_kwargs)
    return _call("gdn", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                 cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias)
