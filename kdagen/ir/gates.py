"""The gate library: a gate is a short DSL function from the raw gate to the natural-log gate g.

A gate takes the raw gate tile (``[C, K]`` for KDA's per-channel gates, ``[C]`` for GDN's
per-head scalar gates), the per-head parameters it declares (as tiles: ``A_log`` rank 0,
``dt_bias`` ``[K]`` or rank 0) and its options, and returns g. It also declares the range of g
(as a function of its options). The range is *enforced*, not only assumed: :meth:`Gate.__call__`
clamps g to it (``kda.clamp``; an infinite end becomes a finite floor, and a raw input is first
clamped to ±2^100, see :mod:`kdagen.ir.gate_ranges`) and attaches it with ``kda.assume_range``
for the exponent-range analysis, so the analysis' proof holds for every input (a raw gate of
±inf, a precomputed g below its promised bound) and the outputs stay finite.

No gate has a hand-written derivative: the backward programs are derived from the forward by
reverse-mode differentiation of the kda IR (:mod:`kdagen.ir.autodiff`), gate included, so a new
gate is just::

    from kdagen.ir.gates import define_gate
    from kdagen.ir.dsl import exp, sigmoid

    @define_gate("sq_sigmoid", range=lambda **o: (-math.inf, 0.0))
    def sq_sigmoid(g_raw, A_log, dt_bias):
        return -exp(A_log) * sigmoid(g_raw + dt_bias) ** 2

and ``build_program("kda_fwd", gate="sq_sigmoid")`` / ``build_program("kda_bwd", ...)``.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

from kdagen.ir.dsl import Tile, assume_range, clamp, exp, sigmoid, softplus
from kdagen.ir.gate_ranges import (A_LOG_MAX, GATE_INPUT_MAX, RAW_GATE_BOUND, enforced_range,
                                   softplus_range)

__all__ = ["Gate", "GATES", "define_gate", "get_gate", "list_gates"]

# per-head parameter kinds: "scalar" -> [HV] (tile rank 0), "channel" -> [HV, K] (tile [K])
PARAM_KINDS = ("scalar", "channel")


@dataclass
class Gate:
    """A gate: ``fn(g_raw, **params, **options) -> g`` plus metadata.

    - ``family``: ``"kda"`` (per-channel g ``[C, K]``) or ``"gdn"`` (per-head g ``[C]``).
    - ``params``: per-head parameters ``{name: "scalar" | "channel"}`` (program inputs).
    - ``input_name``: the program input holding the raw gate (``"g_raw"``, or ``"g"`` for a
      precomputed gate).
    - ``options``: option names with defaults (program options of the same names).
    - ``range_fn(**options) -> (lo, hi)``: the declared range of g.
    """

    name: str
    fn: Callable
    family: str = "kda"
    params: dict = field(default_factory=dict)
    input_name: str = "g_raw"
    options: dict = field(default_factory=dict)
    range_fn: Callable | None = None
    description: str = ""

    def output_range(self, **options) -> tuple[float, float]:
        opts = self.resolve_options(options)
        if self.range_fn is None:
            return (-math.inf, math.inf)
        lo, hi = self.range_fn(**opts)
        return float(lo), float(hi)

    def resolve_options(self, options: dict) -> dict:
        unknown = set(options) - set(self.options)
        if unknown:
            raise ValueError(f"gate {self.name!r}: unknown option(s) {sorted(unknown)}; "
                             f"it takes {sorted(self.options) or 'none'}")
        return {**self.options, **options}

    def enforced_range(self, **options) -> tuple[float, float]:
        """The range g is clamped to: the declared one, infinite ends replaced by the floor
        of :mod:`kdagen.ir.gate_ranges`."""
        return enforced_range(*self.output_range(**options))

    def __call__(self, g_raw: Tile, params: dict, **options) -> Tile:
        """Emit the gate with its range enforced and declared::

            g = assume_range(clamp(fn(clamp(g_raw, ±2^100), ...), lo, hi), lo, hi)

        (the raw clamp only for a raw input ``g_raw``; see :mod:`kdagen.ir.gate_ranges`)."""
        opts = self.resolve_options(options)
        missing = set(self.params) - set(params)
        if missing:
            raise ValueError(f"gate {self.name!r} needs parameters {sorted(missing)}")
        if self.input_name != "g":
            g_raw = clamp(g_raw, -RAW_GATE_BOUND, RAW_GATE_BOUND, name="g_raw_clamped")
        g = self.fn(g_raw, **{k: params[k] for k in self.params}, **opts)
        lo, hi = self.enforced_range(**opts)
        return assume_range(clamp(g, lo, hi, name="g_clamped"), lo, hi, name="g")


GATES: dict[str, Gate] = {}


def define_gate(name: str, *, family: str = "kda", params: dict | None = None, range=None,
                input_name: str = "g_raw", description: str | None = None, register: bool = True):
    """Decorator: make a :class:`Gate` from a DSL function and (by default) register it.

    The function's keyword-only arguments with defaults are the gate's options. ``params``
    defaults to ``{"A_log": "scalar", "dt_bias": "channel"}`` for KDA gates and
    ``{"A_log": "scalar", "dt_bias": "scalar"}`` for GDN gates, restricted to the function's
    positional parameters after the raw gate.
    """
    if family not in ("kda", "gdn"):
        raise ValueError(f"gate family must be 'kda' or 'gdn', got {family!r}")

    def deco(fn):
        sig = inspect.signature(fn)
        positional = [p.name for p in sig.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        options = {p.name: p.default for p in sig.parameters.values()
                   if p.kind == p.KEYWORD_ONLY}
        if params is None:
            default = {"A_log": "scalar", "dt_bias": "channel" if family == "kda" else "scalar"}
            ps = {p: default.get(p, "scalar") for p in positional[1:]}
        else:
            ps = dict(params)
        for p, kind in ps.items():
            if kind not in PARAM_KINDS:
                raise ValueError(f"gate {name!r}: parameter {p!r} kind must be one of {PARAM_KINDS}")
            if family == "gdn" and kind == "channel":
                raise ValueError(f"gate {name!r}: GDN gates have no per-channel parameters")
        doc = description or (inspect.getdoc(fn) or "").split("\n")[0]
        gate = Gate(name=name, fn=fn, family=family, params=ps, input_name=input_name,
                    options=options, range_fn=range, description=doc)
        if register:
            GATES[name] = gate
        return gate

    return deco


def get_gate(gate) -> Gate:
    """A gate by name (or a :class:`Gate`, returned as is)."""
    if isinstance(gate, Gate):
        return gate
    try:
        return GATES[gate]
    except KeyError:
        raise ValueError(f"unknown gate {gate!r}; known gates: {sorted(GATES)}") from None


def list_gates() -> list[tuple[str, str]]:
    """(name, one-line description) for every registered gate."""
    return [(name, f"[{g.family}] {g.description}") for name, g in GATES.items()]


# --------------------------------------------------------------------------------------
# the library
# --------------------------------------------------------------------------------------


def _check_lb(lower_bound):
    if lower_bound is None or not (-5.0 <= float(lower_bound) < 0.0):
        raise ValueError(f"lower_bound must lie in [-5, 0), got {lower_bound!r}")
    return float(lower_bound)


def _declared_A_log(A_log, A_log_max):
    """A_log with its declared upper bound (an option), so exp(A_log) has a provable range."""
    return assume_range(A_log, -math.inf, float(A_log_max), name="A_log_declared")


def _softplus_range(A_log_max, gate_input_max, **_):
    return softplus_range(A_log_max, gate_input_max)


def _lb_range(lower_bound, **_):
    return (_check_lb(lower_bound), 0.0)


def _pre_range(lower_bound, **_):
    return (-math.inf if lower_bound is None else float(lower_bound), 0.0)


@define_gate("softplus", range=_softplus_range)
def softplus_gate(g_raw, A_log, dt_bias, *, A_log_max=A_LOG_MAX, gate_input_max=GATE_INPUT_MAX):
    """KDA softplus gate: g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h, :]), in [-exp(A_log_max) * softplus(gate_input_max), 0]."""
    return -exp(_declared_A_log(A_log, A_log_max)) * softplus(g_raw + dt_bias)


@define_gate("lower_bound", range=_lb_range)
def lower_bound_gate(g_raw, A_log, dt_bias, *, lower_bound=-5.0, A_log_max=A_LOG_MAX):
    """KDA lower-bound (safe) gate: g = lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h, :])), in [lb, 0)."""
    return lower_bound * sigmoid(exp(_declared_A_log(A_log, A_log_max)) * (g_raw + dt_bias))


@define_gate("precomputed", params={}, input_name="g", range=_pre_range)
def precomputed_gate(g, *, lower_bound=None):
    """KDA precomputed log gate g [B, T, HV, K]; optional promise g >= lower_bound."""
    return g


@define_gate("gdn_softplus", family="gdn", range=_softplus_range)
def gdn_softplus_gate(g_raw, A_log, dt_bias, *, A_log_max=A_LOG_MAX, gate_input_max=GATE_INPUT_MAX):
    """GDN softplus gate: g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h]) (scalar per head)."""
    return -exp(_declared_A_log(A_log, A_log_max)) * softplus(g_raw + dt_bias)


@define_gate("gdn_lower_bound", family="gdn", range=_lb_range)
def gdn_lower_bound_gate(g_raw, A_log, dt_bias, *, lower_bound=-5.0, A_log_max=A_LOG_MAX):
    """GDN lower-bound gate: g = lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias[h])), in [lb, 0)."""
    return lower_bound * sigmoid(exp(_declared_A_log(A_log, A_log_max)) * (g_raw + dt_bias))


@define_gate("gdn_precomputed", family="gdn", params={}, input_name="g", range=_pre_range)
def gdn_precomputed_gate(g, *, lower_bound=None):
    """GDN precomputed log gate g [B, T, HV]; optional promise g >= lower_bound."""
    return g
