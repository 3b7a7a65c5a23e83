"""kdagen.decode_reference: a decode step over a state pool, against the per-token recurrence.

Prefill then decode token by token through the pool equals the recurrence on the whole
sequence; skipped sequences keep their outputs and slots; speculative steps keep one state per
draft token and resume from the accepted prefix.
"""
import pytest
import torch

from kdagen.decode_reference import decode_pool_step
from kdagen.reference import recurrent_gated_delta

F64 = torch.float64
TOL = 1e-12


def _inputs(family, B, T, H=1, HV=2, K=64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=F64)
    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, HV, K)
    k = torch.nn.functional.normalize(k, dim=-1)
    g = -torch.rand(*((B, T, HV, K) if family == "kda" else (B, T, HV)), generator=gen,
                    dtype=F64)
    beta = torch.rand(B, T, HV, generator=gen, dtype=F64)
    h0 = rnd(B, HV, K, K) * 0.1
    return q, k, v, g, beta, h0


def _tokens(x, s, e):
    return [t[:, s:e] for t in x[:5]]


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_prefill_then_decode_equals_whole_sequence(family):
    N, T, P = 3, 12, 8
    x = _inputs(family, N, T)
    h0 = x[5]
    o_full, ht_full = recurrent_gated_delta(*x[:5], scale=0.125, initial_state=h0,
                                            output_final_state=True)
    o_pre, ht_pre = recurrent_gated_delta(*_tokens(x, 0, P), scale=0.125, initial_state=h0,
                                          output_final_state=True)
    slots = torch.tensor([5, 1, 3])
    pool = torch.randn(6, *ht_pre.shape[1:], dtype=F64)
    untouched = pool.clone()
    pool[slots] = ht_pre
    outs = [o_pre]
    for t in range(P, T):
        o, pool = decode_pool_step(*_tokens(x, t, t + 1), state_pool=pool,
                                   ssm_state_indices=slots, scale=0.125)
        outs.append(o)
    assert (torch.cat(outs, dim=1) - o_full).abs().max() < TOL
    assert (pool[slots] - ht_full).abs().max() < TOL
    others = [i for i in range(6) if i not in slots.tolist()]
    assert torch.equal(pool[others], untouched[others])


def test_negative_slot_skips_the_sequence():
    x = _inputs("kda", 3, 1)
    pool = torch.randn(4, 2, 64, 64, dtype=F64)
    out = torch.full((3, 1, 2, 64), 7.0, dtype=F64)
    o, new = decode_pool_step(*x[:5], state_pool=pool, ssm_state_indices=torch.tensor([2, -1, 0]),
                              out=out)
    assert torch.equal(o[1], out[1])                   # skipped: output untouched
    assert not torch.equal(o[0], out[0]) and not torch.equal(o[2], out[2])
    assert torch.equal(new[[1, 3]], pool[[1, 3]])      # no slot of the skipped sequence written
    ref, _ = recurrent_gated_delta(*[t[[0]] for t in x[:5]], scale=0.125,
                                   initial_state=pool[[2]])
    assert (o[0] - ref[0]).abs().max() < TOL


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_speculative_step_keeps_a_state_per_draft_token(family):
    N, D = 3, 3
    x = _inputs(family, N, D + 1, seed=1)
    pool = torch.zeros(1 + 2 * N * D, 2, 64, 64, dtype=F64)
    draft = torch.arange(1, 1 + N * D).reshape(N, D)  # one slot per draft token
    pool[draft[:, 0]] = x[5]             # one token accepted before: read from column 0
    o1, pool = decode_pool_step(*_tokens(x, 0, D), state_pool=pool, scale=0.125,
                                ssm_state_indices=draft,
                                num_accepted_tokens=torch.ones(N, dtype=torch.int64))
    for t in range(D):
        ref, ht = recurrent_gated_delta(*_tokens(x, 0, t + 1), scale=0.125,
                                        initial_state=x[5], output_final_state=True)
        assert (pool[draft[:, t]] - ht).abs().max() < TOL
        assert (o1[:, t] - ref[:, t]).abs().max() < TOL
    # sequence n accepted n + 1 draft tokens: it resumes from that token's state
    accepted = torch.tensor([1, 2, 3])
    idx = torch.arange(1 + N * D, 1 + 2 * N * D).reshape(N, D)
    for n, a in enumerate(accepted.tolist()):
        idx[n, a - 1] = draft[n, a - 1]
    o2, pool = decode_pool_step(*_tokens(x, D, D + 1), state_pool=pool, scale=0.125,
                                ssm_state_indices=idx, num_accepted_tokens=accepted)
    for n, a in enumerate(accepted.tolist()):
        seq = [torch.cat([t[[n], :a], t[[n], D:D + 1]], dim=1) for t in x[:5]]
        ref, ht = recurrent_gated_delta(*seq, scale=0.125, initial_state=x[5][[n]],
                                        output_final_state=True)
        assert (o2[n, 0] - ref[0, -1]).abs().max() < TOL
        assert (pool[idx[n, 0]] - ht[0]).abs().max() < TOL


def test_varlen_and_empty_sequences():
    lengths = [2, 0, 3]
    cu = torch.tensor([0, 2, 2, 5])
    x = _inputs("gdn", 1, 5, seed=2)
    pool = torch.randn(3, 2, 64, 64, dtype=F64)
    idx = torch.tensor([2, 0, 1])
    o, new = decode_pool_step(*x[:5], state_pool=pool, ssm_state_indices=idx, cu_seqlens=cu)
    assert torch.equal(new[0], pool[0])                # the empty sequence writes nothing
    s = 0
    for n, L in enumerate(lengths):
        if L:
            ref, ht = recurrent_gated_delta(*_tokens(x, s, s + L), scale=0.125,
                                            initial_state=pool[[int(idx[n])]],
                                            output_final_state=True)
            assert (o[:, s:s + L] - ref).abs().max() < TOL
            assert (new[int(idx[n])] - ht[0]).abs().max() < TOL
        s += L


def test_bad_pool_arguments_name_the_argument():
    x = _inputs("kda", 2, 1)
    pool = torch.zeros(2, 2, 64, 64, dtype=F64)
    with pytest.raises(ValueError, match="ssm_state_indices: slot 5"):
        decode_pool_step(*x[:5], state_pool=pool, ssm_state_indices=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="ssm_state_indices: expected"):
        decode_pool_step(*x[:5], state_pool=pool, ssm_state_indices=torch.tensor([0]))
    with pytest.raises(ValueError, match="state_pool"):
        decode_pool_step(*x[:5], state_pool=pool[:, :1], ssm_state_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        decode_pool_step(*x[:5], state_pool=pool, ssm_state_indices=torch.tensor([0, 1]),
                         num_accepted_tokens=torch.tensor([1, 1]))
