import shutil

import pytest


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


HAS_PTXAS = shutil.which("ptxas") is not None or any(
    __import__("os").path.exists(p) for p in ("/usr/local/cuda/bin/ptxas", "/usr/local/bin/ptxas"))

requires_gpu = pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
requires_ptxas = pytest.mark.skipif(not HAS_PTXAS, reason="needs ptxas (CUDA toolkit)")
