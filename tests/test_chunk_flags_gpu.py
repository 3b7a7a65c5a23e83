"""GPU (skipped without CUDA): a call whose serial scans run beside the chunk kernels that feed
them (chunk-ready flags, kdagen.codegen.lower.chunk_flags; the runtime's side stream) gives
exactly the bits of the same kernels launched in order. A scan that loaded a chunk before the
chunk kernel's stores were out would not. The cases are test_api_gpu's, so its bundle
(``KDAGEN_BUNDLE``, ``python tests/test_api_gpu.py DIR``) holds their variants; each has few
enough scan CTAs for the runtime to overlap them.
"""
import pytest
import torch

import kdagen

from conftest import requires_gpu
from gpu_bundle import kernels_or_skip
from test_api import make_inputs
from test_api_gpu import GPU_CASES, to_cuda

pytestmark = [requires_gpu, pytest.mark.gpu]


def _step(family, x, flags):
    xc, fc = to_cuda(x, flags)
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    o, ht = fn(**xc, **fc)
    (o.float().square().mean() + ht.square().mean()).backward()
    torch.cuda.synchronize()
    return {"o": o.detach(), "ht": ht.detach(), **{f"d{n}": xc[n].grad for n in sorted(xc)}}


@pytest.mark.parametrize("name", ["kda_lowerbound_T1000_gva4", "kda_varlen", "gdn_varlen_gva2",
                                  "kda_precomputed_noh0"])
def test_overlapped_scans_give_the_in_order_bits(name, monkeypatch):
    from kdagen.runtime import launch
    spec = dict(GPU_CASES[name])
    family = spec.pop("family")
    x, flags = make_inputs(family, dtype=torch.bfloat16, g_dtype=torch.float32, seed=len(name),
                           **spec)
    with kernels_or_skip():
        monkeypatch.setattr(launch, "OVERLAP", False)
        in_order = _step(family, x, flags)
        monkeypatch.setattr(launch, "OVERLAP", True)
        overlapped = [_step(family, x, flags) for _ in range(3)]
    assert all(torch.isfinite(t).all() for t in in_order.values())
    for run in overlapped:
        for k, ref in in_order.items():
            assert torch.equal(run[k], ref), f"{k} differs between overlapped and in order"
