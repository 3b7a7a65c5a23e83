"""The torch ops kdagen::{kda,gdn}_{fwd,bwd}: schemas, torch.library.opcheck, fake-tensor
tracing, torch.compile(fullgraph=True) of a training step, and how flags become program options.
"""
import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kdagen
from kdagen import ops
from kdagen.runtime import backends
from kdagen.runtime.backends import Executor

from test_api import make_inputs

F32 = torch.float32
BF16 = torch.bfloat16


def fwd_args(family, x, flags, *, scale=0.125, save_residuals=False):
    """Positional arguments of kdagen::{family}_fwd from make_inputs' (tensors, flags)."""
    return [x["q"], x["k"], x["v"], x["g"], x["beta"], x.get("A_log"), x.get("dt_bias"),
            x.get("initial_state"), flags.get("cu_seqlens"), scale,
            flags.get("output_final_state", False), flags.get("use_qk_l2norm_in_kernel", False),
            flags.get("use_gate_in_kernel", False), flags.get("use_beta_sigmoid_in_kernel", False),
            flags.get("allow_neg_eigval", False), flags.get("safe_gate", False),
            flags.get("lower_bound"), save_residuals]


def bwd_args(fargs, residuals=None):
    """kdagen::{family}_bwd arguments for forward arguments `fargs` (detached, random do/dht);
    ``residuals``: what the forward saved (default: none, empty tensors)."""
    fargs = [a.detach() if isinstance(a, torch.Tensor) else a for a in fargs]
    q, v = fargs[0], fargs[2]
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(v.shape, generator=gen).to(v.dtype)
    dht = None
    if fargs[10]:
        cu = fargs[8]
        N = cu.shape[0] - 1 if cu is not None else q.shape[0]
        dht = torch.randn(N, v.shape[2], q.shape[3], v.shape[3], generator=gen)
    if residuals is None:
        residuals = [q.new_empty(0, dtype=torch.float32) for _ in ops.RESIDUALS]
    return [do, dht] + fargs[:10] + fargs[11:17] + [[r.detach() for r in residuals]]


@contextlib.contextmanager
def executor_for_cpu(executor):
    old = backends.executors()["cpu"]
    backends.register_executor("cpu", executor)
    try:
        yield executor
    finally:
        backends.register_executor("cpu", old)


# ------------------------------------------------------------------------------------------
# schemas
# ------------------------------------------------------------------------------------------


def test_op_schemas():
    for family in ("kda", "gdn"):
        fwd = str(getattr(torch.ops.kdagen, f"{family}_fwd").default._schema)
        bwd = str(getattr(torch.ops.kdagen, f"{family}_bwd").default._schema)
        assert fwd.startswith(f"kdagen::{family}_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
                              "Tensor? A_log, Tensor? dt_bias, Tensor? initial_state, Tensor? cu_seqlens, "
                              "float scale, bool output_final_state, bool use_qk_l2norm_in_kernel, "
                              "bool use_gate_in_kernel, bool use_beta_sigmoid_in_kernel, "
                              "bool allow_neg_eigval, bool safe_gate, float? lower_bound, "
                              "bool save_residuals)"), fwd
        assert fwd.endswith("-> (Tensor, Tensor, Tensor[])"), fwd
        assert bwd.startswith(f"kdagen::{family}_bwd(Tensor do, Tensor? dht, Tensor q, "), bwd
        assert "float? lower_bound, Tensor[] residuals)" in bwd, bwd
        assert bwd.endswith("-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"), bwd
        # nothing is mutated or aliased
        assert "!" not in fwd and "!" not in bwd and "(a" not in fwd
        # the ops of any registered gate: its parameters as a tensor list, the gate by name
        gated_fwd = str(getattr(torch.ops.kdagen, f"{family}_gated_fwd").default._schema)
        gated_bwd = str(getattr(torch.ops.kdagen, f"{family}_gated_bwd").default._schema)
        assert gated_fwd.startswith(f"kdagen::{family}_gated_fwd(Tensor q, Tensor k, Tensor v, Tensor g, "
                                    "Tensor beta, Tensor[] gate_params, "), gated_fwd
        assert "str gate, str gate_options, bool save_residuals)" in gated_fwd
        assert gated_fwd.endswith("-> (Tensor, Tensor, Tensor[])"), gated_fwd
        assert "str gate_options, Tensor[] residuals)" in gated_bwd, gated_bwd
        assert gated_bwd.endswith("-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor[], Tensor)"), gated_bwd
        assert "!" not in gated_fwd and "!" not in gated_bwd
    assert set(ops.OPS) == {f"kdagen::{family}{gated}_{step}" for family in ("kda", "gdn")
                            for gated in ("", "_gated") for step in ("fwd", "bwd")}


# ------------------------------------------------------------------------------------------
# opcheck (test_schema, test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic)
# ------------------------------------------------------------------------------------------

OPCHECK_CASES = {
    # every optional tensor given, in-kernel gate and beta, bf16 with an fp32 gate
    "kda": dict(family="kda", dtype=BF16, T=20, H=1, HV=2, gate="softplus", beta_sigmoid=True,
                g_dtype=F32),
    # varlen, FLA's plain GDN (no optional gate tensors), no final state
    "gdn": dict(family="gdn", dtype=F32, lengths=[5, 15], H=1, HV=1, final_state=False),
}


@pytest.mark.parametrize("name", list(OPCHECK_CASES))
@pytest.mark.parametrize("which", ["fwd", "bwd"])
@pytest.mark.parametrize("save_residuals", [False, True])
def test_opcheck(name, which, save_residuals):
    spec = dict(OPCHECK_CASES[name])
    family = spec.pop("family")
    final_state = spec.pop("final_state", True)
    x, flags = make_inputs(family, **spec)
    flags["output_final_state"] = final_state
    args = fwd_args(family, x, flags, save_residuals=save_residuals)
    if which == "fwd":
        op = getattr(ops, f"{family}_fwd")
    else:
        residuals = getattr(ops, f"{family}_fwd")(*args)[2] if save_residuals else None
        op, args = getattr(ops, f"{family}_bwd"), bwd_args(args, residuals)
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result


# ------------------------------------------------------------------------------------------
# fake tensors and the meta device: shapes and dtypes only, no executor
# ------------------------------------------------------------------------------------------


class _Refuse(Executor):
    name = "refuse"

    def run(self, *a, **k):
        raise AssertionError("an executor ran under fake tensors")


@pytest.mark.parametrize("final_state", [True, False])
def test_fake_tensor_tracing_of_the_ops(final_state):
    with executor_for_cpu(_Refuse()), FakeTensorMode():
        # KDA, varlen of 3 sequences over T = 4096, GVA 4, K = V = 128, bf16 with fp32 gate
        q = torch.empty(1, 4096, 2, 128, dtype=BF16)
        v = torch.empty(1, 4096, 8, 128, dtype=BF16)
        g = torch.empty(1, 4096, 8, 128, dtype=F32)
        beta = torch.empty(1, 4096, 8, dtype=BF16)
        A_log, dt_bias = torch.empty(8), torch.empty(8, 128)
        h0 = torch.empty(3, 8, 128, 128)
        cu = torch.empty(4, dtype=torch.int64)
        o, ht, res = torch.ops.kdagen.kda_fwd(q, q, v, g, beta, A_log, dt_bias, h0, cu, 0.1,
                                              final_state, True, True, True, False, False, None,
                                              True)
        # the residuals' rows: a bound from shapes (ceil(T / 64) + N with cu_seqlens)
        # ... and the segments' start states: none on the CPU (kdagen.runtime.segments)
        assert [tuple(r.shape) for r in res] == [(64 + 3, 8, 64, 64)] * len(ops.RESIDUALS) + [(0,)]
        assert o.shape == v.shape and o.dtype == BF16
        assert ht.dtype == F32 and ht.shape == ((3, 8, 128, 128) if final_state else (0,))
        dht = torch.empty(3, 8, 128, 128) if final_state else None
        grads = torch.ops.kdagen.kda_bwd(o, dht, q, q, v, g, beta, A_log, dt_bias, h0, cu, 0.1,
                                         True, True, True, False, False, None, list(res))
        for gr, like in zip(grads, (q, q, v, g, beta, A_log, dt_bias, h0)):
            assert gr.shape == like.shape and gr.dtype == like.dtype
        # GDN, batch 2, no optional tensors: empty placeholders for the absent gradients
        q = torch.empty(2, 100, 4, 64, dtype=torch.float16)
        v = torch.empty(2, 100, 4, 64, dtype=torch.float16)
        g, beta = torch.empty(2, 100, 4), torch.empty(2, 100, 4)
        o, ht, res = torch.ops.kdagen.gdn_fwd(q, q, v, g, beta, None, None, None, None, 0.1,
                                              final_state, False, False, False, False, False,
                                              None, False)
        assert [tuple(r.shape) for r in res] == [(0,)] * (len(ops.RESIDUALS) + 1)
        assert o.shape == v.shape and o.dtype == torch.float16
        assert ht.shape == ((2, 4, 64, 64) if final_state else (0,))
        dht = torch.empty(2, 4, 64, 64) if final_state else None
        dq, dk, dv, dg, dbeta, dA, ddt, dh0 = torch.ops.kdagen.gdn_bwd(
            o, dht, q, q, v, g, beta, None, None, None, None, 0.1, False, False, False, False, False,
            None, list(res))
        assert dg.shape == g.shape and dg.dtype == F32 and dv.dtype == torch.float16
        assert dA.shape == ddt.shape == dh0.shape == (0,)


def test_fake_tensor_tracing_of_the_api_with_autograd():
    """The API under FakeTensorMode: validation reads no cu_seqlens values, autograd works."""
    with executor_for_cpu(_Refuse()), FakeTensorMode():
        q = torch.empty(1, 300, 2, 64, dtype=BF16, requires_grad=True)
        k = torch.empty(1, 300, 2, 64, dtype=BF16, requires_grad=True)
        v = torch.empty(1, 300, 4, 64, dtype=BF16, requires_grad=True)
        g = torch.empty(1, 300, 4, dtype=F32, requires_grad=True)
        beta = torch.empty(1, 300, 4, dtype=BF16, requires_grad=True)
        h0 = torch.empty(2, 4, 64, 64, requires_grad=True)
        cu = torch.empty(3, dtype=torch.int32)
        o, ht = kdagen.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                              output_final_state=True, cu_seqlens=cu)
        assert o.shape == (1, 300, 4, 64) and ht.shape == (2, 4, 64, 64)
        (o.float().sum() + ht.sum()).backward()
        assert q.grad.shape == q.shape and g.grad.dtype == F32 and h0.grad.shape == h0.shape


def test_meta_device():
    q = torch.empty(1, 64, 1, 64, device="meta", dtype=BF16)
    v = torch.empty(1, 64, 1, 64, device="meta", dtype=BF16)
    g = torch.empty(1, 64, 1, 64, device="meta")
    beta = torch.empty(1, 64, 1, device="meta")
    o, ht = kdagen.chunk_kda(q, q, v, g, beta, output_final_state=True)
    assert o.device.type == "meta" and o.shape == v.shape and ht.shape == (1, 1, 64, 64)


# ------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) of a training step
# ------------------------------------------------------------------------------------------


def _grads_after(step, params, inputs):
    for p in params:
        p.grad = None
    loss = step(*inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_compile_training_step_matches_eager(family):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    HV, K = 2, 64
    W = torch.nn.Parameter(torch.randn(K, K, generator=gen) / K ** 0.5)   # a learnable v projection
    if family == "kda":
        x, flags = make_inputs("kda", dtype=F32, T=40, H=1, HV=HV, gate="softplus", beta_sigmoid=True)
        fn = kdagen.chunk_kda
    else:
        x, flags = make_inputs("gdn", dtype=F32, lengths=[30, 10], H=1, HV=HV)
        fn = kdagen.chunk_gated_delta_rule
    names = list(x)

    def step(*tensors):
        kw = dict(zip(names, tensors))
        kw["v"] = kw["v"] @ W
        o, ht = fn(**kw, **flags)
        return (o.float() ** 2).mean() + 0.1 * ht.square().mean()

    params = [W] + [x[n] for n in names]
    inputs = [x[n] for n in names]
    loss_eager, grads_eager = _grads_after(step, params, inputs)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    loss_c, grads_c = _grads_after(compiled, params, inputs)
    assert counter.frame_count == 1
    torch.testing.assert_close(loss_c, loss_eager, rtol=1e-6, atol=0)
    for n, a, b in zip(["W"] + names, grads_c, grads_eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")
    # a second call reuses the compiled graph
    _grads_after(compiled, params, inputs)
    assert counter.frame_count == 1


# ------------------------------------------------------------------------------------------
# flags -> program options and program inputs (a recording executor: no interpreter)
# ------------------------------------------------------------------------------------------


class Recorder(Executor):
    name = "recorder"

    def __init__(self):
        self.calls = []

    def run(self, program, options, inputs, outputs):
        self.calls.append((program, dict(options), {k for k, v in inputs.items() if v is not None},
                           dict(outputs)))
        return {n: torch.zeros(s.shape, dtype=s.dtype) for n, s in outputs.items()}


MAPPING = {
    # FLA chunk_kda defaults: precomputed gate, plain beta
    "kda_defaults": (dict(family="kda"), {}, "precomputed", {"g", "beta"}, {"dg", "dbeta"}),
    "kda_softplus": (dict(family="kda", gate="softplus", beta_sigmoid=True), {}, "softplus",
                     {"g_raw", "beta_raw", "A_log", "dt_bias"}, {"dg_raw", "dbeta_raw", "dA_log", "ddt_bias"}),
    "kda_lower_bound": (dict(family="kda", gate="lower_bound", lower_bound=-2.0), {}, "lower_bound",
                        {"g_raw", "beta", "A_log", "dt_bias"}, {"dg_raw", "dbeta", "dA_log", "ddt_bias"}),
    "kda_promise": (dict(family="kda", lower_bound=-4.0), {}, "precomputed", {"g", "beta"}, {"dg", "dbeta"}),
    "gdn_defaults": (dict(family="gdn", HV=4, H=2, lengths=[3, 9]), {}, "gdn_precomputed",
                     {"g", "beta", "cu_seqlens"}, {"dg", "dbeta"}),
    "gdn_softplus_neg": (dict(family="gdn", gate="softplus", beta_sigmoid=True),
                         {"allow_neg_eigval": True}, "gdn_softplus",
                         {"g_raw", "beta_raw", "A_log", "dt_bias"}, {"dg_raw", "dbeta_raw", "dA_log", "ddt_bias"}),
}


@pytest.mark.parametrize("name", list(MAPPING))
def test_flags_map_to_program_options(name):
    spec, extra, gate, in_names, grad_names = MAPPING[name]
    spec = dict(spec)
    family = spec.pop("family")
    x, flags = make_inputs(family, dtype=BF16, T=spec.pop("T", 12), **spec)
    flags.update(extra)
    with executor_for_cpu(Recorder()) as rec:
        o, ht = (kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule)(**x, **flags)
        (o.float().sum() + ht.sum()).backward()
    (fprog, fopts, fins, fouts), (bprog, bopts, bins, bouts) = rec.calls
    assert (fprog, bprog) == (f"{family}_fwd", f"{family}_bwd")
    assert fopts == bopts
    assert fopts["gate"] == gate
    assert fopts["dtype"] == "bf16" and fopts["head_k_dim"] == 64 and fopts["head_v_dim"] == 64
    assert fopts["gva_ratio"] == x["v"].shape[2] // x["q"].shape[2]
    assert fopts["use_initial_state"] and fopts["output_final_state"] and fopts["use_qk_l2norm_in_kernel"]
    assert fopts["varlen"] == ("cu_seqlens" in flags)
    assert fopts["use_beta_sigmoid_in_kernel"] == flags.get("use_beta_sigmoid_in_kernel", False)
    assert fopts["allow_neg_eigval"] == extra.get("allow_neg_eigval", False)
    if flags.get("safe_gate"):
        assert fopts["lower_bound"] == flags["lower_bound"]
    else:
        assert "lower_bound" not in fopts
    assert fins == {"q", "k", "v", "scale", "initial_state"} | in_names
    # training: the forward saves the residuals, the backward reads them (same options)
    residuals = set(ops.RESIDUALS)
    assert set(fouts) == {"o", "final_state"} | residuals and fopts["save_residuals"]
    assert bins == fins | {"do", "dht"} | residuals
    assert set(bouts) == {"dq", "dk", "dv", "dh0"} | grad_names
    if "dt_bias" in in_names and family == "kda":
        assert bouts["ddt_bias"].shape == (x["v"].shape[2], 64)


def test_allow_neg_eigval_without_beta_sigmoid_is_ignored():
    """As in FLA (and kdagen.reference): allow_neg_eigval only modifies an in-kernel sigmoid."""
    x, flags = make_inputs("kda", dtype=BF16, T=8)
    with executor_for_cpu(Recorder()) as rec, torch.no_grad():
        kdagen.chunk_kda(**x, **flags, allow_neg_eigval=True)
    assert rec.calls[0][1]["allow_neg_eigval"] is False


@pytest.mark.parametrize("through", ["o", "final_state"])
def test_backward_makes_no_zero_gradients_for_the_residuals(through):
    """The forward's residual outputs never get a gradient; autograd must not fill zero
    tensors for them (a memset of every residual per backward on the GPU), and a backward
    through only one of o and the final state still runs (the other's zeros made by the op)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from kdagen.runtime.executors import RecordingExecutor
    x, flags = make_inputs("kda", dtype=F32, T=80, H=2)
    flags["output_final_state"] = True
    made = []

    class Fills(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.split(".")[0] in ("zeros", "zeros_like", "new_zeros", "zero_",
                                               "fill_", "full", "new_full"):
                made.append(tuple(out.shape))
            return out

    with executor_for_cpu(RecordingExecutor()) as rec:
        args = fwd_args("kda", x, flags, save_residuals=True)
        o, ht, residuals = ops.kda_fwd(*args)
        saved, segment_states = residuals[:len(ops.RESIDUALS)], residuals[-1]
        assert saved and all(r.dim() == 4 for r in saved)
        assert segment_states.numel() == 0         # no segments on the CPU
        residuals = saved
        with Fills():
            (o if through == "o" else ht).sum().backward()
    assert [c[0] for c in rec.calls] == ["kda_fwd", "kda_bwd"]
    shapes = {tuple(r.shape) for r in residuals}
    assert not shapes & set(made), (shapes, made)
    assert x["q"].grad is not None
