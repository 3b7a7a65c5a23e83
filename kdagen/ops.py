"""kdagen's torch ops: ``torch.ops.kdagen.{kda,gdn}_{fwd,bwd}`` with fake kernels and autograd.

Schemas (KDA and GDN alike; the gate ``g`` is ``[B, T, HV, K]`` for KDA, ``[B, T, HV]`` for
GDN, and ``dt_bias`` ``[HV, K]``/``[HV * K]`` resp. ``[HV]``)::

    kdagen::kda_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor? A_log,
                    Tensor? dt_bias, Tensor? initial_state, Tensor? cu_seqlens, float scale,
                    bool output_final_state, bool use_qk_l2norm_in_kernel,
                    bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel,
                    bool allow_neg_eigval, bool safe_gate, float? lower_bound)
                    bool save_residuals)
        -> (Tensor o, Tensor final_state, Tensor[] residuals)
    kdagen::kda_bwd(Tensor do, Tensor? dht, <the forward's inputs from q to lower_bound,
                    without output_final_state>, Tensor[] residuals)
        -> (Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor dA_log,
            Tensor ddt_bias, Tensor dh0)

Conventions (an op cannot return None):

- ``o`` has v's dtype; ``final_state`` is float32 ``[N, HV, K, V]`` with
  ``output_final_state``, else an empty float32 tensor of shape ``[0]``.
- gradients have their input's shape and dtype; the gradient of an input that is None or
  unused (``A_log``/``dt_bias`` without ``use_gate_in_kernel``) is an empty tensor ``[0]``.
- ``dht`` is None when the forward ran without ``output_final_state``.
- flags mean what FLA's do (:mod:`kdagen.api`); ``allow_neg_eigval`` is ignored without
  ``use_beta_sigmoid_in_kernel`` and ``lower_bound`` without ``safe_gate``, as in FLA; with
  ``safe_gate`` and a precomputed gate, ``lower_bound`` is a promise that g >= lower_bound.

The ops run the programs ``kda_fwd``/``kda_bwd``/``gdn_fwd``/``gdn_bwd`` through the executor
of the tensors' device (:mod:`kdagen.runtime.backends`; the compiler's CPU executor and
compile-on-demand are registered by :mod:`kdagen.compiler_hooks`). Nothing here
synchronises with a CUDA device: ``cu_seqlens`` values are read only for CPU tensors
(validation), sizes come from shapes.

The backward recomputes the forward's state scan from the saved inputs (the derived backward
programs carry their own recompute scan). With ``save_residuals`` (what the API asks for when
a gradient is needed: a backward follows) the forward also returns, unless
``KDAGEN_SAVE_RESIDUALS=0``, the chunk products the backward would recompute, ``residuals`` =
[res_kk, res_Akk_inv] (:data:`kdagen.ir.programs.RESIDUALS`; float32 ``[chunks, HV, 64, 64]``
each, chunks = B · ceil(T / 64), or ceil(T / 64) + N with cu_seqlens: a bound that needs no
host read), and the backward reads them instead: its prologue skips the key-key decay product
and the inverse.
Without it, or where the bundle has no such variant (``kdagen emit --residuals`` builds them),
``residuals`` holds empty tensors ``[0]`` and the backward recomputes.

``residuals`` ends with one more tensor: on an sm_90a GPU, where a call of few sequences and
heads runs each sequence as P segments at once (intra-card context parallelism,
:mod:`kdagen.runtime.segments`, :func:`segments_of`), the segments' start states ``[B·P, HV,
K, V]`` (float32), from which the backward runs as the same segments; else an empty tensor.
"""
# No `from __future__ import annotations`: torch.library infers the schemas from the annotations.
import os
from typing import Optional

import torch
from torch import Tensor

from kdagen import compiler_hooks  # noqa: F401  (registers the CPU executor and compile-on-demand)
from kdagen import head_dims, head_pad
from kdagen.target import TARGETS, get_target
from kdagen.runtime import backends
from kdagen.runtime.backends import OutSpec
from kdagen.validation import KdagenInputError, validate_inputs

__all__ = ["kda_fwd", "kda_bwd", "gdn_fwd", "gdn_bwd", "kda_gated_fwd", "kda_gated_bwd",
           "gdn_gated_fwd", "gdn_gated_bwd", "gated_program_options", "program_options", "gate_name",
           "SUPPORTED_KEY_DIMS", "SUPPORTED_VALUE_DIMS", "SUPPORTED_DTYPES", "OPS"]

#: head dims the chunked kernels are built for (kdagen.head_dims): K up to 256; V up to 128,
#: a larger V running as value parts (kdagen.head_pad.value_parts: a [K, 256] fp32 state is
#: 256 KB, more than a CTA holds). Any other size up to the largest runs zero-padded.
SUPPORTED_KEY_DIMS = head_dims.KEY_DIMS
SUPPORTED_VALUE_DIMS = head_dims.VALUE_DIMS


#: the largest key dim at which every chip takes every value dim: calls up to it need no
#: device lookup (torch.compile traces them as constants)
_EVERY_CHIP_UP_TO = max(K for K in SUPPORTED_KEY_DIMS
                        if all(head_dims.value_dims_for(K, t) == SUPPORTED_VALUE_DIMS
                               for t in TARGETS.values()))


def value_dims(K: int, device) -> tuple:
    """The value dims the kernels for key dim ``K`` (run at the next built key dim) are built
    with on ``device``'s chip (all of them off CUDA): kdagen.head_dims.value_dims_for."""
    if K <= _EVERY_CHIP_UP_TO:
        return SUPPORTED_VALUE_DIMS
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type != "cuda":
        return SUPPORTED_VALUE_DIMS
    return _cuda_value_dims(K, device.index)


@torch.compiler.assume_constant_result
def _cuda_value_dims(K: int, index) -> tuple:
    from kdagen.runtime.chips import chip_for_device
    built = head_pad.next_built(K, SUPPORTED_KEY_DIMS) or K
    chip = chip_for_device(index if index is not None else torch.cuda.current_device())
    return head_dims.value_dims_for(built, get_target(chip))


def value_dims_of(q, v) -> tuple:
    """:func:`value_dims` for a call's q and v (every value dim when they are not 4-d tensors:
    the call's validation then reports them)."""
    if not (isinstance(q, Tensor) and isinstance(v, Tensor) and q.ndim == 4):
        return SUPPORTED_VALUE_DIMS
    return value_dims(int(q.shape[-1]), v.device)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
CHUNK_SIZE = 64
#: the residual outputs of a forward with save_residuals (kdagen.ir.programs.RESIDUALS)
RESIDUALS = ("res_kk", "res_Akk_inv")


def save_residuals_wanted(*tensors) -> bool:
    """Whether a backward will follow the forward (the op's ``save_residuals``): a gradient
    is needed. The forward then saves the residual products (unless
    ``KDAGEN_SAVE_RESIDUALS=0``, :func:`residual_products_kept`) and, where it runs as
    segments, their start states."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def residual_products_kept() -> bool:
    """``KDAGEN_SAVE_RESIDUALS`` is not ``0``: a forward followed by a backward keeps the
    products its backward would recompute (a switch for memory: 32 KB per chunk and value
    head; the backward then recomputes them)."""
    return os.environ.get("KDAGEN_SAVE_RESIDUALS", "1") != "0"


#: (executor, program, options, $KDAGEN_BUNDLE) whose save_residuals variant was not found
_NO_RESIDUAL_VARIANT: set = set()


def _run_program(device, program: str, opts: dict, inputs: dict, outputs: dict,
                 plain_instead: bool = True) -> tuple:
    """(outputs, whether the residual variant ran): ``program`` through the executor of
    ``device``. A save_residuals call that finds no such variant (a bundle emitted without
    ``--residuals``) runs the plain variant instead: the forward then saves nothing and its
    backward recomputes, with the same results. ``plain_instead=False``: raise instead (a
    segmented call, which runs whole where its variant is missing, and must not mark the
    residual variant missing for the whole calls)."""
    executor = backends.get_executor(device)
    if not plain_instead:
        return executor.run(program, opts, inputs, outputs), bool(opts.get("save_residuals"))
    plain = {k: v for k, v in opts.items() if k != "save_residuals"}
    memo = (id(executor), program, backends.freeze_options(plain),
            os.environ.get("KDAGEN_BUNDLE"))
    if not opts.get("save_residuals") or memo not in _NO_RESIDUAL_VARIANT:
        try:
            return executor.run(program, opts, inputs, outputs), bool(opts.get("save_residuals"))
        except backends.BundleNotFoundError:
            if not opts.get("save_residuals"):
                raise
            _NO_RESIDUAL_VARIANT.add(memo)      # look once, not on every call
    inputs = {k: v for k, v in inputs.items() if k not in RESIDUALS}
    outputs = {k: v for k, v in outputs.items() if k not in RESIDUALS}
    return executor.run(program, plain, inputs, outputs), False


def _residual_bound(q: Tensor, cu_seqlens: Optional[Tensor]):
    """The rows the residuals have, from shapes only: B · ceil(T / C), or with cu_seqlens
    ceil(T / C) + N (what the bundle executor allocates; the fake kernel's shape too)."""
    T, C = q.shape[1], CHUNK_SIZE
    if cu_seqlens is None:
        return q.shape[0] * -(-T // C)
    return -(-T // C) + cu_seqlens.shape[0] - 1


def _ask_residuals(opts: dict, outputs: dict, q: Tensor, cu_seqlens: Optional[Tensor],
                   HV: int) -> int:
    """Make a forward call save the residuals: the option and their output specs, with the
    rows the program writes (the bound; on CPU, where cu_seqlens may be read, the
    interpreter's exact count). Returns the bound (:func:`_residuals_out` pads to it)."""
    bound = written = _residual_bound(q, cu_seqlens)
    if cu_seqlens is not None and q.device.type == "cpu":
        lens = torch.diff(cu_seqlens.detach().to(torch.int64)).tolist()
        written = sum(-(-n // CHUNK_SIZE) for n in lens)
    opts["save_residuals"] = True
    for name in RESIDUALS:
        outputs[name] = OutSpec((written, HV, CHUNK_SIZE, CHUNK_SIZE), torch.float32)
    return bound


def _residuals_out(res: dict, saved: bool, bound: int, q: Tensor) -> list:
    """The residuals output of a forward: what it saved, zero rows appended up to ``bound``
    (the shape the fake kernel promises), or empty tensors where it saved none; then the
    segments' start states of a segmented call (:func:`segments_of`), or an empty tensor."""
    segment_states = res.get("segment_states")
    segment_states = _empty(q) if segment_states is None else segment_states
    if not saved:
        return _no_residuals(q)[:-1] + [segment_states]
    out = []
    for name in RESIDUALS:
        x = res[name]
        if x.shape[0] < bound:
            x = torch.cat([x, x.new_zeros((bound - x.shape[0], *x.shape[1:]))])
        out.append(x)
    return out + [segment_states]


def _no_residuals(q: Tensor) -> list:
    """The residuals output of a forward that saves none: empty tensors (an empty list
    output trips torch's autograd bookkeeping); the last one stands for the segments'
    start states."""
    return [_empty(q) for _ in RESIDUALS] + [_empty(q)]


def segments_of(q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    """Segments per sequence a training call runs as (kdagen.runtime.segments: intra-card
    context parallelism; 1 = none): sm_90a (its register scans carry what the chaining needs),
    K = V, and the sizes the cost rule of :func:`kdagen.runtime.segments.segments_for` picks
    (``KDAGEN_SEGMENTS`` overrides); packed sequences (cu_seqlens) only with
    ``KDAGEN_SEGMENTS_VARLEN=1`` (not yet GPU-checked)."""
    if q.device.type != "cuda" or q.dim() != 4 or v.dim() != 4:
        return 1
    from kdagen.runtime.chips import chip_for_device, sm_count
    from kdagen.runtime.segments import segments_for, varlen_allowed
    if cu_seqlens is not None and not varlen_allowed():
        return 1
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if chip_for_device(index) != "sm_90a":
        return 1
    # B sequences of T tokens, or (cu_seqlens, B = 1) N sequences of T tokens in all
    return segments_for(int(_sequences(q, cu_seqlens)), int(q.shape[1]), int(v.shape[2]),
                        int(q.shape[3]), int(v.shape[3]), CHUNK_SIZE, sm_count(index),
                        varlen=cu_seqlens is not None)


def _sequences(q: Tensor, cu_seqlens: Optional[Tensor]):
    """N: the call's sequences (B, or len(cu_seqlens) - 1), from shapes."""
    return cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]


def _zero_state(q: Tensor, v: Tensor, cu_seqlens: Optional[Tensor]) -> Tensor:
    """A float32 zero state per sequence, [N, HV, K, V] (shapes only)."""
    return q.new_zeros((_sequences(q, cu_seqlens), v.shape[2], q.shape[3], v.shape[3]),
                       dtype=torch.float32)


# --------------------------------------------------------------------------------------
# flags -> program options and program-named inputs
# --------------------------------------------------------------------------------------


def gate_name(family: str, use_gate_in_kernel: bool, safe_gate: bool) -> str:
    """The program's gate: ``lower_bound`` (in-kernel gate with ``safe_gate``), ``softplus``
    (in-kernel gate), else ``precomputed``; GDN's are prefixed ``gdn_``."""
    if use_gate_in_kernel:
        name = "lower_bound" if safe_gate else "softplus"
    else:
        name = "precomputed"
    return name if family == "kda" else "gdn_" + name


def _normalise_flags(use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
                     lower_bound):
    allow_neg_eigval = bool(allow_neg_eigval and use_beta_sigmoid_in_kernel)
    lower_bound = float(lower_bound) if (safe_gate and lower_bound is not None) else None
    return allow_neg_eigval, lower_bound


def program_options(family: str, q: Tensor, v: Tensor, *, g: Optional[Tensor] = None,
                    beta: Optional[Tensor] = None, use_initial_state: bool, varlen: bool,
                    output_final_state: bool, use_qk_l2norm_in_kernel: bool,
                    use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
                    allow_neg_eigval: bool, safe_gate: bool, lower_bound: Optional[float]) -> dict:
    """The options of the ``{family}_fwd``/``{family}_bwd`` programs for a call."""
    allow_neg_eigval, lower_bound = _normalise_flags(
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound)
    opts = dict(
        chunk_size=CHUNK_SIZE,
        head_k_dim=int(q.shape[-1]),
        head_v_dim=int(v.shape[-1]),
        gate=gate_name(family, use_gate_in_kernel, safe_gate),
        gva_ratio=int(v.shape[2]) // int(q.shape[2]),
        dtype=_DTYPE_NAMES[q.dtype],
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
        use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel),
        allow_neg_eigval=allow_neg_eigval,
        use_initial_state=bool(use_initial_state),
        output_final_state=bool(output_final_state),
        varlen=bool(varlen),
    )
    # g and beta keep their own storage type (FLA keeps gates fp32 next to bf16 q/k/v). Named
    # only where it differs from q's, so the common variants keep their names.
    for opt, x in (("gate_dtype", g), ("beta_dtype", beta)):
        if x is not None and x.dtype != q.dtype:
            opts[opt] = _DTYPE_NAMES[x.dtype]
    if lower_bound is not None:
        opts["lower_bound"] = lower_bound   # the bound of the lower-bound gate, or a promise
    return opts


def _no_zero_gradients(ctx) -> None:
    """Outputs without a gradient reach the backward as None, not as zeros: autograd would
    otherwise fill a zero tensor for every residual (RESIDUALS: 64 MB at KDA B1_T8k_H16, a
    memset per backward) that the backward never reads. The backward makes the
    zeros it needs itself (do, dht)."""
    ctx.set_materialize_grads(False)


def _check(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, use_gate_in_kernel,
           safe_gate, lower_bound):
    """validate_inputs with the kernels' restrictions; reads cu_seqlens values on CPU only."""
    return validate_inputs(
        family, q, k, v, g, beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
        A_log=A_log if use_gate_in_kernel else None, dt_bias=dt_bias if use_gate_in_kernel else None,
        use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate, lower_bound=lower_bound,
        allowed_dtypes=SUPPORTED_DTYPES, supported_head_dims=SUPPORTED_KEY_DIMS,
        supported_value_dims=SUPPORTED_VALUE_DIMS,
        require_contiguous=True, check_values=q.device.type == "cpu")


def _program_inputs(family, sizes, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                    scale, use_gate_in_kernel, use_beta_sigmoid_in_kernel):
    inputs = {"q": q, "k": k, "v": v,
              ("g_raw" if use_gate_in_kernel else "g"): g,
              ("beta_raw" if use_beta_sigmoid_in_kernel else "beta"): beta,
              "scale": float(scale)}
    if use_gate_in_kernel:
        inputs["A_log"] = A_log
        inputs["dt_bias"] = dt_bias.reshape(sizes.HV, sizes.K) if family == "kda" else dt_bias
    if initial_state is not None:
        inputs["initial_state"] = initial_state
    if cu_seqlens is not None:
        inputs["cu_seqlens"] = cu_seqlens
    return inputs


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,), dtype=torch.float32)


# --------------------------------------------------------------------------------------
# implementations (real and fake)
# --------------------------------------------------------------------------------------


def call_spec(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
              output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
              use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound) -> tuple:
    """(sizes, program options, program-named inputs, output specs o and final_state) of a
    call, after checking its tensors: what the chunked forward and the decode step share."""
    sizes = _check(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                   use_gate_in_kernel, safe_gate, lower_bound)
    opts = program_options(
        family, q, v, g=g, beta=beta, use_initial_state=initial_state is not None, varlen=cu_seqlens is not None,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound)
    inputs = _program_inputs(family, sizes, q, k, v, g, beta, A_log, dt_bias, initial_state,
                             cu_seqlens, scale, use_gate_in_kernel, use_beta_sigmoid_in_kernel)
    outputs = {"o": OutSpec(tuple(v.shape), v.dtype)}
    if output_final_state:
        outputs["final_state"] = OutSpec((sizes.N, sizes.HV, sizes.K, sizes.V), torch.float32)
    return sizes, opts, inputs, outputs


#: why a call chosen for segments ran whole (each reason warned about once)
_UNSEGMENTED: set = set()


def _segments_or_whole(segmented, whole):
    """``segmented()``, or, where segments cannot run (the bundle lacks the variant with an
    initial and a final state, or the program cannot be chained; nothing has run then),
    ``whole()``: same results, slower, said once per reason."""
    import warnings

    from kdagen.runtime.segments import SegmentsUnsupported
    try:
        return segmented()
    except (backends.BundleNotFoundError, SegmentsUnsupported) as err:
        key = f"{type(err).__name__}: {err}"
        if key not in _UNSEGMENTED:
            _UNSEGMENTED.add(key)
            warnings.warn(f"kdagen: running whole sequences, not segments ({key})",
                          stacklevel=4)
    return whole()


def _run_fwd(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
             output_final_state, *flags, chunk_states=False, save_residuals=False) -> dict:
    """Run ``{family}_fwd``: ``o``, ``final_state`` with ``output_final_state``, and with
    ``chunk_states`` the state entering every chunk as ``[B, NT, HV, K, V]`` in q's dtype
    (varlen: B = 1 and NT the chunks of all sequences, which reads ``cu_seqlens`` on the host).
    ``flags``: use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, safe_gate, lower_bound."""
    # segments for training only (a backward follows: save_residuals): the backward's scans
    # gain most; a lone forward, whose scan already runs beside its prologue, gained nothing
    # (H100, KDA B1_T32k_H4: fwd 1.08 -> 1.33-1.55 ms, fwd+bwd 5.54 -> 4.40 ms)
    segments = segments_of(q, v, cu_seqlens) if save_residuals and not chunk_states else 1
    args = (family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
            output_final_state, *flags)

    def run(segments):
        return _run_fwd_as(segments, *args, chunk_states=chunk_states,
                           save_residuals=save_residuals)
    return _segments_or_whole(lambda: run(segments), lambda: run(1)) if segments > 1 else run(1)


def _run_fwd_as(segments, family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                scale, output_final_state, *flags, chunk_states=False,
                save_residuals=False) -> dict:
    """:func:`_run_fwd` with each sequence as ``segments`` segments (1: whole)."""
    if segments > 1:
        # the chaining starts from a state and ends in one: the variant with both (zeros
        # where the caller gave none; the final state is returned only where asked for)
        if initial_state is None:
            initial_state = _zero_state(q, v, cu_seqlens)
        output_final_state = True
    sizes, opts, inputs, outputs = call_spec(family, q, k, v, g, beta, A_log, dt_bias,
                                             initial_state, cu_seqlens, scale,
                                             output_final_state, *flags)
    state = (sizes.HV, sizes.K, sizes.V)
    if segments > 1:
        from kdagen.runtime.segments import beside_wanted
        inputs["segments"] = segments
        inputs["segments_beside"] = beside_wanted()
        outputs["segment_initial_state"] = OutSpec((sizes.N * segments, *state), torch.float32)
    bound = (_ask_residuals(opts, outputs, q, cu_seqlens, sizes.HV)
             if save_residuals and residual_products_kept() else 0)
    if chunk_states:
        C = CHUNK_SIZE
        if cu_seqlens is None:
            lead = (sizes.B, -(-sizes.T // C))
        else:
            lens = torch.diff(cu_seqlens.detach().to("cpu", torch.int64)).tolist()
            lead = (1, sum(-(-n // C) for n in lens))
        rows = lead[0] * lead[1]
        opts["output_chunk_states"] = True
        outputs["chunk_states"] = OutSpec((rows, *state), q.dtype)
    res, saved = _run_program(q.device, f"{family}_fwd", opts, inputs, outputs,
                              plain_instead=segments == 1)
    if chunk_states:   # a bundle's buffer may hold more rows (it is sized without reading cu_seqlens)
        res["chunk_states"] = res["chunk_states"][:rows].reshape(*lead, *state)
    if segments > 1:
        res["segment_states"] = res.pop("segment_initial_state")
    res["residuals"] = _residuals_out(res, saved, bound, q)
    return res


def _fwd_impl(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
              output_final_state, *flags, save_residuals=False):
    res = _run_fwd(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
                   output_final_state, *flags, save_residuals=save_residuals)
    return (res["o"], (res["final_state"] if output_final_state else _empty(q)),
            res["residuals"])


def _fwd_fake(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
              output_final_state, save_residuals=False, segmented=True):
    # shapes only: never read data, never specialise symbolic sizes
    o = v.new_empty(v.shape)
    if output_final_state:
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]
        ht = q.new_empty((N, v.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32)
    else:
        ht = _empty(q)
    residuals = _no_residuals(q)
    if save_residuals and residual_products_kept():
        rows, C = _residual_bound(q, cu_seqlens), CHUNK_SIZE
        residuals = [q.new_empty((rows, v.shape[2], C, C), dtype=torch.float32)
                     for _ in RESIDUALS] + residuals[-1:]
    segments = segments_of(q, v, cu_seqlens) if segmented and save_residuals else 1
    if segments > 1:
        residuals[-1] = q.new_empty((_sequences(q, cu_seqlens) * segments, v.shape[2],
                                     q.shape[3], v.shape[3]), dtype=torch.float32)
    return o, ht, residuals


def _add_residuals(opts: dict, inputs: dict, residuals) -> None:
    """A backward call reads the forward's residuals (``residuals``: None or the list)."""
    residuals = list(residuals or [])[:len(RESIDUALS)]
    if residuals and any(x.numel() for x in residuals):
        if len(residuals) != len(RESIDUALS):
            raise KdagenInputError(f"residuals: expected {len(RESIDUALS)} tensors "
                                   f"({', '.join(RESIDUALS)}), got {len(residuals)}")
        opts["save_residuals"] = True
        inputs.update(zip(RESIDUALS, residuals))


def _bwd_impl(family, do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
              use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
              allow_neg_eigval, safe_gate, lower_bound, residuals=None):
    # a segmented forward's start states of its segments (_residuals_out): the backward runs
    # as the same segments, its recompute scan from them, its reverse scan chained; where
    # that cannot run, whole (it needs nothing of the forward's segments)
    args = (family, do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
            use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, safe_gate, lower_bound)
    segment_states = residuals[len(RESIDUALS)] if residuals and len(residuals) > len(RESIDUALS) \
        else None

    def run(states):
        return _bwd_as(*args, residuals=residuals, segment_states=states)
    if segment_states is not None and segment_states.numel():
        return _segments_or_whole(lambda: run(segment_states), lambda: run(None))
    return run(None)


def _bwd_as(family, do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
            use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, safe_gate, lower_bound, residuals=None, segment_states=None):
    """:func:`_bwd_impl` as the segments of ``segment_states`` (None: whole sequences)."""
    asked_dh0 = initial_state is not None
    if segment_states is not None:
        segments = int(segment_states.shape[0]) // int(_sequences(q, cu_seqlens))
        if initial_state is None:
            initial_state = _zero_state(q, v, cu_seqlens)
        if dht is None:
            dht = _zero_state(q, v, cu_seqlens)
    else:
        segments = 1
    sizes, opts, inputs, _ = call_spec(
        family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, dht is not None,
        use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
        safe_gate, lower_bound)
    _add_residuals(opts, inputs, residuals)
    if segments > 1:
        from kdagen.runtime.segments import beside_wanted
        inputs.update(initial_state=segment_states, segments=segments,
                      segment_known=("initial_state",), segments_beside=beside_wanted())
    _check_cotangent("do", do, tuple(v.shape), q.device)
    if dht is not None:
        _check_cotangent("dht", dht, (sizes.N, sizes.HV, sizes.K, sizes.V), q.device)
    inputs["do"] = do
    if dht is not None:
        inputs["dht"] = dht
    gname = "dg_raw" if use_gate_in_kernel else "dg"
    bname = "dbeta_raw" if use_beta_sigmoid_in_kernel else "dbeta"
    outputs = {"dq": OutSpec(tuple(q.shape), q.dtype), "dk": OutSpec(tuple(k.shape), k.dtype),
               "dv": OutSpec(tuple(v.shape), v.dtype), gname: OutSpec(tuple(g.shape), g.dtype),
               bname: OutSpec(tuple(beta.shape), beta.dtype)}
    if use_gate_in_kernel:
        outputs["dA_log"] = OutSpec(tuple(A_log.shape), A_log.dtype)
        outputs["ddt_bias"] = OutSpec(tuple(inputs["dt_bias"].shape), dt_bias.dtype)
    if initial_state is not None:
        outputs["dh0"] = OutSpec(tuple(initial_state.shape), initial_state.dtype)
    res, _ = _run_program(q.device, f"{family}_bwd", opts, inputs, outputs,
                          plain_instead=segment_states is None)
    return (res["dq"], res["dk"], res["dv"], res[gname], res[bname],
            res["dA_log"] if use_gate_in_kernel else _empty(q),
            res["ddt_bias"].reshape(dt_bias.shape) if use_gate_in_kernel else _empty(q),
            res["dh0"] if asked_dh0 else _empty(q))


def forward_with_chunk_states(family, *args):
    """The forward plus the state entering every chunk (FLA's ``return_intermediate_states``,
    for inference: no autograd); ``args`` as the forward op's after ``family``. Returns
    ``(o, final_state or None, h)`` (h as :func:`_run_fwd`'s ``chunk_states``)."""
    res = _run_fwd(family, *args, chunk_states=True)
    return res["o"], res.get("final_state"), res["chunk_states"]


def _check_cotangent(name, x, shape, device):
    if not isinstance(x, Tensor):
        raise KdagenInputError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise KdagenInputError(f"{name}: expected shape {list(shape)}, got {list(x.shape)}")
    if not x.is_floating_point():
        raise KdagenInputError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if x.device != device:
        raise KdagenInputError(f"{name}: expected device {device} (same as q), got {x.device}")
    if not x.is_contiguous():
        raise KdagenInputError(f"{name}: expected a contiguous tensor; call .contiguous()")


def _bwd_fake(family, do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
              use_qk_l2norm_in_kernel, use_gate_in_kernel, *flags):
    use_gate = use_gate_in_kernel and A_log is not None and dt_bias is not None
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape),
            beta.new_empty(beta.shape),
            A_log.new_empty(A_log.shape) if use_gate else _empty(q),
            dt_bias.new_empty(dt_bias.shape) if use_gate else _empty(q),
            initial_state.new_empty(initial_state.shape) if initial_state is not None else _empty(q))


# --------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------


def _define(family: str):
    def fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
            dt_bias: Optional[Tensor], initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
            scale: float, output_final_state: bool, use_qk_l2norm_in_kernel: bool,
            use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool,
            safe_gate: bool, lower_bound: Optional[float], save_residuals: bool
            ) -> tuple[Tensor, Tensor, list[Tensor]]:
        return _fwd_impl(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
                         output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                         save_residuals=save_residuals)

    def bwd(do: Tensor, dht: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, g: Tensor,
            beta: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor],
            initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float,
            use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
            use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, safe_gate: bool,
            lower_bound: Optional[float], residuals: list[Tensor]
            ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        return _bwd_impl(family, do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state,
                         cu_seqlens, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                         residuals)

    fwd.__name__ = fwd.__qualname__ = f"{family}_fwd"
    bwd.__name__ = bwd.__qualname__ = f"{family}_bwd"
    fwd.__doc__ = f"{family.upper()} forward: (o, final_state, residuals); see kdagen.ops."
    bwd.__doc__ = f"{family.upper()} backward: (dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0); see kdagen.ops."
    fwd_op = torch.library.custom_op(f"kdagen::{family}_fwd", mutates_args=())(fwd)
    bwd_op = torch.library.custom_op(f"kdagen::{family}_bwd", mutates_args=())(bwd)

    @fwd_op.register_fake
    def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, output_final_state,
          use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
          safe_gate, lower_bound, save_residuals):
        return _fwd_fake(family, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
                         output_final_state, save_residuals)

    @bwd_op.register_fake
    def _(do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale,
          use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
          safe_gate, lower_bound, residuals):
        return _bwd_fake(family, do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state,
                         cu_seqlens, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel)

    def setup_context(ctx, inputs, output):
        (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, scale, output_final_state,
         use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
         safe_gate, lower_bound, *_save) = inputs
        ctx.save_for_backward(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
                              *output[2])
        _no_zero_gradients(ctx)
        ctx.output_final_state = output_final_state
        ctx.flags = (scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                     allow_neg_eigval, safe_gate, lower_bound)

    def backward_through(run_bwd, ctx, grad_o, grad_ht):
        """The forward's input gradients, the backward run by ``run_bwd`` (the custom op, or
        its implementation straight: ``Eager``)."""
        q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, *residuals = ctx.saved_tensors
        use_gate_in_kernel = ctx.flags[2]
        do = torch.zeros_like(v) if grad_o is None else grad_o.contiguous()
        dht = None
        if ctx.output_final_state:
            dht = (grad_ht.contiguous() if grad_ht is not None else
                   _zero_state(q, v, cu_seqlens))
        dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0 = run_bwd(
            do, dht, q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, *ctx.flags,
            residuals=list(residuals))
        use_gate = use_gate_in_kernel and A_log is not None and dt_bias is not None
        return (dq, dk, dv, dg, dbeta,
                dA_log if use_gate else None,
                ddt_bias if use_gate else None,
                dh0 if initial_state is not None else None,
                None,                                   # cu_seqlens
                None, None, None, None, None, None, None, None,   # scale and flags
                None)                                   # save_residuals

    def backward(ctx, grad_o, grad_ht, _grad_residuals=None):
        return backward_through(bwd_op, ctx, grad_o, grad_ht)

    fwd_op.register_autograd(backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        """The op in eager mode without the custom op's dispatch: the same forward, context
        and backward, called straight. torch.library's autograd wrapper, its argument
        flattening and the dispatcher cost ~0.3-0.7 ms of host time per fwd+bwd (H100,
        B1_T8k_H16, stop 57: GDN 2.28 -> 1.56 ms, KDA 2.22 -> 1.94). :func:`eager_ok` says when
        it is used."""

        @staticmethod
        def forward(ctx, *args):
            o, ht, residuals = fwd(*args)
            setup_context(ctx, args, (o, ht, residuals))
            return o, ht

        @staticmethod
        def backward(ctx, grad_o, grad_ht):
            return backward_through(bwd, ctx, grad_o, grad_ht)

    EAGER[family] = Eager
    return fwd_op, bwd_op


#: the eager autograd path of each family's op (:func:`eager_ok`), on by default: on the H100
#: (B1_T8k_H16 fwd+bwd, bench/results/h100_stop57_layers_*) the host enqueue time per call went
#: 2.276 -> 1.558 ms (GDN) and 2.217 -> 1.940 ms (KDA), and the API GPU tests pass through it
#: (h100_stop57_api_gpu_eager.log: numerics, no host sync, torch.compile, CUDA-graph capture).
#: KDAGEN_EAGER_AUTOGRAD=0 (or EAGER_AUTOGRAD = False) sends every call through the custom op
EAGER: dict = {}
EAGER_AUTOGRAD = os.environ.get("KDAGEN_EAGER_AUTOGRAD", "1") != "0"


def eager_ok(*tensors) -> bool:
    """Whether a call may take the eager path (``EAGER``) instead of the custom op: not
    under torch.compile, no dispatch mode (FakeTensorMode, meta tracing) or functorch
    transform active, and every tensor a plain torch.Tensor off the meta device (no subclass
    such as a fake or a DTensor, no meta tensor: the custom op's registrations handle
    those)."""
    if not EAGER_AUTOGRAD or torch.compiler.is_compiling():
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    if _get_current_dispatch_mode() is not None:
        return False
    transforms = getattr(torch._C, "_are_functorch_transforms_active", None)
    if transforms is not None and transforms():
        return False
    return all(t is None or (type(t) is torch.Tensor and not t.is_meta) for t in tensors)


def forward(family: str, *args, save_residuals: bool):
    """The family's forward op (kdagen::{family}_fwd) with autograd: ``(o, final_state)``;
    eager calls take ``EAGER`` (the same computation, no dispatch)."""
    if eager_ok(*args[:9]):             # q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens
        return EAGER[family].apply(*args, save_residuals)
    op = kda_fwd if family == "kda" else gdn_fwd
    o, ht, _ = op(*args, save_residuals=save_residuals)
    return o, ht


kda_fwd, kda_bwd = _define("kda")
gdn_fwd, gdn_bwd = _define("gdn")


# --------------------------------------------------------------------------------------
# ops with any registered gate: kdagen::{kda,gdn}_gated_{fwd,bwd}
# --------------------------------------------------------------------------------------


def _registered_gate(family: str, gate: str):
    from kdagen.ir.gates import get_gate
    try:
        gobj = get_gate(gate)
    except ValueError as err:
        raise KdagenInputError(f"gate: {err}; define it with kdagen.ir.gates.define_gate or "
                               f"load its file with kdagen.load_gates(PATH)") from None
    if gobj.family != family:
        raise KdagenInputError(f"gate: {gate!r} is a {gobj.family.upper()} gate; "
                               f"{'chunk_kda' if family == 'kda' else 'chunk_gated_delta_rule'} "
                               f"needs a {family.upper()} gate")
    return gobj


def gated_program_options(family: str, q: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
                          gate: str, gate_options: str, use_initial_state: bool, varlen: bool,
                          output_final_state: bool, use_qk_l2norm_in_kernel: bool,
                          use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> dict:
    """The program options of a call with gate ``gate`` (options as JSON): a user's gate
    carries its digest (``gate_digest``), so its compiled kernels are keyed by its source."""
    import json
    gobj = _registered_gate(family, gate)
    opts = program_options(
        family, q, v, g=g, beta=beta, use_initial_state=use_initial_state, varlen=varlen,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, safe_gate=False, lower_bound=None)
    opts["gate"] = gobj.name
    for name, value in sorted(json.loads(gate_options or "{}").items()):
        if name not in gobj.options:
            raise KdagenInputError(f"gate_options: gate {gate!r} has no option {name!r}; its "
                                   f"options are {sorted(gobj.options) or 'none'}")
        opts[name] = value
    if not gobj.builtin:
        opts["gate_digest"] = gobj.digest
    return opts


def _check_gate_params(gobj, sizes, params, device) -> None:
    if len(params) != len(gobj.params):
        raise KdagenInputError(f"gate_params: gate {gobj.name!r} takes {len(gobj.params)} "
                               f"parameter tensor(s) {list(gobj.params)}, got {len(params)}")
    for (pname, kind), x in zip(gobj.params.items(), params):
        want = (sizes.HV,) if kind == "scalar" else (sizes.HV, sizes.K)
        if not isinstance(x, Tensor):
            raise KdagenInputError(f"gate_params[{pname!r}]: expected a torch.Tensor, got "
                                   f"{type(x).__name__}")
        if tuple(x.shape) != want:
            raise KdagenInputError(
                f"gate_params[{pname!r}]: a per-head {kind} parameter of gate {gobj.name!r} "
                f"has shape {list(want)} ({'[HV]' if kind == 'scalar' else '[HV, K]'}), got "
                f"{list(x.shape)}")
        if x.dtype != torch.float32:
            raise KdagenInputError(f"gate_params[{pname!r}]: expected float32, got {x.dtype}; "
                                   f"call .float()")
        if x.device != device:
            raise KdagenInputError(f"gate_params[{pname!r}]: expected device {device} (same as "
                                   f"q), got {x.device}")
        if not x.is_contiguous():
            raise KdagenInputError(f"gate_params[{pname!r}]: expected a contiguous tensor; "
                                   f"call .contiguous()")


def _gated_setup(family, q, k, v, g, beta, gate_params, initial_state, cu_seqlens, scale,
                 output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
                 allow_neg_eigval, gate, gate_options):
    gobj = _registered_gate(family, gate)
    sizes = _check(family, q, k, v, g, beta, None, None, initial_state, cu_seqlens, False,
                   False, None)
    _check_gate_params(gobj, sizes, gate_params, q.device)
    opts = gated_program_options(
        family, q, v, g, beta, gate=gate, gate_options=gate_options,
        use_initial_state=initial_state is not None, varlen=cu_seqlens is not None,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
    inputs = {"q": q, "k": k, "v": v, gobj.input_name: g,
              ("beta_raw" if use_beta_sigmoid_in_kernel else "beta"): beta, "scale": float(scale)}
    inputs.update(zip(gobj.params, gate_params))
    if initial_state is not None:
        inputs["initial_state"] = initial_state
    if cu_seqlens is not None:
        inputs["cu_seqlens"] = cu_seqlens
    return gobj, sizes, opts, inputs


def _gated_fwd_impl(family, q, k, v, g, beta, gate_params, initial_state, cu_seqlens, scale,
                    output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
                    allow_neg_eigval, gate, gate_options, save_residuals=False):
    gobj, sizes, opts, inputs = _gated_setup(
        family, q, k, v, g, beta, gate_params, initial_state, cu_seqlens, scale,
        output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, gate, gate_options)
    outputs = {"o": OutSpec(tuple(v.shape), v.dtype)}
    if output_final_state:
        outputs["final_state"] = OutSpec((sizes.N, sizes.HV, sizes.K, sizes.V), torch.float32)
    bound = (_ask_residuals(opts, outputs, q, cu_seqlens, sizes.HV)
             if save_residuals and residual_products_kept() else 0)
    res, saved = _run_program(q.device, f"{family}_fwd", opts, inputs, outputs)
    return (res["o"], (res["final_state"] if output_final_state else _empty(q)),
            _residuals_out(res, saved, bound, q))


def _gated_bwd_impl(family, do, dht, q, k, v, g, beta, gate_params, initial_state, cu_seqlens,
                    scale, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
                    allow_neg_eigval, gate, gate_options, residuals=None):
    gobj, sizes, opts, inputs = _gated_setup(
        family, q, k, v, g, beta, gate_params, initial_state, cu_seqlens, scale, dht is not None,
        use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, gate,
        gate_options)
    _add_residuals(opts, inputs, residuals)
    _check_cotangent("do", do, tuple(v.shape), q.device)
    if dht is not None:
        _check_cotangent("dht", dht, (sizes.N, sizes.HV, sizes.K, sizes.V), q.device)
    inputs["do"] = do
    if dht is not None:
        inputs["dht"] = dht
    gname = "d" + gobj.input_name
    bname = "dbeta_raw" if use_beta_sigmoid_in_kernel else "dbeta"
    outputs = {"dq": OutSpec(tuple(q.shape), q.dtype), "dk": OutSpec(tuple(k.shape), k.dtype),
               "dv": OutSpec(tuple(v.shape), v.dtype), gname: OutSpec(tuple(g.shape), g.dtype),
               bname: OutSpec(tuple(beta.shape), beta.dtype)}
    for pname, x in zip(gobj.params, gate_params):
        outputs["d" + pname] = OutSpec(tuple(x.shape), x.dtype)
    if initial_state is not None:
        outputs["dh0"] = OutSpec(tuple(initial_state.shape), initial_state.dtype)
    res, _ = _run_program(q.device, f"{family}_bwd", opts, inputs, outputs)
    return (res["dq"], res["dk"], res["dv"], res[gname], res[bname],
            [res["d" + pname] for pname in gobj.params],
            res["dh0"] if initial_state is not None else _empty(q))


def _define_gated(family: str):
    def fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, gate_params: list[Tensor],
            initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float,
            output_final_state: bool, use_qk_l2norm_in_kernel: bool,
            use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, gate: str,
            gate_options: str, save_residuals: bool
            ) -> tuple[Tensor, Tensor, list[Tensor]]:
        return _gated_fwd_impl(family, q, k, v, g, beta, gate_params, initial_state, cu_seqlens,
                               scale, output_final_state, use_qk_l2norm_in_kernel,
                               use_beta_sigmoid_in_kernel, allow_neg_eigval, gate, gate_options,
                               save_residuals=save_residuals)

    def bwd(do: Tensor, dht: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, g: Tensor,
            beta: Tensor, gate_params: list[Tensor], initial_state: Optional[Tensor],
            cu_seqlens: Optional[Tensor], scale: float, use_qk_l2norm_in_kernel: bool,
            use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, gate: str,
            gate_options: str, residuals: list[Tensor]
            ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, list[Tensor], Tensor]:
        return _gated_bwd_impl(family, do, dht, q, k, v, g, beta, gate_params, initial_state,
                               cu_seqlens, scale, use_qk_l2norm_in_kernel,
                               use_beta_sigmoid_in_kernel, allow_neg_eigval, gate, gate_options,
                               residuals)

    fwd.__name__ = fwd.__qualname__ = f"{family}_gated_fwd"
    bwd.__name__ = bwd.__qualname__ = f"{family}_gated_bwd"
    fwd.__doc__ = (f"{family.upper()} forward with any registered gate: (o, final_state, "
                   f"residuals).")
    bwd.__doc__ = (f"{family.upper()} backward with any registered gate: (dq, dk, dv, dg, dbeta, "
                   f"[d param for each gate parameter], dh0).")
    fwd_op = torch.library.custom_op(f"kdagen::{family}_gated_fwd", mutates_args=())(fwd)
    bwd_op = torch.library.custom_op(f"kdagen::{family}_gated_bwd", mutates_args=())(bwd)

    @fwd_op.register_fake
    def _(q, k, v, g, beta, gate_params, initial_state, cu_seqlens, scale, output_final_state,
          use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, gate,
          gate_options, save_residuals):
        return _fwd_fake(family, q, k, v, g, beta, None, None, initial_state, cu_seqlens, scale,
                         output_final_state, save_residuals, segmented=False)

    @bwd_op.register_fake
    def _(do, dht, q, k, v, g, beta, gate_params, initial_state, cu_seqlens, *rest):
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
                g.new_empty(g.shape), beta.new_empty(beta.shape),
                [x.new_empty(x.shape) for x in gate_params],
                initial_state.new_empty(initial_state.shape) if initial_state is not None
                else _empty(q))

    def setup_context(ctx, inputs, output):
        (q, k, v, g, beta, gate_params, initial_state, cu_seqlens, scale, output_final_state,
         *flags) = inputs
        flags = flags[:5]                     # without save_residuals
        ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, *output[2],
                              *gate_params)
        _no_zero_gradients(ctx)
        ctx.residual_count = len(output[2])       # empty tensors when none were saved
        ctx.output_final_state = output_final_state
        ctx.flags = (scale, *flags)

    def backward(ctx, grad_o, grad_ht, _grad_residuals=None):
        q, k, v, g, beta, initial_state, cu_seqlens, *rest = ctx.saved_tensors
        residuals, gate_params = rest[:ctx.residual_count], rest[ctx.residual_count:]
        do = torch.zeros_like(v) if grad_o is None else grad_o.contiguous()
        dht = None
        if ctx.output_final_state:
            dht = (grad_ht.contiguous() if grad_ht is not None else
                   _zero_state(q, v, cu_seqlens))
        dq, dk, dv, dg, dbeta, dparams, dh0 = bwd_op(
            do, dht, q, k, v, g, beta, list(gate_params), initial_state, cu_seqlens, *ctx.flags,
            residuals=list(residuals))
        return (dq, dk, dv, dg, dbeta, list(dparams),
                dh0 if initial_state is not None else None,
                None, None, None, None, None, None, None, None,   # cu_seqlens, scale, flags
                None)                                             # save_residuals

    fwd_op.register_autograd(backward, setup_context=setup_context)
    return fwd_op, bwd_op


kda_gated_fwd, kda_gated_bwd = _define_gated("kda")
gdn_gated_fwd, gdn_gated_bwd = _define_gated("gdn")

#: every op, by qualified name (``kdagen::kda_fwd``, ...)
OPS = {"kdagen::kda_fwd": kda_fwd, "kdagen::kda_bwd": kda_bwd,
       "kdagen::gdn_fwd": gdn_fwd, "kdagen::gdn_bwd": gdn_bwd,
       "kdagen::kda_gated_fwd": kda_gated_fwd, "kdagen::kda_gated_bwd": kda_gated_bwd,
       "kdagen::gdn_gated_fwd": gdn_gated_fwd, "kdagen::gdn_gated_bwd": gdn_gated_bwd}
