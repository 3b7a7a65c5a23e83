"""The pooled backend: PTX from a worker process is byte-identical to the in-process lowering,
results come back in submission order, and a worker's failure surfaces with its message."""
import pytest

from kdagen import driver
from kdagen.codegen import backend_pool
from kdagen.codegen.backend_pool import BackendJob, BackendPool


def _kernels():
    comp = driver.Compilation("gdn_fwd", dict(head_k_dim=64, head_v_dim=64), "sm_120a",
                              pipeline="chip", lower=dict(driver.DEFAULT_LOWERING),
                              keep_stages=False, ptxas=False)
    comp.run("gpu")
    return comp


def test_worker_ptx_equals_in_process_ptx(monkeypatch):
    comp = _kernels()
    jobs = [BackendJob(k.name, "sm_120a", str(k.module)) for k in comp.kernels]
    local = [backend_pool.lower_text(j).ptx for j in jobs]
    monkeypatch.setattr(backend_pool, "BIG_TEXT", 0)       # every job to a worker
    with BackendPool(workers=2) as pool:
        pool.submit(jobs)
        remote = [r.ptx for r in pool.collect()]
    assert remote == local and all(".entry" in p for p in remote)


def test_worker_failure_names_the_kernel(monkeypatch):
    monkeypatch.setattr(backend_pool, "BIG_TEXT", 0)
    with BackendPool(workers=2) as pool:
        pool.submit([BackendJob("broken_kernel", "sm_120a", "this is not MLIR")])
        with pytest.raises(Exception, match="broken_kernel|parse|MLIR|expected"):
            pool.collect()


def test_compile_jobs_setting(monkeypatch):
    monkeypatch.setenv("KDAGEN_COMPILE_JOBS", "3")
    assert backend_pool.compile_jobs() == 3
    monkeypatch.setenv("KDAGEN_COMPILE_JOBS", "many")
    with pytest.raises(ValueError, match="KDAGEN_COMPILE_JOBS"):
        backend_pool.compile_jobs()
