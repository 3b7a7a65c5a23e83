"""The decode ops on the GPU kernels (skipped without CUDA): K = V = 128, bf16 inputs, a pool
stored fp32 or bf16, [slots, HV, K, V] or value-first,
against the float64 pool reference (kdagen.decode_reference) with docs/MATH.md §3's bars (bf16
outputs 2e-3, fp32 states 1e-3, relative L2), in-place (int64 and int32 slots: the kernel
reads and writes the pool rows itself) and per-token (speculative) pool writes, skipped
sequences untouched; an in-place step launches no torch gather/scatter kernel; a decode step
captured in a CUDA graph and replayed equals eager.

``python tests/test_decode_gpu.py DIR [CHIP]`` writes the bundle these tests use (no GPU
needed); run them with ``KDAGEN_BUNDLE=DIR``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kdagen
from kdagen.decode_reference import decode_pool_step
from kdagen.reference import rel_err

from conftest import requires_gpu
from gpu_bundle import kernels_or_skip

K = V = 128
H, HV = 2, 4
BAR_O, BAR_STATE = 2e-3, 1e-3


def _inputs(family, B, T, device, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(device)
    x = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, HV, V),
             beta=torch.rand(B, T, HV, generator=gen).to(torch.bfloat16).to(device))
    shape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    x["g"] = (-torch.rand(*shape, generator=gen) * 0.5).to(torch.bfloat16).to(device)
    return x


def _fn(family):
    return kdagen.fused_recurrent_kda if family == "kda" else kdagen.fused_recurrent_gated_delta_rule


def _ref_inputs(x):
    q = F.normalize(x["q"].double().cpu(), dim=-1, eps=1e-3)
    k = F.normalize(x["k"].double().cpu(), dim=-1, eps=1e-3)
    return q, k, x["v"].double().cpu(), x["g"].double().cpu(), x["beta"].double().cpu()


def _pool(slots, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(slots, HV, K, V, generator=gen) * 0.3).cuda()


#: how a pool is stored: (element type, value-first [slots, HV, V, K])
STORAGE = {"fp32": (torch.float32, False), "bf16": (torch.bfloat16, False),
           "fp32-vfirst": (torch.float32, True), "bf16-vfirst": (torch.bfloat16, True)}


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize("mode", ["in_place", "in_place_i32", "per_token"])
@pytest.mark.parametrize("storage", list(STORAGE))
def test_gpu_decode_pool_matches_the_reference(family, mode, storage):
    """Each pool storage the kernels index themselves: the written rows of a bf16 pool are
    held to the bf16 bar (each new state rounded once), an fp32 pool's to the state bar."""
    dtype, v_first = STORAGE[storage]
    B, T = (64, 1) if mode.startswith("in_place") else (8, 4)
    x = _inputs(family, B, T, "cuda", seed=1)
    logical = _pool(B * T + 3).to(dtype)
    pool = (logical.transpose(-1, -2) if v_first else logical).contiguous()
    if mode.startswith("in_place"):
        slot_dtype = torch.int32 if mode == "in_place_i32" else torch.int64
        idx = torch.randperm(B * T + 3)[:B].to(slot_dtype).cuda()
        idx[5] = -1                                            # a skipped sequence
        kw = dict(ssm_state_indices=idx)
    else:
        idx = torch.arange(B * T).view(B, T).cuda()
        idx[2, 3] = -1                                         # a dropped state
        kw = dict(ssm_state_indices=idx,
                  num_accepted_tokens=torch.randint(1, T + 1, (B,)).cuda())
    want_o, want_pool = decode_pool_step(
        *_ref_inputs(x), state_pool=logical.double().cpu(), ssm_state_indices=idx.cpu(),
        num_accepted_tokens=(kw["num_accepted_tokens"].cpu() if mode == "per_token" else None))
    before = pool.clone()
    with kernels_or_skip():
        o, _ = _fn(family)(**x, initial_state=pool, use_qk_l2norm_in_kernel=True,
                           inplace_final_state=True, state_v_first=v_first, **kw)
    torch.cuda.synchronize()
    got = pool.transpose(-1, -2) if v_first else pool
    bar = BAR_O if dtype == torch.bfloat16 else BAR_STATE
    assert rel_err(o, want_o) <= BAR_O, rel_err(o, want_o)
    assert rel_err(got, want_pool) <= bar, rel_err(got, want_pool)
    written = set(int(i) for i in idx.flatten().tolist() if i >= 0)
    untouched = [s for s in range(pool.shape[0]) if s not in written]
    assert torch.equal(pool[untouched], before[untouched])
    if mode.startswith("in_place"):
        assert torch.count_nonzero(o[5]) == 0                 # the skipped sequence
    print(f"{family} {mode} {storage}: o {rel_err(o, want_o):.2e}, pool "
          f"{rel_err(got, want_pool):.2e}")


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_gpu_in_place_step_moves_no_state_through_torch(family):
    """With ssm_state_indices [N] on a float32 pool the decode kernel reads and writes the
    pool rows itself: the step launches no torch gather/scatter (index_select / index_copy)
    kernel, only the decode kernel (and no state-sized copy)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    B = 64
    x = _inputs(family, B, 1, "cuda", seed=2)
    pool = _pool(B + 3)
    idx = torch.randperm(B + 3)[:B].cuda()
    kw = dict(initial_state=pool, use_qk_l2norm_in_kernel=True, ssm_state_indices=idx,
              inplace_final_state=True)
    with kernels_or_skip():
        _fn(family)(**x, **kw)                                 # load the kernels first
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _fn(family)(**x, **kw)
            torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    print(f"{family}: kernels of one step: {kernels}")
    assert not [k for k in kernels if "index" in k.lower() or "scatter" in k.lower()
                or "gather" in k.lower()], kernels
    assert sum(f"{family}_decode" in k for k in kernels) == 1, kernels


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_gpu_decode_step_in_a_cuda_graph_equals_eager(dtype):
    B = 32
    x = _inputs("kda", B, 1, "cuda", seed=3)
    idx = torch.randperm(B).to(dtype).cuda()
    idx[7] = -1                                                # a skipped sequence
    pool_eager, pool_graph = _pool(B), _pool(B)
    with kernels_or_skip():
        o_eager, _ = kdagen.fused_recurrent_kda(**x, initial_state=pool_eager, use_qk_l2norm_in_kernel=True,
                                                ssm_state_indices=idx, inplace_final_state=True)
        static = {n: t.clone() for n, t in x.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        warm = _pool(B)
        with torch.cuda.stream(side):
            kdagen.fused_recurrent_kda(**static, initial_state=warm, use_qk_l2norm_in_kernel=True,
                                       ssm_state_indices=idx, inplace_final_state=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o_graph, _ = kdagen.fused_recurrent_kda(**static, initial_state=pool_graph,
                                                    use_qk_l2norm_in_kernel=True,
                                                    ssm_state_indices=idx, inplace_final_state=True)
        pool_graph.copy_(_pool(B))
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_eager)
    assert torch.equal(pool_graph, pool_eager)


def variants_used() -> list:
    from kdagen.runtime.backends import recording
    with recording("cpu") as rec:
        for family in ("kda", "gdn"):
            x = _inputs(family, 2, 2, "cpu")
            # 2 and 64 sequences: the tests' batches take both of kdagen.decode.value_split's
            # choices (4 parts for few (sequence, head) pairs, 2 for many)
            for B in (2, 64):
                xb = _inputs(family, B, 1, "cpu")
                for dtype in (torch.int64, torch.int32):
                    _fn(family)(**xb, initial_state=torch.zeros(B + 2, HV, K, V),
                                use_qk_l2norm_in_kernel=True,
                                ssm_state_indices=torch.arange(B, dtype=dtype),
                                inplace_final_state=True)
            _fn(family)(**x, initial_state=torch.zeros(4, HV, K, V), use_qk_l2norm_in_kernel=True,
                        ssm_state_indices=torch.tensor([[0, 1], [2, 3]]),
                        inplace_final_state=True)
            for dtype, v_first in STORAGE.values():        # the other pool storages
                for B, T in ((64, 1), (8, 4)):
                    xb = _inputs(family, B, T, "cpu")
                    idx = torch.arange(B) if T == 1 else torch.arange(B * T).view(B, T)
                    for slots in ((idx, idx.to(torch.int32)) if T == 1 else (idx,)):
                        _fn(family)(**xb, initial_state=torch.zeros(B * T, HV, K, V, dtype=dtype),
                                    use_qk_l2norm_in_kernel=True, ssm_state_indices=slots,
                                    inplace_final_state=True, state_v_first=v_first)
    return rec.variants()


if __name__ == "__main__":
    import sys

    from gpu_bundle import write_variants_bundle
    write_variants_bundle(variants_used(), sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sm_90a")
