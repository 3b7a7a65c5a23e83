"""The register-tile lowering's general rules (kdagen.codegen.lower.register_generic): which
form each product of GDN's backward dq kernel takes, the A operand elements of transposed
products and of decay_matmul checked against the ops' definitions (the emitter's own element
functions run on the CPU simulator backend over whole index grids), the emission order of
chunk stores, and that the kernel assembles. Numerics on the GPU: tools/gpu_check.py on a
bundle lowered with ``register_tiles=true`` (bench/calls/stop55.sh rt2)."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from test_register_tiles import _lowered, _match

C = 64


class _Value(SimpleNamespace):
    """A stand-in for a program value (hashed by identity, as the emitter's env keys are)."""
    __hash__ = object.__hash__
    __eq__ = object.__eq__


def _value(shape, owner=None):
    return _Value(shape=tuple(shape), owner=owner, kind="tile")


def _ref(array):
    from kdagen.codegen.lower import tiles as T_
    return T_.FnRef(array.shape, lambda idx: array[tuple(idx)])


def _a_elements(op, attrs, w, gates=None):
    """The emitter's ``a(m, k)`` of a product over all (m, k) at once (numpy index grids on
    the simulator backend)."""
    from kdagen.codegen.lower import backend as B
    from kdagen.codegen.lower.register_generic import GenericTileOps
    from kdagen.codegen.lower.sim_backend import SimBackend
    wv = _value(w.shape)
    env = {wv: _ref(w)}
    operands = [wv, _value((C, 128))]
    if gates is not None:
        for g in gates:
            vec = _value(g.shape)
            env[vec] = _ref(g)
            operands.append(_value((C, 128), SimpleNamespace(op="kda.broadcast",
                                                             attrs={"dims": [1]},
                                                             operands=[vec])))
    n = SimpleNamespace(op=op, attrs=attrs, operands=operands)
    fake = SimpleNamespace(env=env, _materialised=lambda v: env[v])
    m, k = np.meshgrid(np.arange(w.shape[0]), np.arange(w.shape[1]), indexing="ij")
    with B.use(SimBackend(1)):
        return np.asarray(GenericTileOps._a_element(fake, n)(m, k), np.float64)


@pytest.mark.parametrize("transpose", [False, True])
def test_transposed_left_operand_elements(transpose):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((C, C)).astype(np.float32)
    a = _a_elements("kda.dot", {"transpose_lhs": transpose}, w)
    assert np.array_equal(a, (w.T if transpose else w).astype(np.float64))


@pytest.mark.parametrize("transpose", [False, True])
def test_decay_matmul_weights_give_the_ops_definition(transpose):
    """(W ∘ E)·X (or its transposed form) with A built by the emitter equals
    Σ_j W[i, j] X[j, d] 2^(P[i] - Q[j]) over j <= i + diagonal (kdagen.ir.decay)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((C, C)).astype(np.float32)
    x = rng.standard_normal((C, 16))
    g = np.cumsum(-rng.uniform(0, 0.5, C)).astype(np.float32)
    diagonal = -1
    a = _a_elements("kda.decay_matmul", {"transpose": transpose, "diagonal": diagonal,
                                         "clamp_min": -126.0}, w, gates=(g, g))
    i, j = np.meshgrid(np.arange(C), np.arange(C), indexing="ij")
    e = np.where(j <= i + diagonal, np.exp2(g[:, None].astype(np.float64) - g[None, :]), 0.0)
    weighted = w * e
    want = weighted.T @ x if transpose else weighted @ x
    np.testing.assert_allclose(a @ x, want, rtol=1e-5, atol=1e-6)


def test_gdn_backward_dq_kernel_takes_the_general_rules():
    """The dq kernel: one CTA per head (whole tiles), each product in the form that stages
    least: do·v'ᵀ with v' staged K-major (TF32), Aqkᵀ·do with do as TMA stored it (bf16,
    N-major), do·Sᵀ with S as stored (K-major TF32), the row-gate decay product (a plain dot of
    tril(w ⊙ 2^(g_i - g_j)) after kda-fold-row-decay) with k as stored (its norm folded into
    A); the accumulators a product or an element-wise op reads in another
    layout go through shared copies."""
    from kdagen.codegen.lower.register_generic import product_shape
    plan = _match("gdn_bwd", dot="tf32")["scan2"]     # its decay product asks for tf32x3
    assert not isinstance(plan, str), plan
    assert plan.v_ctas == 1 and plan.smem_bytes <= 227 * 1024
    forms = sorted((n.op, product_shape(n), f) for n, f in plan.b_forms.items())
    assert forms == [("kda.dot", (64, 64, 128), "bf16"),
                     ("kda.dot", (64, 64, 128), "bf16"),
                     ("kda.dot", (64, 128, 64), "stage_tf32"),
                     ("kda.dot", (64, 128, 128), "tf32")]
    assert len(plan.b_stages) == 1
    kinds = sorted(plan.kinds[v] for v in plan.mats)
    assert kinds == ["acc", "acc", "acc_t", "acc_t"]
    assert all(f"mat{i}" in plan.smem for i in range(len(plan.mats)))


def test_chunk_stores_follow_their_accumulators():
    from kdagen.codegen.lower.register_tiles import _early_stores
    plan = _match("gdn_bwd", dot="tf32")["scan2"]
    body = plan.scan.body.nodes
    order = _early_stores(body, plan.kinds)
    assert sorted(map(id, order)) == sorted(map(id, body))
    moved = [n for n in body if n.op == "kda.store_chunk"
             and plan.kinds.get(n.operands[2]) in ("acc", "acc_t")]
    assert moved
    for s in moved:
        assert order[order.index(s) - 1] is s.operands[2].owner or \
            order[order.index(s) - 1].op == "kda.store_chunk"


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_gdn_backward_dq_kernel_takes_its_tf32x3_product_on_register_tiles():
    """Asked for register tiles under the default precisions, the dq kernel's folded row-gate
    decay product (tf32x3) takes the general rule that stages B as TF32 hi + lo (A split the
    same way): three TF32 products per 8-deep block, where the bf16x3 rule (W split bf16 hi
    + lo) would give less than was asked. It assembles."""
    from kdagen import driver
    from kdagen.codegen import ptxas
    ks, t = _lowered("gdn_bwd", register_tiles=True)
    (k,) = [k for k in ks if k.name.endswith("k2_scan2")]
    assert k.path == "sm90-register-tile"
    ptx = driver.ptx_of(k.module, t, k.name)
    tf32 = ptx.count(".tf32.tf32")
    ks32, _ = _lowered("gdn_bwd", register_tiles=True, dot="tf32")
    (k32,) = [k for k in ks32 if k.name.endswith("k2_scan2")]
    assert tf32 > driver.ptx_of(k32.module, t, k32.name).count(".tf32.tf32")
    r = ptxas.assemble(ptx, "sm_90a", ptxas.find_ptxas())
    assert r.ok, r.log


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_gdn_backward_dq_kernel_assembles():
    from kdagen import driver
    from kdagen.codegen import ptxas
    ks, t = _lowered("gdn_bwd", register_tiles=True, dot="tf32")
    (k,) = [k for k in ks if k.name.endswith("k2_scan2")]
    assert k.path == "sm90-register-tile" and k.launch["block"] == [128, 1, 1]
    r = ptxas.assemble(driver.ptx_of(k.module, t, k.name), "sm_90a", ptxas.find_ptxas())
    assert r.ok, r.log
    (res,) = r.resources.values()
    # a known 16-byte spill (the accumulators of the dq chain); a guard against regressions
    assert res.spill_stores <= 64 and res.spill_loads <= 64, res


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_split_staged_b_operand_assembles(monkeypatch):
    """The bf16x3 form of a staged B (hi and lo bf16 tiles, three products) takes no kernel
    yet (GDN's dk kernel, which would, does not fit): lowered here in place of the dq
    kernel's TF32 staging, it assembles, with three times the k16 products."""
    from kdagen import driver
    from kdagen.codegen import ptxas
    from kdagen.codegen.lower import register_generic, register_tiles

    def dq_ptx():
        ks, t = _lowered("gdn_bwd", register_tiles=True, dot="tf32")
        (k,) = [k for k in ks if k.name.endswith("k2_scan2")]
        assert k.path == "sm90-register-tile"
        return driver.ptx_of(k.module, t, k.name)
    before = dq_ptx()

    def split(n, slot_elt, kinds, dot):
        form = register_generic.b_operand_form(n, slot_elt, kinds, dot)
        return "stage_split" if form == "stage_tf32" else form
    monkeypatch.setattr(register_tiles, "b_operand_form", split)
    after = dq_ptx()
    # do·v'ᵀ (K = 128, N = 64): 16 TF32 k8 products become 8 k16 blocks of three bf16 ones
    k16, k8 = "m64n64k16.f32.bf16.bf16", "m64n64k8.f32.tf32.tf32"
    assert after.count(k16) - before.count(k16) == 3 * 128 // 16
    assert before.count(k8) - after.count(k8) == 128 // 8
    r = ptxas.assemble(after, "sm_90a", ptxas.find_ptxas())
    assert r.ok, r.log
