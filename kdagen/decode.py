"""Decoding: ``kdagen.fused_recurrent_kda`` / ``kdagen.fused_recurrent_gated_delta_rule`` (FLA's
names and keywords) over the DSL's decode programs (``kda_decode`` / ``gdn_decode``: the
per-token recurrence, one scan step per token), with an inference engine's state pool.

The ops ``torch.ops.kdagen.{kda,gdn}_decode`` run the program through the executor of the
tensors' device (kernels on CUDA, the interpreter on CPU); they have fake kernels and read no
tensor value on the host, so a decode step can be captured in a CUDA graph. Schema as
``kdagen::{family}_fwd`` (:mod:`kdagen.ops`) plus ``bool output_token_states``, returning
``(o, final_state, token_states)`` (empty ``[0]`` tensors where not asked for); no autograd.

The pool (``ssm_state_indices``; semantics of :mod:`kdagen.decode_reference`). A negative read
slot skips the sequence (its outputs are 0, no slot is written), a negative write slot drops
that token's state. Where the pool is a contiguous float32 or bfloat16 tensor, stored
``[slots, HV, K, V]`` or value-first ``[slots, HV, V, K]`` (``state_v_first``), the kernel reads
each sequence's initial state from its slot itself (the program options ``state_dtype`` and
``state_v_first`` say how the rows are stored; a bfloat16 row is widened to fp32 on load and the
new state rounded to nearest once on store): the ops ``torch.ops.kdagen.{kda,gdn}_decode_pool``
run the decode program with ``state_pool=True`` (the slot of sequence n is an input
``state_slots[n]``; :data:`kdagen.ir.programs.DECODE_OPTIONS`), which mutate the pool:

- ``ssm_state_indices`` ``[N]``: the kernel reads slot ``idx[n]`` and writes the new state
  back to it, in place — each state crosses memory once each way, and no torch op runs
  around the kernel;
- ``[N, T]`` (speculative): the kernel reads slot ``idx[n, num_accepted_tokens[n] - 1]`` (that
  index is picked by a small torch gather on the ``[N, T]`` table) and returns the state after
  every token; these are scattered into their slots by torch (`_scatter_states`).

A non-contiguous pool (or one of head dims the kernels are not built for) takes the torch path
for both: the states are gathered from their slots (``index_select``, transposed where stored
value-first), the plain decode program advances them, and the new states are scattered back.
Without a pool, ``state_v_first`` transposes the initial state into the step and the final
state back (one copy each way). The scatter is one indexed copy in which the rows that must
not write repeat a writing row's slot and value (`_scatter_states`), so no host
synchronisation is needed to leave the skipped slots out, and every state is stored exactly.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from kdagen import head_pad, ops
from kdagen.runtime import backends
from kdagen.runtime.backends import OutSpec
from kdagen.validation import KdagenInputError, check_fla_kwargs

__all__ = ["fused_recurrent_kda", "fused_recurrent_gated_delta_rule", "kda_decode", "gdn_decode",
           "kda_decode_pool", "gdn_decode_pool"]


def _run(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
         output_final_state, output_token_states, use_qk_l2norm_in_kernel, use_gate_in_kernel,
         use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound):
    sizes, opts, inputs, outputs = ops.call_spec(
        family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
        output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound)
    _decode_options(sizes, opts, outputs, output_token_states)
    res = backends.get_executor(q.device).run(f"{family}_decode", opts, inputs, outputs)
    empty = q.new_empty((0,), dtype=torch.float32)
    return (res["o"], res["final_state"] if output_final_state else empty,
            res["token_states"] if output_token_states else empty)


#: a fixed number of CTAs per (sequence, value head) for every decode step (an ablation:
#: bench/decode_bench.py --value-split); None: value_split() chooses per call
VALUE_SPLIT = None
#: (sequence, head) pairs up to which a decode step splits each state over 4 CTAs, not 2
FEW_PAIRS = 128


def value_split(N: int, HV: int, V: int) -> int:
    """CTAs per (sequence, value head) of a decode step, each owning V / value_split columns
    of the state, v and o (the decode programs' option). Measured on the H200 (K = V = 128,
    fp32 pool in place, CUDA graphs; bench/results/h200_decode_value_split_*): with few
    sequences the step's latency is one CTA's chain, which 4 parts shorten most (KDA N = 1,
    HV = 16: 7.34 us unsplit, 5.39 with 2 parts, 4.24 with 4; FLA 4.11); with many, 2 parts
    keep the most state bytes in flight (N = 256, HV = 16: 171.2, 163.0, 188.8 us)."""
    parts = VALUE_SPLIT if VALUE_SPLIT is not None else (4 if N * HV <= FEW_PAIRS else 2)
    while parts > 1 and V % (8 * parts):
        parts //= 2
    return parts


def _decode_options(sizes, opts: dict, outputs: dict, output_token_states: bool) -> None:
    """The chunked op's call spec made a decode step's: one token per scan step, the value
    columns split over value_split() CTAs, and the state after every token as an output where
    asked for."""
    del opts["chunk_size"]
    parts = value_split(sizes.N, sizes.HV, sizes.V)
    if parts > 1:
        opts["value_split"] = parts
    if output_token_states:
        opts["output_token_states"] = True
        outputs["token_states"] = OutSpec((sizes.B * sizes.T, sizes.HV, sizes.K, sizes.V),
                                          torch.float32)


def _define(family: str):
    def op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
           dt_bias: Optional[Tensor], initial_state: Optional[Tensor],
           cu_seqlens: Optional[Tensor], scale: float, output_final_state: bool,
           output_token_states: bool, use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
           use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, safe_gate: bool,
           lower_bound: Optional[float]) -> tuple[Tensor, Tensor, Tensor]:
        return _run(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
                    output_final_state, output_token_states, use_qk_l2norm_in_kernel,
                    use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
                    lower_bound)

    op.__name__ = op.__qualname__ = f"{family}_decode"
    op.__doc__ = f"{family.upper()} decode step: (o, final_state, token_states); see kdagen.decode."
    custom = torch.library.custom_op(f"kdagen::{family}_decode", mutates_args=())(op)

    @custom.register_fake
    def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, output_final_state,
          output_token_states, *flags):
        state = (v.shape[2], q.shape[3], v.shape[3])
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]
        empty = q.new_empty((0,), dtype=torch.float32)
        ht = q.new_empty((N, *state), dtype=torch.float32) if output_final_state else empty
        hs = (q.new_empty((q.shape[0] * q.shape[1], *state), dtype=torch.float32)
              if output_token_states else empty)
        return v.new_empty(v.shape), ht, hs
    return custom


kda_decode = _define("kda")
gdn_decode = _define("gdn")


def _run_pool(family, q, k, v, g, beta, A_log, dt_bias, state_pool, state_slots, cu_seqlens,
              scale, write_final_state, output_token_states, state_v_first,
              use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
              allow_neg_eigval, safe_gate, lower_bound):
    sizes, opts, inputs, outputs = ops.call_spec(
        family, q, k, v, g, beta, A_log, dt_bias, None, cu_seqlens, scale, False,
        use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, safe_gate, lower_bound)
    _check_pool_operands(state_pool, state_slots, sizes, q.device, state_v_first)
    _decode_options(sizes, opts, outputs, output_token_states)
    opts.update(use_initial_state=True, output_final_state=bool(write_final_state),
                state_pool=True, slot_dtype=_SLOT_DTYPES[state_slots.dtype])
    # how the pool's rows are stored (named only where not the default: fp32 [K, V])
    if state_pool.dtype != torch.float32:
        opts["state_dtype"] = _POOL_DTYPES[state_pool.dtype]
    if state_v_first:
        opts["state_v_first"] = True
    inputs.update(initial_state=state_pool, state_slots=state_slots)
    if write_final_state:
        inputs["final_state"] = state_pool        # the pool output, written in place
    res = backends.get_executor(q.device).run(f"{family}_decode", opts, inputs, outputs)
    return (res["o"], res["token_states"] if output_token_states
            else q.new_empty((0,), dtype=torch.float32))


_SLOT_DTYPES = {torch.int32: "i32", torch.int64: "i64"}
#: the pool element types the decode kernels read and write themselves (program state_dtype)
_POOL_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _check_pool_operands(pool: Tensor, slots: Tensor, sizes, device,
                         v_first: bool = False) -> None:
    """What the pool kernels take (shapes and types only, nothing read): a contiguous float32
    or bfloat16 pool [slots, HV, K, V] ([slots, HV, V, K] with ``v_first``) and an int32/int64
    slot per sequence, on the inputs' device."""
    want = (sizes.HV, sizes.V, sizes.K) if v_first else (sizes.HV, sizes.K, sizes.V)
    if (pool.dtype not in _POOL_DTYPES or pool.ndim != 4 or tuple(pool.shape[1:]) != want
            or not pool.is_contiguous()):
        raise KdagenInputError(f"state_pool: expected a contiguous float32 or bfloat16 pool "
                               f"[slots, {', '.join(map(str, want))}]"
                               f"{' (state_v_first)' if v_first else ''}, got {pool.dtype} "
                               f"{list(pool.shape)}"
                               f"{'' if pool.is_contiguous() else ' (not contiguous)'}")
    if slots.dtype not in _SLOT_DTYPES or tuple(slots.shape) != (sizes.N,):
        raise KdagenInputError(f"state_slots: expected an int32/int64 tensor [N = {sizes.N}], "
                               f"got {slots.dtype} {list(slots.shape)}")
    for name, x in (("state_pool", pool), ("state_slots", slots)):
        if x.device != device:
            raise KdagenInputError(f"{name}: expected device {device}, got {x.device}")


def _define_pool(family: str):
    def op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
           dt_bias: Optional[Tensor], state_pool: Tensor, state_slots: Tensor,
           cu_seqlens: Optional[Tensor], scale: float, write_final_state: bool,
           output_token_states: bool, state_v_first: bool, use_qk_l2norm_in_kernel: bool,
           use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool,
           safe_gate: bool, lower_bound: Optional[float]) -> tuple[Tensor, Tensor]:
        return _run_pool(family, q, k, v, g, beta, A_log, dt_bias, state_pool, state_slots,
                         cu_seqlens, scale, write_final_state, output_token_states,
                         state_v_first, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound)

    op.__name__ = op.__qualname__ = f"{family}_decode_pool"
    op.__doc__ = (f"{family.upper()} decode step on a state pool [slots, HV, K, V] "
                  f"([slots, HV, V, K] with state_v_first; float32 or bfloat16, contiguous): "
                  f"sequence n starts from row state_slots[n] (int32/int64 [N]); "
                  f"with write_final_state its new state goes back there, in place (a bfloat16 "
                  f"row rounded to nearest once); a negative "
                  f"slot skips the sequence (it starts from 0, its o is 0, no row is written). "
                  f"Returns (o, token_states [tokens, HV, K, V] float32); see kdagen.decode.")
    custom = torch.library.custom_op(f"kdagen::{family}_decode_pool",
                                     mutates_args=("state_pool",))(op)

    @custom.register_fake
    def _(q, k, v, g, beta, A_log, dt_bias, state_pool, state_slots, cu_seqlens, scale,
          write_final_state, output_token_states, state_v_first, *flags):
        state = (v.shape[2], q.shape[3], v.shape[3])
        hs = (q.new_empty((q.shape[0] * q.shape[1], *state), dtype=torch.float32)
              if output_token_states else q.new_empty((0,), dtype=torch.float32))
        return v.new_empty(v.shape), hs
    return custom


kda_decode_pool = _define_pool("kda")
gdn_decode_pool = _define_pool("gdn")


# ------------------------------------------------------------------------------------------
# the pool
# ------------------------------------------------------------------------------------------


def _token_seq(B: int, T: int, cu_seqlens, device) -> tuple[Tensor, Tensor]:
    """(sequence, position in it) of every token, flattened [B·T], computed on the device."""
    tok = torch.arange(B * T, device=device)
    if cu_seqlens is None:
        return tok // T, tok % T
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], tok, right=True)
    return seq, tok - cu[seq]


def _scatter_states(pool: Tensor, slots: Tensor, states: Tensor, write: Tensor) -> None:
    """pool[slots[i]] = states[i] where ``write[i]``, in place, exactly, without a host sync.
    A row that must not write is pointed at the slot of the first row that does, carrying
    that row's state: duplicate indices then all carry the same value, so the copy is
    deterministic (with no row writing, every row rewrites slot 0 with its own value)."""
    # index_select with a one-element index tensor: indexing with a 0-d tensor reads it on the
    # host (.item()), which a CUDA graph capture refuses
    first = torch.argmax(write.to(torch.int32)).view(1)          # 0 when no row writes
    anyone = write.any()
    slot = torch.where(write, slots, torch.where(anyone, slots.index_select(0, first), 0))
    fallback = torch.where(anyone, states.index_select(0, first)[0].to(pool.dtype), pool[0])
    value = torch.where(write.view(-1, 1, 1, 1), states.to(pool.dtype), fallback[None])
    pool.index_copy_(0, slot, value)


def _check_pool(pool, idx, num_accepted, N, inplace_final_state):
    if not isinstance(idx, Tensor) or idx.dtype not in (torch.int32, torch.int64):
        raise KdagenInputError("ssm_state_indices: expected an int32/int64 tensor [N] or [N, T]")
    if idx.ndim not in (1, 2) or idx.shape[0] != N:
        raise KdagenInputError(f"ssm_state_indices: expected [N] or [N, T] with N = {N} "
                               f"sequences, got shape {list(idx.shape)}")
    if pool is None or pool.ndim != 4:
        raise KdagenInputError("initial_state: with ssm_state_indices, the state pool "
                               "[slots, HV, K, V] (fp32 or bf16)")
    if pool.dtype not in (torch.float32, torch.bfloat16):
        raise KdagenInputError(f"initial_state: the pool's dtype must be float32 or bfloat16, "
                               f"got {pool.dtype}")
    if idx.device != pool.device:
        raise KdagenInputError(f"ssm_state_indices: expected device {pool.device}, got "
                               f"{idx.device}")
    if num_accepted is not None:
        if idx.ndim != 2:
            raise KdagenInputError("num_accepted_tokens: needs ssm_state_indices [N, T] (a "
                                   "slot per draft token)")
        if num_accepted.shape != (N,) or num_accepted.dtype not in (torch.int32, torch.int64):
            raise KdagenInputError(f"num_accepted_tokens: expected an int tensor [N = {N}], got "
                                   f"{num_accepted.dtype} {list(num_accepted.shape)}")
    if not inplace_final_state:
        raise KdagenInputError("inplace_final_state: with ssm_state_indices the pool is updated "
                               "in place; pass inplace_final_state=True")


def _call(family, q, k, v, g, beta, *, A_log, dt_bias, scale, initial_state, output_final_state,
          use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
          allow_neg_eigval, lower_bound, state_v_first, cu_seqlens, ssm_state_indices,
          num_accepted_tokens, inplace_final_state, fla_kwargs):
    check_fla_kwargs(f"fused_recurrent_{'kda' if family == 'kda' else 'gated_delta_rule'}",
                     fla_kwargs)
    # what a call that re-enters _call on transposed states or value parts passes on as is
    passed = dict(A_log=A_log, dt_bias=dt_bias, scale=scale,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_gate_in_kernel=use_gate_in_kernel,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound,
                  cu_seqlens=cu_seqlens, fla_kwargs=fla_kwargs)
    if state_v_first and ssm_state_indices is None:
        return _call_transposed(family, q, k, v, g, beta, initial_state=initial_state,
                                output_final_state=output_final_state,
                                inplace_final_state=inplace_final_state, **passed)
    if (isinstance(v, Tensor) and v.ndim == 4 and int(v.shape[-1]) > max(ops.value_dims_of(q, v))
            and (initial_state is None or (
                isinstance(initial_state, Tensor)
                and _as_kv(initial_state, state_v_first).shape[-1] == v.shape[-1]))):
        return _call_value_parts(
            family, q, k, v, g, beta, initial_state=initial_state,
            output_final_state=output_final_state, state_v_first=state_v_first,
            ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
            inplace_final_state=inplace_final_state, **passed)
    safe_gate = lower_bound is not None and use_gate_in_kernel
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if use_gate_in_kernel and dt_bias is None:
        dt_bias = torch.zeros((v.shape[2], q.shape[3]) if family == "kda" else (v.shape[2],),
                              dtype=torch.float32, device=q.device)
    if not use_gate_in_kernel:
        A_log = dt_bias = None
    pad = _head_pad(family, q, k, v, g, dt_bias, _as_kv(initial_state, state_v_first))
    if pad.active:            # head dims between the built ones: zero channels (head_pad)
        q, k, v, g = pad.operands(family, q, k, v, g)
        if family == "kda" and dt_bias is not None:
            dt_bias = pad.keys(dt_bias.reshape(v.shape[2], pad.K))
    op = kda_decode if family == "kda" else gdn_decode
    flags = (bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel),
             bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(safe_gate),
             float(lower_bound) if safe_gate else None)
    if ssm_state_indices is None:
        o, ht, _ = op(q, k, v, g, beta, A_log, dt_bias, pad.state(initial_state), cu_seqlens,
                      float(scale), bool(output_final_state or inplace_final_state), False,
                      *flags)
        o, ht = pad.out(o), pad.out_state(ht)
        if inplace_final_state and initial_state is not None:
            initial_state.copy_(ht.to(initial_state.dtype))
            return o, initial_state
        return o, (ht if output_final_state else None)
    B, T = int(q.shape[0]), int(q.shape[1])
    N = int(cu_seqlens.shape[0]) - 1 if cu_seqlens is not None else B
    pool, idx = initial_state, ssm_state_indices
    _check_pool(pool, idx, num_accepted_tokens, N, inplace_final_state)
    read = _read_slots(idx, num_accepted_tokens, N)
    per_token = idx.ndim == 2
    if not pad.active and _kernel_indexes_pool(pool):
        pool_op = kda_decode_pool if family == "kda" else gdn_decode_pool
        o, hs = pool_op(q, k, v, g, beta, A_log, dt_bias, pool, read.contiguous(), cu_seqlens,
                        float(scale), not per_token, per_token, bool(state_v_first), *flags)
        if per_token:
            _write_token_states(pool, idx, read, _as_stored(hs, state_v_first), B, T, cu_seqlens)
        return o, pool
    live = read >= 0
    h0 = _as_kv(pool.index_select(0, read.clamp(min=0).to(torch.int64)).to(torch.float32),
                state_v_first)
    o, ht, hs = op(q, k, v, g, beta, A_log, dt_bias, pad.state(h0).contiguous(), cu_seqlens,
                   float(scale), not per_token, per_token, *flags)
    o, ht, hs = pad.out(o), pad.out_state(ht), pad.out_state(hs)
    seq, _ = _token_seq(B, T, cu_seqlens, q.device)
    o = o * live[seq].view(B, T, 1, 1).to(o.dtype)          # skipped sequences: 0
    if per_token:
        _write_token_states(pool, idx, read, _as_stored(hs, state_v_first), B, T, cu_seqlens)
    else:
        _scatter_states(pool, read.to(torch.int64), _as_stored(ht, state_v_first), live)
    return o, pool


def _as_kv(state, v_first: bool):
    """A state (or pool) as [.., K, V]: a view, transposed where it is stored value-first."""
    return state.transpose(-1, -2) if v_first and isinstance(state, Tensor) else state


#: the inverse view: [.., K, V] states as a value-first pool stores them
_as_stored = _as_kv


def _call_transposed(family, q, k, v, g, beta, *, initial_state, output_final_state,
                     inplace_final_state, **rest):
    """state_v_first without a pool: the initial state [N, HV, V, K] is transposed into the
    step's [N, HV, K, V] (one copy), the final state returned, or written into
    initial_state, as [N, HV, V, K]."""
    if initial_state is not None and (not isinstance(initial_state, Tensor)
                                      or initial_state.ndim != 4):
        raise KdagenInputError("initial_state: expected a 4-D tensor [N, HV, V, K] "
                               "(state_v_first=True)")
    h0 = _as_kv(initial_state, True).contiguous() if initial_state is not None else None
    write_back = inplace_final_state and initial_state is not None
    o, ht = _call(family, q, k, v, g, beta, initial_state=h0,
                  output_final_state=output_final_state or write_back, inplace_final_state=False,
                  state_v_first=False, ssm_state_indices=None, num_accepted_tokens=None, **rest)
    if write_back:
        initial_state.copy_(_as_stored(ht, True))
        return o, initial_state
    return o, (_as_stored(ht, True).contiguous() if output_final_state else None)


def _call_value_parts(family, q, k, v, g, beta, *, initial_state, output_final_state,
                      inplace_final_state, ssm_state_indices, state_v_first, **rest):
    """A value head dim larger than the built ones: one step per part of the value columns
    (the delta rule never mixes them; as kdagen.api's chunked op does). Each part reads and
    writes its columns of the states through a view: of a state pool (in place, on torch's
    gather/scatter path, since the view is not dense; a value-first pool's part is a range of
    its rows' V axis) or of an initial state updated in place."""
    pool = ssm_state_indices is not None
    write_back = not pool and inplace_final_state and initial_state is not None
    outs = []
    for a, b in head_pad.value_parts(int(v.shape[-1]), ops.value_dims_of(q, v)):
        h0 = (_as_stored(_as_kv(initial_state, state_v_first)[..., a:b], state_v_first)
              if initial_state is not None else None)
        if h0 is not None and not pool:
            h0 = h0.contiguous()         # a plain initial state is read densely, written below
        o, ht = _call(family, q, k, v[..., a:b].contiguous(), g, beta, initial_state=h0,
                      output_final_state=output_final_state or write_back,
                      inplace_final_state=inplace_final_state and pool,
                      ssm_state_indices=ssm_state_indices, state_v_first=state_v_first, **rest)
        if write_back:
            initial_state[..., a:b].copy_(ht.to(initial_state.dtype))
        outs.append((o, ht))
    o = torch.cat([r[0] for r in outs], dim=-1)
    if pool or write_back:
        return o, initial_state
    return o, (torch.cat([r[1] for r in outs], dim=-1) if output_final_state else None)


def _head_pad(family, q, k, v, g, dt_bias, state) -> head_pad.HeadPad:
    """The padding of a call whose head dims lie between the built ones (UNPADDED: built
    dims, or inputs whose shapes disagree, which the op then reports). The pool path takes
    the gathered states through torch (the kernels index only pools of the built dims)."""
    if not all(isinstance(x, Tensor) and x.ndim == 4 for x in (q, k, v)):
        return head_pad.UNPADDED
    K, V, HV = int(q.shape[3]), int(v.shape[3]), int(v.shape[2])
    if K in ops.SUPPORTED_KEY_DIMS and V in ops.value_dims_of(q, v):
        return head_pad.UNPADDED
    consistent = (k.shape[3] == K and (family == "gdn" or (isinstance(g, Tensor) and g.ndim == 4
                                                            and g.shape[3] == K))
                  and (dt_bias is None or family == "gdn" or dt_bias.numel() == HV * K)
                  and (state is None or (state.ndim == 4 and tuple(state.shape[2:]) == (K, V))))
    if not consistent:
        return head_pad.UNPADDED
    return head_pad.plan(K, V, ops.SUPPORTED_KEY_DIMS, ops.value_dims_of(q, v))


def _kernel_indexes_pool(pool: Tensor) -> bool:
    """Whether the decode kernel reads (and writes) the pool's slots itself: a contiguous
    float32 or bfloat16 pool (what the kernels' state rows can be, either layout); else the
    states go through torch."""
    return pool.dtype in _POOL_DTYPES and pool.is_contiguous() and pool.shape[0] > 0


def _read_slots(idx: Tensor, num_accepted: Tensor | None, N: int) -> Tensor:
    """The slot each sequence starts from ([N], idx's dtype, negative = skipped): ``idx`` [N],
    or ``idx[n, num_accepted[n] - 1]`` of an [N, T] table (column 0 without it)."""
    if idx.ndim == 1:
        return idx
    first = (num_accepted.to(torch.int64) - 1 if num_accepted is not None
             else torch.zeros(N, dtype=torch.int64, device=idx.device))
    return idx.gather(1, first.clamp(min=0)[:, None])[:, 0]


def _write_token_states(pool, idx, read, token_states, B, T, cu_seqlens) -> None:
    """The state after token t of sequence n into slot ``idx[n, t]`` (not for a skipped
    sequence, a negative slot, or a token past the table's columns)."""
    seq, pos = _token_seq(B, T, cu_seqlens, pool.device)
    idx = idx.to(torch.int64)
    slots = idx[seq, pos.clamp(max=idx.shape[1] - 1)]
    write = (read >= 0)[seq] & (slots >= 0) & (pos < idx.shape[1])
    _scatter_states(pool, slots, token_states, write)


def fused_recurrent_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                        A_log: Tensor | None = None, dt_bias: Tensor | None = None,
                        scale: float | None = None, initial_state: Tensor | None = None,
                        output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                        use_gate_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                        allow_neg_eigval: bool = False, lower_bound: float | None = None,
                        state_v_first: bool = False, cu_seqlens: Tensor | None = None, *,
                        ssm_state_indices: Tensor | None = None,
                        num_accepted_tokens: Tensor | None = None,
                        inplace_final_state: bool = False, **fla_kwargs: Any):
    """KDA decode (FLA's ``fused_recurrent_kda``): q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``,
    g ``[B, T, HV, K]``, beta ``[B, T, HV]``, T tokens per sequence (or varlen with
    ``cu_seqlens``); the gate and beta flags as :func:`kdagen.chunk_kda` (``lower_bound``
    with ``use_gate_in_kernel`` is the lower-bound gate). Returns ``(o, final_state)``.

    With ``ssm_state_indices`` ``initial_state`` is a state pool ``[slots, HV, K, V]``
    (``[slots, HV, V, K]`` with ``state_v_first``; fp32 or bf16) updated in place
    (``inplace_final_state=True``): ``[N]`` reads and writes slot
    ``idx[n]``; ``[N, T]`` writes the state after token t to ``idx[n, t]`` and reads
    ``idx[n, num_accepted_tokens[n] - 1]`` (``idx[n, 0]`` without it); a negative read slot
    skips the sequence (o = 0, nothing written), a negative write slot drops that state; the
    slots of the sequences that run must differ. The pool is returned as the second result.
    A contiguous float32 or bfloat16 pool is read (and with ``[N]``, written) by the kernel
    itself, in place; see :mod:`kdagen.decode`."""
    return _call("kda", q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound,
                 state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                 ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                 inplace_final_state=inplace_final_state, fla_kwargs=fla_kwargs)


def fused_recurrent_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None,
                                     gk: Tensor | None = None, gv: Tensor | None = None,
                                     beta: Tensor | None = None, scale: float | None = None,
                                     initial_state: Tensor | None = None,
                                     output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False,
                                     use_gate_in_kernel: bool = False,
                                     A_log: Tensor | None = None, dt_bias: Tensor | None = None,
                                     use_beta_sigmoid_in_kernel: bool = False,
                                     allow_neg_eigval: bool = False, state_v_first: bool = False,
                                     cu_seqlens: Tensor | None = None, *,
                                     lower_bound: float | None = None,
                                     ssm_state_indices: Tensor | None = None,
                                     num_accepted_tokens: Tensor | None = None,
                                     inplace_final_state: bool = False, **fla_kwargs: Any):
    """GDN decode (FLA's ``fused_recurrent_gated_delta_rule``, same arguments in the same
    order): ``g`` ``[B, T, HV]`` the per-head log gate (raw with ``use_gate_in_kernel``), or
    ``gk`` ``[B, T, HV, K]`` a per-key gate (the KDA recurrence); ``gv`` (a per-value gate)
    is not supported. The pool keywords as :func:`fused_recurrent_kda`."""
    if gv is not None:
        raise KdagenInputError("gv: a per-value gate is not supported by kdagen's decode; "
                               "pass g (per head) or gk (per key)")
    if beta is None:
        raise KdagenInputError("beta: required ([B, T, HV])")
    if (g is None) == (gk is None):
        raise KdagenInputError("g / gk: pass exactly one: g [B, T, HV] (per head) or gk "
                               "[B, T, HV, K] (per key)")
    family = "gdn" if g is not None else "kda"
    return _call(family, q, k, v, g if g is not None else gk, beta, A_log=A_log,
                 dt_bias=dt_bias, scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state,
                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel,
                 use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound,
                 state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                 ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                 inplace_final_state=inplace_final_state, fla_kwargs=fla_kwargs)
