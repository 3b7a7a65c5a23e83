"""kdagen's Python API: drop-ins for FLA's ``chunk_kda`` and ``chunk_gated_delta_rule``.

Both validate their arguments (:func:`kdagen.validation.validate_inputs`; every error is a
:class:`~kdagen.validation.KdagenInputError` naming the argument), map FLA's flags to program
options and call the torch ops of :mod:`kdagen.ops`, which carry autograd (gradients for q, k,
v, g, beta, A_log, dt_bias, initial_state, and through the final state) and run on the
executor of the tensors' device: the kernels on CUDA, the interpreter on CPU
(:mod:`kdagen.runtime.backends`). Both work under ``torch.compile(fullgraph=True)``.

Supported: q, k, v in bfloat16, float16 or float32 (all three alike; g and beta in the same
dtype or float32, kept as given), head dims K up to 128 and any V (other than 64 and 128 they
run zero-padded, V above 128 in parts of the value columns), tensors of any strides on one
device (non-contiguous ones are copied), ``initial_state`` ``[N, HV, K, V]`` (or FLA's
``state_v_first`` ``[N, HV, V, K]``) in fp32/fp64 or bf16/fp16, GVA (HV a multiple of H),
varlen (B = 1 with ``cu_seqlens``, a tensor or a list). A q whose shape reads as T < H draws a
warning that names the likely head-first layout mix-up.
"""
from __future__ import annotations

import operator
import warnings
from typing import Any

import torch

from kdagen import cp, head_pad, ops
from kdagen.validation import (KdagenInputError, check_cu_seqlens_values, check_fla_kwargs,
                               validate_inputs)

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


# ------------------------------------------------------------------------------------------
# FLA's argument conventions -> the ops' (dense tensors, [HV] A_log, fp32 [N, HV, K, V] state)
# ------------------------------------------------------------------------------------------

#: chunk sizes FLA accepts; kdagen computes with its own chunk (the result does not depend on it)
FLA_CHUNK_SIZES = {"kda": (32, 64), "gdn": (16, 32, 64)}


def _check_chunk_size(family: str, chunk_size) -> None:
    allowed = FLA_CHUNK_SIZES[family]
    if isinstance(chunk_size, bool) or chunk_size not in allowed:
        raise KdagenInputError(
            f"chunk_size: expected one of {list(allowed)} (FLA's values for this op), got "
            f"{chunk_size!r}; it only steers FLA's tiling: kdagen chooses its own chunk size "
            f"and the result does not depend on it")


def _as_cu_seqlens(cu_seqlens, q: torch.Tensor):
    """A list/tuple of offsets becomes an int64 tensor on q's device (its values are checked
    here, on the host, where they already are)."""
    if cu_seqlens is None or isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens
    if isinstance(cu_seqlens, (list, tuple)):
        try:
            offsets = [operator.index(c) for c in cu_seqlens]
        except TypeError:
            raise KdagenInputError(
                f"cu_seqlens: expected integer offsets, got {list(cu_seqlens)!r}; pass "
                f"torch.tensor(offsets, dtype=torch.int64)") from None
        if isinstance(q, torch.Tensor) and q.ndim == 4:
            check_cu_seqlens_values(offsets, int(q.shape[1]))
        return torch.tensor(offsets, dtype=torch.int64, device=q.device)
    raise KdagenInputError(
        f"cu_seqlens: expected a 1-D int32/int64 tensor [N + 1] or a list of ints, got "
        f"{type(cu_seqlens).__name__}")


def _dense(x):
    """Any strided layout is accepted: the kernels read dense rows, so others are copied."""
    if isinstance(x, torch.Tensor) and not x.is_contiguous():
        return x.contiguous()
    return x


def _as_head_vector(x, HV: int):
    """FLA's A_log may come as [1, 1, HV, 1] (broadcast over [B, T, HV, K]): read as [HV]."""
    if (isinstance(x, torch.Tensor) and x.ndim > 1 and x.numel() == HV
            and sum(int(d) != 1 for d in x.shape) <= 1):
        return x.reshape(HV)
    return x


def _initial_state(h0, state_v_first: bool):
    """FLA's state layouts and dtypes -> the ops' fp32 (or fp64) [N, HV, K, V]."""
    if h0 is None or not isinstance(h0, torch.Tensor):
        return h0
    if state_v_first:
        if h0.ndim != 4:
            raise KdagenInputError(
                f"initial_state: expected a 4-D tensor [N, HV, V, K] (state_v_first=True), got "
                f"shape {list(h0.shape)}")
        h0 = h0.transpose(-1, -2)
    if h0.dtype in (torch.bfloat16, torch.float16):
        h0 = h0.float()            # the state is kept in fp32; autograd casts dh0 back
    return _dense(h0)


def _warn_if_head_first(q) -> None:
    if isinstance(q, torch.Tensor) and q.ndim == 4 and 1 < q.shape[1] < q.shape[2]:
        warnings.warn(
            f"q has shape {list(q.shape)}: read as [B, T, H, K] that is T = {q.shape[1]} < "
            f"H = {q.shape[2]}. kdagen (like FLA) takes [B, T, H, K]; if your tensors are "
            f"head-first [B, H, T, K], pass them with .transpose(1, 2).", stacklevel=4)


def _call_value_parts(family, q, k, v, g, beta, *, initial_state, state_v_first,
                      output_final_state, return_intermediate_states, **rest):
    """A value head dim larger than the built ones (FLA's V = 256): the delta rule never mixes
    value columns (o, the state and their gradients are column-separable in v and h0), so the
    op runs once per part of the columns, on the same q, k, gate and beta, and the parts'
    outputs are concatenated. Autograd sums the parts' gradients of the shared inputs. The
    cost: each part repeats the chunk products that do not depend on v (the key-key products
    and the inverse)."""
    state_dim = -2 if state_v_first else -1           # the value axis of initial_state, ht, h
    outs = []
    for a, b in head_pad.value_parts(int(v.shape[-1]), ops.value_dims_of(q, v)):
        h0 = initial_state
        if isinstance(h0, torch.Tensor):
            h0 = h0.narrow(state_dim, a, b - a)
        outs.append(_call(family, q, k, v[..., a:b], g, beta, initial_state=h0,
                          state_v_first=state_v_first, output_final_state=output_final_state,
                          return_intermediate_states=return_intermediate_states, **rest))
    o = torch.cat([r[0] for r in outs], dim=-1)
    ht = torch.cat([r[1] for r in outs], dim=state_dim) if output_final_state else None
    if return_intermediate_states:
        return o, ht, torch.cat([r[2] for r in outs], dim=state_dim)
    return o, ht


def _call(family, q, k, v, g, beta, *, scale, initial_state, output_final_state,
          use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
          safe_gate, lower_bound, cu_seqlens, A_log, dt_bias, chunk_size, state_v_first,
          return_intermediate_states, gate=None, gate_params=None, gate_options=None,
          cp_context=None):
    # the call's options, as the dispatchers below pass them on
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
              use_gate_in_kernel=use_gate_in_kernel,
              use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
              allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
              cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
              state_v_first=state_v_first, return_intermediate_states=return_intermediate_states,
              gate=gate, gate_params=gate_params, gate_options=gate_options)
    if (isinstance(v, torch.Tensor) and v.ndim == 4
            and int(v.shape[-1]) > max(ops.value_dims_of(q, v))):
        if scale is None and isinstance(q, torch.Tensor) and q.ndim == 4:
            kw["scale"] = int(q.shape[-1]) ** -0.5     # every part scales as the whole head does
        return _call_value_parts(family, q, k, v, g, beta, cp_context=cp_context, **kw)
    if cp_context is not None:
        return _call_cp(family, cp_context, q, k, v, g, beta, **kw)
    if gate is not None:
        return _call_gated(family, q, k, v, g, beta, **kw)
    if gate_params is not None or gate_options is not None:
        raise KdagenInputError("gate_params/gate_options: given without gate=; pass the gate "
                               "they belong to")
    _check_chunk_size(family, chunk_size)
    _warn_if_head_first(q)
    cu_seqlens = _as_cu_seqlens(cu_seqlens, q)
    q, k, v, g, beta = (_dense(x) for x in (q, k, v, g, beta))
    HV = int(v.shape[2]) if isinstance(v, torch.Tensor) and v.ndim == 4 else 0
    K = int(q.shape[3]) if isinstance(q, torch.Tensor) and q.ndim == 4 else 0
    if use_gate_in_kernel:
        A_log = _dense(_as_head_vector(A_log, HV))
        dt_bias = _dense(dt_bias)
        like = dict(dtype=torch.float32, device=q.device)
        if dt_bias is None and A_log is not None:
            dt_bias = torch.zeros((HV, K) if family == "kda" else (HV,), **like)   # no bias
        if A_log is None and family == "kda" and safe_gate and lower_bound is not None:
            # FLA: without A_log the lower-bound gate is lower_bound * sigmoid(g + dt_bias)
            A_log = torch.zeros(HV, **like)
            if dt_bias is None:
                dt_bias = torch.zeros(HV, K, **like)
    elif safe_gate and lower_bound is None:
        safe_gate = False      # FLA: a precomputed gate with safe_gate is the caller's promise
    initial_state = _initial_state(initial_state, state_v_first)
    sizes = validate_inputs(
        family, q, k, v, g, beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
        A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate,
        lower_bound=lower_bound, allowed_dtypes=ops.SUPPORTED_DTYPES,
        supported_head_dims=None, require_contiguous=True,
        check_values=_read_values(q, cu_seqlens))
    pad = head_pad.plan(sizes.K, sizes.V, ops.SUPPORTED_KEY_DIMS, ops.value_dims_of(q, v))
    if scale is None:
        scale = sizes.K ** -0.5
    elif isinstance(scale, torch.Tensor):
        raise KdagenInputError("scale: expected a Python float, got a tensor; pass float(scale)")
    if use_gate_in_kernel:
        if family == "kda":
            dt_bias = pad.keys(dt_bias.reshape(sizes.HV, sizes.K))   # [HV * K] -> [HV, K]
    else:
        A_log = dt_bias = None                               # unused, as in FLA
    q, k, v, g = pad.operands(family, q, k, v, g)
    initial_state = pad.state(initial_state)
    args = (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, float(scale),
            bool(output_final_state), bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
            bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(safe_gate),
            _lower_bound(lower_bound, safe_gate))
    if return_intermediate_states:
        _require_inference("return_intermediate_states", q, k, v, g, beta, A_log, dt_bias,
                           initial_state)
        o, ht, h = ops.forward_with_chunk_states(family, *args)
    else:
        o, ht = ops.forward(family, *args, save_residuals=ops.save_residuals_wanted(
            q, k, v, g, beta, A_log, dt_bias, initial_state))
        h = None
    o, ht, h = pad.out(o), pad.out_state(ht), pad.out_state(h)
    if state_v_first:
        ht = ht.transpose(-1, -2).contiguous() if output_final_state else None
        h = h.transpose(-1, -2).contiguous() if h is not None else None
    ht = ht if output_final_state else None
    return (o, ht, h) if return_intermediate_states else (o, ht)


def _call_cp(family, cp_context, q, k, v, g, beta, *, initial_state, output_final_state,
             cu_seqlens, state_v_first, return_intermediate_states, **rest):
    """The op under context parallelism (kdagen.cp): this rank's tokens, the states chained
    over the group."""
    if cu_seqlens is not None:
        raise KdagenInputError("cu_seqlens: not with cp_context; the context carries this "
                               "rank's offsets (build it from the global cu_seqlens)")
    if return_intermediate_states:
        raise KdagenInputError("return_intermediate_states: not supported with cp_context")
    h0 = _initial_state(initial_state, state_v_first)

    def call(q, k, v, g, beta, *, initial_state, output_final_state, cu_seqlens):
        return _call(family, q, k, v, g, beta, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                     state_v_first=False, return_intermediate_states=False, **rest)
    o, ht = cp.cp_call(call, cp_context, q, k, v, g, beta, initial_state=h0,
                       output_final_state=output_final_state)
    if state_v_first and ht is not None:
        ht = ht.transpose(-1, -2).contiguous()
    return o, ht


def _resolve_gate(family: str, gate):
    """A gate name or Gate object -> the registered Gate (a Gate object is registered under
    its name, so the ops, which take names, find it)."""
    from kdagen.ir import gates as gate_lib
    if isinstance(gate, gate_lib.Gate):
        have = gate_lib.GATES.get(gate.name)
        if have is not gate:
            if have is not None and have.builtin:
                raise KdagenInputError(f"gate: {gate.name!r} is a built-in gate's name; name "
                                       f"yours differently")
            gate_lib.GATES[gate.name] = gate
    elif not isinstance(gate, str):
        raise KdagenInputError(f"gate: expected a gate name or a kdagen.ir.gates.Gate, got "
                               f"{type(gate).__name__}")
    return ops._registered_gate(family, gate if isinstance(gate, str) else gate.name)


def _gate_param_tensors(gobj, gate_params, A_log, dt_bias, HV: int, K: int) -> list:
    given = dict(gate_params or {})
    if not isinstance(gate_params, (dict, type(None))):
        raise KdagenInputError(f"gate_params: expected a dict name -> tensor, got "
                               f"{type(gate_params).__name__}")
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if x is None:
            continue
        if name not in gobj.params:
            raise KdagenInputError(f"{name}: gate {gobj.name!r} has no parameter {name!r} "
                                   f"(its parameters: {list(gobj.params) or 'none'})")
        if name in given:
            raise KdagenInputError(f"{name}: given twice (as {name}= and in gate_params)")
        given[name] = x
    unknown = sorted(set(given) - set(gobj.params))
    missing = [p for p in gobj.params if p not in given]
    if unknown or missing:
        raise KdagenInputError(
            f"gate_params: gate {gobj.name!r} takes parameters {dict(gobj.params)}; "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and unknown else "") + (f"unknown {unknown}" if unknown else ""))
    out = []
    for pname, kind in gobj.params.items():
        x = given[pname]
        if not isinstance(x, torch.Tensor):
            raise KdagenInputError(f"gate_params[{pname!r}]: expected a torch.Tensor, got "
                                   f"{type(x).__name__}")
        if not x.is_floating_point():
            raise KdagenInputError(f"gate_params[{pname!r}]: expected a floating-point tensor, "
                                   f"got {x.dtype}")
        want = HV if kind == "scalar" else HV * K
        if x.numel() != want:
            raise KdagenInputError(
                f"gate_params[{pname!r}]: a per-head {kind} parameter has "
                f"{'[HV]' if kind == 'scalar' else '[HV, K]'} = "
                f"{[HV] if kind == 'scalar' else [HV, K]} elements, got shape {list(x.shape)}")
        x = x.reshape(HV) if kind == "scalar" else x.reshape(HV, K)
        out.append(_dense(x.float()))     # autograd casts the gradient back to x's dtype
    return out


def _json_value(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if x is None:
        return "null"
    if isinstance(x, (int, float)):
        return repr(float(x)) if isinstance(x, float) else str(int(x))
    if isinstance(x, str):
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise KdagenInputError(f"gate_options: values must be numbers, booleans, strings or None, "
                           f"got {type(x).__name__}")


def _options_json(options) -> str:
    """Gate options as the ops' JSON text, sorted (json.dumps is not traceable by dynamo)."""
    items = sorted(dict(options or {}).items())
    return "{" + ", ".join(f'"{k}": {_json_value(v)}' for k, v in items) + "}"


def _call_gated(family, q, k, v, g, beta, *, scale, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                allow_neg_eigval, safe_gate, lower_bound, cu_seqlens, A_log, dt_bias, chunk_size,
                state_v_first, return_intermediate_states, gate, gate_params, gate_options):
    for flag, value in (("use_gate_in_kernel", use_gate_in_kernel), ("safe_gate", safe_gate),
                        ("lower_bound", lower_bound is not None)):
        if value:
            raise KdagenInputError(f"{flag}: not used with gate= (the gate takes the raw g and "
                                   f"its own parameters and options); drop it")
    if return_intermediate_states:
        raise KdagenInputError("return_intermediate_states: not available with gate= yet; "
                               "call without it")
    _check_chunk_size(family, chunk_size)
    _warn_if_head_first(q)
    gobj = _resolve_gate(family, gate)
    if gate_options is not None and not isinstance(gate_options, dict):
        raise KdagenInputError(f"gate_options: expected a dict, got {type(gate_options).__name__}")
    try:
        gobj.resolve_options(dict(gate_options or {}))
    except ValueError as err:
        raise KdagenInputError(f"gate_options: {err}") from None
    cu_seqlens = _as_cu_seqlens(cu_seqlens, q)
    q, k, v, g, beta = (_dense(x) for x in (q, k, v, g, beta))
    initial_state = _initial_state(initial_state, state_v_first)
    sizes = validate_inputs(
        family, q, k, v, g, beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
        allowed_dtypes=ops.SUPPORTED_DTYPES, supported_head_dims=None,
        require_contiguous=True, check_values=_read_values(q, cu_seqlens))
    pad = head_pad.plan(sizes.K, sizes.V, ops.SUPPORTED_KEY_DIMS, ops.value_dims_of(q, v))
    params = _gate_param_tensors(gobj, gate_params, _as_head_vector(A_log, sizes.HV), dt_bias,
                                 sizes.HV, sizes.K)
    params = [pad.keys(x) if kind == "channel" else x
              for x, kind in zip(params, gobj.params.values())]
    if scale is None:
        scale = sizes.K ** -0.5
    elif isinstance(scale, torch.Tensor):
        raise KdagenInputError("scale: expected a Python float, got a tensor; pass float(scale)")
    q, k, v, g = pad.operands(family, q, k, v, g)
    initial_state = pad.state(initial_state)
    op = ops.kda_gated_fwd if family == "kda" else ops.gdn_gated_fwd
    o, ht, _ = op(q, k, v, g, beta, params, initial_state, cu_seqlens, float(scale),
                  bool(output_final_state), bool(use_qk_l2norm_in_kernel),
                  bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), gobj.name,
                  _options_json(gate_options),
                  save_residuals=ops.save_residuals_wanted(q, k, v, g, beta, initial_state,
                                                           *params))
    o, ht = pad.out(o), pad.out_state(ht)
    if state_v_first and output_final_state:
        ht = ht.transpose(-1, -2).contiguous()
    return o, (ht if output_final_state else None)


def _require_inference(flag: str, *tensors) -> None:
    """FLA's inference-only outputs bypass autograd: refuse them where a gradient is wanted."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in tensors):
        raise KdagenInputError(
            f"{flag}: the intermediate states are for inference and bypass autograd, but an "
            f"input requires grad; call under torch.inference_mode() (or torch.no_grad())")


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
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    *,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    chunk_size: int = 64,
    gate: Any = None,
    gate_params: dict | None = None,
    gate_options: dict | None = None,
    cp_context: Any = None,
    **fla_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi Delta Attention, chunked: FLA's ``chunk_kda`` (same arguments, in FLA's order, and
    the same results).

    - q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; beta ``[B, T, HV]``. Any strides are
      accepted (q/k/v split from a fused projection, say); the kernels read dense rows, so
      a non-contiguous tensor is copied first.
    - ``g`` ``[B, T, HV, K]``: the natural-log gate; with ``use_gate_in_kernel`` the raw gate,
      turned into ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` or, with ``safe_gate``,
      ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))`` (lower_bound in [-5, 0)).
      ``A_log`` ``[HV]`` (or FLA's ``[1, 1, HV, 1]``) is then required (except with
      ``safe_gate``, where None means A_log = 0, as in FLA); ``dt_bias`` ``[HV, K]``/``[HV * K]``
      may be None (no bias). Without ``use_gate_in_kernel`` they are ignored. g and beta keep
      their own dtype (fp32 next to bf16 q/k/v is not rounded). Each gate's declared range is
      enforced inside the kernels (a precomputed g below ``lower_bound`` is clamped to it).
    - ``use_beta_sigmoid_in_kernel``: beta is raw, turned into ``sigmoid(beta)``
      (``2 * sigmoid(beta)`` with ``allow_neg_eigval``; ignored otherwise).
    - ``use_qk_l2norm_in_kernel``: L2-normalise q and k (eps 1e-6 inside the sqrt).
    - ``scale`` defaults to ``K ** -0.5``; ``initial_state`` ``[N, HV, K, V]`` (``[N, HV, V, K]``
      with ``state_v_first``) in fp32, or bf16/fp16 (computed in fp32); ``cu_seqlens``
      ``[N + 1]`` int32/int64 (a tensor or a list) with B = 1 (varlen).
    - ``return_intermediate_states`` (inference: under ``torch.inference_mode()``): also return
      h ``[B, NT, HV, K, V]`` in q's dtype, the state entering each chunk of 64 tokens (varlen:
      B = 1, NT the chunks of all sequences; this reads ``cu_seqlens`` on the host, as FLA does).
    - ``chunk_size``: FLA's values (32 or 64) are accepted; kdagen chooses its own chunk size
      (the result does not depend on it). FLA's tuning keywords ``chunk_indices``,
      ``cu_seqlens_cpu``, ``disable_recompute`` are accepted and ignored.
    - ``gate`` (kdagen's own): any registered gate (a name, or a
      :class:`kdagen.ir.gates.Gate`; a user's gate file is loaded with
      :func:`kdagen.load_gates`). g is then its raw input, ``gate_params`` maps each of the
      gate's parameters to a tensor (a per-head scalar ``[HV]``, a per-channel one
      ``[HV, K]``/``[HV * K]``; ``A_log=``/``dt_bias=`` fill the parameters of those names),
      ``gate_options`` sets its options. Gradients reach every parameter. It replaces
      ``use_gate_in_kernel``/``safe_gate``/``lower_bound``.
    - ``cp_context``: context parallelism over a ``torch.distributed`` group (a
      :class:`kdagen.cp.CPContext` from :func:`kdagen.cp.build_cp_context` on the global
      ``cu_seqlens``): q, k, v, g, beta are this rank's ``[1, T / world_size, ...]`` tokens,
      ``cu_seqlens`` comes from the context (do not pass it); exact, differentiable, and unlike
      FLA with ``initial_state`` (global ``[N, HV, K, V]``) and ``output_final_state`` (the
      state after each of the rank's segments, ``[n_local, HV, K, V]``). See :mod:`kdagen.cp`.

    Returns ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype, final_state float32
    ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``) with ``output_final_state``,
    else None; ``(o, final_state, h)`` with ``return_intermediate_states``. Differentiable in
    q, k, v, g, beta, A_log, dt_bias and initial_state.
    """
    check_fla_kwargs("chunk_kda", fla_kwargs)
    return _call("kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                 cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
                 state_v_first=state_v_first,
                 return_intermediate_states=return_intermediate_states,
                 gate=gate, gate_params=gate_params, gate_options=gate_options,
                 cp_context=cp_context)


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
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | list[int] | None = None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    chunk_size: int = 64,
    return_intermediate_states: bool = False,
    gate: Any = None,
    gate_params: dict | None = None,
    gate_options: dict | None = None,
    cp_context: Any = None,
    **fla_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet, chunked: FLA's ``chunk_gated_delta_rule`` (same arguments, in FLA's
    order).

    ``g`` ``[B, T, HV]`` is the natural-log gate per head, ``beta`` ``[B, T, HV]`` the
    (already activated) beta, or raw with ``use_beta_sigmoid_in_kernel`` (+ ``allow_neg_eigval``).
    ``use_gate_in_kernel`` takes a raw gate (with ``A_log`` ``[HV]``, ``dt_bias`` ``[HV]`` or
    None, optionally ``safe_gate`` + ``lower_bound``). ``chunk_size``: FLA's values (16, 32,
    64) are accepted, the result does not depend on it. Strides, dtypes, ``state_v_first`` and
    ``cu_seqlens`` as in :func:`chunk_kda`; ``gate``/``gate_params``/``gate_options`` as in
    :func:`chunk_kda`, with GDN gates (a per-head scalar g; parameters ``[HV]``).

    Returns ``(o [B, T, HV, V] in v's dtype, final_state float32 [N, HV, K, V] or None)``.
    """
    check_fla_kwargs("chunk_gated_delta_rule", fla_kwargs)
    return _call("gdn", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                 cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
                 state_v_first=state_v_first,
                 return_intermediate_states=return_intermediate_states,
                 gate=gate, gate_params=gate_params, gate_options=gate_options,
                 cp_context=cp_context)
