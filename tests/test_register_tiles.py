"""The register-tile lowering of chunk-parallel kernels (kdagen.codegen.lower.register_tiles):
which kernels it takes and why it refuses the others, the operand algebra its products rely on
(a NumPy model of the transposed products at the fragment coordinates it reads), and that the
emitted kernel assembles without spills. Numerics on the GPU: tools/gpu_check.py on a bundle
lowered with ``register_tiles=true`` (bench/calls/stop54_refs.sh rt)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kdagen.codegen.common.layouts import SmemLayout, wgmma_d_coord, wgmma_tf32_a_coord


def _groups(program, **opts):
    from kdagen import driver
    from kdagen.codegen.lower.plan import group_kernels
    from kdagen.codegen.lower.program import read_program
    prog = read_program(driver.build_module(program, opts, pipeline="chip", chip="sm_90a"))
    return prog, group_kernels(prog, True)


def _match(program, dot: str = "auto"):
    from kdagen.codegen.lower import register_tiles
    from kdagen.target import TARGETS
    prog, groups = _groups(program)
    out = {}
    for g in groups:
        if g.kind == "tile" and g.parallel:
            try:
                out[g.label] = register_tiles.match(prog, g, TARGETS["sm_90a"], dot=dot)
            except register_tiles.NoMatch as e:
                out[g.label] = str(e)
    return out


def _lowered(program: str, **opts):
    """``program``'s kernels for sm_90a on the native path (``dot="auto"``, ``opts`` over the
    LowerOptions defaults), and the target."""
    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module(program, {}, pipeline="chip", chip="sm_90a")
    return lower_program(mod, t, options=LowerOptions(**{"path": "native", "dot": "auto",
                                                         **opts})), t


def test_gdn_forward_output_kernel_takes_the_register_tiles():
    plans = _match("gdn_fwd")
    out = plans["scan2"]
    assert not isinstance(out, str), out
    # q and k whole (bf16, the decay product's operands and the first product's B), S and v'
    # as this CTA's 64 value columns (f32, read into registers as A operands)
    slots = {s.tensor: (s.elt, s.rows, s.cols, s.value_cols) for s in out.slots}
    assert slots == {"q": ("bf16", 64, 128, False), "k": ("bf16", 64, 128, False),
                     "S_chunks": ("f32", 128, 64, True), "v_new_chunks": ("f32", 64, 64, True)}
    assert out.v_ctas == 2 and out.grid == ["HV * 2", "N", "max_chunks"]
    # shared vectors: two row norms and the gate cumsum, and the row factors of the decay
    # product's two operands and of the first product's; Aqk stored once as a B tile
    assert out.vectors == 3 + 3 and len(out.staged) == 1
    # two CTAs fit in an SM's shared memory
    assert 2 * (out.smem_bytes + 1024) <= 228 * 1024


@pytest.mark.parametrize("program", ["gdn_fwd", "gdn_bwd"])
def test_gdn_prologue_takes_the_register_tiles(program):
    """The prologue (k·kᵀ with the decay and β, its inverse, w and u, the workspaces) stores
    [C, K] tiles as well, so it runs one CTA per head and chunk, reading k and v whole."""
    out = _match(program)["scan0"]
    assert not isinstance(out, str), out
    assert out.v_ctas == 1 and out.inverses == 1 and not out.staged
    assert {s.tensor: (s.elt, s.rows, s.cols) for s in out.slots} == {
        "k": ("bf16", 64, 128), "v": ("bf16", 64, 128)}
    assert 2 * (out.smem_bytes + 1024) <= 228 * 1024


def test_kda_forward_output_kernel_takes_the_register_tiles_once_per_head():
    """KDA's output kernel: its per-channel decay is V-independent, so one CTA per head reads S
    and v' whole; it fits in a block's shared memory because regions not live at the same time
    share bytes (285 KB side by side)."""
    out = _match("kda_fwd")["scan2"]
    assert not isinstance(out, str), out
    assert out.v_ctas == 1 and out.grid == ["HV", "N", "max_chunks"]
    assert out.grids == [(64, 128)] and out.channel_decays == [128]
    assert out.staged == [(64, 128), (64, 64)]
    assert out.smem_bytes <= 227 * 1024 < sum(size for _, size, _, _ in out.live.values())


@pytest.mark.parametrize("program,label", [("kda_fwd", "scan2"), ("kda_fwd", "scan0"),
                                           ("gdn_fwd", "scan0"), ("gdn_fwd", "scan2")])
def test_shared_regions_share_bytes_only_when_not_live_together(program, label):
    out = _match(program)[label]
    regions = list(out.live.items())
    for i, (a, (oa, sa, fa, la)) in enumerate(regions):
        assert oa % 16 == 0 and oa + sa <= out.smem_bytes
        for b, (ob, sb, fb, lb) in regions[i + 1:]:
            together = not (la < fb or lb < fa)
            if together:
                assert oa + sa <= ob or ob + sb <= oa, (a, b)
    # ring tiles live from the copies at the start, 1024-aligned for the 128B swizzle
    for s in out.slots:
        assert out.live[s.tensor][2] == -1 and s.offset % 1024 == 0


def test_kda_forward_prologue_takes_the_register_tiles():
    """The prologue: the channel decay of k·kᵀ, its inverse, w (kd·β staged transposed as the
    TF32 B tile), u (v·β exact as bf16), kr and the chunk decay stored."""
    out = _match("kda_fwd")["scan0"]
    assert not isinstance(out, str), out
    assert out.v_ctas == 1 and out.inverses == 1 and out.channel_decays == [128]
    assert out.staged == [(128, 64)] and out.grids == [(64, 128)]


def test_kernels_without_rules_are_refused_with_a_reason():
    """The KDA backward's prologue and dq kernel ask for bf16x3 products (the gate gradients'
    accuracy, docs/MATH.md §3), which the TF32 rules do not give: refused, not rounded less."""
    plans = _match("kda_bwd")
    assert "bf16x3" in plans["scan0"] and "bf16x3" in plans["scan2"]
    for label, out in plans.items():
        assert isinstance(out, str) and out, label


def test_gdn_backward_chunk_kernels_take_the_general_rules():
    """gdn_bwd's dq and dk kernels: kda-fold-row-decay's products ask for tf32x3, which the
    general product rule gives by staging B as TF32 hi + lo; the mask of a weighting of a
    loaded tile is a lazy tile expression. The dq kernel fits as programmed. The dk kernel's
    ring tiles alone (~400 KB) do not: it takes the tight plan (workspace tiles copied where
    their bytes come free, staged B a K panel at a time, the step re-ordered so tiles are read
    late and sums fold each term in when it is made, costly vectors computed once)."""
    plans = _match("gdn_bwd")
    dq, dk = plans["scan2"], plans["scan4"]
    assert not isinstance(dq, str), dq
    assert not isinstance(dk, str), dk
    assert "stage_split_tf32" in dq.b_forms.values() and "stage_split_tf32" in dk.b_forms.values()
    assert not dq.sliced_staging and not dq.phases and not dq.vec_mats
    assert dk.sliced_staging and dk.phases and dk.vec_mats
    assert dk.smem_bytes <= 227 * 1024
    assert sum(s.nbytes for s in dk.slots) > 227 * 1024      # what the copies alone would take
    # every ring tile of the dk kernel is live from its copy: the chunk's first copies (-1) or
    # its issue point, after every region overlapping its bytes was last read
    regions = list(dk.live.items())
    starts = {s.tensor: s.issue for s in dk.slots}
    for i, (a, (oa, sa, fa, la)) in enumerate(regions):
        fa = min(fa, starts.get(a, fa))
        for b, (ob, sb, fb, lb) in regions[i + 1:]:
            fb = min(fb, starts.get(b, fb))
            if not (la < fb or lb < fa):
                assert oa + sa <= ob or ob + sb <= oa, (a, b)
    assert any(s.issue > 0 for s in dk.slots)
    assert all(s.issue == -1 for s in dk.slots if s.kind == "token")


def _step():
    """A chunk step built by hand: (its block, the register-tile kinds of its values, and
    ``node(op, operands, kind, shape=(64, 128), attrs=None)``, which appends an op and
    returns its result)."""
    from kdagen.codegen.lower.program import Block, new_node
    blk = Block([], [])
    kinds = {}

    def node(op, operands, kind, shape=(64, 128), attrs=None):
        r = new_node(blk, op, operands, shape, attrs=attrs)
        kinds[r] = kind
        return r
    return blk, kinds, node


def test_sums_fold_each_term_in_when_it_is_made():
    """`_sums_by_availability`: a sum of accumulators becomes a chain over its terms in the
    order the step makes them (lazy terms join the first), keeping its result value."""
    from kdagen.codegen.lower.register_tiles import _sums_by_availability
    blk, kinds, node = _step()
    lazy = node("kda.mul", [], "tile")
    a, b = node("kda.dot", [], "acc"), node("kda.dot", [], "acc")
    # program order: ((lazy + b) + c) + a, with c made last
    s1 = node("kda.add", [lazy, b], "acc")
    c = node("kda.dot", [], "acc")
    s2 = node("kda.add", [s1, c], "acc")
    root = node("kda.add", [s2, a], "acc")
    _sums_by_availability(blk, kinds)
    chain = []
    v = root
    while v.owner.op == "kda.add" and v.owner is not None:
        x, t = v.owner.operands
        chain.append(t)
        v = x
    chain.append(v)
    assert chain[::-1] == [a, lazy, b, c]            # a first (made first), then the rest
    assert root.owner.operands[1] is c
    for n in blk.nodes:
        for i, o in enumerate(n.operands):
            assert (n, i) in o.uses
    assert sum(len(v.uses) for v in (a, b, c, lazy)) == 4


def test_blocked_inverse_matches_the_triangular_solve():
    """The order of `_tril_inv`: 16 x 16 diagonal blocks by forward substitution, then the
    blocks at distance d = 1, 2, 3 below them, L[b, c] = -L[b, b] Σ_{k=c}^{b-1} X[b, k] L[k, c]
    (k over 0 .. 2 with the terms outside c .. b - 1 zeroed), gives (I + X)⁻¹."""
    rng = np.random.default_rng(2)
    X = np.tril(rng.standard_normal((64, 64)) * 0.3, -1)
    L = np.zeros((64, 64))
    for w in range(4):
        r0 = 16 * w
        for col in range(16):
            rows = []
            for a in range(16):
                v = 1.0 if col == a else 0.0
                for k in range(a):
                    v -= X[r0 + a, r0 + k] * rows[k]
                rows.append(v)
            for a in range(16):
                L[r0 + a, r0 + col] = rows[a]
    blk = lambda M, r, c: M[16 * r:16 * r + 16, 16 * c:16 * c + 16]
    for d in (1, 2, 3):
        tmp = {}
        for b in range(d, 4):
            c = b - d
            tmp[b] = sum((blk(X, b, k) @ blk(L, k, c) if c <= k < b else 0) for k in range(3))
        for b in range(d, 4):
            c = b - d
            L[16 * b:16 * b + 16, 16 * c:16 * c + 16] = -blk(L, b, b) @ tmp[b]
    assert np.allclose(L, np.linalg.inv(np.eye(64) + X), atol=1e-10)


def test_n_major_ring_operand_product_has_the_natural_orientation():
    """A·diag(r)·Y as `_dot_tile` computes it: A's rows and columns at the 16-bit A fragment's
    coordinates, scaled by Y's row factors, as bf16 hi + lo; Y (bf16, [K, N]) as B; the
    accumulator holds (row, column) of the product at `wgmma_d_coord`."""
    rng = np.random.default_rng(3)
    A = np.tril(rng.standard_normal((64, 64)))
    r = rng.uniform(0.5, 1.5, 64)
    Y = _bf16(rng.standard_normal((64, 128)))
    D = np.zeros((64, 128))
    for kb in range(64 // 16):
        A_hi, A_lo = np.zeros((64, 16)), np.zeros((64, 16))
        for tid in range(128):
            for j in range(4):
                for h in (0, 1):
                    m, c = _half_a_coord(tid // 32, tid % 32, j, h)
                    x = A[m, 16 * kb + c] * r[16 * kb + c]
                    A_hi[m, c] = _bf16(x)
                    A_lo[m, c] = _bf16(x - A_hi[m, c])
        D += (A_lo + A_hi) @ Y[16 * kb:16 * kb + 16]
    want = A @ np.diag(r) @ Y
    got = np.zeros_like(want)
    for tid, regs in enumerate(_acc_coords(128)):
        for (m, n) in regs:
            got[m, n] = D[m, n]
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_row_scaled_operands_are_found_through_views():
    """qd = q·broadcast(rq)·broadcast(2^G) (through the pipeline wait, the layout conversion and
    the widening convert) is the ring load of q with two row factors."""
    from kdagen.codegen.lower import register_tiles
    prog, groups = _groups("gdn_fwd")
    g = next(g for g in groups if g.label == "scan2")
    dots = [n for n in g.scans[0].body.nodes if n.op == "kda.dot"]
    load, factors = register_tiles.row_scaled(dots[0].operands[0])
    assert load is not None and load.op == "kda.load" and load.attrs["name"] == "q"
    assert len(factors) == 2 and all(len(f.shape) == 1 for f in factors)
    # the second product's left operand is a product result, not a ring tile
    assert register_tiles.row_scaled(dots[1].operands[0]) == (None, [])


def _assembles_without_spills(ptx: str, what: str) -> None:
    """ptxas (sm_90a) takes the kernel, and it spills nothing."""
    from kdagen.codegen import ptxas
    r = ptxas.assemble(ptx, "sm_90a", ptxas.find_ptxas())
    assert r.ok, (what, r.log)
    (res,) = r.resources.values()
    assert res.spill_stores == 0 and res.spill_loads == 0, what


def _acc_coords(n_cols):
    return [[wgmma_d_coord(tid // 32, tid % 32, i) for i in range(n_cols // 2)]
            for tid in range(128)]


def _bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.view(np.float32).astype(np.float64)


def _half_a_coord(warp, lane, j, h):
    g, t = lane // 4, lane % 4
    return 16 * warp + g + 8 * (j % 2), 2 * t + 8 * (j // 2) + h


def test_transposed_ring_product_reads_its_a_operand_at_the_fragment_coordinates():
    """(X·W)ᵀ as `_dot_ring` computes it: A[m, k] = W[k, m] read at the 16-bit A fragment's
    coordinates, split into bf16 hi + lo, against X (exact bf16) as B; each accumulator
    register lands at (token, value) = (column, row) of the transposed accumulator."""
    rng = np.random.default_rng(0)
    X = _bf16(rng.standard_normal((64, 128)))      # [C, K] bf16 ring tile
    W = rng.standard_normal((128, 64))             # [K, V block] f32 ring tile
    D = np.zeros((64, 64))
    for kb in range(128 // 16):
        A_hi, A_lo = np.zeros((64, 16)), np.zeros((64, 16))
        for tid in range(128):
            for j in range(4):
                for h in (0, 1):
                    m, c = _half_a_coord(tid // 32, tid % 32, j, h)
                    x = W[16 * kb + c, m]
                    A_hi[m, c] = _bf16(x)
                    A_lo[m, c] = _bf16(x - A_hi[m, c])
        D += A_lo @ X[:, 16 * kb:16 * kb + 16].T + A_hi @ X[:, 16 * kb:16 * kb + 16].T
    want = X @ W                                    # logical [C, V]
    got = np.zeros_like(want)
    for tid, regs in enumerate(_acc_coords(64)):
        for (m, n) in regs:
            got[n, m] = D[m, n]                     # Acc(transposed): (token n, value m)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    # a plain bf16 W would be far off: the test sees the lo parts
    assert np.abs(X @ _bf16(W) - want).max() > 1e-3 * np.abs(want).max()


def test_transposed_accumulator_product_uses_the_stored_tile_as_k_major_b():
    """(A·W)ᵀ as `_dot_acc` computes it: A stored [i, j] (K-major for B = Aᵀ), Wᵀ read into
    TF32 A fragments at (m, 8·kb + k) = W[8·kb + k, m]."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal((64, 64))
    W = rng.standard_normal((64, 64))
    D = np.zeros((64, 64))
    for kb in range(64 // 8):
        Af = np.zeros((64, 8))
        for tid in range(128):
            for jj in range(4):
                m, kc = wgmma_tf32_a_coord(tid // 32, tid % 32, jj)
                Af[m, kc] = W[8 * kb + kc, m]
        B_kmajor = A[:, 8 * kb:8 * kb + 8]          # row n = i of the stored tile, k = j
        D += Af @ B_kmajor.T
    assert np.allclose(D.T, A @ W)


def test_swizzled_offsets_cover_each_tile_once():
    """Every element of the ring and staging tiles the kernel addresses has its own bytes."""
    for rows, cols, eb in ((64, 128, 2), (128, 64, 4), (64, 64, 4)):
        lay = SmemLayout(rows, cols, eb, 128)
        offs = {lay.byte_offset(r, c) for r in range(rows) for c in range(cols)}
        assert len(offs) == rows * cols and max(offs) < lay.size_bytes


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_register_tile_kernel_assembles_without_spills():
    from kdagen import driver
    ks, t = _lowered("gdn_fwd", register_tiles=True, tuned=False)
    tiles = [k for k in ks if k.path == "sm90-register-tile"]
    # the prologue and the output kernel (one warpgroup each without the table); the serial
    # scan keeps its own path
    assert [k.name.rsplit("_", 1)[-1] for k in tiles] == ["scan0", "scan2"]
    assert all(k.launch["block"] == [128, 1, 1] for k in tiles)
    assert tiles[0].launch["grid"] == ["HV", "N", "max_chunks"]
    assert tiles[1].launch["grid"] == ["HV * 2", "N", "max_chunks"]
    prologue = driver.ptx_of(tiles[0].module, t, tiles[0].name)
    # k·kᵀ from shared memory, w and u with register A (bf16 hi + lo) and B N-major, the
    # inverse's merges as mma.sync
    assert "m64n64k16.f32.bf16.bf16" in prologue and "mma.sync.aligned.m16n8k8" in prologue
    _assembles_without_spills(prologue, "prologue")
    tiles = tiles[1:]
    ptx = driver.ptx_of(tiles[0].module, t, tiles[0].name)
    # the decay product from shared memory (bf16), the ring product with register A (bf16 hi
    # and lo), the accumulator product with register A (TF32)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ptx
    assert ptx.count("m64n64k8.f32.tf32.tf32") == 64 // 8
    counts = tiles[0].cost["counts"]
    assert counts["wgmma"] == 128 // 16 + 2 * (128 // 16) + 64 // 8
    # no per-op buffers: nothing goes to a global scratch, no element loop per op
    assert tiles[0].launch["scratch_bytes_per_cta"] == 0
    _assembles_without_spills(ptx, "output")
    # by default the tuning table puts both on the path (measured faster): the output kernel
    # with one warpgroup, the prologue with two at one CTA per SM; without the table and the
    # option both stay on the native tile path
    ks, _ = _lowered("gdn_fwd")
    tiles = {k.name.rsplit("_", 1)[-1]: k for k in ks if k.path == "sm90-register-tile"}
    assert sorted(tiles) == ["scan0", "scan2"]
    assert tiles["scan0"].launch["block"] == [256, 1, 1]
    assert tiles["scan0"].launch["tuned"] == {"register_tiles": True,
                                              "register_tile_warpgroups": 2,
                                              "register_tile_ctas_per_sm": 1}
    from kdagen.codegen.lower.register_tiles import TWO_PER_SM
    assert tiles["scan0"].launch["dynamic_shared_memory"] > TWO_PER_SM    # one CTA per SM
    assert tiles["scan2"].launch["block"] == [128, 1, 1]
    ks, _ = _lowered("gdn_fwd", tuned=False)
    assert not any(k.path == "sm90-register-tile" for k in ks)


@pytest.mark.parametrize("steep", [False, True])
def test_column_block_factoring_of_the_channel_decay(steep):
    """`_decay_dot_channels`' algebra: column block c through reference row r (its first row,
    or its last where the block is steep, with the diagonal block then exact) gives
    Σ_d x_id y_jd 2^(G_id - G_jd) for j <= i, with every factor <= 2^STEEP_BLOCK."""
    from kdagen.codegen.lower.register_tiles import STEEP_BLOCK
    rng = np.random.default_rng(4)
    C, K = 64, 32
    g = -rng.uniform(0, 8.0 if steep else 0.5, (C, K))
    G = np.cumsum(g, axis=0)
    X, Y = rng.standard_normal((C, K)), rng.standard_normal((C, K))
    want = np.tril(np.einsum("id,jd,ijd->ij", X, Y, 2.0 ** (G[:, None, :] - G[None, :, :])))
    got = np.zeros((C, C))
    for c in range(C // 16):
        is_steep = (G[16 * c] - G[16 * c + 15]).max() >= STEEP_BLOCK
        ref, first = (16 * c + 15, 16 * c + 16) if is_steep else (16 * c, 16 * c)
        a = X * 2.0 ** (G - G[ref])
        a[:first] = 0
        b = Y[16 * c:16 * c + 16] * 2.0 ** (G[ref] - G[16 * c:16 * c + 16])
        assert a.max() <= 1e300 and np.abs(2.0 ** (G[ref] - G[16 * c:16 * c + 16])).max() <= \
            2.0 ** STEEP_BLOCK
        got[:, 16 * c:16 * c + 16] = a @ b.T
        if is_steep:
            rows = slice(16 * c, 16 * c + 16)
            got[rows, rows] = np.einsum("id,jd,ijd->ij", X[rows], Y[rows],
                                        2.0 ** (G[rows][:, None] - G[rows][None, :]))
    got = np.tril(got)
    assert steep == any((G[16 * c] - G[16 * c + 15]).max() >= STEEP_BLOCK for c in range(4))
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_kda_forward_register_tile_kernels_assemble_without_spills():
    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module("kda_fwd", {}, pipeline="chip", chip="sm_90a")
    ks = [k for k in lower_program(mod, t, options=LowerOptions(path="native", dot="auto",
                                                                register_tiles=True))
          if k.path == "sm90-register-tile"]
    assert [k.name.rsplit("_", 1)[-1] for k in ks] == ["scan0", "scan2"]
    for k in ks:
        ptx = driver.ptx_of(k.module, t, k.name)
        # the channel decay: a TF32 m64n16 product per 16-column block
        assert "m64n16k8.f32.tf32.tf32" in ptx
        _assembles_without_spills(ptx, k.name)


def test_one_cta_per_sm_pads_the_shared_memory():
    """register_tile_ctas_per_sm=1: the kernel declares more than half an SM's shared memory
    (an SM it leaves is empty, for the scan beside it); 0 keeps what it needs; others refused."""
    from kdagen.codegen.lower import register_tiles
    from kdagen.codegen.lower.plan import LoweringError

    def smem(**kw):
        ks, _ = _lowered("gdn_fwd", register_tiles=True, tuned=False, **kw)
        return {k.name.rsplit("_", 1)[-1]: k.launch["dynamic_shared_memory"]
                for k in ks if k.path == "sm90-register-tile"}
    fit, one = smem(), smem(register_tile_ctas_per_sm=1)
    assert fit.keys() == one.keys() == {"scan0", "scan2"}
    assert all(v <= register_tiles.TWO_PER_SM for v in fit.values())
    assert all(v > register_tiles.TWO_PER_SM for v in one.values())
    with pytest.raises(LoweringError, match="register_tile_ctas_per_sm"):
        smem(register_tile_ctas_per_sm=3)


def test_cost_report_prices_register_tile_kernels_per_instruction():
    """Register-tile kernels are latency-bound (one warpgroup per CTA): the report adds an
    estimate proportional to the consumer thread's instruction count (the H100 fit)."""
    from kdagen.codegen.lower import cost_model
    ks, _ = _lowered("gdn_fwd")
    by = {k.name.rsplit("_", 1)[-1]: k for k in ks}
    lb = by["scan2"].cost["latency_bound"]
    assert by["scan2"].path == "sm90-register-tile"
    assert lb["instructions"] > 100
    assert lb["us"] == round(lb["instructions"] * cost_model.REGISTER_TILE_NS_PER_INSTRUCTION
                             / 1000, 2)
    assert "latency_bound" not in by["scan1"].cost           # the register scan's
    text = cost_model.format_report("k2", by["scan2"].cost)
    assert "REGISTER-TILE ESTIMATE" in text


def test_two_warpgroups_cover_each_tile_once():
    """register_tile_warpgroups=2: a transposed accumulator per warpgroup holds its own
    64-column value block, a plain one its half of the columns (col0); together they hold every
    element of the tile exactly once."""
    from kdagen.codegen.lower.register_values import Acc

    def held(make):
        seen = []
        for wg in range(2):
            acc = make(wg)
            for tid in range(128):
                seen += acc.coords(tid // 32, tid % 32)
        return seen
    plain = held(lambda wg: Acc([0.0] * 16, 32, False, wg * 32))          # [64, 64] halves
    assert sorted(plain) == [(i, j) for i in range(64) for j in range(64)]
    parts = held(lambda wg: Acc([0.0] * 32, 64, True, wg * 64))           # [64, 128] blocks
    assert sorted(parts) == [(i, j) for i in range(64) for j in range(128)]


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_two_warpgroups_take_gdn_forward_kernels():
    """GDN's forward prologue and output kernel split over two warpgroups: one CTA per head
    and chunk of 256 threads, the decay product as two m64n32 halves, the prologue's w and u
    one 64-column panel per warpgroup (its inverse on the first warpgroup's warps). KDA's
    per-channel decay product splits its column blocks, the general rules split N (KDA's
    kernels and GDN's backward dq kernel take two too, without spills); at V = 64 there is one
    value block, so kernels keep one warpgroup; other counts are refused."""
    from kdagen import driver
    from kdagen.codegen.lower.plan import LoweringError
    ks, t = _lowered("gdn_fwd", register_tiles=True, register_tile_warpgroups=2)
    by = {k.name.rsplit("_", 1)[-1]: k for k in ks if k.path == "sm90-register-tile"}
    assert by["scan2"].launch["block"] == [256, 1, 1] and by["scan2"].launch["grid"][0] == "HV"
    assert by["scan0"].launch["block"] == [256, 1, 1]
    for label, k in by.items():
        ptx = driver.ptx_of(k.module, t, k.name)
        assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16") == 128 // 16
        _assembles_without_spills(ptx, f"{label}, two warpgroups")
    prologue = driver.ptx_of(by["scan0"].module, t, by["scan0"].name)
    # w and u: 4 k-blocks x hi and lo, one panel each (two with one warpgroup)
    assert prologue.count("m64n64k16.f32.bf16.bf16") == 2 * 4 * 2
    ks, t = _lowered("kda_fwd", register_tiles=True, register_tile_warpgroups=2)
    tiles = [k for k in ks if k.path == "sm90-register-tile"]
    assert [k.launch["block"] for k in tiles] == [[256, 1, 1]] * 2
    for k in tiles:
        ptx = driver.ptx_of(k.module, t, k.name)
        # two of the four 16-column blocks per warpgroup, K / 8 TF32 steps each
        assert ptx.count("m64n16k8.f32.tf32.tf32") == 2 * 128 // 8
        _assembles_without_spills(ptx, k.name)
    ks, t = _lowered("gdn_bwd", register_tiles=True, register_tile_warpgroups=2, dot="tf32")
    (dq,) = [k for k in ks if k.name.endswith("k2_scan2")]
    assert dq.path == "sm90-register-tile" and dq.launch["block"] == [256, 1, 1]
    _assembles_without_spills(driver.ptx_of(dq.module, t, dq.name), "dq, two warpgroups")
    from kdagen.codegen.lower import register_tiles
    from kdagen.codegen.lower.plan import group_kernels
    from kdagen.codegen.lower.program import read_program
    prog = read_program(driver.build_module("gdn_fwd", dict(head_k_dim=64, head_v_dim=64),
                                            pipeline="chip", chip="sm_90a"))
    (out,) = [g for g in group_kernels(prog, True) if g.label == "scan2"]
    with pytest.raises(register_tiles.NoMatch, match="V = 128"):
        register_tiles.match(prog, out, t, warpgroups=2)
    assert register_tiles.match(prog, out, t).warpgroups == 1
    with pytest.raises(LoweringError, match="register_tile_warpgroups"):
        _lowered("gdn_fwd", register_tiles=True, register_tile_warpgroups=3)


def test_gate_cumsum_reads_each_channel_parameter_once():
    """KDA's 2-D gate cumsum evaluates a column's values as points of that column: the
    per-channel parameters (dt_bias: a global load) are read once per column, not once per
    row (128 loads per thread before)."""
    from kdagen.codegen.lower import cost_model
    saved, cost_model.BY_OP_TOP = cost_model.BY_OP_TOP, None
    try:
        ks, _ = _lowered("kda_fwd", register_tiles=True)
    finally:
        cost_model.BY_OP_TOP = saved
    (k,) = [k for k in ks if k.name.endswith("k0_scan0")]
    (row,) = [r for r in k.cost["by_op"] if r["op"].startswith("cumsum") and "128]" in r["op"]]
    assert row["counts"].get("ld.global", 0) <= 4, row
    assert row["counts"].get("st.shared", 0) == 64          # one store per row of its column


def test_two_warpgroups_split_each_gate_cumsum_column_in_two():
    """With two warpgroups (256 threads, 128 columns) each column's cumsum runs as two
    32-row segments, the second adding the first's total to its rows: the busiest thread
    evaluates half the rows (its count: one segment and the shift)."""
    from kdagen.codegen.lower import cost_model
    from kdagen.codegen.lower.register_tiles import cumsum_segments
    assert cumsum_segments(64, 128, 128) == 1
    assert cumsum_segments(64, 128, 256) == 2
    assert cumsum_segments(64, 64, 256) == 4
    assert cumsum_segments(16, 128, 1024) == 2           # at least 8 rows a segment
    assert cumsum_segments(64, 256, 256) == 1

    def cumsum_row(**opts):
        saved, cost_model.BY_OP_TOP = cost_model.BY_OP_TOP, None
        try:
            ks, _ = _lowered("kda_fwd", register_tiles=True, **opts)
        finally:
            cost_model.BY_OP_TOP = saved
        (k,) = [k for k in ks if k.name.endswith("k2_scan2")]
        (row,) = [r for r in k.cost["by_op"]
                  if r["op"].startswith("cumsum") and "128]" in r["op"]]
        return row
    one, two = cumsum_row(), cumsum_row(register_tile_warpgroups=2)
    assert two["counts"]["st.shared"] == 32 + 32          # its segment, then the shift
    assert two["counts"]["ld.shared"] >= 32 + 1           # the shift's reads, the offset
    assert two["instructions"] < 0.65 * one["instructions"]


@pytest.mark.parametrize("program, label, reverse", [
    ("gdn_fwd", "scan0", False), ("gdn_bwd", "scan2", True)])
def test_reverse_kernels_take_the_last_chunk_first(program, label, reverse):
    """A reverse scan beside the dq kernel waits for the last chunk first: the kernel's first
    CTAs (grid z = 0, 1, ...) take the last chunks, as the native path's do."""
    from kdagen.codegen.lower import backend as B
    from kdagen.codegen.lower.register_tiles import cta_chunk
    from kdagen.codegen.lower.sim_backend import SimBackend
    _, groups = _groups(program)
    group = next(g for g in groups if g.label == label and g.parallel)
    assert bool(group.scans[0].attrs.get("reverse", False)) == reverse
    z = np.arange(5)
    with B.use(SimBackend(1)):
        got = np.asarray(cta_chunk(group, z, 5))
    assert list(got) == ([4, 3, 2, 1, 0] if reverse else [0, 1, 2, 3, 4])


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_native_sums_take_the_tile_lowerings_ordered_emitters():
    """register_tile_sums="native": the gate cumsum and the row sums of tile expressions (the
    L2 norms) go through the tile lowering's emitters with sums ordered by the shapes
    (tiles.emit_cumsum_warp: a butterfly of xor shuffles, no shfl.up scan), so a register-tile
    kernel sums as a native kernel of the same program does; the kernel still assembles
    without spills. "own" keeps the register lowering's shuffle scan; other values are
    refused."""
    from kdagen import driver
    from kdagen.codegen import ptxas
    from kdagen.codegen.lower.plan import LoweringError
    ptx = {}
    for mode in ("own", "native"):
        ks, t = _lowered("gdn_fwd", register_tile_sums=mode)
        (k,) = [k for k in ks if k.name.endswith("k0_scan0")]
        assert k.path == "sm90-register-tile"
        ptx[mode] = driver.ptx_of(k.module, t, k.name)
    assert "shfl.sync.up" in ptx["own"] and "shfl.sync.up" not in ptx["native"]
    assert "shfl.sync.bfly" in ptx["native"]
    r = ptxas.assemble(ptx["native"], "sm_90a", ptxas.find_ptxas())
    assert r.ok, r.log
    (res,) = r.resources.values()
    assert res.spill_stores == 0, res
    with pytest.raises(LoweringError, match="register_tile_sums"):
        _lowered("gdn_fwd", register_tile_sums="tree")


def test_a_refused_tight_plan_leaves_the_step_as_programmed():
    """Where even the tight plan does not fit, the kernel keeps the native path, which must
    lower the step as programmed: `_plan` undoes its re-ordering and re-association."""
    from kdagen.codegen.lower import register_tiles
    from kdagen.target import TARGETS
    prog, groups = _groups("gdn_bwd")
    (g,) = [g for g in groups if g.label == "scan4"]
    body = g.scans[0].body
    before = [(n, list(n.operands)) for n in body.nodes]
    uses = {id(o): list(o.uses) for n in body.nodes for o in n.operands}
    with pytest.raises(register_tiles.NoMatch, match="shared memory"):
        register_tiles.match(prog, g, TARGETS["sm_90a"], dot="auto", warpgroups=2,
                             smem_limit=150 * 1024)
    assert [(n, list(n.operands)) for n in body.nodes] == before
    assert {id(o): list(o.uses) for n in body.nodes for o in n.operands} == uses
    # and where it fits, the step is re-ordered (the plan's)
    register_tiles.match(prog, g, TARGETS["sm_90a"], dot="auto", warpgroups=2)
    assert [n for n in body.nodes] != [n for n, _ in before]


def test_row_sum_of_a_sum_becomes_the_sum_of_the_terms_row_sums():
    """`_row_sums_by_term`: reduce_sum(a + b + c) over the columns, the sum read by nothing
    else, becomes rowsum(a) + rowsum(b) + rowsum(c): a reduce per term (each term's registers
    go with it), the reduce op itself the last vector add (its readers unchanged), the inner
    sums gone from the step; the shared vectors it adds are counted (two warpgroups: two per
    accumulator's row sum, one per lazy term's)."""
    from kdagen.codegen.lower.register_tiles import _row_sums_by_term
    blk, kinds, node = _step()
    a, lazy, c = node("kda.dot", [], "acc"), node("kda.mul", [], "tile"), node("kda.dot", [], "acc")
    s1 = node("kda.add", [a, lazy], "acc")
    s2 = node("kda.add", [s1, c], "acc")
    red = node("kda.reduce_sum", [s2], "vec", (64,), {"dims": [1]})
    user = node("kda.neg", [red], "vec", (64,))
    extra = _row_sums_by_term(blk, kinds, warpgroups=2)
    assert extra == 2 + 1 + 2 - 2
    ops = [n.op for n in blk.nodes]
    assert s1.owner not in blk.nodes and s2.owner not in blk.nodes
    assert ops.count("kda.reduce_sum") == 3
    assert red.owner.op == "kda.add" and user.owner.operands[0] is red
    reduced = sorted(n.operands[0].name for n in blk.nodes if n.op == "kda.reduce_sum")
    assert reduced == sorted(v.name for v in (a, lazy, c))
    for n in blk.nodes:
        for i, o in enumerate(n.operands):
            assert (n, i) in o.uses


def test_two_chunks_per_cta_keep_both_chunks_copies_apart():
    """register_tile_chunks_per_cta=2: CTA z takes chunks 2z and 2z + 1 (grid z halved), and
    both chunks' ring tiles have bytes of their own for the whole chunk (the second chunk's
    copies land while the first computes): no region shares bytes with either set."""
    from kdagen.codegen.lower import register_tiles
    from kdagen.target import TARGETS
    prog, groups = _groups("gdn_fwd")
    g = next(g for g in groups if g.label == "scan0" and g.parallel)
    one = register_tiles.match(prog, g, TARGETS["sm_90a"])
    two = register_tiles.match(prog, g, TARGETS["sm_90a"], chunks_per_cta=2)
    assert one.chunks_per_cta == 1 and one.grid[2] == "max_chunks"
    assert two.chunks_per_cta == 2 and two.grid[2] == "ceil_div(max_chunks, 2)"
    assert two.smem_bytes > one.smem_bytes
    ring = [(s.offset, s.nbytes) for s in two.slots] + [(s.offset_b, s.nbytes) for s in two.slots]
    assert all(off >= 0 and off % 1024 == 0 for off, _ in ring)
    others = [(off, size) for name, (off, size, _, _) in two.live.items()
              if name not in {s.tensor for s in two.slots} and not str(name).startswith("next")]
    assert others
    for i, (oa, sa) in enumerate(ring):
        for ob, sb in ring[i + 1:] + others:
            assert oa + sa <= ob or ob + sb <= oa, ((oa, sa), (ob, sb))
    # the mbarriers: one set per chunk of the CTA
    assert two.smem_bytes >= two.smem["barrier"] + 2 * two.barrier_bytes
    # where the second set does not fit, the kernel keeps one chunk per CTA
    small = register_tiles.match(prog, g, TARGETS["sm_90a"], smem_limit=one.smem_bytes,
                                 chunks_per_cta=2)
    assert small.chunks_per_cta == 1 and small.smem_bytes == one.smem_bytes
    with pytest.raises(register_tiles.NoMatch, match="chunks_per_cta"):
        register_tiles.match(prog, g, TARGETS["sm_90a"], chunks_per_cta=3)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
def test_two_chunks_per_cta_assemble_and_wait_on_their_own_barriers():
    from kdagen import driver
    from kdagen.codegen.lower.plan import LoweringError
    tune = "gdn_fwd.k0_scan0:register_tile_chunks_per_cta=2"
    ks, t = _lowered("gdn_fwd", tune=tune)
    k = next(k for k in ks if k.name.endswith("k0_scan0"))
    assert k.launch["grid"] == ["HV", "N", "ceil_div(max_chunks, 2)"]
    assert k.launch["tuned"]["register_tile_chunks_per_cta"] == 2
    ptx = driver.ptx_of(k.module, t, k.name)
    base, _ = _lowered("gdn_fwd")
    ptx1 = driver.ptx_of(next(b for b in base if b.name.endswith("k0_scan0")).module, t, k.name)
    # both chunks' copies issued at the start (twice the TMA loads), each chunk waiting on its
    # own mbarrier
    assert ptx.count("cp.async.bulk.tensor") == 2 * ptx1.count("cp.async.bulk.tensor") > 0
    assert ptx.count("mbarrier.init") == 2 * ptx1.count("mbarrier.init")
    assert ptx.count("mbarrier.try_wait") >= 2 * ptx1.count("mbarrier.try_wait") > 0
    _assembles_without_spills(ptx, "prologue, two chunks per CTA")
    with pytest.raises(LoweringError, match="register_tile_chunks_per_cta"):
        _lowered("gdn_fwd", register_tile_chunks_per_cta=3)
