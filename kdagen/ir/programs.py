"""The program library: KDA and GDN forward and backward as kda-dialect programs.

The forward programs are written below in the DSL, in the naive factored form of docs/MATH.md §1
in log2 space (g2 = g·log2 e; Γ = cumsum(g2); kd = k·2^Γ, ki = k·2^−Γ, qd = q·2^Γ,
kr = k·2^(Γ_C − Γ)). They are *not* stabilised here: that is the job of the
``kda-stable-reassociate`` pass; in float32 at strong decay these programs overflow.

The backward programs are derived: ``kda_bwd = autodiff(kda_fwd)``,
``gdn_bwd = autodiff(gdn_fwd)`` (:mod:`kdagen.ir.autodiff`), so every gate, including a
user-defined one, gets its backward with no extra code.

Entry points: :func:`build_program`, :data:`PROGRAMS`, :func:`list_programs`,
:func:`program_options`.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Callable

from kdagen._mlir import ir
from kdagen.ir import dsl
from kdagen.ir.dsl import (LOG2E, ProgramBuilder, cumsum, exp2, l2norm, last_row, name_locals,
                           sigmoid, strict_tril, tril, tril_inv, where, zeros)
from kdagen.ir.gates import Gate, get_gate

__all__ = ["PROGRAMS", "Program", "build_program", "list_programs", "program_options",
           "DEFAULT_OPTIONS", "DECODE_OPTIONS", "ProgramOptionError", "RESIDUALS"]


class ProgramOptionError(ValueError):
    """An invalid program option (the message names the option and the allowed values)."""


# option name -> (default, help). gate-specific options (lower_bound, A_log_max, ...) come from
# the chosen gate.
DEFAULT_OPTIONS = {
    "chunk_size": (64, "chunk size C, one of 16, 32, 64, 128"),
    "head_k_dim": (128, "key head dim K: 64, 128 or 256"),
    "head_v_dim": (128, "value head dim V: 64 or 128 (a larger V runs as value parts)"),
    "gate": (None, "gate name (kdagen list); default 'softplus' (KDA) / 'gdn_softplus' (GDN)"),
    "gva_ratio": (1, "value heads per q/k head (HV // H)"),
    "dtype": ("bf16", "storage type of q, k, v, o (and of g, beta unless set below): bf16, fp16 or fp32"),
    "gate_dtype": (None, "storage type of the gate input (g / g_raw) and its gradient: bf16, "
                         "fp16 or fp32; default: dtype"),
    "beta_dtype": (None, "storage type of beta (beta / beta_raw) and its gradient: bf16, fp16 "
                         "or fp32; default: dtype"),
    "use_qk_l2norm_in_kernel": (True, "L2-normalise q and k in the kernel"),
    "use_beta_sigmoid_in_kernel": (True, "beta = sigmoid(beta_raw) in the kernel"),
    "allow_neg_eigval": (False, "beta = 2 * sigmoid(beta_raw) (needs use_beta_sigmoid_in_kernel)"),
    "use_initial_state": (True, "read initial_state [N, HV, K, V]"),
    "output_final_state": (True, "write final_state [N, HV, K, V]"),
    "output_chunk_states": (False, "forward: write chunk_states [chunks, HV, K, V], the state "
                                   "at the start of every chunk (FLA's return_intermediate_states)"),
    "varlen": (False, "sequences given by cu_seqlens (B = 1)"),
    "save_residuals": (False, "forward: also write the chunk products the backward would "
                              "recompute (RESIDUALS: [chunks, HV, C, C] fp32 each); backward: "
                              "read them (inputs of those names, from the forward of the same "
                              "options) instead of recomputing them"),
    "gate_digest": (None, "a user gate's digest (Gate.digest): the program is built only if the "
                          "registered gate still has it; keys compiled kernels by the gate's source"),
}

#: the chunk values a forward with save_residuals writes for its backward ([C, C] fp32 per
#: chunk and value head): the masked key-key decay product and the inverse (I + Akk)^-1, the
#: costliest recomputation of the backward's prologue. The masked query-key decay product is
#: not one: the forward computes it in its output kernel, and saving it moved it into the
#: prologue (+148 us) while the dq kernel that loaded it got slower (929 -> 996 us; H200,
#: KDA B1_T8k_H16, bench/results/h200_residuals3_B1_T8k_H16.log)
RESIDUALS = ("res_kk", "res_Akk_inv")

#: The families whose kr = k ⊙ 2^(Γ_C − Γ) has its exponent written as suffix sums of the gate
#: instead of the difference of the chunk's last cumsum row and the cumsum. The value is the
#: same; the derived backward differs: from the difference, the chunk-end gate's adjoint enters
#: dG as +Σ_i x_i on the last row and −x_i on every row, and the reverse cumsum to dg computes
#: Σ_{s<t} x_s as total minus suffix -- under a steep gate two large sums with a small
#: difference (tools.rounding_attribution). From suffix sums the adjoint is that prefix sum
#: itself. CPU evidence (stop 45; GDN, K = 128, T = 200, steep gate): the float32 program's
#: dA_log 1.87e-2 -> 2.3e-3 (tools.program_precision); the simulated sm_90a kernels 4.6e-4 ->
#: 2.6e-5 (tools.sim_check); on the H100 (GPU check, stop 46) 2.50e-3 -> 3.0e-5, ddt_bias
#: 1.70e-3 -> 1.1e-4. GDN only: its gate is one value per row, so kda-narrow-reductions runs
#: the adjoint's cumsums on [C] (GDN fwd+bwd B1_T8k_H16 4.30 -> 4.35 ms). KDA's per-key gate
#: makes them [C, K] tiles, and on the H100 its misses did not move while its kernels slowed:
#: K = 64 steep dA_log 1.68e-3 -> 1.62e-3, correlated 2.43e-3 -> 2.47e-3, lower-bound weak
#: 2.51e-3 -> 3.30e-3; dk kernel 1712 -> 1909 us, forward prologue 392 -> 471 us
#: (bench/results/h100_stop46_*kr_suffix_sums_experiment.log).
KR_SUFFIX_SUM_FAMILIES = ("gdn",)

_CHUNKS = (16, 32, 64, 128)
#: key and value head dims a program is built for (kdagen.head_dims: the APIs run any other
#: size up to the largest key dim on these, zero-padded, with V in parts of the largest value
#: dim). V stops at 128: a [K, 256] fp32 state is 256 KB, more than a CTA holds
_KEY_DIMS = (64, 128, 256)
_VALUE_DIMS = (64, 128)
_DTYPES = ("bf16", "fp16", "fp32")


def _resolve(family: str, options: dict) -> tuple[dict, Gate, dict]:
    opts = {k: v[0] for k, v in DEFAULT_OPTIONS.items()}
    gate = get_gate(options.get("gate") or ("softplus" if family == "kda" else "gdn_softplus"))
    if gate.family != family:
        raise ProgramOptionError(f"gate: {gate.name!r} is a {gate.family.upper()} gate; a "
                                 f"{family.upper()} program needs one of "
                                 f"{sorted(n for n, g in _gates().items() if g.family == family)}")
    gate_opts = {}
    for k, v in options.items():
        if k in opts:
            opts[k] = v
        elif k in gate.options:
            gate_opts[k] = v
        else:
            raise ProgramOptionError(
                f"unknown option {k!r}; options are {sorted(opts)} plus the gate's "
                f"{sorted(gate.options) or '(none)'}")
    opts["gate"] = gate.name
    if opts["gate_digest"] is not None and opts["gate_digest"] != gate.digest:
        raise ProgramOptionError(
            f"gate_digest: {opts['gate_digest']!r} is not the digest of the registered gate "
            f"{gate.name!r} ({gate.digest}): the gate was edited since; compile it again (or "
            f"load the gate file the kernels were emitted from)")

    def check(name, allowed):
        if opts[name] not in allowed:
            raise ProgramOptionError(f"{name}: {opts[name]!r} is not one of {list(allowed)}")

    check("chunk_size", _CHUNKS)
    check("head_k_dim", _KEY_DIMS)
    check("head_v_dim", _VALUE_DIMS)
    check("dtype", _DTYPES)
    for name in ("gate_dtype", "beta_dtype"):
        if opts[name] is None:
            opts[name] = opts["dtype"]
        check(name, _DTYPES)
    if not isinstance(opts["gva_ratio"], int) or isinstance(opts["gva_ratio"], bool) or opts["gva_ratio"] < 1:
        raise ProgramOptionError(f"gva_ratio: expected a positive int, got {opts['gva_ratio']!r}")
    for flag in ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                 "use_initial_state", "output_final_state", "output_chunk_states", "varlen",
                 "save_residuals"):
        if not isinstance(opts[flag], bool):
            raise ProgramOptionError(f"{flag}: expected true or false, got {opts[flag]!r}")
    if opts["save_residuals"] and opts["output_chunk_states"]:
        raise ProgramOptionError("save_residuals: not with output_chunk_states (that is an "
                                 "inference output; residuals serve the backward)")
    if opts["allow_neg_eigval"] and not opts["use_beta_sigmoid_in_kernel"]:
        raise ProgramOptionError("allow_neg_eigval: needs use_beta_sigmoid_in_kernel=True")
    try:
        gate_opts = gate.resolve_options(gate_opts)
        gate.output_range(**gate_opts)  # validates e.g. lower_bound
    except ValueError as err:
        raise ProgramOptionError(str(err)) from None
    return opts, gate, gate_opts


def _gates():
    from kdagen.ir.gates import GATES
    return GATES


def _program_attrs(name: str, family: str, C: int, opt: dict, gate, gate_opts: dict) -> dict:
    """The function attributes every program of the library records (its options)."""
    lo, hi = gate.output_range(**gate_opts)
    attrs = dict(program=name, family=family, chunk_size=C, head_k_dim=opt["head_k_dim"],
                 head_v_dim=opt["head_v_dim"], gate=gate.name,
                 gate_options={k: v for k, v in gate_opts.items() if v is not None},
                 gate_range=[lo, hi], gva_ratio=opt["gva_ratio"], dtype=opt["dtype"],
                 gate_dtype=opt["gate_dtype"], beta_dtype=opt["beta_dtype"],
                 use_qk_l2norm_in_kernel=opt["use_qk_l2norm_in_kernel"],
                 use_beta_sigmoid_in_kernel=opt["use_beta_sigmoid_in_kernel"],
                 allow_neg_eigval=opt["allow_neg_eigval"], use_initial_state=opt["use_initial_state"],
                 output_final_state=opt["output_final_state"], varlen=opt["varlen"])
    if opt["gate_digest"] is not None:
        attrs["gate_digest"] = opt["gate_digest"]
    if opt["save_residuals"]:
        attrs["save_residuals"] = True
    return attrs


def _declare_arguments(p: ProgramBuilder, family: str, opt: dict, gate,
                       slot_dtype: str | None = None, storage: StateStorage | None = None) -> str:
    """The arguments of a forward-direction program (FLA's names): inputs q, k, v, the gate's
    input and parameters, beta, initial_state, cu_seqlens, scale; outputs o, final_state.
    With ``slot_dtype`` (a state pool) the states are pool rows (layout ``pool``
    [slots, HV, K, V]) chosen by the input ``state_slots`` [N] of that int type, declared
    after cu_seqlens. ``storage``: how initial_state / final_state are stored (fp32 [K, V]
    when None). Returns beta's argument name."""
    storage = storage or StateStorage()
    K, V, dt = opt["head_k_dim"], opt["head_v_dim"], opt["dtype"]
    gate_tail = [K] if family == "kda" else []
    beta_name = "beta_raw" if opt["use_beta_sigmoid_in_kernel"] else "beta"
    p.input("q", "token", [K], dt, heads="qk")
    p.input("k", "token", [K], dt, heads="qk")
    p.input("v", "token", [V], dt, heads="v")
    p.input(gate.input_name, "token", gate_tail, opt["gate_dtype"], heads="v")
    p.input(beta_name, "token", [], opt["beta_dtype"], heads="v")
    for pname, kind in gate.params.items():
        p.input(pname, "head", [K] if kind == "channel" else [], "fp32")
    state = "state" if slot_dtype is None else "pool"
    state_tail = storage.tail(K, V)
    if opt["use_initial_state"]:
        p.input("initial_state", state, state_tail, storage.dtype, grad_name="dh0")
    if opt["varlen"]:
        p.input("cu_seqlens", "seqlens", [], "i64")
    if slot_dtype is not None:
        p.input("state_slots", "slots", [], slot_dtype)
    p.scalar_input("scale", default=K ** -0.5)
    p.output("o", "token", [V], dt, heads="v")
    if opt["output_final_state"]:
        p.output("final_state", state, state_tail, storage.dtype, grad_name="dht")
    return beta_name


def _step_inputs(p: ProgramBuilder, c, family: str, opt: dict, gate, gate_opts: dict,
                 params: dict, beta_name: str, rows: int, value_parts: int = 1) -> dict:
    """The inputs of scan step ``c`` (``rows`` tokens: a chunk, or one token) as the delta
    rule uses them, fp32: q, k (L2-normalised in kernel), v, beta (sigmoid in kernel) and the
    gate (natural-log decay in its declared range, 0 on rows past the sequence end, which read
    as 0; GDN's per-head gate broadcast over K). The tiles come back by their variable names,
    for the caller's ``name_locals``. ``value_parts``: v is this part's columns only."""
    K = opt["head_k_dim"]
    qf = p.load("q", c).f32()
    kf = p.load("k", c).f32()
    vf = p.load("v", c, value_parts=value_parts).f32()
    beta_in = p.load(beta_name, c).f32()
    g_in = p.load(gate.input_name, c).f32()
    qn, kn = (l2norm(qf), l2norm(kf)) if opt["use_qk_l2norm_in_kernel"] else (qf, kf)
    if opt["use_beta_sigmoid_in_kernel"]:
        beta = 2.0 * sigmoid(beta_in) if opt["allow_neg_eigval"] else sigmoid(beta_in)
    else:
        beta = beta_in
    valid = p.valid_rows(c)
    g_valid = where(valid[:, None] if family == "kda" else valid,
                    gate(g_in, params, **gate_opts), 0.0)
    if family == "gdn":
        g_valid = dsl.broadcast_to(g_valid[:, None], (rows, K), name="g_k")  # same decay on all K
    return dict(qf=qf, kf=kf, vf=vf, beta_in=beta_in, g_in=g_in, qn=qn, kn=kn, beta=beta,
                valid=valid, g_valid=g_valid)


@dataclass(frozen=True)
class StateStorage:
    """How a program's initial_state / final_state rows are stored: element type (the state
    is fp32 in the program; a bf16 row is read into fp32 and rounded to nearest on store) and
    whether a row is [V, K] (value-first, the state's transpose) rather than [K, V]."""
    dtype: str = "fp32"
    v_first: bool = False

    def tail(self, K: int, V: int) -> list:
        return [V, K] if self.v_first else [K, V]

    @property
    def value_axis(self) -> int:
        return -2 if self.v_first else -1

    def load(self, p: ProgramBuilder, mem: str, *, name: str, slots, value_parts: int) -> Tile:
        """The [K, V'] fp32 state of a stored row (V' = this part's value columns)."""
        plain = not self.v_first and self.dtype == "fp32"
        row = p.load_state(mem, slots=slots, value_parts=value_parts, value_axis=self.value_axis,
                           name=name if plain else f"{name}_row")
        if plain:
            return row
        state = row.T if self.v_first else row
        return state.to("fp32", name=name) if self.dtype != "fp32" else state.named(name)

    def store(self, p: ProgramBuilder, mem: str, state: Tile, *, slots, value_parts: int):
        """Store the [K, V'] fp32 ``state`` as a row of ``mem``."""
        row = state.T if self.v_first else state
        if self.dtype != "fp32":
            row = row.to(self.dtype)
        p.store_state(mem, row, slots=slots, value_parts=value_parts,
                      value_axis=self.value_axis)


def _state_scan(p: ProgramBuilder, opt: dict, gate, slots: str | None = None,
                value_parts: int = 1, storage: StateStorage | None = None) -> tuple:
    """(scale, the gate's per-head parameters, the forward scan over the state S from
    initial_state or zeros): how the forward and the decode program open their body.
    ``slots``: the slot table choosing initial_state's pool row; ``value_parts``: the state
    holds this part's value columns only; ``storage``: how initial_state is stored."""
    K, V = opt["head_k_dim"], opt["head_v_dim"] // value_parts
    scale = p.scalar("scale")
    params = {pname: p.load_head(pname) for pname in gate.params}
    S0 = ((storage or StateStorage()).load(p, "initial_state", name="h0", slots=slots,
                                           value_parts=value_parts)
          if opt["use_initial_state"] else zeros((K, V), name="h0"))
    return scale, params, p.scan([S0], names=["S"], name="S_final")


def _delta_rule_fwd(family: str, name: str, options: dict,
                    diagonal_apart: bool = False) -> ir.Module:
    """The chunked gated delta rule forward (docs/MATH.md §1), shared by KDA and GDN.

    ``diagonal_apart``: the form a backward is derived from (GDN's). Aqk's diagonal
    q_i . k_i carries no decay (exp(Γ_i − Γ_i) = 1), so it multiplies v' apart from the strictly
    lower decay product. The value is the same; the derived gate gradient then no longer
    sums the diagonal into both of the two halves that cancel (q ⊙ dq and k ⊙ dk) — halves that
    a steep gate leaves as nothing but that diagonal, so its dg was their rounding. In the
    CPU simulator of the H200 kernels, GDN's GPU-check case "B1_T200 correlated steep" moves
    dA_log 8.3e-3 -> 8.8e-4 and ddt_bias 4.1e-3 -> 9.0e-4; KDA's cases do not move (its
    error at those gates is elsewhere), so KDA keeps one product. The forward programs keep
    it too: the split costs a [C, V] product term where only the gradient gains."""
    opt, gate, gate_opts = _resolve(family, options)
    C, K, V, dt = opt["chunk_size"], opt["head_k_dim"], opt["head_v_dim"], opt["dtype"]
    attrs = _program_attrs(name, family, C, opt, gate, gate_opts)
    if opt["output_chunk_states"]:
        attrs["output_chunk_states"] = True
    p = ProgramBuilder(name, attrs)
    beta_name = _declare_arguments(p, family, opt, gate)
    if opt["output_chunk_states"]:
        # inference only (FLA's return_intermediate_states): in the storage type, as FLA's h
        p.output("chunk_states", "chunk", [K, V], dt, heads="v")
    residuals = opt["save_residuals"]
    for res in RESIDUALS if residuals else ():
        p.output(res, "chunk", [C, C], "fp32", heads="v", residual=True)

    with p.body():
        scale, params, scan = _state_scan(p, opt, gate)
        with scan as (c, S):
            if opt["output_chunk_states"]:
                p.store_chunk("chunk_states", c, S.to(dt))   # the state entering chunk c
            x = _step_inputs(p, c, family, opt, gate, gate_opts, params, beta_name, C)
            qn, kn, vf, beta, g_valid = (x[n] for n in ("qn", "kn", "vf", "beta", "g_valid"))
            # -- log2-space decays: Γ = cumsum(g·log2 e) within the chunk, Γ_C its last row
            G = cumsum(g_valid * LOG2E)
            G_C = last_row(G)
            eG = exp2(G)
            kd = kn * eG                  # k ⊙ exp(Γ)
            ki = kn * exp2(-G)            # k ⊙ exp(−Γ)
            qd = qn * eG                  # q ⊙ exp(Γ)
            if family in KR_SUFFIX_SUM_FAMILIES:
                # Γ_C − Γ_i = Σ_{t>i} g_t·log2 e, summed as such (clamped ≤ 0 for the range
                # analysis; the clamp changes no value: the sum of non-positive terms)
                inc = g_valid * LOG2E
                kr = kn * exp2(dsl.clamp(cumsum(inc, reverse=True) - inc, -math.inf, 0.0))
            else:
                kr = kn * exp2(G_C - G)       # k ⊙ exp(Γ_C − Γ)
            # -- WY/UT form: T = (I + Akk)^-1 diag(β);  w = T kd,  u = T v
            _kk = strict_tril(kd @ ki.T)
            Akk = _kk * beta[:, None]
            Akk_inv = tril_inv(Akk)
            w = Akk_inv @ (kd * beta[:, None])
            u = Akk_inv @ (vf * beta[:, None])
            if diagonal_apart:
                Aqk = strict_tril(qd @ ki.T) * scale
                qk_diagonal = dsl.row_sum(qn * kn) * scale
            else:
                Aqk = tril(qd @ ki.T) * scale
            if residuals:
                # what the backward would recompute: its chunk products (autodiff loads
                # the stored values in their place, kdagen/ir/autodiff.py)
                for res, value in zip(RESIDUALS, (_kk, Akk_inv)):
                    p.store_chunk(res, c, value)
            # -- state-dependent part: v' = u − w S;  o = scale qd S + Aqk v'
            v_new = u - w @ S
            o_c = (qd @ S) * scale + Aqk @ v_new
            if diagonal_apart:
                o_c = o_c + qk_diagonal[:, None] * v_new
            p.store("o", c, o_c.to(dt))
            # -- S ← diag(exp Γ_C) S + krᵀ v'
            S_next = S * exp2(G_C)[:, None] + kr.T @ v_new
            scan.yield_(S_next)
            name_locals({**locals(), **x})
        if opt["output_final_state"]:
            p.store_state("final_state", scan.results[0])
    return p.finish()


#: the options only the decode programs take: name -> (default, help)
DECODE_OPTIONS = {
    "output_token_states": (False, "write token_states [tokens, HV, K, V], the state after "
                                   "every token (a speculative verify step keeps one per draft "
                                   "token)"),
    "state_pool": (False, "initial_state / final_state are a state pool [slots, HV, K, V]: "
                          "sequence n reads and writes row state_slots[n] (input [N]), in "
                          "place when both are one tensor; a negative slot skips the sequence "
                          "(its o is 0, nothing is read or written)"),
    "slot_dtype": ("i64", "state_pool: the element type of state_slots, i32 or i64"),
    "value_split": (1, "run each (sequence, head) as this many CTAs, each owning V / value_split "
                       "value columns of the state, v, o (the columns never mix: 1, 2, 4 or 8)"),
    "state_dtype": ("fp32", "the element type of initial_state / final_state (a pool's too): "
                            "fp32, or bf16 (read into fp32, the new state rounded to nearest "
                            "on store); token_states stay fp32"),
    "state_v_first": (False, "initial_state / final_state (a pool's rows too) are stored "
                             "[.., V, K], the transpose of the state (FLA's state_v_first)"),
}

#: the element types a decode program's state may be stored in
STATE_DTYPES = ("fp32", "bf16")


def _decode_options(name: str, options: dict) -> tuple[dict, dict]:
    """(the decode-only options resolved, the rest for :func:`_resolve`)."""
    if options.get("chunk_size", 1) != 1:
        raise ProgramOptionError(f"chunk_size: {name} steps one token at a time; leave "
                                 f"chunk_size unset (1), got {options['chunk_size']!r}")
    own = {k: options.get(k, default) for k, (default, _) in DECODE_OPTIONS.items()}
    for flag in ("output_token_states", "state_pool", "state_v_first"):
        if not isinstance(own[flag], bool):
            raise ProgramOptionError(f"{flag}: expected true or false, got {own[flag]!r}")
    if own["value_split"] not in (1, 2, 4, 8):
        raise ProgramOptionError(f"value_split: one of 1, 2, 4, 8, got {own['value_split']!r}")
    if own["slot_dtype"] not in ("i32", "i64"):
        raise ProgramOptionError(f"slot_dtype: {own['slot_dtype']!r} is not one of "
                                 f"['i32', 'i64']")
    if own["state_dtype"] not in STATE_DTYPES:
        raise ProgramOptionError(f"state_dtype: {own['state_dtype']!r} is not one of "
                                 f"{list(STATE_DTYPES)}")
    if "slot_dtype" in options and not own["state_pool"]:
        raise ProgramOptionError("slot_dtype: only with state_pool=True")
    rest = {k: v for k, v in options.items() if k not in DECODE_OPTIONS and k != "chunk_size"}
    if rest.get("save_residuals"):
        raise ProgramOptionError(f"save_residuals: not an option of {name} (decode has no "
                                 f"backward)")
    if rest.get("output_chunk_states"):
        raise ProgramOptionError(f"output_chunk_states: not an option of {name} (its "
                                 f"output_token_states gives the state after every token)")
    if own["state_pool"] and not rest.get("use_initial_state", True):
        raise ProgramOptionError("state_pool: needs use_initial_state (the pool holds the "
                                 "initial states)")
    return own, rest


def _delta_rule_decode(family: str, name: str, options: dict) -> ir.Module:
    """The per-token recurrence (docs/MATH.md §1) for decoding: the scan steps one token at a
    time (``chunk_size`` 1), so a sequence of T tokens (1..8 in a decode or speculative verify
    step) takes T steps from its state; the same arguments as the chunked forward, plus
    :data:`DECODE_OPTIONS` (per-token states, a state pool indexed by a slot table)."""
    own, options = _decode_options(name, options)
    token_states, pool = own["output_token_states"], own["state_pool"]
    opt, gate, gate_opts = _resolve(family, options)
    K, dt = opt["head_k_dim"], opt["dtype"]
    parts = own["value_split"]
    if opt["head_v_dim"] % (8 * parts):
        raise ProgramOptionError(f"value_split: {opt['head_v_dim']} value columns do not split "
                                 f"into {parts} parts of a multiple of 8")
    V = opt["head_v_dim"] // parts          # this CTA's value columns
    attrs = _program_attrs(name, family, 1, opt, gate, gate_opts)
    if parts > 1:
        attrs["value_split"] = parts
    if token_states:
        attrs["output_token_states"] = True
    if pool:
        attrs.update(state_pool=True, slot_dtype=own["slot_dtype"])
    storage = StateStorage(own["state_dtype"], own["state_v_first"])
    if storage != StateStorage():
        attrs.update(state_dtype=storage.dtype, state_v_first=storage.v_first)
    p = ProgramBuilder(name, attrs)
    slots = "state_slots" if pool else None
    beta_name = _declare_arguments(p, family, opt, gate, own["slot_dtype"] if pool else None,
                                   storage)
    if token_states:
        # the state after every token (a speculative verify step keeps one per draft token)
        p.output("token_states", "chunk", [K, opt["head_v_dim"]], "fp32", heads="v")

    with p.body():
        # a skipped sequence (negative slot) starts from 0 and its outputs are 0
        live = p.slot_valid(slots) if pool else None
        scale, params, scan = _state_scan(p, opt, gate, slots, value_parts=parts,
                                          storage=storage)
        with scan as (t, S):
            # -- token t ([1, ...] tiles; value-indexed ones hold this part's V columns)
            x = _step_inputs(p, t, family, opt, gate, gate_opts, params, beta_name, 1,
                             value_parts=parts)
            qn, kn, vf, beta, g_valid = (x[n] for n in ("qn", "kn", "vf", "beta", "g_valid"))
            # -- S' = diag(a) S + β kᵀ e with a = exp g, e = v − k diag(a) S;  o = scale q S'.
            # Reassociated so that S is read only by products and by the one element-wise
            # update (no [K, V] temporary): k diag(a) S = (k ⊙ a) S, and
            # q S' = (q ⊙ a) S + (q · βk) e
            decay = exp2(last_row(g_valid) * LOG2E)
            kb = kn * beta[:, None]
            err = vf - (kn * decay[None, :]) @ S
            S_next = (S * decay[:, None]
                      + dsl.broadcast_to(last_row(kb)[:, None], (K, V))
                      * dsl.broadcast_to(last_row(err)[None, :], (K, V)))
            q_kb = dsl.row_sum(qn * kb)
            o_t = ((qn * decay[None, :]) @ S + q_kb[:, None] * err) * scale
            if live is not None:
                o_t = where(live, o_t, 0.0)
            p.store("o", t, o_t.to(dt), value_parts=parts)
            if token_states:
                p.store_chunk("token_states", t, S_next, value_parts=parts)
            scan.yield_(S_next)
            name_locals({**locals(), **x})
        if opt["output_final_state"]:
            storage.store(p, "final_state", scan.results[0], slots=slots, value_parts=parts)
    return p.finish()


def _kda_decode(**options) -> ir.Module:
    return _delta_rule_decode("kda", "kda_decode", options)


def _gdn_decode(**options) -> ir.Module:
    return _delta_rule_decode("gdn", "gdn_decode", options)


def _kda_fwd(**options) -> ir.Module:
    return _delta_rule_fwd("kda", "kda_fwd", options)


def _gdn_fwd(**options) -> ir.Module:
    return _delta_rule_fwd("gdn", "gdn_fwd", options)


def _kda_bwd(**options) -> ir.Module:
    from kdagen.ir.derive import derive_backward
    return derive_backward(_kda_fwd(**options), name="kda_bwd")


def _gdn_bwd(**options) -> ir.Module:
    from kdagen.ir.derive import derive_backward
    return derive_backward(_delta_rule_fwd("gdn", "gdn_fwd", options, diagonal_apart=True),
                           name="gdn_bwd")


@dataclass(frozen=True)
class Program:
    name: str
    build: Callable
    family: str
    description: str
    doc: str


PROGRAMS: dict[str, Program] = {
    "kda_fwd": Program(
        "kda_fwd", _kda_fwd, "kda",
        "KDA forward (per-channel gate): o, final_state from q, k, v, g_raw, beta_raw, A_log, dt_bias, h0",
        """Kimi Delta Attention forward, chunked (docs/MATH.md §1), per-channel gate g [B, T, HV, K].
Inputs q, k [B, T, H, K]; v [B, T, HV, V]; g_raw (g for the precomputed gate); beta_raw (beta
without in-kernel sigmoid) [B, T, HV]; the gate's per-head params (A_log [HV], dt_bias [HV, K]);
initial_state [N, HV, K, V]; cu_seqlens [N+1] (varlen); scale. Outputs o [B, T, HV, V],
final_state [N, HV, K, V]."""),
    "kda_bwd": Program(
        "kda_bwd", _kda_bwd, "kda",
        "KDA backward = autodiff(kda_fwd): dq, dk, dv, dg_raw, dbeta_raw, dA_log, ddt_bias, dh0",
        """Kimi Delta Attention backward, derived from kda_fwd by reverse-mode differentiation of
the kda IR: a forward recompute scan stores the chunk-start states in a workspace; a reverse scan
carries dS, recomputes each chunk from its stored state and runs the adjoints. Inputs: kda_fwd's
inputs plus do (and dht); outputs the gradients of every input."""),
    "gdn_fwd": Program(
        "gdn_fwd", _gdn_fwd, "gdn",
        "GDN forward (scalar gate per head): o, final_state from q, k, v, g_raw, beta_raw, A_log, dt_bias, h0",
        """Gated DeltaNet forward, chunked; the per-head scalar gate g [B, T, HV] decays all K
channels alike (broadcast to [C, K] in the chunk). Arguments as kda_fwd with dt_bias [HV]."""),
    "gdn_bwd": Program(
        "gdn_bwd", _gdn_bwd, "gdn",
        "GDN backward = autodiff(gdn_fwd): dq, dk, dv, dg_raw, dbeta_raw, dA_log, ddt_bias, dh0",
        """Gated DeltaNet backward, derived from gdn_fwd by reverse-mode differentiation."""),
    "kda_decode": Program(
        "kda_decode", _kda_decode, "kda",
        "KDA decode: the per-token recurrence, one scan step per token (inference, no backward)",
        """Kimi Delta Attention as its per-token recurrence (docs/MATH.md §1), for decoding: the scan
steps one token at a time, so each sequence's T tokens (1..8 in a decode or speculative step;
varlen through cu_seqlens) advance its state T times. Arguments and outputs as kda_fwd."""),
    "gdn_decode": Program(
        "gdn_decode", _gdn_decode, "gdn",
        "GDN decode: the per-token recurrence, one scan step per token (inference, no backward)",
        """Gated DeltaNet as its per-token recurrence, for decoding. Arguments and outputs as
gdn_fwd."""),
}


def build_program(name: str, **options) -> ir.Module:
    """Build program ``name`` (see :data:`PROGRAMS`) with ``options`` (see
    :func:`program_options`); returns a verified ``ir.Module`` in a fresh kda context.

    Raises :class:`ProgramOptionError` (a ValueError) for a bad option, KeyError for an
    unknown program.
    """
    try:
        prog = PROGRAMS[name]
    except KeyError:
        raise KeyError(f"unknown program {name!r}; programs: {sorted(PROGRAMS)}") from None
    return prog.build(**options)


def list_programs() -> list[tuple[str, str]]:
    """(name, one-line description) for every program."""
    return [(p.name, p.description) for p in PROGRAMS.values()]


def program_options(name: str | None = None) -> dict[str, tuple]:
    """Option name -> (default, help) for the programs (the gate adds its own options, see
    ``kdagen.ir.gates.get_gate(name).options``; the decode programs add
    :data:`DECODE_OPTIONS`)."""
    out = dict(DEFAULT_OPTIONS)
    if name is not None:
        fam = PROGRAMS[name].family
        out["gate"] = ("softplus" if fam == "kda" else "gdn_softplus", DEFAULT_OPTIONS["gate"][1])
        if name.endswith("_decode"):
            out.update(DECODE_OPTIONS)
    return out
