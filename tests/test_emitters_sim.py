"""CPU simulation of the emitted warp-tile matmuls (numpy, no GPU, no MLIR).

`mma.run_warp_matmul` executes the same `WarpMatmulPlan` the kernels emit, with the same lane
addresses and shared layouts; `warpsim.NumpyBackend` plays ldmatrix and mma.sync per the ISA.
Random A, B go into simulated shared memory through the layouts, each warp's registers come out
of the plan, the accumulator is gathered through `AccLayout` — and must equal A @ B.
"""
import numpy as np
import pytest

from kdagen.codegen.common import warpsim as ws
from kdagen.codegen.common.convert import acc_to_a_frags, acc_to_bt_frags
from kdagen.codegen.common.layouts import AccLayout, SmemLayout
from kdagen.codegen.common.mma import RegOperand, SmemOperand, run_warp_matmul, warp_matmul_plan


def rand16(rng, shape, dtype="bf16"):
    return ws.round16(rng.standard_normal(shape).astype(np.float32), dtype)


def simulate(A, B, layout, trans_a, trans_b, swizzle, dtype="bf16"):
    """Run the warp-matmul plan for C = A @ B (A [M, K], B [K, N] logical)."""
    smem = ws.SimSmem(256 * 1024)
    sa = A.T.copy() if trans_a else A
    sb = B.T.copy() if trans_b else B

    def make(mat):
        if swizzle == "pad":
            lay = SmemLayout(*mat.shape, 2, 0, pad_bytes=16)
        elif swizzle == "auto":
            lay = SmemLayout.auto(*mat.shape)
        else:
            lay = SmemLayout(*mat.shape, 2, swizzle)
        t = smem.tile(lay)
        t.write(mat, dtype)
        return t
    ta, tb = make(sa), make(sb)
    plan = warp_matmul_plan(layout, A.shape[1])
    be = ws.NumpyBackend(smem, dtype)
    accs = ws.zero_acc(layout)
    out = [run_warp_matmul(plan, be, accs[w], SmemOperand(ta, trans_a), SmemOperand(tb, trans_b), w, ws.LANES)
           for w in range(layout.num_warps)]
    return ws.gather_acc(layout, out), plan


def rel_err(x, ref):
    return np.linalg.norm(x - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_single_warp_16x16x16(trans_a, trans_b):
    rng = np.random.default_rng(1)
    A, B = rand16(rng, (16, 16)), rand16(rng, (16, 16))
    C, plan = simulate(A, B, AccLayout(16, 16), trans_a, trans_b, "auto")
    assert plan.num_mma == 2 and plan.num_ldmatrix == 2
    assert rel_err(C, A.astype(np.float64) @ B) < 1e-6


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("swizzle", [128, 64, 32, "pad"])
def test_four_warps_64x64x64(trans_a, trans_b, swizzle):
    rng = np.random.default_rng(2)
    A, B = rand16(rng, (64, 64)), rand16(rng, (64, 64))
    C, plan = simulate(A, B, AccLayout(64, 64, 2, 2), trans_a, trans_b, swizzle)
    assert plan.num_mma == 2 * 4 * 4     # per warp: 2 m16 atoms x 4 n8 atoms x 4 k16 steps
    assert rel_err(C, A.astype(np.float64) @ B) < 1e-6


@pytest.mark.parametrize("m,n,k,wm,wn", [(16, 24, 32, 1, 1), (32, 40, 16, 2, 1), (16, 128, 64, 1, 4),
                                         (128, 64, 32, 4, 2)])
def test_other_shapes_and_odd_n8_atoms(m, n, k, wm, wn):
    rng = np.random.default_rng(3)
    A, B = rand16(rng, (m, k)), rand16(rng, (k, n))
    for ta, tb in [(False, True), (True, False)]:
        C, _ = simulate(A, B, AccLayout(m, n, wm, wn), ta, tb, "auto")
        assert rel_err(C, A.astype(np.float64) @ B) < 1e-6


def test_f16():
    rng = np.random.default_rng(4)
    A, B = rand16(rng, (32, 32), "f16"), rand16(rng, (32, 32), "f16")
    C, _ = simulate(A, B, AccLayout(32, 32, 2, 1), False, False, "auto", "f16")
    assert rel_err(C, A.astype(np.float64) @ B) < 1e-6


def test_simulation_detects_a_layout_bug():
    # Lie about the storage of A (claim transposed while it is natural): the product must differ.
    rng = np.random.default_rng(5)
    A, B = rand16(rng, (64, 64)), rand16(rng, (64, 64))
    smem = ws.SimSmem(64 * 1024)
    ta, tb = smem.tile(SmemLayout.auto(64, 64)), smem.tile(SmemLayout.auto(64, 64))
    ta.write(A, "bf16")
    tb.write(B, "bf16")
    layout = AccLayout(64, 64, 2, 2)
    plan = warp_matmul_plan(layout, 64)
    be = ws.NumpyBackend(smem)
    out = [run_warp_matmul(plan, be, ws.zero_acc(layout)[w], SmemOperand(ta, True), SmemOperand(tb), w, ws.LANES)
           for w in range(4)]
    assert rel_err(ws.gather_acc(layout, out), A.astype(np.float64) @ B) > 0.5


def test_register_reuse_chain():
    """P = A @ B in registers; O = bf16(P) @ V with P as the A operand (C → A); Q = A2 @ bf16(P)ᵀ
    with Pᵀ as the B operand (C → Bᵀ) — exactly the testkernels.build_mma_chain data flow."""
    rng = np.random.default_rng(6)
    m, k1, n1, n2, warps = 64, 64, 64, 32, 4
    A, B, V, A2 = rand16(rng, (m, k1)), rand16(rng, (k1, n1)), rand16(rng, (n1, n2)), rand16(rng, (16, n1))
    smem = ws.SimSmem(128 * 1024)
    tiles = {}
    for name, mat in [("A", A), ("B", B), ("V", V), ("A2", A2)]:
        tiles[name] = smem.tile(SmemLayout.auto(*mat.shape))
        tiles[name].write(mat, "bf16")
    be = ws.NumpyBackend(smem)
    lp, lo, lq = AccLayout(m, n1, warps, 1), AccLayout(m, n2, warps, 1), AccLayout(16, m, 1, warps)
    p_acc = [run_warp_matmul(warp_matmul_plan(lp, k1), be, ws.zero_acc(lp)[w],
                             SmemOperand(tiles["A"]), SmemOperand(tiles["B"]), w, ws.LANES) for w in range(warps)]
    P16 = ws.round16(ws.gather_acc(lp, p_acc), "bf16").astype(np.float64)
    o_acc, q_acc = [], []
    for w in range(warps):
        a_reg = RegOperand(acc_to_a_frags(lp, p_acc[w], be.pack), lp)
        o_acc.append(run_warp_matmul(warp_matmul_plan(lo, n1, a_in_regs=True), be, ws.zero_acc(lo)[w],
                                     a_reg, SmemOperand(tiles["V"]), w, ws.LANES))
        bt_reg = RegOperand(acc_to_bt_frags(lp, p_acc[w], be.pack), lp)
        q_acc.append(run_warp_matmul(warp_matmul_plan(lq, n1, b_in_regs=True), be, ws.zero_acc(lq)[w],
                                     SmemOperand(tiles["A2"]), bt_reg, w, ws.LANES))
    assert rel_err(ws.gather_acc(lo, o_acc), P16 @ V) < 1e-6
    assert rel_err(ws.gather_acc(lq, q_acc), A2.astype(np.float64) @ P16.T) < 1e-6


def test_bf16_rounding_model():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9, -2.5, 3.0e38], np.float32)
    r = ws.round16(x, "bf16")
    assert r[0] == 1.0 and r[1] == 1.0          # ties to even
    assert r[2] == np.float32(1.0 + 2 ** -7)
    assert r[3] == -2.5
    assert np.isfinite(r[4])


@pytest.mark.parametrize("rows,cols,wn", [(16, 8, 1), (64, 32, 1), (64, 64, 2)])
def test_cumsum_rows_scan(rows, cols, wn):
    """The shuffle scan of shuffle.acc_cumsum_rows (same code, numpy lane ops) = np.cumsum."""
    from kdagen.codegen.common.shuffle import cumsum_rows_warp
    rng = np.random.default_rng(7)
    X = rng.standard_normal((rows, cols)).astype(np.float32)
    layout = AccLayout(rows, cols, 1, wn)
    regs = ws.scatter_acc(layout, X)
    out = [cumsum_rows_warp(layout, regs[w], ws.LANES, ws.NumpyLaneOps())[0] for w in range(wn)]
    np.testing.assert_allclose(ws.gather_acc(layout, out), np.cumsum(X, 0), rtol=1e-5, atol=1e-5)


def test_cumsum_scan_detects_a_wrong_shuffle_distance():
    from kdagen.codegen.common.shuffle import cumsum_rows_warp

    class Broken(ws.NumpyLaneOps):
        def shfl_up(self, x, delta):
            return super().shfl_up(x, delta // 2)
    X = np.random.default_rng(8).standard_normal((16, 8)).astype(np.float32)
    layout = AccLayout(16, 8)
    out = cumsum_rows_warp(layout, ws.scatter_acc(layout, X)[0], ws.LANES, Broken())[0]
    assert not np.allclose(ws.gather_acc(layout, [out]), np.cumsum(X, 0), atol=1e-3)
