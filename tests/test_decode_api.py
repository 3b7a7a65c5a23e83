"""kdagen.fused_recurrent_kda / fused_recurrent_gated_delta_rule (kdagen.decode) on the CPU
(the decode programs in the interpreter): against the float64 pool reference
(kdagen.decode_reference) for plain, in-place pool, per-token (speculative) writes with
num_accepted_tokens, skipped sequences and dropped slots; prefill with the chunked op then
decode token by token equals the chunked op on the whole sequence; bad pool arguments name
themselves. A float32 pool goes through the pool ops (the kernel reads and writes the slots):
which program each case runs, permuted int32/int64 slots, opcheck, torch.compile and meta
tensors (nothing read on the host)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kdagen
from kdagen import reference as R
from kdagen.decode_reference import decode_pool_step
from kdagen.validation import KdagenInputError

K = V = 64


def _inputs(family, B, T, H=1, HV=2, seed=0, varlen_lengths=None, K=K, V=V):
    gen = torch.Generator().manual_seed(seed)
    if varlen_lengths is not None:
        B, T = 1, sum(varlen_lengths)

    def rnd(*shape, s=1.0):
        return torch.randn(*shape, generator=gen) * s
    x = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V),
             beta=torch.rand(B, T, HV, generator=gen))
    x["g"] = (-torch.rand(B, T, HV, K, generator=gen) * 0.5 if family == "kda"
              else -torch.rand(B, T, HV, generator=gen) * 0.5)
    return x


def _fn(family):
    return kdagen.fused_recurrent_kda if family == "kda" else kdagen.fused_recurrent_gated_delta_rule


def _ref_inputs(x, H, HV):
    """What the reference recurrence takes: L2-normalised q/k in float64, beta and g as given."""
    q = F.normalize(x["q"].double(), dim=-1, eps=1e-6 ** 0.5)
    k = F.normalize(x["k"].double(), dim=-1, eps=1e-6 ** 0.5)
    return q, k, x["v"].double(), x["g"].double(), x["beta"].double()


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_plain_decode_matches_the_chunked_reference(family):
    x = _inputs(family, B=3, T=4)
    h0 = torch.randn(3, 2, K, V) * 0.3
    o, ht = _fn(family)(**x, initial_state=h0, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
    ref = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    o_ref, ht_ref = ref(*(t.double() for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])),
                        initial_state=h0.double(), output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
    assert R.rel_err(o, o_ref) < 1e-5 and R.rel_err(ht, ht_ref) < 1e-5


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_pool_in_place_with_a_skipped_sequence(family):
    lengths = [1, 3, 2]
    x = _inputs(family, 0, 0, varlen_lengths=lengths)
    cu = torch.tensor([0, 1, 4, 6])
    pool = torch.randn(5, 2, K, V) * 0.3
    idx = torch.tensor([3, -1, 0])                 # sequence 1 is skipped
    want_o, want_pool = decode_pool_step(*_ref_inputs(x, 1, 2), state_pool=pool.double(),
                                         ssm_state_indices=idx, cu_seqlens=cu)
    before = pool.clone()
    o, out_pool = _fn(family)(**x, initial_state=pool, use_qk_l2norm_in_kernel=True,
                              cu_seqlens=cu, ssm_state_indices=idx, inplace_final_state=True)
    assert out_pool is pool
    assert R.rel_err(pool, want_pool) < 1e-5
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])        # untouched slots, exactly
    assert R.rel_err(o, want_o) < 1e-5
    assert torch.count_nonzero(o[0, 1:4]) == 0                     # the skipped sequence


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_speculative_per_token_writes_with_accepted_tokens(family):
    B, T = 3, 4
    x = _inputs(family, B, T, seed=1)
    pool = torch.randn(16, 2, K, V) * 0.3
    idx = torch.tensor([[0, 1, 2, 3], [4, 5, -1, 7], [8, 9, 10, 11]])   # one dropped state
    accepted = torch.tensor([2, 1, 4])
    want_o, want_pool = decode_pool_step(*_ref_inputs(x, 1, 2), state_pool=pool.double(),
                                         ssm_state_indices=idx, num_accepted_tokens=accepted)
    before = pool.clone()
    o, _ = _fn(family)(**x, initial_state=pool, use_qk_l2norm_in_kernel=True,
                       ssm_state_indices=idx, num_accepted_tokens=accepted,
                       inplace_final_state=True)
    assert R.rel_err(o, want_o) < 1e-5
    assert R.rel_err(pool, want_pool) < 1e-5
    assert torch.equal(pool[[6, 12, 13, 14, 15]], before[[6, 12, 13, 14, 15]])


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_prefill_then_decode_equals_the_chunked_op_on_the_whole_sequence(family):
    T, P = 70, 66                       # prefill 66 tokens, then 4 one-token decode steps
    x = _inputs(family, 1, T, seed=2)
    chunk = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    o_all, ht_all = chunk(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_pre, state = chunk(**{n: t[:, :P] for n, t in x.items()}, output_final_state=True,
                         use_qk_l2norm_in_kernel=True)
    outs = [o_pre]
    for t in range(P, T):
        o_t, state = _fn(family)(**{n: v[:, t:t + 1] for n, v in x.items()}, initial_state=state,
                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
        outs.append(o_t)
    assert R.rel_err(torch.cat(outs, dim=1), o_all) < 1e-5
    assert R.rel_err(state, ht_all) < 1e-5


def test_bad_pool_arguments_name_themselves():
    x = _inputs("kda", 2, 1)
    pool = torch.zeros(4, 2, K, V)
    f = kdagen.fused_recurrent_kda
    with pytest.raises(KdagenInputError, match="inplace_final_state"):
        f(**x, initial_state=pool, ssm_state_indices=torch.tensor([0, 1]))
    with pytest.raises(KdagenInputError, match="ssm_state_indices"):
        f(**x, initial_state=pool, ssm_state_indices=torch.tensor([0, 1, 2]),
          inplace_final_state=True)
    with pytest.raises(KdagenInputError, match="num_accepted_tokens"):
        f(**x, initial_state=pool, ssm_state_indices=torch.tensor([0, 1]),
          num_accepted_tokens=torch.tensor([1, 1]), inplace_final_state=True)
    with pytest.raises(KdagenInputError, match="initial_state"):
        f(**x, initial_state=pool[0], state_v_first=True)


def test_gdn_decode_takes_flas_argument_order_and_a_per_key_gate():
    """FLA's order (q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state, ...):
    positional g is the per-head gate; gk runs the per-key (KDA) recurrence; gv is refused."""
    x = _inputs("gdn", 2, 3, seed=4)
    h0 = torch.randn(2, 2, K, V) * 0.3
    o_kw, ht_kw = kdagen.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=h0,
        output_final_state=True)
    o_pos, ht_pos = kdagen.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], None, None, x["beta"], None, h0, True)
    assert torch.equal(o_kw, o_pos) and torch.equal(ht_kw, ht_pos)
    gk = x["g"][..., None].expand(2, 3, 2, K).contiguous()     # the same decay on every key
    o_gk, ht_gk = kdagen.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], gk=gk, beta=x["beta"], initial_state=h0, output_final_state=True)
    assert R.rel_err(o_gk, o_kw) < 1e-5 and R.rel_err(ht_gk, ht_kw) < 1e-5
    with pytest.raises(KdagenInputError, match="gv"):
        kdagen.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], gv=x["v"], beta=x["beta"])
    with pytest.raises(KdagenInputError, match="g / gk"):
        kdagen.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], beta=x["beta"])


def test_a_bf16_pool_stores_each_new_state_rounded_once():
    """A bf16 pool: each written slot holds the fp32 result rounded to bf16 exactly once (the
    fp32 pool's value, cast), skipped and dropped slots keep their bits."""
    x = _inputs("kda", 3, 2, seed=6)
    idx = torch.tensor([[4, 1], [-1, 2], [0, -1]])
    pool32 = (torch.randn(6, 2, K, V) * 0.3).to(torch.bfloat16).float()
    pool16 = pool32.to(torch.bfloat16)
    before = pool16.clone()
    kdagen.fused_recurrent_kda(**x, initial_state=pool32, ssm_state_indices=idx,
                               inplace_final_state=True)
    kdagen.fused_recurrent_kda(**x, initial_state=pool16, ssm_state_indices=idx,
                               inplace_final_state=True)
    assert torch.equal(pool16[[0, 1, 4]], pool32[[0, 1, 4]].to(torch.bfloat16))
    assert torch.equal(pool16[[2, 3, 5]], before[[2, 3, 5]])      # skipped / dropped / unused


def test_pool_scatter_reads_nothing_on_the_host():
    """The pool scatter is capturable in a CUDA graph (servers capture decode): no op reads a
    tensor on the host. Meta tensors have no data, so any .item() / data-dependent op raises.
    (A 0-d tensor index did: the H200's CUDA-graph test failed on it.)"""
    from kdagen.decode import _scatter_states
    pool = torch.empty(8, 2, 4, 4, device="meta")
    slots = torch.empty(3, dtype=torch.int64, device="meta")
    states = torch.empty(3, 2, 4, 4, device="meta")
    write = torch.empty(3, dtype=torch.bool, device="meta")
    _scatter_states(pool, slots, states, write)
    # and on real tensors it still writes exactly: rows 0 and 2 write, row 1 must not
    pool = torch.zeros(8, 1, 1, 1)
    _scatter_states(pool, torch.tensor([5, 5, 2]), torch.tensor([1.0, 9.0, 3.0]).view(3, 1, 1, 1),
                    torch.tensor([True, False, True]))
    assert pool.flatten().tolist() == [0, 0, 3, 0, 0, 1, 0, 0]


# ------------------------------------------------------------------------------------------
# the pool in the kernel (kdagen::{kda,gdn}_decode_pool)
# ------------------------------------------------------------------------------------------


def _recorded(call) -> list:
    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        call()
    return rec.calls


def test_an_fp32_pool_is_read_and_written_by_the_kernel():
    """Which program each pool case runs: [N] slots -> the decode program on the pool
    (state_pool, the slot table's int type, the final state written to the pool); [N, T] ->
    the pool read in the kernel, the per-token states returned for torch to scatter; a bf16
    or non-contiguous pool -> the plain program on gathered states."""
    x = _inputs("kda", 3, 1)
    f = kdagen.fused_recurrent_kda
    pool = torch.zeros(5, 2, K, V)
    (prog, opts), = _recorded(lambda: f(**x, initial_state=pool, inplace_final_state=True,
                                        ssm_state_indices=torch.tensor([4, -1, 0],
                                                                       dtype=torch.int32)))
    assert prog == "kda_decode" and opts["state_pool"] and opts["slot_dtype"] == "i32"
    assert opts["output_final_state"] and not opts.get("output_token_states")
    x2 = _inputs("kda", 3, 2)
    (prog, opts), = _recorded(lambda: f(**x2, initial_state=pool, inplace_final_state=True,
                                        ssm_state_indices=torch.arange(6).view(3, 2) % 5))
    assert opts["state_pool"] and opts["slot_dtype"] == "i64"
    assert opts["output_token_states"] and not opts["output_final_state"]
    other = torch.zeros(2, 5, K, V).transpose(0, 1)           # not contiguous
    (prog, opts), = _recorded(lambda: f(**x, initial_state=other, inplace_final_state=True,
                                        ssm_state_indices=torch.tensor([4, -1, 0])))
    assert "state_pool" not in opts
    # a bf16 pool, and one stored value-first, are the kernel's too (state_dtype, state_v_first)
    for stored, v_first, want in ((pool.to(torch.bfloat16), False, dict(state_dtype="bf16")),
                                  (pool, True, dict(state_v_first=True)),
                                  (pool.to(torch.bfloat16), True,
                                   dict(state_dtype="bf16", state_v_first=True))):
        (prog, opts), = _recorded(lambda: f(**x, initial_state=stored, inplace_final_state=True,
                                            state_v_first=v_first,
                                            ssm_state_indices=torch.tensor([4, -1, 0])))
        assert opts["state_pool"]
        assert {n: opts[n] for n in ("state_dtype", "state_v_first") if n in opts} == want


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_pool_in_place_with_permuted_slots(family, dtype):
    """Slots in any order, a skipped sequence in the middle, a pool larger than the batch:
    the in-kernel pool step equals the reference; unused and skipped slots keep their bits."""
    B = 5
    x = _inputs(family, B, 1, seed=7)
    pool = torch.randn(9, 2, K, V) * 0.3
    idx = torch.tensor([7, 2, -1, 0, 5], dtype=dtype)
    want_o, want_pool = decode_pool_step(*_ref_inputs(x, 1, 2), state_pool=pool.double(),
                                         ssm_state_indices=idx)
    before = pool.clone()
    o, out = _fn(family)(**x, initial_state=pool, use_qk_l2norm_in_kernel=True,
                         ssm_state_indices=idx, inplace_final_state=True)
    assert out is pool
    assert R.rel_err(o, want_o) < 1e-5 and R.rel_err(pool, want_pool) < 1e-5
    assert torch.equal(pool[[1, 3, 4, 6, 8]], before[[1, 3, 4, 6, 8]])
    assert torch.count_nonzero(o[2]) == 0


def test_a_non_contiguous_pool_takes_the_torch_path_and_agrees():
    x = _inputs("gdn", 3, 2, seed=8)
    pool = (torch.randn(2, 6, K, V) * 0.3).transpose(0, 1)            # [slots, HV, K, V] view
    idx = torch.tensor([4, -1, 1])
    want_o, want_pool = decode_pool_step(*_ref_inputs(x, 1, 2), state_pool=pool.double(),
                                         ssm_state_indices=idx)
    o, _ = kdagen.fused_recurrent_gated_delta_rule(**x, initial_state=pool,
                                                   use_qk_l2norm_in_kernel=True,
                                                   ssm_state_indices=idx,
                                                   inplace_final_state=True)
    assert R.rel_err(o, want_o) < 1e-5 and R.rel_err(pool, want_pool) < 1e-5


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("per_token", [False, True])
def test_opcheck_decode_pool_ops(family, per_token):
    """The pool ops' schema (the pool mutated, nothing else), fake kernel and AOT dispatch."""
    from kdagen.decode import gdn_decode_pool, kda_decode_pool
    B, T = 3, 2 if per_token else 1
    x = _inputs(family, B, T, seed=9)
    pool = torch.randn(5, 2, K, V) * 0.3
    slots = torch.tensor([4, -1, 0])
    op = kda_decode_pool if family == "kda" else gdn_decode_pool
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, pool, slots, None,
            K ** -0.5, not per_token, per_token, False, True, False, False, False, False, None)
    torch.library.opcheck(op, args)


def test_compiled_pool_step_matches_eager():
    """torch.compile(fullgraph=True) of a decode step on the pool: the mutation of the pool
    survives functionalisation (the same pool and o as eagerly)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    x = _inputs("kda", 3, 1, seed=10)
    pool = torch.randn(5, 2, K, V) * 0.3
    slots = torch.tensor([4, -1, 0])

    def step(q, k, v, g, beta, pool, slots):
        o, _ = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool,
                                          ssm_state_indices=slots, inplace_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
        return o * 2
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    eager_pool, compiled_pool = pool.clone(), pool.clone()
    o_eager = step(*args, eager_pool, slots)
    counter = CompileCounterWithBackend("aot_eager")
    o_compiled = torch.compile(step, backend=counter, fullgraph=True)(*args, compiled_pool, slots)
    assert counter.frame_count == 1
    assert torch.equal(o_compiled, o_eager) and torch.equal(compiled_pool, eager_pool)
    assert not torch.equal(eager_pool, pool)


def test_pool_step_reads_no_tensor_on_the_host():
    """The whole pool step (both cases) runs on meta tensors, which have no data: nothing reads
    a value on the host, so a CUDA graph can capture it."""
    f = kdagen.fused_recurrent_kda
    meta = {n: t.to("meta") for n, t in _inputs("kda", 3, 1).items()}
    o, pool = f(**meta, initial_state=torch.empty(5, 2, K, V, device="meta"),
                ssm_state_indices=torch.empty(3, dtype=torch.int32, device="meta"),
                inplace_final_state=True)
    assert o.shape == meta["v"].shape and pool.shape == (5, 2, K, V)
    meta = {n: t.to("meta") for n, t in _inputs("kda", 3, 2).items()}
    o, _ = f(**meta, initial_state=torch.empty(8, 2, K, V, device="meta"),
             ssm_state_indices=torch.empty(3, 2, dtype=torch.int64, device="meta"),
             num_accepted_tokens=torch.empty(3, dtype=torch.int64, device="meta"),
             inplace_final_state=True)
    assert o.shape == meta["v"].shape


def test_the_pool_op_checks_its_operands():
    """torch.ops.kdagen.kda_decode_pool called directly: a pool or slot table the kernel
    cannot take names itself (shapes and types only)."""
    from kdagen.decode import kda_decode_pool
    x = _inputs("kda", 3, 1)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None)
    tail = (None, K ** -0.5, True, False, False, True, False, False, False, False, None)
    pool, slots = torch.zeros(5, 2, K, V), torch.tensor([4, -1, 0])
    for bad_pool, bad_slots, name in ((pool.to(torch.float16), slots, "state_pool"),
                                      (torch.zeros(5, 3, K, V), slots, "state_pool"),
                                      (pool, slots[:2], "state_slots"),
                                      (pool, slots.float(), "state_slots")):
        with pytest.raises(KdagenInputError, match=name):
            kda_decode_pool(*args, bad_pool, bad_slots, *tail)


# ------------------------------------------------------------------------------------------
# states stored value-first ([.., V, K], FLA's state_v_first) and bf16 pools
# ------------------------------------------------------------------------------------------


def _wide_inputs(family, B, T, seed):
    """Inputs with K = 64 != V = 128, so a transposed state has another shape."""
    gen = torch.Generator().manual_seed(seed)
    Kw, Vw, HV = 64, 128, 2
    x = dict(q=torch.randn(B, T, 1, Kw, generator=gen), k=torch.randn(B, T, 1, Kw, generator=gen),
             v=torch.randn(B, T, HV, Vw, generator=gen),
             beta=torch.rand(B, T, HV, generator=gen))
    x["g"] = -torch.rand(*((B, T, HV, Kw) if family == "kda" else (B, T, HV)), generator=gen) * 0.5
    return x, (HV, Kw, Vw)


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_value_first_initial_and_final_states(family):
    """Without a pool: state_v_first takes [N, HV, V, K] and returns the final state so, the
    transpose of the [K, V] call's; with inplace_final_state it is written into the given
    initial state."""
    x, (HV, Kw, Vw) = _wide_inputs(family, 3, 2, seed=11)
    h0 = torch.randn(3, HV, Kw, Vw) * 0.3
    f = _fn(family)
    o, ht = f(**x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_vf, ht_vf = f(**x, initial_state=h0.transpose(-1, -2).contiguous(), output_final_state=True,
                    use_qk_l2norm_in_kernel=True, state_v_first=True)
    assert ht_vf.shape == (3, HV, Vw, Kw)
    assert torch.equal(o_vf, o) and torch.equal(ht_vf, ht.transpose(-1, -2))
    h0_vf = h0.transpose(-1, -2).contiguous()
    _, same = f(**x, initial_state=h0_vf, inplace_final_state=True, use_qk_l2norm_in_kernel=True,
                state_v_first=True)
    assert same is h0_vf and torch.equal(h0_vf, ht.transpose(-1, -2))


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_value_first_pool_equals_the_reference(family, per_token, dtype):
    """A pool [slots, HV, V, K] (fp32 or bf16) read and written by the kernel, [N] slots in
    place or [N, T] per-token writes with accepted tokens: the reference on the transposed
    pool; a bf16 pool's written rows are the fp32 result rounded once; the other rows keep
    their bits."""
    B, T = 3, 3 if per_token else 1
    x, (HV, Kw, Vw) = _wide_inputs(family, B, T, seed=12)
    logical = (torch.randn(9, HV, Kw, Vw) * 0.3).to(dtype).double()
    if per_token:
        idx = torch.tensor([[5, 1, 7], [-1, 2, 3], [0, 6, -1]])
        acc = torch.tensor([2, 1, 1])
        kw = dict(ssm_state_indices=idx, num_accepted_tokens=acc)
    else:
        idx = torch.tensor([5, -1, 0])
        kw = dict(ssm_state_indices=idx)
    want_o, want_pool = decode_pool_step(
        *(F.normalize(x[n].double(), dim=-1, eps=1e-6 ** 0.5) if n in "qk" else x[n].double()
          for n in ("q", "k", "v", "g")), x["beta"].double(), state_pool=logical, **kw)
    pool = logical.transpose(-1, -2).to(dtype).contiguous()
    before = pool.clone()
    o, out = _fn(family)(**x, initial_state=pool, inplace_final_state=True, state_v_first=True,
                         use_qk_l2norm_in_kernel=True, **kw)
    assert out is pool
    assert R.rel_err(o, want_o) < 1e-5
    got = pool.transpose(-1, -2).double()
    # per token: sequence 1 is skipped (its read slot is -1), so its slots 2 and 3 stay
    written = [0, 1, 5, 6, 7] if per_token else [0, 5]
    if dtype == torch.bfloat16:
        assert R.rel_err(got, want_pool) < 4e-3
        assert torch.equal(got[written].to(torch.bfloat16).double(), got[written])
    else:
        assert R.rel_err(got, want_pool) < 1e-5
    untouched = [s for s in range(9) if s not in written]
    assert torch.equal(pool[untouched], before[untouched])
