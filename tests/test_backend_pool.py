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


def test_workers_live_across_jobs(monkeypatch):
    """Each worker process takes job after job (MLIR is imported once per worker, not once
    per kernel); the results still equal the in-process lowering, in order."""
    started = []

    class CountingWorker(backend_pool._Worker):
        def __init__(self):
            started.append(self)
            super().__init__()

    comp = _kernels()
    jobs = [BackendJob(k.name, "sm_120a", str(k.module)) for k in comp.kernels] * 3
    local = [backend_pool.lower_text(j).ptx for j in jobs]
    monkeypatch.setattr(backend_pool, "_Worker", CountingWorker)
    monkeypatch.setattr(backend_pool, "BIG_TEXT", 0)
    with BackendPool(workers=2) as pool:
        pool.submit(jobs)
        remote = [r.ptx for r in pool.collect()]
    assert remote == local
    assert 1 <= len(started) <= 2 < len(jobs)
    assert all(w._proc.poll() is not None for w in started)     # closed with the pool


def test_unused_dialect_stages_are_skipped_without_changing_the_ptx(monkeypatch):
    """The vector / memref conversions are left out of a module that has no such ops, and the
    PTX is byte-identical to the full pipeline's."""
    from kdagen._mlir import gpu, ir, passmanager
    from kdagen.codegen import to_ptx
    from kdagen.target import get_target
    target = get_target("sm_120a")
    comp = _kernels()
    text = str(comp.kernels[0].module)
    full, trimmed = to_ptx.lowering_pipeline(target), to_ptx.lowering_pipeline(target, text)
    assert "finalize-memref-to-llvm" in full and "finalize-memref-to-llvm" not in trimmed
    assert "convert-vector-to-llvm" not in trimmed
    assert "finalize-memref-to-llvm" in to_ptx.lowering_pipeline(target, text + "memref.load")

    def ptx(pipeline):
        module = ir.Module.parse(text, context=ir.Context())
        with module.context:
            passmanager.PassManager.parse(pipeline).run(module.operation)
        (binary,) = [op for op in module.body.operations if op.operation.name == "gpu.binary"]
        return gpu.ObjectAttr(binary.attributes["objects"][0]).object

    assert ptx(full) == ptx(trimmed)
