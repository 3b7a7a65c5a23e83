"""tools.emitted_ops weighs each emitted op by the trips of the loops around it."""
import pytest

pytest.importorskip("numba_cuda_mlir")

from tools import emitted_ops  # noqa: E402


def test_loop_bodies_count_once_per_trip_and_recorded_trips_are_used():
    from kdagen.codegen.common.ints import IntVal
    from kdagen.codegen.common.kernel import GpuModuleBuilder, Param
    from kdagen.codegen.common.sreg import thread_idx
    from kdagen.codegen.lower import backend as B
    from kdagen.codegen.lower.mlir_backend import MlirBackend

    b = GpuModuleBuilder("k")
    with b.kernel("k", [Param("x", "ptr", "f32")], (128, 1, 1)) as p:
        with B.use(MlirBackend()):
            tid = IntVal(thread_idx("x"))

            def outer(i):
                def inner(j):          # 3 trips x 4 trips of one multiply
                    B.store(p["x"], j, B.mul(B.load(p["x"], j), B.f(2.0)))
                    return []
                B.for_range(0, 4, 1, inner)
                return []
            B.for_range(0, 3, 1, outer)
            # bounds from the thread index: the trips the lowering declares are used
            B.for_range(tid, 1024, 128, lambda e: [B.store(p["x"], e, B.f(1.0))] and [],
                        trips=8)
    b.verify()
    from kdagen.ir.transforms import walk
    (func,) = [op for op in walk(b.module) if op.name == "gpu.func"]
    counts = emitted_ops.weighted_ops(func)
    assert counts["arith.mulf"] == 12
    assert counts["llvm.load"] == 12
    assert counts["llvm.store"] == 12 + 8
    assert emitted_ops.summary(counts)["memory"] == 32
