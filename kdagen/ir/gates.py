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
    from kdagen.ir.gate_math import exp, sigmoid

    @define_gate("sq_sigmoid", range=(-math.inf, 0.0))
    def sq_sigmoid(g_raw, A_log, dt_bias):
        return -exp(A_log) * sigmoid(g_raw + dt_bias) ** 2

and ``build_program("kda_fwd", gate="sq_sigmoid")`` / ``build_program("kda_bwd", ...)``, or
``kdagen.chunk_kda(..., gate="sq_sigmoid", gate_params={"A_log": ..., "dt_bias": ...})``. In a
file of its own it is loaded with :func:`load_gate_file` (``kdagen emit --gates FILE.py``).

The functions of :mod:`kdagen.ir.gate_math` work on DSL tiles and on torch tensors alike, so
:meth:`Gate.torch` evaluates the same gate in torch (the float64 reference a GPU check uses);
this module and gate files that use only ``gate_math`` import without the compiler.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import marshal
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kdagen.ir.gate_math import assume_range, clamp, exp, is_torch, sigmoid, softplus
from kdagen.ir.gate_ranges import (A_LOG_MAX, GATE_INPUT_MAX, RAW_GATE_BOUND, enforced_range,
                                   softplus_range)

__all__ = ["Gate", "GATES", "define_gate", "get_gate", "list_gates", "load_gate_file",
           "GateFileError"]

# per-head parameter kinds: "scalar" -> [HV] (tile rank 0), "channel" -> [HV, K] (tile [K])
PARAM_KINDS = ("scalar", "channel")
# program arguments a gate parameter may not be named like (its gradient is "d" + its name)
RESERVED_NAMES = frozenset({"q", "k", "v", "g", "g_raw", "beta", "beta_raw", "initial_state",
                            "cu_seqlens", "scale", "o", "ht", "final_state", "chunk_states"})


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

    def __call__(self, g_raw, params: dict, **options):
        """Emit the gate with its range enforced and declared::

            g = assume_range(clamp(fn(clamp(g_raw, ±2^100), ...), lo, hi), lo, hi)

        (the raw clamp only for a raw input ``g_raw``; see :mod:`kdagen.ir.gate_ranges`).
        On torch tensors this is the same function in torch (see :meth:`torch`)."""
        opts = self.resolve_options(options)
        missing = set(self.params) - set(params)
        if missing:
            raise ValueError(f"gate {self.name!r} needs parameters {sorted(missing)}")
        if self.input_name != "g":
            g_raw = clamp(g_raw, -RAW_GATE_BOUND, RAW_GATE_BOUND, name="g_raw_clamped")
        g = self.fn(g_raw, **{k: params[k] for k in self.params}, **opts)
        lo, hi = self.enforced_range(**opts)
        return assume_range(clamp(g, lo, hi, name="g_clamped"), lo, hi, name="g")

    def torch(self, g_raw, params: dict | None = None, **options):
        """The gate on torch tensors, as the kernels compute it (clamps included), in the
        inputs' dtype; differentiable by autograd. ``g_raw`` is ``[..., HV, K]`` (KDA) or
        ``[..., HV]`` (GDN); a ``scalar`` parameter is ``[HV]`` (any shape of HV elements),
        a ``channel`` parameter ``[HV, K]`` or ``[HV * K]``. This is the float64 reference of
        a gate (pass float64 tensors) that a GPU check compares kernels against."""
        if not is_torch(g_raw):
            raise TypeError(f"gate {self.name!r}: Gate.torch takes torch tensors, got "
                            f"{type(g_raw).__name__}")
        params = dict(params or {})
        missing = set(self.params) - set(params)
        if missing:
            raise ValueError(f"gate {self.name!r} needs parameters {sorted(missing)}")
        shaped = {}
        for pname, kind in self.params.items():
            x = params[pname]
            if self.family == "kda":
                HV, K = int(g_raw.shape[-2]), int(g_raw.shape[-1])
                x = x.reshape(HV, 1) if kind == "scalar" else x.reshape(HV, K)
            else:
                x = x.reshape(int(g_raw.shape[-1]))
            shaped[pname] = x.to(g_raw.dtype)
        return self(g_raw, shaped, **options)

    # -- identity ----------------------------------------------------------------------
    @property
    def builtin(self) -> bool:
        """A gate of kdagen's own library (covered by kdagen's source hash)."""
        return getattr(self.fn, "__module__", None) == __name__

    @property
    def digest(self) -> str:
        """sha256 (16 hex digits) of what defines the gate: its metadata and the source of
        the file that defines it (helpers and range included; a function without a file: its
        code objects). Computed once, when first asked, from the file as it was then: a gate
        edited and loaded again is a new Gate with a new digest. Compiled kernels of a
        user's gate are keyed by it (program option ``gate_digest``)."""
        if self._digest is None:
            h = hashlib.sha256()
            meta = (self.name, self.family, sorted(self.params.items()), self.input_name,
                    sorted((k, repr(v)) for k, v in self.options.items()))
            h.update(repr(meta).encode())
            h.update(_source_bytes(self.fn))
            if self.range_fn is not None:
                h.update(_source_bytes(self.range_fn))
            self._digest = h.hexdigest()[:16]
        return self._digest

    _digest: str | None = field(default=None, init=False, repr=False, compare=False)


def _source_bytes(fn) -> bytes:
    """The text of the file defining ``fn``, else its code objects and closure values."""
    try:
        path = inspect.getsourcefile(fn)
        if path and os.path.isfile(path):
            return Path(path).read_bytes()
    except (TypeError, OSError):
        pass
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn).encode()
    cells = tuple(repr(c.cell_contents) for c in (fn.__closure__ or ()))
    return marshal.dumps(code) + repr(cells).encode()


GATES: dict[str, Gate] = {}
_LOADING: list | None = None     # the gates a gate file defines while load_gate_file runs it


class GateFileError(ValueError):
    """A user's gate file that cannot be loaded (the message names the file and the fix)."""


def define_gate(name: str, *, family: str = "kda", params: dict | None = None, range=None,
                input_name: str = "g_raw", description: str | None = None, register: bool = True):
    """Decorator: make a :class:`Gate` from a DSL function and (by default) register it.

    The function's keyword-only arguments with defaults are the gate's options. ``params``
    defaults to ``{"A_log": "scalar", "dt_bias": "channel"}`` for KDA gates and
    ``{"A_log": "scalar", "dt_bias": "scalar"}`` for GDN gates, restricted to the function's
    positional parameters after the raw gate; any other parameter name is a per-head scalar
    unless ``params`` says ``"channel"``. ``range``: the declared range of g, a ``(lo, hi)``
    pair or a function of the options returning one. Re-defining a gate of the same name
    (a gate file loaded again after an edit) replaces it; a built-in gate cannot be replaced.
    """
    if family not in ("kda", "gdn"):
        raise ValueError(f"gate family must be 'kda' or 'gdn', got {family!r}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"gate name must be a Python identifier, got {name!r}")
    range_fn = range
    if range is not None and not callable(range):
        try:
            lo, hi = (float(x) for x in range)
        except (TypeError, ValueError):
            raise ValueError(f"gate {name!r}: range must be a (lo, hi) pair or a function of "
                             f"the gate's options, got {range!r}") from None
        if not lo <= hi:
            raise ValueError(f"gate {name!r}: range ({lo}, {hi}) has lo > hi")
        range_fn = lambda lo=lo, hi=hi, **_: (lo, hi)   # noqa: E731

    def deco(fn):
        sig = inspect.signature(fn)
        positional = [p.name for p in sig.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not positional:
            raise ValueError(f"gate {name!r}: the function takes the raw gate as its first "
                             f"argument")
        options = {p.name: p.default for p in sig.parameters.values()
                   if p.kind == p.KEYWORD_ONLY}
        if params is None:
            default = {"A_log": "scalar", "dt_bias": "channel" if family == "kda" else "scalar"}
            ps = {p: default.get(p, "scalar") for p in positional[1:]}
        else:
            ps = dict(params)
            unknown = set(ps) - set(positional[1:])
            if unknown:
                raise ValueError(f"gate {name!r}: params {sorted(unknown)} are not arguments "
                                 f"of the function (it takes {positional[1:]})")
        for p, kind in ps.items():
            if p in RESERVED_NAMES or "d" + p in ps:
                raise ValueError(f"gate {name!r}: parameter name {p!r} is taken (by a program "
                                 f"argument, {sorted(RESERVED_NAMES)}, or by the gradient "
                                 f"'d{p}' of another parameter); rename it")
            if kind not in PARAM_KINDS:
                raise ValueError(f"gate {name!r}: parameter {p!r} kind must be one of {PARAM_KINDS}")
            if family == "gdn" and kind == "channel":
                raise ValueError(f"gate {name!r}: GDN gates have no per-channel parameters")
        old = GATES.get(name)
        if register and old is not None and old.builtin and fn.__module__ != __name__:
            raise ValueError(f"gate {name!r} is one of kdagen's built-in gates; give yours "
                             f"another name")
        doc = description or (inspect.getdoc(fn) or "").split("\n")[0]
        gate = Gate(name=name, fn=fn, family=family, params=ps, input_name=input_name,
                    options=options, range_fn=range_fn, description=doc)
        if register:
            GATES[name] = gate
        if _LOADING is not None:
            _LOADING.append(gate)
        return gate

    return deco


def load_gate_file(path) -> list[Gate]:
    """Run a user's gate file (Python defining gates with :func:`define_gate`) and return the
    gates it defined, now registered by name (``build_program(..., gate=NAME)``,
    ``kdagen.chunk_kda(..., gate=NAME)``). Loading the file again after an edit replaces its
    gates (their digests change, so their kernels are compiled again)."""
    global _LOADING
    path = Path(path)
    if not path.is_file():
        raise GateFileError(f"gate file {str(path)!r} does not exist; pass a Python file that "
                            f"defines gates with kdagen.ir.gates.define_gate")
    resolved = path.resolve()
    modname = "kdagen_gates_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(modname, resolved)
    if spec is None or spec.loader is None:
        raise GateFileError(f"gate file {str(path)!r}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    outer, _LOADING = _LOADING, []
    try:
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            sys.modules.pop(modname, None)
            raise GateFileError(f"gate file {str(path)!r} failed to load: "
                                f"{type(err).__name__}: {err}") from err
        loaded = [g for g in _LOADING if GATES.get(g.name) is g]
    finally:
        _LOADING = outer
    if not loaded:
        raise GateFileError(f"gate file {str(path)!r} defines no gate; decorate a function with "
                            f"@define_gate(NAME, range=(lo, hi)) from kdagen.ir.gates")
    return loaded


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
