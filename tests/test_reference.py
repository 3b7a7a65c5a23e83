"""Tests of kdagen/reference.py: the float64 KDA/GDN references (docs/MATH.md §1, §5)."""

import math

import pytest
import torch

from kdagen import reference as R
from kdagen.validation import KdagenInputError

F64 = torch.float64
LN16 = math.log(16.0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The reference works on tiny tensors: intra-op threads only add overhead (and thrash when
    # other processes share the cores). Restore the setting for other test modules.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_inputs(op, B, T, H, HV, K, V, *, seed=0, h0=True, N=None, gate="softplus", dtype=F64):
    """Raw inputs for the entry points (in-kernel gate, beta sigmoid, l2norm all on)."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).to(dtype)

    N = B if N is None else N
    inp = dict(
        q=rn(B, T, H, K),
        k=rn(B, T, H, K),
        v=rn(B, T, HV, V),
        g=rn(B, T, HV, K) if op == "kda" else rn(B, T, HV),
        beta=rn(B, T, HV),
        # A_log up to ln 16 (strong decay with the softplus gate)
        A_log=torch.full((HV,), LN16, dtype=F64) - torch.rand(HV, generator=gen, dtype=F64),
        dt_bias=0.5 * (rn(HV, K) if op == "kda" else rn(HV)),
        initial_state=rn(N, HV, K, V) if h0 else None,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
    )
    inp["A_log"][0] = LN16
    if gate == "lower_bound":
        inp.update(safe_gate=True, lower_bound=-5.0)
    return inp


def entry(op):
    return R.chunk_kda if op == "kda" else R.chunk_gated_delta_rule


# ------------------------------------------------------------------------------------------
# hand-checkable cases
# ------------------------------------------------------------------------------------------

# One sequence, one head, T = 2, K = V = 2, scale = 1, precomputed gates, no transforms.
Q = [[1.0, 1.0], [2.0, 0.0]]
KEYS = [[1.0, 0.0], [1.0, 1.0]]
VALS = [[3.0, 1.0], [0.0, 2.0]]
BETA = [0.5, 1.0]
H0 = [[1.0, 0.0], [0.0, 2.0]]  # S0[k_index][v_index]


def _hand_tensors(g):
    q = torch.tensor(Q, dtype=F64).view(1, 2, 1, 2)
    k = torch.tensor(KEYS, dtype=F64).view(1, 2, 1, 2)
    v = torch.tensor(VALS, dtype=F64).view(1, 2, 1, 2)
    beta = torch.tensor(BETA, dtype=F64).view(1, 2, 1)
    h0 = torch.tensor(H0, dtype=F64).view(1, 1, 2, 2)
    return q, k, v, g, beta, h0


def _run_all_forms(op, q, k, v, g, beta, h0, scale):
    """The same case through the recurrence, the chunked reference and the entry point."""
    results = [R.recurrent_gated_delta(q, k, v, g, beta, scale, h0, True)]
    for C in (1, 2, 3):
        results.append(R.chunked_gated_delta(q, k, v, g, beta, scale, h0, True, chunk_size=C))
    results.append(entry(op)(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True))
    results.append(entry(op)(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True,
                             chunk_size=64))
    return results


def test_hand_computed_kda():
    # per-channel decays exp(g1) = [1/2, 1/4], exp(g2) = [1, 1/2]
    g = torch.tensor([[math.log(0.5), math.log(0.25)], [0.0, math.log(0.5)]], dtype=F64).view(1, 2, 1, 2)
    # t = 1: S = diag(.5,.25) S0 = [[.5, 0], [0, .5]]
    #        S^T k1 = row 0 = [.5, 0];  e = [3, 1] - [.5, 0] = [2.5, 1]
    #        S += .5 * k1 (x) e -> row 0 += [1.25, .5]  ->  S = [[1.75, .5], [0, .5]]
    #        o1 = S^T q1 = row0 + row1 = [1.75, 1.0]
    # t = 2: S = diag(1, .5) S = [[1.75, .5], [0, .25]]
    #        S^T k2 = row0 + row1 = [1.75, .75];  e = [0, 2] - [1.75, .75] = [-1.75, 1.25]
    #        S += 1 * k2 (x) e -> both rows += e  ->  S = [[0, 1.75], [-1.75, 1.5]]
    #        o2 = S^T q2 = 2 * row0 = [0, 3.5]
    o_expected = torch.tensor([[1.75, 1.0], [0.0, 3.5]], dtype=F64).view(1, 2, 1, 2)
    s_expected = torch.tensor([[0.0, 1.75], [-1.75, 1.5]], dtype=F64).view(1, 1, 2, 2)
    q, k, v, g, beta, h0 = _hand_tensors(g)
    for o, ht in _run_all_forms("kda", q, k, v, g, beta, h0, 1.0):
        torch.testing.assert_close(o, o_expected, rtol=0, atol=1e-14)
        torch.testing.assert_close(ht, s_expected, rtol=0, atol=1e-14)
    # scale multiplies o only
    o, ht = R.recurrent_gated_delta(q, k, v, g, beta, 0.5, h0, True)
    torch.testing.assert_close(o, 0.5 * o_expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(ht, s_expected, rtol=0, atol=1e-14)


def test_hand_computed_gdn():
    # scalar decays exp(g1) = exp(g2) = 1/2
    g = torch.tensor([math.log(0.5), math.log(0.5)], dtype=F64).view(1, 2, 1)
    # t = 1: S = .5 S0 = [[.5, 0], [0, 1]];  S^T k1 = [.5, 0];  e = [2.5, 1]
    #        row 0 += .5 * e = [1.25, .5]  ->  S = [[1.75, .5], [0, 1]];  o1 = row0 + row1 = [1.75, 1.5]
    # t = 2: S = .5 S = [[.875, .25], [0, .5]];  S^T k2 = [.875, .75];  e = [-.875, 1.25]
    #        both rows += e  ->  S = [[0, 1.5], [-.875, 1.75]];  o2 = 2 * row0 = [0, 3]
    o_expected = torch.tensor([[1.75, 1.5], [0.0, 3.0]], dtype=F64).view(1, 2, 1, 2)
    s_expected = torch.tensor([[0.0, 1.5], [-0.875, 1.75]], dtype=F64).view(1, 1, 2, 2)
    q, k, v, g, beta, h0 = _hand_tensors(g)
    for o, ht in _run_all_forms("gdn", q, k, v, g, beta, h0, 1.0):
        torch.testing.assert_close(o, o_expected, rtol=0, atol=1e-14)
        torch.testing.assert_close(ht, s_expected, rtol=0, atol=1e-14)


def test_hand_computed_transforms():
    x = torch.tensor([[3.0, 4.0]], dtype=F64)
    torch.testing.assert_close(R.l2norm(x), torch.tensor([[3.0, 4.0]], dtype=F64) / math.sqrt(25.0 + 1e-6))
    torch.testing.assert_close(R.l2norm(x, eps=0.0), torch.tensor([[0.6, 0.8]], dtype=F64))
    b = torch.tensor([0.0, math.log(3.0)], dtype=F64)  # sigmoid: 1/2, 3/4
    torch.testing.assert_close(R.beta_sigmoid(b), torch.tensor([0.5, 0.75], dtype=F64))
    torch.testing.assert_close(R.beta_sigmoid(b, allow_neg_eigval=True), torch.tensor([1.0, 1.5], dtype=F64))

    # KDA, HV = 2, K = 2. head 0: A = exp(ln 2) = 2; head 1: A = 1.
    A_log = torch.tensor([math.log(2.0), 0.0], dtype=F64)
    dt_bias = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=F64)
    g_raw = torch.tensor([[0.0, -1.0], [1.0, math.log(math.e - 1)]], dtype=F64)  # [HV, K]
    # x = g_raw + dt_bias = [[0, 0], [0, ln(e - 1)]]; softplus(0) = ln 2, softplus(ln(e-1)) = 1
    sp = torch.tensor([[-2 * math.log(2), -2 * math.log(2)], [-math.log(2), -1.0]], dtype=F64)
    torch.testing.assert_close(R.kda_gate_softplus(g_raw, A_log, dt_bias), sp)
    torch.testing.assert_close(R.kda_gate_softplus(g_raw, A_log, dt_bias.flatten()), sp)
    # lower bound -4: sigmoid(A * x): head 0 -> sigmoid(0) = 1/2; head 1 -> [1/2, sigmoid(ln(e-1)) = (e-1)/e]
    lb = torch.tensor([[-2.0, -2.0], [-2.0, -4 * (math.e - 1) / math.e]], dtype=F64)
    torch.testing.assert_close(R.kda_gate_lower_bound(g_raw, A_log, dt_bias, -4.0), lb)

    # GDN, HV = 2: x = g_raw + dt_bias = [0, ln 3]; softplus(ln 3) = ln 4
    g_raw = torch.tensor([[1.0, math.log(3.0) - 1.0]], dtype=F64)  # [T=1, HV]
    dtb = torch.tensor([-1.0, 1.0], dtype=F64)
    torch.testing.assert_close(R.gdn_gate_softplus(g_raw, A_log, dtb),
                               torch.tensor([[-2 * math.log(2), -math.log(4)]], dtype=F64))
    # lower bound: head 0 sigmoid(2 * 0) = 1/2, head 1 sigmoid(ln 3) = 3/4
    torch.testing.assert_close(R.gdn_gate_lower_bound(g_raw, A_log, dtb, -2.0),
                               torch.tensor([[-1.0, -1.5]], dtype=F64))
    # the softplus is exact far out (no linearisation threshold): softplus(30) - 30 = log1p(e^-30)
    big = R.gdn_gate_softplus(torch.tensor([30.0], dtype=F64), torch.zeros(1, dtype=F64),
                              torch.zeros(1, dtype=F64))
    assert abs(float(big) + 30.0 + math.exp(-30.0)) < 1e-14


# ------------------------------------------------------------------------------------------
# recurrence vs chunked reference
# ------------------------------------------------------------------------------------------

TOL = 1e-10


def _compare(op, inp, chunk_sizes, cu_seqlens=None):
    fn = entry(op)
    o_ref, h_ref = fn(**inp, cu_seqlens=cu_seqlens)
    assert o_ref.dtype == F64 and torch.isfinite(o_ref).all() and torch.isfinite(h_ref).all()
    assert o_ref.abs().max() > 0
    for C in chunk_sizes:
        o, h = fn(**inp, cu_seqlens=cu_seqlens, chunk_size=C)
        assert R.rel_err(o, o_ref) <= TOL, (C, R.rel_err(o, o_ref))
        assert R.rel_err(h, h_ref) <= TOL, (C, R.rel_err(h, h_ref))
    return o_ref, h_ref


@pytest.mark.parametrize("op", ["kda", "gdn"])
@pytest.mark.parametrize("gate", ["softplus", "lower_bound"])
@pytest.mark.parametrize("H,HV", [(4, 4), (2, 4), (1, 4)])
@pytest.mark.parametrize("h0", [True, False])
def test_recurrence_matches_chunked(op, gate, H, HV, h0):
    # T = 100 is not a multiple of either chunk size: full chunks plus a tail
    inp = make_inputs(op, 2, 100, H, HV, 16, 8, gate=gate, h0=h0, seed=H * 7 + HV + h0)
    _compare(op, inp, (64, 16))


@pytest.mark.parametrize("T", [1, 63, 64, 65])
def test_chunk_boundaries(T):
    for op in ("kda", "gdn"):
        _compare(op, make_inputs(op, 1, T, 2, 2, 8, 8, seed=T), (64,))


@pytest.mark.parametrize("op", ["kda", "gdn"])
@pytest.mark.parametrize("gate", ["softplus", "lower_bound"])
def test_varlen_matches_chunked_and_per_sequence(op, gate):
    lengths = [1, 17, 64, 129, 1000]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32)
    inp = make_inputs(op, 1, offsets[-1], 1, 2, 16, 16, N=len(lengths), gate=gate, seed=3)
    o_ref, h_ref = _compare(op, inp, (64, 16), cu_seqlens=cu)
    # independent check of the varlen plumbing: each sequence on its own
    for n in range(len(lengths)):
        s, e = offsets[n], offsets[n + 1]
        one = dict(inp)
        for name in ("q", "k", "v", "g", "beta"):
            one[name] = inp[name][:, s:e]
        one["initial_state"] = inp["initial_state"][n : n + 1]
        o, h = entry(op)(**one)
        assert R.rel_err(o_ref[:, s:e], o) <= 1e-14
        assert R.rel_err(h_ref[n : n + 1], h) <= 1e-14


@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_gva_equals_repeated_heads(op):
    inp = make_inputs(op, 2, 20, 2, 6, 8, 4, seed=11)
    o, h = entry(op)(**inp)
    rep = dict(inp)
    rep["q"] = inp["q"].repeat_interleave(3, dim=2)  # value head h uses q/k head h // 3
    rep["k"] = inp["k"].repeat_interleave(3, dim=2)
    o2, h2 = entry(op)(**rep)
    assert R.rel_err(o, o2) <= 1e-14 and R.rel_err(h, h2) <= 1e-14
    # and a wrong grouping (h % H instead of h // group) gives a different answer
    wrong = dict(inp)
    wrong["q"] = inp["q"].repeat(1, 1, 3, 1)
    wrong["k"] = inp["k"].repeat(1, 1, 3, 1)
    assert R.rel_err(entry(op)(**wrong)[0], o) > 1e-3


def test_strong_decay_stays_exact():
    # Very strong decay: g as low as ~ -16 * 6 per token; exp(Γ) over a chunk underflows in
    # float64 but the relative form stays finite and matches the recurrence.
    inp = make_inputs("kda", 1, 200, 1, 1, 8, 8, seed=5)
    inp["g"] = inp["g"] * 3 + 3
    o, h = _compare("kda", inp, (64, 128))
    g = R.kda_gate_softplus(inp["g"], inp["A_log"], inp["dt_bias"])
    assert g.min() < -60  # the decay is strong, Γ over a 64-chunk is far below -700
    assert torch.isfinite(o).all() and torch.isfinite(h).all()


@pytest.mark.parametrize("op", ["kda", "gdn"])
@pytest.mark.parametrize("gate", ["softplus", "lower_bound"])
def test_strong_decay_gradients_recurrent_vs_chunked(op, gate):
    # autograd through the chunk form (masked relative exponents) stays finite and agrees with
    # autograd through the recurrence, for every input, under strong decay and GVA
    inp = make_inputs(op, 1, 150, 1, 2, 8, 8, seed=12, gate=gate)
    if gate == "softplus":
        inp["g"] = inp["g"] + 2.0
    gen = torch.Generator().manual_seed(13)
    do = torch.randn(1, 150, 2, 8, generator=gen, dtype=F64)
    dht = torch.randn(1, 2, 8, 8, generator=gen, dtype=F64)
    ref = R.reference_grads(entry(op), inp, do, dht)
    for C in (64, 32):
        got = R.reference_grads(entry(op), dict(inp, chunk_size=C), do, dht)
        for name in GRAD_NAMES:
            assert torch.isfinite(got[name]).all(), name
            assert R.rel_err(got[name], ref[name]) <= 1e-9, (name, C, R.rel_err(got[name], ref[name]))


def test_precomputed_gates_and_flags():
    B, T, H, HV, K, V = 1, 30, 2, 2, 8, 8
    inp = make_inputs("kda", B, T, H, HV, K, V, seed=9, gate="lower_bound")
    o, h = R.chunk_kda(**inp)
    # same call with every transform done outside
    g = R.kda_gate_lower_bound(inp["g"], inp["A_log"], inp["dt_bias"], -5.0)
    assert g.min() >= -5.0 and g.max() < 0
    beta = R.beta_sigmoid(inp["beta"])
    o2, h2 = R.chunk_kda(R.l2norm(inp["q"]), R.l2norm(inp["k"]), inp["v"], g, beta,
                         initial_state=inp["initial_state"], output_final_state=True,
                         safe_gate=True, lower_bound=-5.0)
    assert R.rel_err(o2, o) <= 1e-14 and R.rel_err(h2, h) <= 1e-14
    # the core functions directly, explicit default scale K ** -0.5
    o3, h3 = R.recurrent_gated_delta(R.l2norm(inp["q"]), R.l2norm(inp["k"]), inp["v"], g, beta,
                                     K ** -0.5, inp["initial_state"], True)
    assert R.rel_err(o3, o) <= 1e-14 and R.rel_err(h3, h) <= 1e-14
    # flattened dt_bias [HV * K] is the same as [HV, K]
    flat = dict(inp, dt_bias=inp["dt_bias"].flatten())
    assert R.rel_err(R.chunk_kda(**flat)[0], o) == 0.0
    # allow_neg_eigval doubles the sigmoid
    o4, _ = R.chunk_kda(**inp, allow_neg_eigval=True)
    o5, _ = R.chunk_kda(**dict(inp, use_beta_sigmoid_in_kernel=False, beta=2 * beta), allow_neg_eigval=True)
    assert R.rel_err(o4, o5) <= 1e-14 and R.rel_err(o4, o) > 1e-3
    # lower_bound without safe_gate is ignored (softplus form), as in FLA
    o6, _ = R.chunk_kda(**dict(inp, safe_gate=False))
    o7, _ = R.chunk_kda(**dict(inp, safe_gate=False, lower_bound=None))
    assert R.rel_err(o6, o7) == 0.0 and R.rel_err(o6, o) > 1e-3
    # no final state unless asked for; outputs are float64 whatever the input dtype
    o8, h8 = R.chunk_kda(**dict(inp, output_final_state=False, q=inp["q"].float(), k=inp["k"].float(),
                                v=inp["v"].float()))
    assert h8 is None and o8.dtype == F64
    assert R.rel_err(o8, o) < 1e-5


def test_gdn_precomputed_log_gate_passthrough():
    inp = make_inputs("gdn", 2, 40, 1, 2, 8, 8, seed=4)
    o, h = R.chunk_gated_delta_rule(**inp)
    g = R.gdn_gate_softplus(inp["g"], inp["A_log"], inp["dt_bias"])
    o2, h2 = R.chunk_gated_delta_rule(R.l2norm(inp["q"]), R.l2norm(inp["k"]), inp["v"], g,
                                      R.beta_sigmoid(inp["beta"]), None, inp["initial_state"], True)
    assert R.rel_err(o2, o) <= 1e-14 and R.rel_err(h2, h) <= 1e-14


def test_entry_points_validate_and_fla_kwargs():
    inp = make_inputs("kda", 1, 8, 1, 1, 4, 4)
    with pytest.raises(KdagenInputError, match="k: expected shape"):
        R.chunk_kda(**dict(inp, k=inp["k"][..., :3]))
    with pytest.raises(KdagenInputError, match="dt_bias: required"):
        R.chunk_kda(**dict(inp, dt_bias=None))
    with pytest.raises(KdagenInputError, match="g: expected shape"):
        R.chunk_gated_delta_rule(**inp)  # a KDA gate passed to GDN
    with pytest.raises(TypeError, match="not_an_argument"):
        R.chunk_kda(**inp, not_an_argument=1)
    o, _ = R.chunk_kda(**inp, chunk_indices=None, cu_seqlens_cpu=None)  # FLA-only, ignored
    assert R.rel_err(o, R.chunk_kda(**inp)[0]) == 0.0
    with pytest.raises(ValueError, match="chunk_size"):
        R.chunk_kda(**inp, chunk_size=0)


def test_recurrence_long_sequence():
    # No wall-clock bound here: timings belong in benchmarks (CI runs on 2 shared cores).
    inp = make_inputs("kda", 1, 3000, 2, 4, 32, 32, seed=1)
    o, h = R.chunk_kda(**inp)
    assert o.shape == (1, 3000, 4, 32) and torch.isfinite(o).all()


# ------------------------------------------------------------------------------------------
# gradients
# ------------------------------------------------------------------------------------------

GRAD_NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")


def _gradcheck(op, gate, chunk_size, cu_seqlens=None, T=5, N=None):
    inp = make_inputs(op, 1, T, 1, 2, 3, 2, seed=2, gate=gate, N=N)
    inp["chunk_size"] = chunk_size
    inp["cu_seqlens"] = cu_seqlens
    tensors = tuple(inp[n].detach().clone().requires_grad_(True) for n in GRAD_NAMES)

    def f(*ts):
        return entry(op)(**dict(inp, **dict(zip(GRAD_NAMES, ts))))

    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-8, rtol=1e-6)
    grads = torch.autograd.grad(sum(x.sum() for x in f(*tensors)), tensors)
    for name, gr in zip(GRAD_NAMES, grads):  # every input really receives a gradient
        assert gr.abs().max() > 0, name


@pytest.mark.parametrize("op", ["kda", "gdn"])
@pytest.mark.parametrize("gate", ["softplus", "lower_bound"])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_gradcheck_entry_points(op, gate, chunk_size):
    _gradcheck(op, gate, chunk_size)


@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_gradcheck_varlen_chunked(op):
    _gradcheck(op, "softplus", 2, cu_seqlens=torch.tensor([0, 3, 4, 7]), T=7, N=3)


@pytest.mark.parametrize("op", ["kda", "gdn"])
@pytest.mark.parametrize("core", ["recurrent", "chunked"])
def test_gradcheck_cores_precomputed_gate(op, core):
    gen = torch.Generator().manual_seed(8)
    B, T, H, HV, K, V = 1, 5, 1, 2, 3, 2
    q = R.l2norm(torch.randn(B, T, H, K, generator=gen, dtype=F64))
    k = R.l2norm(torch.randn(B, T, H, K, generator=gen, dtype=F64))
    v = torch.randn(B, T, HV, V, generator=gen, dtype=F64)
    g = -torch.rand(*((B, T, HV, K) if op == "kda" else (B, T, HV)), generator=gen, dtype=F64)
    beta = torch.rand(B, T, HV, generator=gen, dtype=F64)
    h0 = torch.randn(B, HV, K, V, generator=gen, dtype=F64)
    tensors = tuple(x.requires_grad_(True) for x in (q, k, v, g, beta, h0))

    def f(q, k, v, g, beta, h0):
        if core == "recurrent":
            return R.recurrent_gated_delta(q, k, v, g, beta, 0.7, h0, True)
        return R.chunked_gated_delta(q, k, v, g, beta, 0.7, h0, True, chunk_size=2)

    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_reference_grads_helper():
    inp = make_inputs("kda", 1, 12, 1, 2, 4, 4, seed=6)
    low = {n: (x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and n != "initial_state" else x)
           for n, x in inp.items()}
    low["chunk_size"] = 4
    do = torch.randn(1, 12, 2, 4, dtype=F64)
    dht = torch.randn(1, 2, 4, 4, dtype=F64)
    res = R.reference_grads(R.chunk_kda, low, do, dht)
    assert set(GRAD_NAMES) <= set(res) and "o" in res and "final_state" in res
    for n in GRAD_NAMES:
        assert res[n].dtype == F64 and res[n].shape == low[n].shape
    # same numbers as plain autograd on the float64 cast of the same inputs
    leaves = {n: low[n].detach().to(F64).requires_grad_(True) for n in GRAD_NAMES}
    o, h = R.chunk_kda(**dict(low, **leaves))
    grads = torch.autograd.grad((o * do).sum() + (h * dht).sum(), list(leaves.values()))
    for n, gr in zip(leaves, grads):
        assert R.rel_err(res[n], gr) <= 1e-14, n
    assert R.rel_err(res["o"], o) == 0.0
    # dht contributes: without it the gradients differ (v of the last tokens feeds ht directly)
    res2 = R.reference_grads(R.chunk_kda, low, do)
    assert R.rel_err(res2["v"], res["v"]) > 1e-3
    # an input that does not influence the output gets None
    res3 = R.reference_grads(R.chunk_kda, dict(low, use_gate_in_kernel=False, g=-torch.rand(1, 12, 2, 4)), do)
    assert res3["A_log"] is None and res3["dt_bias"] is None and res3["g"] is not None
    with pytest.raises(ValueError, match="dht"):
        R.reference_grads(R.chunk_kda, dict(low, output_final_state=False), do, dht)


def test_rel_err():
    a = torch.tensor([1.0, 0.0])
    b = torch.tensor([1.0, 1.0])
    assert R.rel_err(a, b) == pytest.approx(1 / math.sqrt(2))
    assert R.rel_err(b, b) == 0.0
    assert R.rel_err(torch.zeros(3), torch.zeros(3)) == 0.0
    assert R.rel_err(torch.tensor([3.0, 4.0]), torch.zeros(2)) == pytest.approx(5.0)  # absolute
    assert R.rel_err(torch.tensor([1.0, float("nan")]), b) == math.inf
    assert R.rel_err(torch.tensor([1.0, float("inf")]), b) == math.inf
    assert R.rel_err(b.to(torch.bfloat16), b.to(F64)) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        R.rel_err(torch.zeros(2), torch.zeros(3))
