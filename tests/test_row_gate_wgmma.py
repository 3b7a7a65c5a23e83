"""Row-gate decay products on the sm_90a native path (sm90_native._row_gate_decay): a
decay_dot whose gates are one value per row (GDN's, after kda-narrow-broadcasts) is one wgmma
product, its decay an epilogue scale of the accumulators; an unfolded decay_matmul stays on
mma.sync (sm90_native._wgmma_product_dims: as a tf32x3 wgmma product it measured slower);
kda-fold-row-decay makes GDN's plain dots of precomputed weights. KDA's per-key decay products
are untouched. Numerics: the GPU check (548 ok on the H200 with both ops on wgmma,
bench/results/h200_stop40_gpu_check_native_row_gate_wgmma.log)."""
from __future__ import annotations

import pytest

from kdagen.codegen import ptxas
from kdagen.codegen.lower import cost_model
from kdagen.driver import DEFAULT_LOWERING, Compilation

K128 = dict(head_k_dim=128, head_v_dim=128)


def _by_op(program: str, kernel: str, pipeline: str = "chip", **lower) -> dict:
    """op label -> counts of kernel ``kernel`` (its short name) of ``program`` on sm_90a."""
    saved, cost_model.BY_OP_TOP = cost_model.BY_OP_TOP, None
    try:
        comp = Compilation(program, K128, "sm_90a", lower=dict(DEFAULT_LOWERING, **lower),
                           pipeline=pipeline)
        comp.run(until="gpu")
    finally:
        cost_model.BY_OP_TOP = saved
    (k,) = [k for k in comp.kernels if k.name.endswith(kernel)]
    return {r["op"].split(" ")[0] + " " + r["op"].split(" ")[1]:
            dict(r["counts"], instructions=r["instructions"]) for r in k.cost["by_op"]}


def _rows(by_op: dict, op: str) -> list:
    return [c for label, c in by_op.items() if label.startswith(op)]


def test_gdn_output_kernel_decay_dot_is_one_wgmma_product():
    # the native path's kernel (the tuning table puts this one on register tiles)
    rows = _rows(_by_op("gdn_fwd", "k2_scan2", register_tiles=False), "decay_dot")
    assert len(rows) == 1
    counts = rows[0]
    # [64, 64] from K = 128 in TF32: 4 slices of 32, 4 k-steps of 8 each, on the thread's
    # warpgroup; no mma.sync, and one exponential per output element it holds
    assert counts.get("wgmma", 0) == 16 and counts.get("mma.sync", 0) == 0
    assert counts.get("ex2", 0) == 64 * 64 // 256


def test_adjoint_decay_products_stay_on_mma_sync_unless_folded():
    unfolded = _by_op("gdn_bwd", "k4_scan4", pipeline="chip+kda-fold-row-decay{fold=false}")
    rows = _rows(unfolded, "decay_matmul")
    assert len(rows) == 3
    assert all(c.get("mma.sync", 0) > 0 and c.get("wgmma", 0) == 0 for c in rows)
    # kda-fold-row-decay (the default pipeline) makes them plain dots of precomputed weights:
    # no decay_matmul and no mma.sync left in the kernel, a fifth fewer instructions
    folded = _by_op("gdn_bwd", "k4_scan4")
    assert not _rows(folded, "decay_matmul")
    assert sum(c.get("mma.sync", 0) for c in folded.values()) == 0
    total = lambda by_op: sum(c["instructions"] for c in by_op.values())  # noqa: E731
    assert total(folded) < 0.8 * total(unfolded)


def test_kda_per_key_decay_products_untouched():
    rows = _rows(_by_op("kda_fwd", "k2_scan2"), "decay_dot")
    assert rows and all(c.get("mma.sync", 0) > 0 and c.get("wgmma", 0) == 0 for c in rows)


def _has_ptxas() -> bool:
    try:
        ptxas.find_ptxas()
        return True
    except ptxas.PtxasNotFound:
        return False


@pytest.mark.skipif(not _has_ptxas(), reason="needs ptxas")
def test_gdn_chunk_kernels_assemble_without_spills():
    comp = Compilation("gdn_fwd", K128, "sm_90a", lower=dict(DEFAULT_LOWERING))
    comp.run(until="cubin")
    for name, res in comp.assembled.items():
        assert res.ok, name
        assert all(r.spills == 0 for r in res.resources.values()), name
