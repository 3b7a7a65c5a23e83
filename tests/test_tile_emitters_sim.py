"""Single tile emitters of the lowering (kdagen.codegen.lower.tiles) run on the CTA simulator
(one CTA, every thread a numpy lane, races checked) against numpy: the blocked unit-lower
inverse against the column substitution and float64, and the batched element loops
(materialize, cumsum, reductions) against their definitions, with thread counts and shapes
that take every branch (batched, remainder, straight-line, fallback)."""
import numpy as np
import pytest

from kdagen.codegen.lower import backend as B
from kdagen.codegen.lower import tiles as T_
from kdagen.codegen.lower.sim_backend import SimBackend, SimMemory, SimPtr


def _run(nthreads, shapes, fill, emit, ordered=False):
    """Allocate tracked fp32 tiles (name -> shape), fill them, run ``emit(th, refs)`` on the
    simulator (a barrier after it, as the kernels put one) and return the tiles."""
    sizes = {k: int(np.prod(s)) for k, s in shapes.items()}
    mem = SimMemory("smem", np.zeros(sum(sizes.values()), np.float32), "f32", track=True)
    refs, off = {}, 0
    for k, s in shapes.items():
        refs[k] = T_.BufRef(T_.Scratch(SimPtr(mem), "smem"), off, tuple(s),
                            tuple(int(np.prod(s[i + 1:])) for i in range(len(s))))
        mem.data[off:off + sizes[k]] = np.asarray(fill.get(k, 0.0), np.float32).reshape(-1) \
            if k in fill else 0.0
        off += sizes[k]
    be = SimBackend(nthreads, check_races=True)
    with B.use(be):
        emit(T_.Threads(be.fresh_tid(), nthreads, ordered=ordered), refs)
        B.barrier()
    out, off = {}, 0
    for k, s in shapes.items():
        out[k] = mem.data[off:off + sizes[k]].reshape(s).copy()
        off += sizes[k]
    return out, be.stats["barriers"]


def _lower(C, rng, scale=0.3):
    x = rng.standard_normal((C, C)).astype(np.float32) * scale
    x += np.triu(rng.standard_normal((C, C)).astype(np.float32)) * 100   # ignored part
    return x


# 256 and 512: the consumer threads of 2 and 4 warpgroups (LowerOptions.chunk_warpgroups)
@pytest.mark.parametrize("C,nthreads", [(64, 128), (32, 128), (64, 64), (48, 128), (64, 256), (64, 512)])
def test_blocked_tril_inverse_matches_float64(C, nthreads):
    rng = np.random.default_rng(C + nthreads)
    x = _lower(C, rng)
    got, barriers = _run(nthreads, {"x": (C, C), "out": (C, C)}, {"x": x},
                         lambda th, r: T_.emit_tril_inv(th, r["out"], r["x"]))
    L = np.tril(x.astype(np.float64), -1) + np.eye(C)
    ref = np.linalg.inv(L)
    err = np.linalg.norm(got["out"] - ref) / np.linalg.norm(ref)
    assert err < 1e-5, err
    assert np.all(np.triu(got["out"], 1) == 0)      # the upper scratch is cleared
    assert np.all(np.diag(got["out"]) == 1)
    # blocked: n + 1 barriers of its own (+ the caller's) instead of none but C serial rows
    assert barriers == C // T_.TRIL_INV_BLOCK + 2


@pytest.mark.parametrize("precision,bar", [("tf32", 2e-3), ("bf16x3", 2e-5), ("tf32x3", 2e-6)])
@pytest.mark.parametrize("C,nthreads", [(64, 256), (64, 128), (48, 128), (64, 512), (32, 64)])
def test_blocked_tril_inverse_on_tensor_cores(C, nthreads, precision, bar):
    """The merge's block products as one-warp mma contractions (a warp per output block);
    the diagonal blocks stay fp32. TF32 operands: ~2^-11 per product."""
    rng = np.random.default_rng(C + nthreads + 1)
    x = _lower(C, rng)
    got, barriers = _run(nthreads, {"x": (C, C), "out": (C, C)}, {"x": x},
                         lambda th, r: T_.emit_tril_inv(th, r["out"], r["x"],
                                                        precision=precision))
    ref = np.linalg.inv(np.tril(x.astype(np.float64), -1) + np.eye(C))
    err = np.linalg.norm(got["out"] - ref) / np.linalg.norm(ref)
    assert err < bar, err
    if precision == "tf32":
        assert err > 1e-7, err                       # the products really were rounded
    assert np.all(np.triu(got["out"], 1) == 0)
    assert np.all(np.diag(got["out"]) == 1)
    assert barriers == C // T_.TRIL_INV_BLOCK + 2


def test_blocked_and_column_inverse_agree_to_fp32_rounding():
    rng = np.random.default_rng(7)
    x = _lower(64, rng, scale=0.5)
    blocked, _ = _run(128, {"x": (64, 64), "out": (64, 64)}, {"x": x},
                      lambda th, r: T_.emit_tril_inv_blocked(th, r["out"], r["x"]))
    cols, _ = _run(128, {"x": (64, 64), "out": (64, 64)}, {"x": x},
                   lambda th, r: T_.emit_tril_inv_columns(th, r["out"], r["x"]))
    assert np.linalg.norm(blocked["out"] - cols["out"]) / np.linalg.norm(cols["out"]) < 1e-5


def test_blocked_inverse_reads_a_lazy_operand():
    """x as a lazy expression (strict_tril(...) * beta, as the programs give it)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 64)).astype(np.float32) * 0.2
    beta = rng.random(64).astype(np.float32)

    def emit(th, r):
        lazy = T_.FnRef((64, 64), lambda idx: B.mul(r["a"].read(idx), r["beta"].read(idx[:1])))
        T_.emit_tril_inv(th, r["out"], lazy)
    got, _ = _run(128, {"a": (64, 64), "beta": (64,), "out": (64, 64)},
                  {"a": a, "beta": beta}, emit)
    L = np.tril(a.astype(np.float64) * beta[:, None], -1) + np.eye(64)
    assert np.abs(got["out"] - np.linalg.inv(L)).max() < 1e-5


@pytest.mark.parametrize("shape,nthreads", [((64, 128), 128), ((64, 64), 128), ((3, 50), 128),
                                            ((2, 64), 128), ((7,), 128), ((96, 16), 128),
                                            ((64, 128), 512), ((3, 50), 512)])
def test_batched_materialize_copies_every_element(shape, nthreads):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)

    def emit(th, r):
        T_.materialize(th, T_.FnRef(shape, lambda idx: B.mul(r["x"].read(idx), B.f(2.0))), r["y"])
    got, _ = _run(nthreads, {"x": shape, "y": shape}, {"x": x}, emit)
    np.testing.assert_array_equal(got["y"], x * 2)


# 128 threads: one per column; 256 / 512: every thread, 2 / 4 row segments per column
@pytest.mark.parametrize("reverse,nthreads", [(False, 128), (True, 128), (False, 512),
                                              (True, 512), (True, 256)])
def test_cumsum_matches_numpy(reverse, nthreads):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    got, _ = _run(nthreads, {"x": (64, 128), "y": (64, 128)}, {"x": x},
                  lambda th, r: T_.emit_cumsum(th, r["y"], r["x"], reverse))
    ref = np.flip(np.cumsum(np.flip(x, 0), 0, dtype=np.float32), 0) if reverse \
        else np.cumsum(x, 0, dtype=np.float32)
    np.testing.assert_allclose(got["y"], ref, rtol=0, atol=1e-5)


# one column (GDN's [C] gate and its adjoints): the first warp scans by shuffles; 16 rows
# (not a multiple of 32) take the segmented path
@pytest.mark.parametrize("rows,reverse,nthreads", [(64, False, 128), (64, True, 512),
                                                   (32, True, 256), (128, False, 384),
                                                   (16, True, 128)])
def test_one_column_cumsum_matches_numpy(rows, reverse, nthreads):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows,)).astype(np.float32)
    got, _ = _run(nthreads, {"x": (rows,), "y": (rows,)}, {"x": x},
                  lambda th, r: T_.emit_cumsum(th, r["y"], r["x"], reverse))
    x64 = x.astype(np.float64)
    ref = np.flip(np.cumsum(np.flip(x64))) if reverse else np.cumsum(x64)
    np.testing.assert_allclose(got["y"], ref, rtol=0, atol=1e-5)


def test_one_column_cumsum_on_a_warp_has_no_barrier_inside():
    """The warp scan ends at the op's barrier only; the segmented path of a [64, 2] tile takes
    two of its own (the segments' totals, then the shift)."""
    barriers = {shape: _run(128, {"x": shape, "y": shape}, {"x": np.ones(shape, np.float32)},
                            lambda th, r: T_.emit_cumsum(th, r["y"], r["x"], False))[1]
                for shape in ((64,), (64, 2))}
    assert barriers[(64,)] == 1, barriers          # the one _run puts after every op
    assert barriers[(64, 2)] == 3, barriers


# every kernel that computes the gate's cumsum or a row's norm must get the same bits, whatever
# its thread count (the sm_90a native kernels run 256, 384 or 512 consumer threads, the portable
# ones 128): the gate gradient's near-cancelling sums amplify any difference
# (LowerOptions.ordered_sums -> Threads.ordered)
def test_default_cumsum_bits_depend_on_the_thread_count():
    """Why ordered sums exist: filling the threads, a [64, 128] cumsum takes 1, 2 or 4 row
    segments at 128, 256 or 512 threads, and its last rows differ in the last bits."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 128)) * 7).astype(np.float32)
    outs = [_run(n, {"x": (64, 128), "y": (64, 128)}, {"x": x},
                 lambda th, r: T_.emit_cumsum(th, r["y"], r["x"], False))[0]["y"]
            for n in (128, 512)]
    assert not np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("shape,reverse", [((64, 128), False), ((64, 64), True), ((64,), True),
                                           ((32, 128), False), ((128, 64), True)])
def test_cumsum_bits_do_not_depend_on_the_thread_count(shape, reverse):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 7).astype(np.float32)
    outs = [_run(n, {"x": shape, "y": shape}, {"x": x},
                 lambda th, r: T_.emit_cumsum(th, r["y"], r["x"], reverse), ordered=True)[0]["y"]
            for n in (128, 256, 384, 512)]
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])
    x64 = x.astype(np.float64)
    ref = np.flip(np.cumsum(np.flip(x64, 0), 0), 0) if reverse else np.cumsum(x64, 0)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape,dims", [((64, 128), [1]), ((64, 64), [1]), ((128, 128), [1]),
                                        ((64, 128), [0]), ((64, 128), [0, 1]), ((128, 128), [0, 1]),
                                        ((64,), [0])])
def test_reduce_sum_bits_do_not_depend_on_the_thread_count(shape, dims):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 7).astype(np.float32)
    out_shape = tuple(s for d, s in enumerate(shape) if d not in dims) or (1,)

    def emit(th, r):
        red = T_.ReduceScratch(r["slots"])
        out = r["y"] if len(out_shape) and out_shape != (1,) else T_.BufRef(
            r["y"].scratch, r["y"].offset, (), ())
        T_.emit_reduce_sum(th, out, r["x"], dims, red)
    outs = [_run(n, {"x": shape, "y": out_shape, "slots": (16,)}, {"x": x}, emit,
                 ordered=True)[0]["y"]
            for n in (128, 256, 384, 512)]
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])
    ref = x.astype(np.float64).sum(axis=tuple(dims)).reshape(outs[0].shape)
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape,dims,nthreads", [((64, 128), [0], 128), ((64, 128), [1], 128),
                                                 ((64, 37), [1], 128), ((64, 128), [0, 1], 128),
                                                 ((64, 128), [0, 1], 512), ((64, 128), [1], 512),
                                                 ((128, 128), [1], 512), ((64, 64), [1], 256)])
def test_reduce_sum_matches_numpy(shape, dims, nthreads):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(np.float32)
    out_shape = tuple(s for d, s in enumerate(shape) if d not in dims)

    def emit(th, r):
        red = T_.ReduceScratch(r["red"])
        T_.emit_reduce_sum(th, r["y"], r["x"], dims, red)
    # 16 slots: one per warp of up to 512 threads (REDUCE_SLOTS_BYTES)
    got, _ = _run(nthreads, {"x": shape, "y": out_shape, "red": (16,)}, {"x": x}, emit)
    np.testing.assert_allclose(got["y"], x.sum(axis=tuple(dims)), rtol=1e-5, atol=1e-5)


def test_column_inverse_when_asked_or_when_the_tile_does_not_block():
    """blocked=False (LowerOptions.tril_inv="columns") and C = 16 take the column
    substitution: no barrier of its own."""
    rng = np.random.default_rng(9)
    for C, blocked in ((64, False), (16, True)):
        x = _lower(C, rng)
        got, barriers = _run(128, {"x": (C, C), "out": (C, C)}, {"x": x},
                             lambda th, r: T_.emit_tril_inv(th, r["out"], r["x"], blocked=blocked))
        ref = np.linalg.inv(np.tril(x.astype(np.float64), -1) + np.eye(C))
        assert np.linalg.norm(got["out"] - ref) / np.linalg.norm(ref) < 1e-5
        assert barriers == 1


def _decay_reference(lhs, rhs, g, diagonal, transpose=False, w=None):
    """float64 decay_dot (w None) / decay_matmul of the exact-diagonal emitters."""
    rhs, g = rhs.astype(np.float64), g.astype(np.float64)
    C = g.shape[0]
    E = np.exp2(np.clip(g[:, None, :] - g[None, :, :], -126, None))   # [i, j, d]
    mask = np.tril(np.ones((C, C)), diagonal)
    if w is None:
        return np.einsum("id,jd,ijd->ij", lhs.astype(np.float64), rhs, E) * mask
    w = w.astype(np.float64) * mask
    if not transpose:
        return np.einsum("ij,jd,ijd->id", w, rhs, E)
    return np.einsum("ij,id,ijd->jd", w, rhs, E)


# 512 / 256 threads over 4 diagonal blocks: 128 / 64 per block (pairs below the diagonal
# split evenly, the diagonal on count / 16 threads); 128 over 4 blocks: 32 per block
@pytest.mark.parametrize("nthreads", [512, 256, 128])
@pytest.mark.parametrize("diagonal", [0, -1])
@pytest.mark.parametrize("path", ["factored", "exact", "exact-triangle"])
@pytest.mark.parametrize("precision", ["bf16x3", "tf32"])
def test_exact_diagonal_decay_products_match_float64(nthreads, diagonal, path, precision,
                                                     monkeypatch):
    """Both run-time paths: the diagonal blocks factored like the rest (a gentle gate) and the
    exact in-block sums (a steep gate; the span bound forced below every span, so the test
    does not depend on where the random spans fall)."""
    rng = np.random.default_rng(11)
    C, D = 64, 32
    lhs = rng.standard_normal((C, D)).astype(np.float32)
    rhs = rng.standard_normal((C, D)).astype(np.float32)
    w = rng.standard_normal((C, C)).astype(np.float32)
    # cumulative sums of decaying increments (log2 units): down to -8 per row (a 16-row block
    # falls by up to 128: steep), or -3 per row (at most 45 per block: factorable)
    steepest = 3.0 if path == "factored" else 8.0
    g = np.cumsum(-rng.uniform(0, steepest, (C, D)), 0).astype(np.float32)
    monkeypatch.setattr(T_, "FACTORED_SPAN_MAX", 64.0 if path == "factored" else -1.0)
    triangle = path == "exact-triangle"
    spans = g[::16] - g[15::16]
    assert (spans.max() <= 64.0) == (path == "factored")
    shapes = {"lhs": (C, D), "rhs": (C, D), "g": (C, D), "w": (C, C), "dot": (C, C),
              "mm": (C, D), "mmt": (C, D)}

    def emit(th, r):
        T_.emit_decay_dot_mma_exact_diagonal(th, r["dot"], r["lhs"], r["rhs"], r["g"],
                                             diagonal, -126.0, 16, precision)
        B.barrier()
        for key, tr in (("mm", False), ("mmt", True)):
            T_.emit_decay_matmul_mma_exact_diagonal(th, r[key], r["w"], r["rhs"], r["g"],
                                                    diagonal, tr, -126.0, 16, precision,
                                                    triangle=triangle)
            B.barrier()
    got, _ = _run(nthreads, shapes, {"lhs": lhs, "rhs": rhs, "g": g, "w": w}, emit)
    for key, ref in (("dot", _decay_reference(lhs, rhs, g, diagonal)),
                     ("mm", _decay_reference(None, rhs, g, diagonal, False, w)),
                     ("mmt", _decay_reference(None, rhs, g, diagonal, True, w))):
        err = np.abs(got[key] - ref).max() / np.abs(ref).max()
        # TF32 operands (10-bit mantissa): ~2^-11 per element, well below bf16's 2^-8
        assert err < (2e-5 if precision == "bf16x3" else 2e-3), (key, err)
        if precision == "tf32" and path == "factored":
            assert err > 1e-6, (key, err)          # the operands really were rounded


def test_contraction_plan_gives_every_thread_work_when_rows_are_few():
    """A 1-row product (decode's [1, K] @ [K, V]) spreads its columns over all threads (was one
    warp with four outputs each); chunk-sized products keep their tiling."""
    plan = T_.contraction_plan(1, 128, 128)
    assert (plan.tm, plan.tn, plan.rm, plan.rn) == (1, 128, 1, 1)
    assert T_.contraction_plan(2, 64, 128).threads == 128
    big = T_.contraction_plan(64, 128, 256)
    assert (big.tm, big.tn, big.rm, big.rn) == (8, 32, 8, 4)


@pytest.mark.parametrize("nthreads", [256, 128])
@pytest.mark.parametrize("diagonal", [0, -1])
@pytest.mark.parametrize("precision", ["bf16x3", "tf32x3", "tf32", "fma"])
@pytest.mark.parametrize("steepest", [0.5, 40.0])
def test_row_gate_decay_products_match_float64(nthreads, diagonal, precision, steepest):
    """The decay products of a gate the same in every column (GDN's, after
    kda-narrow-broadcasts): the decay leaves the contraction, one exponential per output
    (decay_dot) or weight (decay_matmul). A gentle gate (down to -0.5 per row in log2 units)
    and a steep one (-40: the masked elements' exponents reach +2500 and overflow, which must
    not leak)."""
    rng = np.random.default_rng(5)
    C, D = 64, 32
    lhs = rng.standard_normal((C, D)).astype(np.float32)
    rhs = rng.standard_normal((C, D)).astype(np.float32)
    w = rng.standard_normal((C, C)).astype(np.float32)
    g1 = np.cumsum(-rng.uniform(0, steepest, C)).astype(np.float32)
    shapes = {"lhs": (C, D), "rhs": (C, D), "g": (C,), "w": (C, C), "dot": (C, C),
              "mm": (C, D), "mmt": (C, D)}

    def emit(th, r):
        T_.emit_decay_dot_row_gates(th, r["dot"], r["lhs"], r["rhs"], r["g"], r["g"],
                                    diagonal, -126.0, precision)
        B.barrier()
        for key, tr in (("mm", False), ("mmt", True)):
            T_.emit_decay_matmul_row_gates(th, r[key], r["w"], r["rhs"], r["g"], r["g"],
                                           diagonal, tr, -126.0, precision)
            B.barrier()
    got, _ = _run(nthreads, shapes, {"lhs": lhs, "rhs": rhs, "g": g1, "w": w}, emit)
    mask = np.tril(np.ones((C, C), bool), diagonal)
    diff = np.where(mask, g1[:, None].astype(np.float64) - g1[None, :], 0.0)   # [i, j] <= 0
    E = np.where(mask, np.exp2(np.clip(diff, -126, None)), 0.0)
    l64, r64, w64 = (a.astype(np.float64) for a in (lhs, rhs, w))
    for key, ref in (("dot", (l64 @ r64.T) * E), ("mm", (w64 * E) @ r64),
                     ("mmt", (w64 * E).T @ r64)):
        assert np.isfinite(got[key]).all(), key
        err = np.abs(got[key] - ref).max() / np.abs(ref).max()
        bar = {"bf16x3": 2e-5, "tf32x3": 1e-6, "tf32": 2e-3, "fma": 2e-6}[precision]
        assert err < bar, (key, err)
