"""Context parallelism across processes (kdagen.cp): gloo on CPU, 2 and 4 ranks, the ops on the
interpreter. Every rank's outputs and every gradient (its tokens' q, k, v, g, beta; the global
initial state and gate parameters summed over the ranks) must equal the single-process op on
the whole packed batch; sequences cross one and several rank boundaries, with initial states,
final states, GVA and the in-kernel gate."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kdagen
from kdagen import cp
from kdagen.validation import KdagenInputError

# sequence 1 crosses every boundary of 4 ranks (64 tokens each) and one of 2 ranks
CU_SEQLENS = [0, 40, 200, 256]
TOL = 1e-5


def _inputs(family: str, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T, H, HV, K = CU_SEQLENS[-1], (2 if family == "kda" else 1), 2, 64

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
    x = dict(q=rnd(1, T, H, K), k=rnd(1, T, H, K), v=rnd(1, T, HV, K),
             beta=rnd(1, T, HV), h0=rnd(len(CU_SEQLENS) - 1, HV, K, K, scale=0.3))
    if family == "kda":
        x["g"] = rnd(1, T, HV, K)                      # raw gate: -exp(A_log) softplus(g + dt)
        x["A_log"] = rnd(HV, scale=0.3)
        x["dt_bias"] = rnd(HV, K, scale=0.3)
    else:
        x["g"] = -torch.rand(1, T, HV, generator=gen) * 0.5
    x["w_o"] = rnd(1, T, HV, K)
    x["w_h"] = rnd(len(CU_SEQLENS) - 1, HV, K, K)
    return x


def _op(family, x, **kw):
    common = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  initial_state=x["h0"], output_final_state=True)
    if family == "kda":
        return kdagen.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], use_gate_in_kernel=True,
                                A_log=x["A_log"], dt_bias=x["dt_bias"], **common, **kw)
    return kdagen.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], **common, **kw)


_GRADS = ("q", "k", "v", "g", "beta")
_SHARED = ("h0", "A_log", "dt_bias")


def _leaves(x: dict) -> dict:
    return {n: (t.clone().requires_grad_() if n not in ("w_o", "w_h") else t) for n, t in x.items()}


def _rel(a, b) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _finish() -> None:
    """Leave the group in step: a barrier, then exit the worker without tearing gloo down (a
    worker once aborted with std::terminate in a loaded CI run, most likely gloo's teardown
    racing its peer's)."""
    if dist.is_initialized():
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)


def _worker(rank: int, world: int, family: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x = _inputs(family)
    ctx = cp.build_cp_context(torch.tensor(CU_SEQLENS))
    per = ctx.tokens_per_rank
    lo, hi = rank * per, (rank + 1) * per
    ends = [n for n in range(len(CU_SEQLENS) - 1) if lo < CU_SEQLENS[n + 1] <= hi]
    # the single-process op on the whole batch; each sequence's final state enters the
    # loss on the rank where it ends
    ref = _leaves(x)
    o, ht = _op(family, ref, cu_seqlens=torch.tensor(CU_SEQLENS))
    ((o * x["w_o"]).sum() + (ht * x["w_h"]).sum()).backward()
    # this rank's share under CP
    mine = _leaves({n: (t[:, lo:hi] if n in (*_GRADS, "w_o") else t) for n, t in x.items()})
    o_cp, ht_cp = _op(family, mine, cp_context=ctx)
    ids = list(ctx.seq_ids)
    loss = (o_cp * mine["w_o"]).sum()
    for i, n in enumerate(ids):
        if n in ends:
            loss = loss + (ht_cp[i] * x["w_h"][n]).sum()
    loss.backward()
    err = {"o": _rel(o_cp, o.detach()[:, lo:hi])}
    for i, n in enumerate(ids):
        if n in ends:
            want = ht.detach()[n]
        else:      # goes on: the state at this rank's last token, from the prefix alone
            a = CU_SEQLENS[n]
            pre = {m: (t[:, a:hi] if m in _GRADS else t) for m, t in x.items()}
            pre["h0"] = x["h0"][n:n + 1]
            want = _op(family, pre)[1].detach()[0]
        err[f"final_state[{i}]"] = _rel(ht_cp.detach()[i], want)
    for n in _GRADS:
        err["d" + n] = _rel(mine[n].grad, ref[n].grad[:, lo:hi])
    scale = {}
    for n in _SHARED:
        if n in mine:
            g = mine[n].grad       # None on a rank none of whose sequences starts there
            total = g.clone() if g is not None else torch.zeros_like(mine[n])
            dist.all_reduce(total)              # each rank holds its paths' share
            err["d" + n] = _rel(total, ref[n].grad)
            scale[n] = float(ref[n].grad.abs().max())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"err": err, "scale": scale}, f)
    _finish()


def _run_ranks(worker, world: int, family: str, tmp_path) -> list:
    """Run ``worker(rank, world, family, store, out)`` in ``world`` spawned processes; the
    JSON each rank wrote to ``out.<rank>``, in rank order."""
    out = str(tmp_path / "err")
    mp.start_processes(worker, args=(world, family, str(tmp_path / "store"), out), nprocs=world,
                       join=True, start_method="spawn")
    got = []
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            got.append(json.load(f))
    return got


@pytest.mark.parametrize("family,world", [("kda", 2), ("kda", 4), ("gdn", 4)])
def test_cp_matches_the_single_process_op(tmp_path, family, world):
    for rank, got in enumerate(_run_ranks(_worker, world, family, tmp_path)):
        err = got["err"]
        assert min(got["scale"].values()) > 0        # the shared gradients are not trivially 0
        assert set(err) >= {"o", "final_state[0]", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
        bad = {n: e for n, e in err.items() if not e <= TOL}
        assert not bad, f"rank {rank} of {world}: {bad}"


def _ctx_worker(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    ctx = cp.build_cp_context([0, 40, 200, 256])
    errors = []
    for bad in ([0, 40, 201], [0, 0, 256], [5, 256]):
        try:
            cp.build_cp_context(bad)
        except KdagenInputError as e:
            errors.append(str(e).split(":")[0])
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"cu": ctx.cu_seqlens_cpu.tolist(), "ids": list(ctx.seq_ids),
                   "first": ctx.first_continues, "last": ctx.last_continues,
                   "starts": list(ctx.starts), "errors": errors}, f)
    _finish()


def test_cp_context_splits_the_packed_batch(tmp_path):
    out = str(tmp_path / "ctx")
    mp.start_processes(_ctx_worker, args=(4, str(tmp_path / "store"), out), nprocs=4, join=True,
                       start_method="spawn")
    got = []
    for rank in range(4):
        with open(f"{out}.{rank}") as f:
            got.append(json.load(f))
    assert [g["cu"] for g in got] == [[0, 40, 64], [0, 64], [0, 64], [0, 8, 64]]
    assert [g["ids"] for g in got] == [[0, 1], [1], [1], [1, 2]]
    assert [(g["first"], g["last"]) for g in got] == [(False, True), (True, True), (True, True),
                                                      (True, False)]
    assert got[0]["starts"] == [0, 0, 0, 0]
    # odd total (201 over 4 ranks), an empty sequence, offsets not from 0
    assert got[0]["errors"] == ["cu_seqlens"] * 3


def test_cp_context_needs_an_initialised_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(KdagenInputError, match="init_process_group"):
        cp.build_cp_context([0, 8])


@pytest.mark.skipif(os.name != "posix", reason="file store")
def test_cp_rejects_cu_seqlens_and_intermediate_states(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        x = _inputs("gdn")
        ctx = cp.build_cp_context(torch.tensor(CU_SEQLENS))
        with pytest.raises(KdagenInputError, match="cu_seqlens"):
            _op("gdn", x, cp_context=ctx, cu_seqlens=torch.tensor(CU_SEQLENS))
        with pytest.raises(KdagenInputError, match="return_intermediate_states"):
            _op("gdn", x, cp_context=ctx, return_intermediate_states=True)
        with pytest.raises(KdagenInputError, match="tokens"):
            _op("gdn", {**x, **{n: x[n][:, :100] for n in _GRADS}}, cp_context=ctx)
    finally:
        dist.destroy_process_group()        # this test runs in the pytest process itself
