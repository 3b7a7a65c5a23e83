"""Test helpers: random program inputs and float64 references named like the programs' arguments.

Used by the interpreter/program tests and by pass tests (the interpreter is their oracle)::

    case = make_case("kda", gate="lower_bound", B=1, T=300, H=2, HV=4, K=64, V=64,
                     lengths=[1, 17, 64, 218], seed=0)
    module = build_program("kda_fwd", **case.options)
    out = interpreter.run(module, case.inputs)
    ref_o, ref_ht = case.reference()
    grads = case.reference_grads(do, dht)   # {"dq": ..., "dg_raw": ..., "dh0": ...}
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from kdagen.ir.gates import GATES, get_gate

__all__ = ["Case", "make_case", "GRAD_NAMES"]

F64 = torch.float64
GRAD_NAMES = {"initial_state": "dh0", "final_state": "dht"}


def grad_name(name: str) -> str:
    return GRAD_NAMES.get(name, "d" + name)


@dataclass
class Case:
    family: str
    options: dict
    inputs: dict
    gate_fn: Callable | None = None  # torch function (g_raw, **params) -> g for custom gates
    sizes: dict = field(default_factory=dict)

    @property
    def gate(self):
        return get_gate(self.options["gate"])

    def _call(self, **x):
        """The float64 reference on program-named inputs; returns (o, final_state)."""
        from kdagen import reference as R
        opt = self.options
        gate = self.gate
        g_in = x[gate.input_name]
        params = {p: x[p] for p in gate.params}
        builtin = (gate.name in ("softplus", "lower_bound", "gdn_softplus", "gdn_lower_bound")
                   and GATES.get(gate.name) is gate)
        kw = dict(scale=x.get("scale"), initial_state=x.get("initial_state"),
                  output_final_state=opt.get("output_final_state", True),
                  use_qk_l2norm_in_kernel=opt.get("use_qk_l2norm_in_kernel", True),
                  use_beta_sigmoid_in_kernel=opt.get("use_beta_sigmoid_in_kernel", True),
                  allow_neg_eigval=opt.get("allow_neg_eigval", False),
                  cu_seqlens=x.get("cu_seqlens"))
        if builtin:
            kw.update(use_gate_in_kernel=True, safe_gate="lower_bound" in gate.name,
                      lower_bound=opt.get("lower_bound", -5.0) if "lower_bound" in gate.name else None,
                      A_log=params["A_log"], dt_bias=params["dt_bias"])
            g = g_in
        else:
            # the gate's enforced range, as the programs clamp it (kdagen.ir.gate_ranges)
            lo, hi = gate.enforced_range(**{k: v for k, v in opt.items() if k in gate.options})
            if gate.params or self.gate_fn is not None:
                if self.gate_fn is None:
                    raise ValueError(f"gate {gate.name!r}: pass gate_fn (a torch version) for the reference")
                raw = R.clamp_raw_gate(g_in) if gate.input_name != "g" else g_in.to(F64)
                g = self.gate_fn(raw, **{k: v.to(F64) for k, v in params.items()})
            else:
                g = g_in
            g = R.clamp_gate(g, lo, hi)
        beta = x.get("beta_raw", x.get("beta"))
        fn = R.chunk_kda if self.family == "kda" else R.chunk_gated_delta_rule
        return fn(x["q"], x["k"], x["v"], g, beta, **kw)

    def reference(self):
        """(o, final_state) in float64."""
        with torch.no_grad():
            return self._call(**self.inputs)

    def reference_grads(self, do, dht=None) -> dict:
        """Gradients of <o, do> + <final_state, dht> by autograd, keyed by gradient names."""
        from kdagen import reference as R
        g = R.reference_grads(self._call, self.inputs, do, dht)
        return {grad_name(k): v for k, v in g.items()
                if k not in ("o", "final_state") and v is not None}


def make_case(family: str = "kda", *, gate: str | None = None, B: int = 1, T: int = 64, H: int = 1,
              HV: int | None = None, K: int = 64, V: int = 64, lengths=None, chunk_size: int = 64,
              use_initial_state: bool = True, output_final_state: bool = True,
              use_qk_l2norm_in_kernel: bool = True, use_beta_sigmoid_in_kernel: bool = True,
              allow_neg_eigval: bool = False, decay: str = "moderate", seed: int = 0,
              gate_fn: Callable | None = None, **gate_options) -> Case:
    """Random float64 inputs for a program and the matching options.

    ``lengths`` (varlen) makes B = 1 with ``cu_seqlens``. ``decay="strong"`` pushes the gate to
    its strongest decay (softplus: A_log = ln 16; lower-bound: g near lb per token).
    """
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H
    gobj = get_gate(gate or ("softplus" if family == "kda" else "gdn_softplus"))
    gname = gobj.name
    varlen = lengths is not None
    if varlen:
        B, T = 1, int(sum(lengths))
    N = len(lengths) if varlen else B

    def rnd(*s, scale=1.0):
        return torch.randn(*s, generator=gen, dtype=F64) * scale

    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    inputs = {"q": rnd(B, T, H, K), "k": rnd(B, T, H, K), "v": rnd(B, T, HV, V)}
    if not use_qk_l2norm_in_kernel:
        inputs["q"] = inputs["q"] / math.sqrt(K)
        inputs["k"] = inputs["k"] / math.sqrt(K)
    if gobj.input_name == "g":  # precomputed log gate
        lo = gate_options.get("lower_bound")
        span = -(lo if lo is not None else (-5.0 if decay == "strong" else -1.0))
        inputs["g"] = -torch.rand(*gshape, generator=gen, dtype=F64) * span
    else:
        strong = decay == "strong"
        if "lower_bound" in gname:
            inputs["g_raw"] = rnd(*gshape) + (6.0 if strong else 0.0)
        else:
            inputs["g_raw"] = rnd(*gshape) - (3.0 if strong else 1.0)
        for p, kind in gobj.params.items():
            shp = (HV, K) if kind == "channel" else (HV,)
            if p == "A_log":
                inputs[p] = torch.full(shp, math.log(16.0), dtype=F64) if strong else rnd(*shp, scale=0.5)
            else:
                inputs[p] = rnd(*shp, scale=0.5)
    beta = rnd(B, T, HV)
    inputs["beta_raw" if use_beta_sigmoid_in_kernel else "beta"] = (
        beta if use_beta_sigmoid_in_kernel else torch.sigmoid(beta))
    if use_initial_state:
        inputs["initial_state"] = rnd(N, HV, K, V, scale=0.5)
    if varlen:
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + int(n))
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64)
    options = dict(chunk_size=chunk_size, head_k_dim=K, head_v_dim=V,
                   gate=gname if gname in GATES and GATES[gname] is gobj else gobj, gva_ratio=HV // H,
                   dtype="bf16", use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                   allow_neg_eigval=allow_neg_eigval, use_initial_state=use_initial_state,
                   output_final_state=output_final_state, varlen=varlen, **gate_options)
    return Case(family, options, inputs, gate_fn, dict(B=B, T=T, H=H, HV=HV, K=K, V=V, N=N))
