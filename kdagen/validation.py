"""Input validation shared by the float64 reference and the GPU runtime.

Layouts (FLA's, see docs/MATH.md §1):

- ``q``, ``k``: ``[B, T, H, K]``
- ``v``: ``[B, T, HV, V]`` (GVA: ``HV`` a multiple of ``H``)
- ``g``: KDA ``[B, T, HV, K]`` (per-channel log gate), GDN ``[B, T, HV]`` (per-head)
- ``beta``: ``[B, T, HV]``
- ``initial_state``: ``[N, HV, K, V]`` float32/float64 (``N = B``, or the number of
  sequences with ``cu_seqlens``)
- ``cu_seqlens``: ``[N + 1]`` int32/int64, ``0 = c_0 < c_1 < ... < c_N = T``, needs ``B == 1``
- ``A_log``: ``[HV]``; ``dt_bias``: KDA ``[HV, K]`` or ``[HV * K]``, GDN ``[HV]``

Every error is a :class:`KdagenInputError` (a ``ValueError``) whose message starts with the
name of the offending argument, says what was expected and what was received, and gives the
fix where there is one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch

__all__ = ["KdagenInputError", "InputSizes", "validate_inputs", "check_fla_kwargs",
           "check_cu_seqlens_values", "head_first_hint"]

LOWER_BOUND_MIN = -5.0

# FLA keyword arguments that only steer FLA's kernels and do not change the result.
IGNORED_FLA_KWARGS = frozenset({"chunk_indices", "cu_seqlens_cpu", "disable_recompute"})


def check_fla_kwargs(fn: str, kwargs: dict) -> None:
    """Accept FLA's tuning keywords (ignored); any other unknown keyword is a TypeError."""
    unknown = sorted(set(kwargs) - IGNORED_FLA_KWARGS)
    if unknown:
        raise TypeError(f"{fn}() got unexpected keyword argument(s) {unknown}")


class KdagenInputError(ValueError):
    """An argument of a kdagen call has the wrong shape, dtype, device, layout or value."""


@dataclass(frozen=True)
class InputSizes:
    """Sizes derived from validated inputs.

    ``N`` is the number of sequences (``B``, or ``len(cu_seqlens) - 1``), ``group`` is
    ``HV // H`` (value head ``h`` uses q/k head ``h // group``). Supports ``sizes["T"]``.
    """

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int
    group: int

    def __getitem__(self, name: str) -> int:
        return getattr(self, name)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _shape(x: torch.Tensor | Iterable[int]) -> str:
    dims = x.shape if isinstance(x, torch.Tensor) else x
    return "[" + ", ".join(str(int(d)) for d in dims) + "]"


def _err(name: str, msg: str) -> KdagenInputError:
    return KdagenInputError(f"{name}: {msg}")


def _require_tensor(name: str, x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise _err(name, f"expected a torch.Tensor, got {type(x).__name__}")
    return x


def _require_float(name: str, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise _err(
            name,
            f"expected a floating-point tensor, got dtype {x.dtype}; cast it with .float()",
        )


def _require_shape(name: str, x: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise _err(name, f"expected shape {what} = {_shape(expected)}, got {_shape(x)}")


def check_cu_seqlens_values(offsets, T: int) -> None:
    """``offsets`` (ints) must be ``0 = c_0 < c_1 < ... < c_N = T``."""
    offs = [int(c) for c in offsets]
    if len(offs) < 2:
        raise _err("cu_seqlens", f"expected at least 2 offsets [0, ..., T], got {len(offs)}")
    if offs[0] != 0:
        raise _err("cu_seqlens", f"expected cu_seqlens[0] == 0, got {offs[0]}")
    for i in range(1, len(offs)):
        if offs[i] <= offs[i - 1]:
            raise _err(
                "cu_seqlens",
                f"expected strictly increasing offsets (every sequence length >= 1; "
                f"drop empty sequences), got cu_seqlens[{i}] = {offs[i]} <= "
                f"cu_seqlens[{i - 1}] = {offs[i - 1]}",
            )
    if offs[-1] != T:
        raise _err("cu_seqlens", f"expected cu_seqlens[-1] == T = {T} (from q), got {offs[-1]}")


def head_first_hint(q_shape) -> str:
    """A hint for shape errors when q's shape suggests a head-first ``[B, H, T, K]`` layout
    (FLA's and kdagen's layout is ``[B, T, H, K]``): read as such, T < H. Empty otherwise."""
    B, T, H, K = (int(d) for d in q_shape)
    if T >= H:
        return ""
    return (f" (q's shape {_shape(q_shape)} read as [B, T, H, K] gives T = {T} < H = {H}: if "
            f"your tensors are head-first [B, H, T, K], pass them as [B, T, H, K] with "
            f".transpose(1, 2))")


def validate_inputs(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_gate_in_kernel: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    allowed_dtypes: Iterable[torch.dtype] | None = None,
    supported_head_dims: Iterable[int] | None = None,
    supported_value_dims: Iterable[int] | None = None,
    require_equal_head_dims: bool = False,
    require_contiguous: bool = True,
    device: torch.device | str | None = None,
    check_values: bool = True,
) -> InputSizes:
    """Check the arguments of a KDA (``op="kda"``) or GDN (``op="gdn"``) call.

    Returns the derived sizes (:class:`InputSizes`); raises :class:`KdagenInputError`.

    - ``allowed_dtypes``: the dtypes q, k, v may have (all three must agree anyway). g and
      beta must be floating point and, when ``allowed_dtypes`` is given, in it or float32
      (FLA passes fp32 gates next to bf16 q/k/v).
    - ``supported_head_dims``: the allowed values of K (and of V unless
      ``supported_value_dims`` gives those); ``require_equal_head_dims``
      additionally demands K == V.
    - ``device``: when given, every tensor must live there; otherwise on q's device.
    - ``require_contiguous``: reject non-contiguous tensors.
    - ``check_values``: read ``cu_seqlens`` values (a host sync for a CUDA tensor; the
      runtime may turn it off). Values of tensors on the ``meta`` device are never read.
    - ``use_gate_in_kernel``: g is the raw gate; ``A_log`` and ``dt_bias`` are required.
    - ``safe_gate``: ``lower_bound`` is required and must lie in [-5, 0). (As in FLA, the
      lower-bound gate form is used only with ``safe_gate``; a ``lower_bound`` passed without
      ``safe_gate`` is ignored and not checked.)

    ``A_log``/``dt_bias`` passed without ``use_gate_in_kernel`` are checked when given (a
    wrongly shaped parameter is a bug either way) but not required.
    """
    if op not in ("kda", "gdn"):
        raise _err("op", f'expected "kda" or "gdn", got {op!r}')
    kda = op == "kda"

    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _require_tensor(name, x)

    # ---- shapes ------------------------------------------------------------------------
    if q.ndim != 4:
        raise _err("q", f"expected a 4-D tensor [B, T, H, K], got shape {_shape(q)} (ndim {q.ndim})")
    B, T, H, K = (int(d) for d in q.shape)
    if H < 1 or K < 1:
        raise _err("q", f"expected H >= 1 and K >= 1 in [B, T, H, K], got {_shape(q)}")
    if tuple(k.shape) != tuple(q.shape):
        raise _err("k", f"expected shape [B, T, H, K] = {_shape(q)} to match q, got {_shape(k)}")
    if v.ndim != 4 or tuple(v.shape[:2]) != (B, T):
        raise _err(
            "v",
            f"expected shape [B, T, HV, V] with B = {B}, T = {T} (from q), got {_shape(v)}",
        )
    HV, V = int(v.shape[2]), int(v.shape[3])
    if V < 1 or HV < 1:
        raise _err("v", f"expected HV >= 1 and V >= 1 in [B, T, HV, V], got {_shape(v)}")
    if HV % H != 0:
        raise _err(
            "v",
            f"HV must be a multiple of H (GVA: value head h uses q/k head h // (HV // H)); "
            f"got HV = {HV} from v and H = {H} from q",
        )
    if kda:
        if tuple(g.shape) != (B, T, HV, K):
            hint = ""
            if g.ndim == 3:
                hint = " (a per-head [B, T, HV] gate is GDN: use chunk_gated_delta_rule)"
            raise _err(
                "g",
                f"expected shape [B, T, HV, K] = {_shape((B, T, HV, K))} (KDA per-channel gate), "
                f"got {_shape(g)}{hint}",
            )
    else:
        if tuple(g.shape) != (B, T, HV):
            hint = ""
            if g.ndim == 4:
                hint = " (a per-channel [B, T, HV, K] gate is KDA: use chunk_kda)"
            raise _err(
                "g",
                f"expected shape [B, T, HV] = {_shape((B, T, HV))} (GDN per-head gate), "
                f"got {_shape(g)}{hint}",
            )
    _require_shape("beta", beta, (B, T, HV), "[B, T, HV]")

    # ---- dtypes --------------------------------------------------------------------------
    allowed = None if allowed_dtypes is None else tuple(allowed_dtypes)
    _require_float("q", q)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise _err(
                name,
                f"expected dtype {q.dtype} to match q, got {x.dtype}; cast it with .to({q.dtype})",
            )
    if allowed is not None and q.dtype not in allowed:
        raise _err(
            "q",
            f"dtype {q.dtype} is not supported (q, k and v must be one of "
            f"{[str(d) for d in allowed]}); cast with .to({allowed[0]})",
        )
    for name, x in (("g", g), ("beta", beta)):
        _require_float(name, x)
        if allowed is not None and x.dtype not in allowed and x.dtype != torch.float32:
            raise _err(
                name,
                f"dtype {x.dtype} is not supported; expected one of "
                f"{[str(d) for d in allowed + (torch.float32,)]}; cast with .float()",
            )

    # ---- devices -------------------------------------------------------------------------
    if device is not None:
        want = torch.device(device)
        if q.device.type != want.type or (want.index is not None and q.device != want):
            raise _err("q", f"expected a tensor on device {want}, got {q.device}; move it with .to('{want}')")
    dev = q.device

    def check_device(name: str, x: torch.Tensor) -> None:
        if x.device != dev:
            raise _err(
                name,
                f"expected device {dev} (same as q), got {x.device}; move it with .to(q.device)",
            )

    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_device(name, x)

    # ---- layout --------------------------------------------------------------------------
    def check_contiguous(name: str, x: torch.Tensor) -> None:
        if require_contiguous and not x.is_contiguous():
            raise _err(
                name,
                f"expected a contiguous tensor, got shape {_shape(x)} with strides "
                f"{tuple(x.stride())}; call .contiguous()",
            )

    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_contiguous(name, x)

    # ---- head dims -----------------------------------------------------------------------
    if supported_head_dims is not None:
        dims = sorted(int(d) for d in supported_head_dims)
        vdims = (dims if supported_value_dims is None
                 else sorted(int(d) for d in supported_value_dims))
        if K not in dims:
            raise _err("q", f"head dim K = {K} is not supported; supported head dims: {dims}")
        if V not in vdims:
            raise _err("v", f"head dim V = {V} is not supported; supported value head dims: "
                            f"{vdims}")
    if require_equal_head_dims and K != V:
        raise _err("v", f"expected V == K = {K} (this kernel needs equal head dims), got V = {V}")

    # ---- cu_seqlens ----------------------------------------------------------------------
    N = B
    if cu_seqlens is not None:
        _require_tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise _err(
                "cu_seqlens",
                f"expected dtype torch.int32 or torch.int64, got {cu_seqlens.dtype}; "
                "cast it with .to(torch.int32)",
            )
        if cu_seqlens.ndim != 1:
            raise _err(
                "cu_seqlens",
                f"expected a 1-D tensor [N + 1], got shape {_shape(cu_seqlens)} (ndim {cu_seqlens.ndim})",
            )
        if cu_seqlens.shape[0] < 2:
            raise _err(
                "cu_seqlens",
                f"expected at least 2 offsets [0, ..., T], got {cu_seqlens.shape[0]}",
            )
        if B != 1:
            raise _err(
                "cu_seqlens",
                f"expected batch size B == 1 with cu_seqlens, got B = {B} from q; "
                "pass B == 1 with cu_seqlens (concatenate the sequences into [1, total_T, ...])",
            )
        check_device("cu_seqlens", cu_seqlens)
        check_contiguous("cu_seqlens", cu_seqlens)
        N = int(cu_seqlens.shape[0]) - 1
        if check_values and cu_seqlens.device.type != "meta":
            check_cu_seqlens_values(cu_seqlens.tolist(), T)

    # ---- initial_state -------------------------------------------------------------------
    if initial_state is not None:
        _require_tensor("initial_state", initial_state)
        origin = (
            "number of sequences = len(cu_seqlens) - 1" if cu_seqlens is not None else "B"
        )
        if tuple(initial_state.shape) != (N, HV, K, V):
            raise _err(
                "initial_state",
                f"expected shape [N, HV, K, V] = {_shape((N, HV, K, V))} (N = {origin} = {N}), "
                f"got {_shape(initial_state)}",
            )
        if initial_state.dtype not in (torch.float32, torch.float64):
            raise _err(
                "initial_state",
                f"expected dtype torch.float32 or torch.float64 (the state is kept in fp32), "
                f"got {initial_state.dtype}; cast it with .float()",
            )
        check_device("initial_state", initial_state)
        check_contiguous("initial_state", initial_state)

    # ---- gate parameters -----------------------------------------------------------------
    gate_desc = (
        "lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))"
        if safe_gate
        else "-exp(A_log[h]) * softplus(g + dt_bias[h])"
    )
    if use_gate_in_kernel:
        if A_log is None:
            raise _err(
                "A_log",
                f"required when use_gate_in_kernel=True (the gate is {gate_desc}), got None; "
                f"pass A_log of shape [HV] = [{HV}]",
            )
        if dt_bias is None:
            fix = f"torch.zeros({HV}, {K})" if kda else f"torch.zeros({HV})"
            raise _err(
                "dt_bias",
                f"required when use_gate_in_kernel=True (the gate is {gate_desc}), got None; "
                f"pass {fix} for no bias",
            )
    if A_log is not None:
        _require_tensor("A_log", A_log)
        if tuple(A_log.shape) != (HV,):
            raise _err("A_log", f"expected shape [HV] = {_shape((HV,))} (HV from v), got "
                                f"{_shape(A_log)}{head_first_hint(q.shape)}")
        _require_float("A_log", A_log)
        check_device("A_log", A_log)
        check_contiguous("A_log", A_log)
    if dt_bias is not None:
        _require_tensor("dt_bias", dt_bias)
        if kda:
            if tuple(dt_bias.shape) not in ((HV, K), (HV * K,)):
                raise _err(
                    "dt_bias",
                    f"expected shape [HV, K] = {_shape((HV, K))} or [HV * K] = "
                    f"{_shape((HV * K,))}, got {_shape(dt_bias)}{head_first_hint(q.shape)}",
                )
        elif tuple(dt_bias.shape) != (HV,):
            raise _err("dt_bias", f"expected shape [HV] = {_shape((HV,))} (HV from v), got "
                                  f"{_shape(dt_bias)}{head_first_hint(q.shape)}")
        _require_float("dt_bias", dt_bias)
        check_device("dt_bias", dt_bias)
        check_contiguous("dt_bias", dt_bias)
    if safe_gate:
        if lower_bound is None:
            raise _err(
                "lower_bound",
                "required when safe_gate=True (the gate is bounded below by it), got None; "
                "pass e.g. lower_bound=-5.0",
            )
        if isinstance(lower_bound, torch.Tensor):
            if lower_bound.numel() != 1:
                raise _err("lower_bound", f"expected a Python float, got a tensor of shape {_shape(lower_bound)}")
            lower_bound = lower_bound.item()
        try:
            lb = float(lower_bound)
        except (TypeError, ValueError):
            raise _err("lower_bound", f"expected a float in [-5, 0), got {lower_bound!r}") from None
        if not (math.isfinite(lb) and LOWER_BOUND_MIN <= lb < 0.0):
            raise _err("lower_bound", f"expected a value in [-5, 0), got {lb}")

    return InputSizes(B=B, T=T, H=H, HV=HV, K=K, V=V, N=N, group=HV // H)
