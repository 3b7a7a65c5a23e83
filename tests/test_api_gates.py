"""kdagen.chunk_kda / chunk_gated_delta_rule with gate=: a researcher's gate (loaded from its
file) through the torch ops on CPU (the interpreter): values and gradients for every gate
parameter against autograd of the float64 reference, torch.compile(fullgraph) of a training
step, opcheck of the gated ops, clear errors, and kernels keyed by the gate's source."""
import sys
from pathlib import Path

import pytest
import torch

import kdagen
from kdagen import reference as R
from kdagen.ir import gates
from kdagen.validation import KdagenInputError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "gates"


def _load(name):
    (gate,) = gates.load_gate_file(EXAMPLES / name)
    return gate, sys.modules[gate.fn.__module__]


def _inputs(family, T=40, H=1, HV=2, K=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)   # noqa: E731
    g = r(1, T, HV, K) if family == "kda" else r(1, T, HV)
    return dict(q=r(1, T, H, K), k=r(1, T, H, K), v=r(1, T, HV, K), g=g - 1.0, beta=r(1, T, HV),
                initial_state=r(1, HV, K, K) * 0.3)


@pytest.mark.parametrize("name", ["kda_channel_rate.py", "gdn_temperature.py"])
def test_gate_values_and_gradients_match_the_reference(name):
    gate, mod = _load(name)
    x = _inputs(gate.family)
    params = {n: t.float() for n, t in mod.sample_params(2, 64, "strong",
                                                         torch.Generator().manual_seed(1)).items()}
    fn = kdagen.chunk_kda if gate.family == "kda" else kdagen.chunk_gated_delta_rule
    ref_fn = R.chunk_kda if gate.family == "kda" else R.chunk_gated_delta_rule
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              output_final_state=True)
    leaves = {n: t.clone().requires_grad_(True) for n, t in {**x, **params}.items()}
    o, ht = fn(**{n: leaves[n] for n in x}, gate=gate.name,
               gate_params={n: leaves[n] for n in params}, **kw)
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    torch.autograd.backward([o, ht], [do, dht])
    ref = R.reference_grads(lambda **a: ref_fn(**{n: a[n] for n in x}, gate=gate,
                                               gate_params={n: a[n] for n in params}, **kw),
                            {**x, **params}, do, dht)
    assert R.rel_err(o, ref["o"]) < 1e-5 and R.rel_err(ht, ref["final_state"]) < 1e-5
    for n, leaf in leaves.items():
        assert leaf.grad is not None and R.rel_err(leaf.grad, ref[n]) < 1e-4, n


def test_builtin_keywords_fill_the_gates_parameters_and_match_the_builtin_gate():
    """gate="softplus" with A_log=/dt_bias= is the built-in in-kernel gate."""
    x = _inputs("kda")
    A_log, dt_bias = torch.randn(2) * 0.3, torch.randn(2, 64) * 0.3
    a, _ = kdagen.chunk_kda(**x, gate="softplus", A_log=A_log, dt_bias=dt_bias)
    b, _ = kdagen.chunk_kda(**x, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_compile_training_step_with_a_custom_gate_matches_eager():
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    gate, mod = _load("sq_sigmoid.py")
    x = _inputs("kda", T=24)
    A_log = torch.nn.Parameter(torch.full((2,), 0.5))
    dt_bias = torch.nn.Parameter(torch.zeros(2, 64))
    W = torch.nn.Parameter(torch.eye(64) + 0.01 * torch.randn(64, 64, generator=torch.Generator().manual_seed(4)))

    def step(q, k, v, g, beta):
        o, ht = kdagen.chunk_kda(q, k, v @ W, g, beta, output_final_state=True,
                                 use_qk_l2norm_in_kernel=True, gate="sq_sigmoid",
                                 gate_params={"A_log": A_log, "dt_bias": dt_bias})
        return (o ** 2).mean() + 0.1 * ht.square().mean()

    params = [A_log, dt_bias, W]
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]

    def run(f):
        for p in params:
            p.grad = None
        loss = f(*args)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in params]

    loss_e, grads_e = run(step)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    loss_c, grads_c = run(compiled)
    assert counter.frame_count == 1
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=0)
    for a, b in zip(grads_c, grads_e):
        assert a.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_opcheck_gated_ops(which):
    _load("kda_channel_rate.py")
    x = _inputs("kda", T=20)
    params = [torch.randn(2, 64) * 0.3, torch.randn(2, 64) * 0.3]
    flags = (x["initial_state"], None, 64 ** -0.5)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], params, *flags)
    if which == "fwd":
        args = args + (True, True, True, False, "kda_channel_rate", "{}", True)
        op = torch.ops.kdagen.kda_gated_fwd.default
    else:
        do = torch.randn_like(x["v"])
        dht = torch.randn(1, 2, 64, 64)
        # the residuals its forward saved (save_residuals=True)
        residuals = list(torch.ops.kdagen.kda_gated_fwd(
            *args, True, True, True, False, "kda_channel_rate", "{}", True)[2])
        # ... and no segments' start states (the gated ops run whole sequences)
        assert [tuple(r.shape) for r in residuals] == [(1, 2, 64, 64)] * 2 + [(0,)]
        args = (do, dht) + args + (True, True, False, "kda_channel_rate", "{}", residuals)
        op = torch.ops.kdagen.kda_gated_bwd.default
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                 "test_autograd_registration"))


def test_errors_name_the_argument_and_the_fix():
    _load("kda_channel_rate.py")
    x = _inputs("kda", T=8)
    p = {"rate": torch.zeros(2, 64), "sharpness": torch.zeros(2, 64)}
    with pytest.raises(KdagenInputError, match="unknown gate"):
        kdagen.chunk_kda(**x, gate="no_such_gate")
    with pytest.raises(KdagenInputError, match=r"missing \['sharpness'\]"):
        kdagen.chunk_kda(**x, gate="kda_channel_rate", gate_params={"rate": p["rate"]})
    with pytest.raises(KdagenInputError, match="has no parameter 'A_log'"):
        kdagen.chunk_kda(**x, gate="kda_channel_rate", gate_params=p, A_log=torch.zeros(2))
    with pytest.raises(KdagenInputError, match=r"\[HV, K\]"):
        kdagen.chunk_kda(**x, gate="kda_channel_rate",
                         gate_params={**p, "rate": torch.zeros(2, 3)})
    with pytest.raises(KdagenInputError, match="use_gate_in_kernel"):
        kdagen.chunk_kda(**x, gate="kda_channel_rate", gate_params=p, use_gate_in_kernel=True)
    with pytest.raises(KdagenInputError, match="GDN gate"):
        kdagen.chunk_kda(**x, gate="gdn_softplus")
    with pytest.raises(KdagenInputError, match="gate_options.*no option|unknown option"):
        kdagen.chunk_kda(**x, gate="kda_channel_rate", gate_params=p, gate_options={"tau": 1})
    with pytest.raises(KdagenInputError, match="without gate="):
        kdagen.chunk_kda(**x, gate_params=p)


def test_compiled_kernels_are_keyed_by_the_gates_source(tmp_path):
    """The program options of a call carry the gate's digest; editing the gate file changes
    them, and so the compile cache's key (a new compile, not a stale hit)."""
    from kdagen import ops
    from kdagen.runtime.cache import cache_key
    path = tmp_path / "g.py"
    src = (EXAMPLES / "sq_sigmoid.py").read_text().replace('"sq_sigmoid"', '"keyed_gate"')
    path.write_text(src)
    x = _inputs("kda", T=8)

    def key():
        opts = ops.gated_program_options(
            "kda", x["q"], x["v"], x["g"], x["beta"], gate="keyed_gate", gate_options="{}",
            use_initial_state=True, varlen=False, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False)
        return opts, cache_key("kda_fwd", opts, "sm_90a", "NVIDIA H200", "13.0")

    gates.load_gate_file(path)
    (o1, k1), (o2, k2) = key(), key()
    assert k1 == k2 and o1["gate_digest"] == gates.get_gate("keyed_gate").digest
    path.write_text(src.replace("** 2", "** 4"))
    gates.load_gate_file(path)
    o3, k3 = key()
    assert k3 != k1 and o3["gate_digest"] != o1["gate_digest"]
    builtin, _ = ops.gated_program_options(
        "kda", x["q"], x["v"], x["g"], x["beta"], gate="softplus", gate_options="{}",
        use_initial_state=True, varlen=False, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        allow_neg_eigval=False), None
    assert "gate_digest" not in builtin          # built-ins: kdagen's source hash keys them
    gates.GATES.pop("keyed_gate")
