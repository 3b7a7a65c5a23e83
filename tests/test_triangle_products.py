"""The decay products' triangle (kdagen.codegen.lower.tiles.triangle_jobs): a product whose
mask keeps a (block) triangle skips what the mask zeroes and balances what is left over the
warps. Checked on the CTA simulator against the plain tiling, bit for bit (what is skipped
adds exact zeros), for every decay-product emitter, and the balance itself (the longest
warp's share)."""
import numpy as np
import pytest

from kdagen.codegen.lower import backend as B
from kdagen.codegen.lower import tiles as T_

from test_tile_emitters_sim import _run


def _products(precision, diagonal, path):
    """Emit every decay product of one case into its own output tile."""
    def emit(th, r):
        if path == "row_gates":
            T_.emit_decay_dot_row_gates(th, r["dot"], r["lhs"], r["rhs"], r["g1"], r["g1"],
                                        diagonal, -126.0, precision)
        elif path == "subblock":
            T_.emit_decay_dot_mma(th, r["dot"], r["lhs"], r["rhs"], r["g"], r["g"], diagonal,
                                  -126.0, 16, precision)
        else:
            T_.emit_decay_dot_mma_exact_diagonal(th, r["dot"], r["lhs"], r["rhs"], r["g"],
                                                 diagonal, -126.0, 16, precision)
        B.barrier()
        for key, tr in (("mm", False), ("mmt", True)):
            if path == "row_gates":
                T_.emit_decay_matmul_row_gates(th, r[key], r["w"], r["rhs"], r["g1"], r["g1"],
                                               diagonal, tr, -126.0, precision)
            elif path != "subblock":
                T_.emit_decay_matmul_mma_exact_diagonal(th, r[key], r["w"], r["rhs"], r["g"],
                                                        diagonal, tr, -126.0, 16, precision)
            B.barrier()
    return emit


@pytest.mark.parametrize("nthreads", [512, 256, 128])
@pytest.mark.parametrize("diagonal", [0, -1])
@pytest.mark.parametrize("path", ["gentle", "steep", "row_gates", "subblock"])
@pytest.mark.parametrize("precision", ["tf32", "bf16x3"])
def test_triangle_tiling_equals_the_plain_tiling_bit_for_bit(nthreads, diagonal, path,
                                                            precision, monkeypatch):
    rng = np.random.default_rng(nthreads + 7 * diagonal)
    C, D = 64, 64
    steepest = 8.0 if path == "steep" else 2.0
    fill = {"lhs": rng.standard_normal((C, D)), "rhs": rng.standard_normal((C, D)),
            "w": rng.standard_normal((C, C)),
            "g": np.cumsum(-rng.uniform(0, steepest, (C, D)), 0),
            "g1": np.cumsum(-rng.uniform(0, 0.5, C))}
    if path == "steep":      # the exact in-block sums, whatever the random spans
        monkeypatch.setattr(T_, "FACTORED_SPAN_MAX", -1.0)
    shapes = {"lhs": (C, D), "rhs": (C, D), "g": (C, D), "g1": (C,), "w": (C, C),
              "dot": (C, C), "mm": (C, D), "mmt": (C, D)}
    emit = _products(precision, diagonal, path)
    calls = []
    real = T_.triangle_jobs

    def counted(*a, **k):
        split = real(*a, **k)
        calls.append(split is not None)
        return split
    monkeypatch.setattr(T_, "triangle_jobs", counted)
    got, _ = _run(nthreads, shapes, fill, emit)
    # decay_dot alone gains only at 8 warps (16 hold 2 atoms either way; 4 would need two
    # row blocks on a warp): the plain tiling elsewhere
    assert any(calls) == (path != "subblock" or nthreads == 256), calls
    monkeypatch.setattr(T_, "triangle_jobs", lambda *a, **k: None)
    plain, _ = _run(nthreads, shapes, fill, emit)
    for key in ("dot", "mm", "mmt"):
        assert np.array_equal(got[key], plain[key]), key
        assert np.isfinite(got[key]).all()
    mask = np.tril(np.ones((C, C), bool), diagonal)
    assert np.all(got["dot"][~mask] == 0)       # the skipped columns are cleared


def _longest(jobs, slots):
    """The most (atom x partner-step) units any warp runs, and the most atoms it holds."""
    steps = max(sum(s.atoms and (s.k_hi - s.k_lo) * held for s, held in zip(j, slots))
                for j in jobs)
    return steps, max(slots)


def test_column_triangle_holds_three_atoms_instead_of_four():
    """decay_dot 64 x 64 (diagonal -1) on 8 warps: 20 live atoms of 16 x 8; the plain tiling
    holds 4 per warp, the triangle 3, each warp on one row block, every live atom on a warp."""
    live = T_.LiveTriangle(cols=lambda rb: 16 * rb + 15)
    jobs, slots = T_.triangle_jobs(64, 64, 128, 8, 8, live)
    assert slots == [3]
    covered = sorted((s.rb, s.c0 + a) for j in jobs for s in j for a in range(s.atoms))
    assert covered == sorted((rb, c) for rb in range(4) for c in range(2 * rb + 2))
    # 16 warps hold 2 atoms in the plain tiling already: nothing to gain, plain tiling
    assert T_.triangle_jobs(64, 64, 128, 8, 16, live) is None


@pytest.mark.parametrize("transpose", [False, True])
def test_partner_triangle_pairs_blocks_so_every_warp_runs_five_eighths(transpose):
    """decay_matmul 64 x 128, 64 partners in k8 steps on 8 warps: the plain tiling's longest
    warp runs 8 steps on 8 atoms (64 units); paired row blocks (0, 3) and (1, 2) run 10 steps
    on 4 atoms (40) on every warp."""
    live = T_.LiveTriangle(k_range=(lambda rb: (16 * rb, 64)) if transpose
                           else (lambda rb: (0, 16 * rb + 16)))
    jobs, slots = T_.triangle_jobs(64, 128, 64, 8, 8, live)
    assert slots == [4, 4]
    per_warp = {sum((s.k_hi - s.k_lo) // 8 * s.atoms for s in j) for j in jobs}
    assert per_warp == {40}
    # each (row block, column atom) pair is computed by exactly one warp
    covered = sorted((s.rb, s.c0 + a) for j in jobs for s in j for a in range(s.atoms))
    assert covered == sorted((rb, c) for rb in range(4) for c in range(16))
