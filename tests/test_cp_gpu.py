"""Context parallelism (kdagen.cp) on the GPU kernels: 2 and 4 ranks as processes sharing one
GPU (gloo, which carries CUDA tensors), bf16 inputs at K = V = 128. Each rank's outputs and
gradients are compared with the single-GPU op on the whole packed batch (the same kernels, one
process), with the API tests' bars vs the float64 reference (tests/test_api.BARS, relative L2):
the two differ only by rounding (CP chunks a crossing sequence from the rank boundary), an
error of the chaining would be O(1). Skipped without CUDA.

``python tests/test_cp_gpu.py DIR [CHIP]`` writes the bundle these tests use (no GPU needed);
run them with ``KDAGEN_BUNDLE=DIR``."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from kdagen import cp
from kdagen.reference import rel_err

from conftest import requires_gpu
from gpu_bundle import kernels_or_skip
from test_cp import _finish, _leaves, _op, _run_ranks

# sequence 1 crosses every boundary of 4 ranks (1024 tokens each)
CU_SEQLENS = [0, 700, 3500, 4096]
K = 128
BARS = {"o": 0.005, "final_state": 0.005, "q": 0.008, "k": 0.008, "v": 0.008, "h0": 0.008,
        "g": 0.02, "beta": 0.02, "A_log": 0.008, "dt_bias": 0.008}
_GRADS = ("q", "k", "v", "g", "beta")
_SHARED = ("h0", "A_log", "dt_bias")


def _inputs(family: str, device, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T, H, HV, N = CU_SEQLENS[-1], (2 if family == "kda" else 1), 2, len(CU_SEQLENS) - 1

    def rnd(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)
    x = dict(q=rnd(1, T, H, K), k=rnd(1, T, H, K), v=rnd(1, T, HV, K), beta=rnd(1, T, HV),
             h0=rnd(N, HV, K, K, scale=0.3, dtype=torch.float32))
    if family == "kda":
        x["g"] = rnd(1, T, HV, K)
        x["A_log"] = rnd(HV, scale=0.3, dtype=torch.float32)
        x["dt_bias"] = rnd(HV, K, scale=0.3, dtype=torch.float32)
    else:
        x["g"] = (-torch.rand(1, T, HV, generator=gen) * 0.1).to(torch.bfloat16).to(device)
    x["w_o"] = rnd(1, T, HV, K, dtype=torch.float32)
    x["w_h"] = rnd(N, HV, K, K, dtype=torch.float32)
    return x


def _worker(rank: int, world: int, family: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x = _inputs(family, "cuda")
    ctx = cp.build_cp_context(torch.tensor(CU_SEQLENS), device="cuda")
    per = ctx.tokens_per_rank
    lo, hi = rank * per, (rank + 1) * per
    ends = [n for n in range(len(CU_SEQLENS) - 1) if lo < CU_SEQLENS[n + 1] <= hi]
    ref = _leaves(x)
    o, ht = _op(family, ref, cu_seqlens=torch.tensor(CU_SEQLENS, device="cuda"))
    ((o.float() * x["w_o"]).sum() + (ht * x["w_h"]).sum()).backward()
    mine = _leaves({n: (t[:, lo:hi] if n in (*_GRADS, "w_o") else t) for n, t in x.items()})
    o_cp, ht_cp = _op(family, mine, cp_context=ctx)
    loss = (o_cp.float() * mine["w_o"]).sum()
    for i, n in enumerate(ctx.seq_ids):
        if n in ends:
            loss = loss + (ht_cp[i] * x["w_h"][n]).sum()
    loss.backward()
    err = {"o": rel_err(o_cp, o[:, lo:hi])}
    for i, n in enumerate(ctx.seq_ids):
        if n in ends:
            err[f"final_state[{i}]"] = rel_err(ht_cp[i], ht[n])
    for n in _GRADS:
        err[n] = rel_err(mine[n].grad, ref[n].grad[:, lo:hi])
    for n in _SHARED:
        if n in mine:
            g = mine[n].grad
            total = g.clone() if g is not None else torch.zeros_like(mine[n])
            dist.all_reduce(total)
            err[n] = rel_err(total, ref[n].grad)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(err, f)
    _finish()


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("family,world", [("kda", 2), ("kda", 4), ("gdn", 4)])
def test_gpu_cp_matches_the_single_gpu_op(tmp_path, family, world):
    with kernels_or_skip():
        _op(family, _inputs(family, "cuda"), cu_seqlens=torch.tensor(CU_SEQLENS, device="cuda"))
    for rank, err in enumerate(_run_ranks(_worker, world, family, tmp_path)):
        print(f"{family} rank {rank}/{world}: " + ", ".join(f"{n} {e:.2e}" for n, e in err.items()))
        bad = {n: e for n, e in err.items() if not e <= BARS[n.split("[")[0]]}
        assert not bad, f"rank {rank} of {world}: {bad}"


def variants_used() -> list:
    """The program variants the CP calls use (each one a varlen call with initial and final
    states; recorded on the CPU)."""
    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        for family in ("kda", "gdn"):
            x = _leaves(_inputs(family, "cpu"))
            x = {n: (t[:, :256] if n in (*_GRADS, "w_o") else t) for n, t in x.items()}
            o, ht = _op(family, x, cu_seqlens=torch.tensor([0, 100, 200, 256]))
            (o.float().sum() + ht.sum()).backward()
    return rec.variants()


if __name__ == "__main__":
    import sys

    from gpu_bundle import write_variants_bundle
    write_variants_bundle(variants_used(), sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sm_90a")
