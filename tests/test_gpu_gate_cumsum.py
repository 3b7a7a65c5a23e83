"""The first emitted kernel (KDA gate + within-chunk cumsum) on the GPU vs the float64 reference."""
import math

import pytest
import torch

from conftest import requires_gpu
from gpu_bundle import bundle_for_tests
from kdagen import reference


@requires_gpu
@pytest.mark.parametrize("T,H,log_a", [(1, 2, 0.0), (200, 4, math.log(16.0)), (1000, 3, -1.0)])
def test_gate_cumsum_matches_reference(T, H, log_a):
    from kdagen.runtime.chips import chip_for_device
    from kdagen.runtime.loader import KernelLibrary
    K, C = 128, 64
    dev = torch.device("cuda")
    lib = KernelLibrary(bundle_for_tests(chip_for_device(dev)))
    kernel = lib.get(f"kda_gate_cumsum_K{K}_C{C}_bf16", dev)
    torch.manual_seed(T + H)
    g_raw = torch.randn(T, H, K, device=dev).to(torch.bfloat16)
    A_log = (torch.randn(H, device=dev) * 0.5 + log_a).float()
    dt_bias = torch.randn(H, K, device=dev).float()
    out = torch.full((T, H, K), float("nan"), device=dev)          # poisoned
    kernel.launch(((T + C - 1) // C, H, 1), [g_raw, A_log, dt_bias, out, T, H])
    torch.cuda.synchronize()
    g = reference.kda_gate_softplus(g_raw.double()[None], A_log.double(), dt_bias.double())[0]
    chunks = torch.nn.functional.pad(g, (0, 0, 0, 0, 0, (-T) % C)).view(-1, C, H, K)
    ref = (chunks.cumsum(1).view(-1, H, K)[:T]) / math.log(2.0)
    assert torch.isfinite(out).all()
    err = reference.rel_err(out.double(), ref)
    assert err < 1e-5, err


@requires_gpu
def test_a_kernel_loads_and_launches_on_a_thread_with_no_context_bound():
    """The autograd engine runs a backward on its own thread, which has no driver context bound
    until its first CUDA runtime call; a kernel loaded there first must still load and run."""
    import threading

    from cuda.bindings import driver as cu

    from kdagen.runtime.chips import chip_for_device
    from kdagen.runtime.loader import KernelLibrary
    K, C, T, H = 128, 64, 200, 2
    dev = torch.device("cuda")
    lib = KernelLibrary(bundle_for_tests(chip_for_device(dev)))    # fresh: nothing loaded
    torch.manual_seed(0)
    g_raw = torch.randn(T, H, K, device=dev).to(torch.bfloat16)
    A_log = torch.randn(H, device=dev).float()
    dt_bias = torch.randn(H, K, device=dev).float()
    out = torch.full((T, H, K), float("nan"), device=dev)
    torch.cuda.synchronize()
    errors = []

    def on_a_bare_thread():
        try:
            (err,) = cu.cuCtxSetCurrent(cu.CUcontext(0))
            assert err == cu.CUresult.CUDA_SUCCESS, err
            (err, ctx) = cu.cuCtxGetCurrent()
            assert int(ctx) == 0, "the thread should start with no context bound"
            kernel = lib.get(f"kda_gate_cumsum_K{K}_C{C}_bf16", dev)
            kernel.launch(((T + C - 1) // C, H, 1), [g_raw, A_log, dt_bias, out, T, H])
            torch.cuda.synchronize()
        except Exception as exc:            # reported on the test's thread
            errors.append(exc)

    worker = threading.Thread(target=on_a_bare_thread)
    worker.start()
    worker.join()
    assert not errors, errors
    g = reference.kda_gate_softplus(g_raw.double()[None], A_log.double(), dt_bias.double())[0]
    chunks = torch.nn.functional.pad(g, (0, 0, 0, 0, 0, (-T) % C)).view(-1, C, H, K)
    ref = (chunks.cumsum(1).view(-1, H, K)[:T]) / math.log(2.0)
    assert reference.rel_err(out.double(), ref) < 1e-5
