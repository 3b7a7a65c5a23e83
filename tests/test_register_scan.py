"""The register-resident scan lowering (kdagen.codegen.lower.register_scan): its layout algebra
on the CPU (a NumPy model of the register-A TF32 wgmma over the interleaved column order and the
interleave8_rows tensor-map view), which kernels take it, its workspace contract, and that the
emitted PTX assembles. Numerics on the GPU: tools/gpu_check.py on a native bundle."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from kdagen.codegen.common.layouts import (acc_reg_for_tf32_a, interleave8, wgmma_d_coord,
                                           wgmma_tf32_a_coord)
from kdagen.codegen.lower.sim_backend import tf32_round
from kdagen.runtime.tensormap import view_dims

F32_CHECKPOINTS = "chip+kda-narrow-checkpoints{dtype=fp32}"


def _acc_coords(n_cols):
    """[thread][register] -> (row, col) of a wgmma m64n{n_cols} accumulator."""
    return [[wgmma_d_coord(tid // 32, tid % 32, i) for i in range(n_cols // 2)] for tid in range(128)]


def _tma_rows(rows):
    """Tensor row landing in each shared row of a box walked through the interleave8_rows view."""
    shape, strides, box = view_dims((3, rows, 32), (1, rows, 32), "interleave8_rows")
    out = []
    for j in range(box[1]):
        for t in range(box[2]):
            for e in range(box[3]):
                out.append((j * strides[1] + t * strides[2] + e * strides[3]) // strides[2])
    return out


def _wgmma_rs(acc_regs, a_regs, b_smem):
    """Model of m64nNk8 with A from registers: acc[tid][i] += sum_p A[m, p] B[p, n]."""
    n_cols = b_smem.shape[0]
    A = np.zeros((64, 8))
    for tid in range(128):
        for j in range(4):
            r, c = wgmma_tf32_a_coord(tid // 32, tid % 32, j)
            A[r, c] = a_regs[tid][j]
    D = A @ b_smem.T          # b_smem[n, p]: K-major B, row n of shared memory
    coords = _acc_coords(n_cols)
    return [[acc_regs[tid][i] + D[coords[tid][i]] for i in range(n_cols // 2)] for tid in range(128)]


@pytest.mark.parametrize("M,Kd", [(64, 128), (128, 64)])
def test_transposed_product_in_interleaved_order(M, Kd):
    """(L·X)ᵀ computed as the kernel does — A = Xᵀ from X's own accumulator registers, B = L with
    its rows loaded through the view — is again a fragment in the interleaved column order."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((Kd, 64))          # [Kd, V-block]: register tile
    L = rng.standard_normal((M, Kd))           # ring tile, row-major
    # X as the kernel holds it: accumulator column n holds tile row interleave8(n)
    xc = _acc_coords(Kd)
    x_regs = [[X[interleave8(c), r] for (r, c) in xc[tid]] for tid in range(128)]
    b_smem = L[_tma_rows(M)]                   # shared row n = tensor row interleave8(n)
    assert _tma_rows(M) == [interleave8(n) for n in range(M)]
    acc = [[0.0] * (M // 2) for _ in range(128)]
    for kb in range(Kd // 8):
        a = [[x_regs[tid][acc_reg_for_tf32_a(kb, j)] for j in range(4)] for tid in range(128)]
        acc = _wgmma_rs(acc, a, b_smem[:, 8 * kb:8 * kb + 8])
    want = (L @ X).T                           # [V-block, M]
    oc = _acc_coords(M)
    for tid in range(128):
        for i, (r, c) in enumerate(oc[tid]):
            assert abs(acc[tid][i] - want[r, interleave8(c)]) < 1e-9


def test_interleave8_is_a_permutation_of_each_block():
    assert sorted(interleave8(n) for n in range(64)) == list(range(64))
    assert [interleave8(n) for n in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]


def test_tf32_rounding_is_round_to_nearest_ties_away():
    one_ulp = 2.0 ** -10
    x = np.array([1.0 + one_ulp / 2, 1.0 + one_ulp / 2 - 2 ** -20, -(1.0 + one_ulp / 2),
                  np.inf, 3.0], np.float32)
    got = tf32_round(x)
    assert got[0] == np.float32(1.0 + one_ulp)           # tie: away from zero
    assert got[1] == np.float32(1.0)
    assert got[2] == np.float32(-(1.0 + one_ulp))
    assert np.isinf(got[3]) and got[4] == 3.0
    y = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert np.all(np.abs(tf32_round(y) - y) <= np.abs(y) * 2.0 ** -11 * 1.0001)
    assert np.all((tf32_round(y).view(np.uint32) & 0x1FFF) == 0)


def _plans(program, k_split=1, **opts):
    from kdagen import driver
    from kdagen.codegen.lower.kernel import _register_scan_plans
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.plan import group_kernels
    from kdagen.codegen.lower.program import read_program
    from kdagen.target import TARGETS
    # fp32 checkpoints: the staging rules these tests check (the fp16 ones, scaled by column,
    # are test_fp16_checkpoints.py's)
    prog = read_program(driver.build_module(program, opts, pipeline=F32_CHECKPOINTS,
                                            chip="sm_90a"))
    groups = group_kernels(prog, True)
    # the tuning table off: these tests are of the plans' rules (the table's entries, e.g.
    # the reverse scans on two warpgroups, are test_reverse_scans_take_two_warpgroups_by_the_table's)
    return prog, groups, _register_scan_plans(prog, groups, TARGETS["sm_90a"],
                                              LowerOptions(path="native", dot="auto",
                                                           scan_k_split=k_split, tuned=False))


@pytest.mark.parametrize("program", ["kda_bwd", "gdn_bwd"])
def test_reverse_scans_take_two_warpgroups_by_the_table(program):
    """The tuning table puts both reverse dS scans at K = V = 128 on two consumer warpgroups,
    one CTA per head (H100: the dq kernel beside the scan gets the SMs back); their forward
    recompute scans keep one warpgroup per 64 value columns, and the table off, so does the
    reverse scan."""
    from kdagen import driver
    from kdagen.codegen.lower.kernel import _register_scan_plans
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.plan import group_kernels
    from kdagen.codegen.lower.program import read_program
    from kdagen.target import TARGETS
    prog = read_program(driver.build_module(program, {}, pipeline="chip", chip="sm_90a"))
    groups = group_kernels(prog, True)
    for tuned, want in ((True, (2, 1)), (False, (1, 2))):
        plans = _register_scan_plans(prog, groups, TARGETS["sm_90a"],
                                     LowerOptions(path="native", dot="auto", tuned=tuned))
        by_dir = {bool(rp.scan.attrs.get("reverse")): rp for rp in plans.values()}
        assert (by_dir[True].warpgroups, by_dir[True].v_ctas) == want, tuned
        assert (by_dir[False].warpgroups, by_dir[False].v_ctas) == (1, 2)


@pytest.mark.parametrize("program", ["kda_fwd", "gdn_fwd"])
def test_forward_state_kernel_takes_the_register_scan(program):
    prog, groups, plans = _plans(program)
    serial = [g.index for g in groups if g.scans and not g.parallel]
    assert list(plans) == serial and len(serial) == 1
    rp = plans[serial[0]]
    # one consumer warpgroup per CTA, two CTAs per head (64 value columns each)
    assert (rp.K, rp.V, rp.warpgroups, rp.v_ctas) == (128, 128, 1, 2)
    assert rp.grid == ["HV * 2", "N", "1"]
    by_name = {s.tensor: s for s in rp.slots}
    assert by_name["u_ws"].v_cols == 64 and by_name["w_ws"].v_cols == 0
    by_name = {s.tensor: s for s in rp.slots}
    # w·S: w is a B operand as stored; krᵀ·v': kr is stored transposed by the chunk kernel
    assert by_name["w_ws"].operand and not by_name["w_ws"].transposed
    assert by_name["kr_ws"].operand and by_name["kr_ws"].transposed
    assert not by_name["u_ws"].operand
    storage = {mem.workspace["name"]: v for mem, v in rp.workspace_storage().items()}
    assert storage == {"w_ws": {"transposed": False, "round": "tf32"},
                       "kr_ws": {"transposed": True, "round": "tf32"}}
    assert rp.depth == 2
    maps = rp.tensor_maps()
    assert maps["kr_ws_tmap_b"]["view"] == "interleave8_rows" and maps["kr_ws_tmap_b"]["transposed"]


@pytest.mark.parametrize("program", ["kda_bwd", "gdn_bwd"])
def test_backward_scans_take_the_register_scan_with_their_own_layouts(program):
    """The backward's recompute scan reads kr transposed and w as stored; its reverse scan reads
    kr as stored and w, qd transposed. The workspaces share names (one buffer used in turn) but
    are distinct values with distinct writers, so each pair agrees on its own layout."""
    _, groups, plans = _plans(program)
    serial = [g.index for g in groups if g.scans and not g.parallel]
    assert sorted(plans) == serial and len(serial) == 2
    recompute, reverse = (plans[i] for i in serial)
    assert not recompute.scan.attrs.get("reverse") and reverse.scan.attrs.get("reverse")
    layout = {}
    for rp in (recompute, reverse):
        for mem, st in rp.workspace_storage().items():
            layout.setdefault(mem.workspace["name"], []).append(st["transposed"])
    assert layout["kr_ws"] == [True, False] and layout["w_ws"] == [False, True]
    assert layout["qd_ws"] == [True]
    ops = [s.tensor for s in reverse.slots]
    assert "do" in ops and "dv_new_ws" in ops


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("k_split", [1, 2])
def test_register_scan_kernel_assembles_for_sm90a(tmp_path, k_split):
    import subprocess

    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module("kda_fwd", {}, pipeline=F32_CHECKPOINTS, chip="sm_90a")
    opts = LowerOptions(path="native", dot="tf32", scan_k_split=k_split, scan_tma_stores=False)
    ks = [k for k in lower_program(mod, t, options=opts) if k.path == "sm90-register-scan"]
    assert len(ks) == 1
    ptx = driver.ptx_of(ks[0].module, t, ks[0].name)
    assert "cp.async.bulk.tensor.5d" in ptx
    # A operands rounded to TF32 by one add of half a TF32 ulp to the bits (the tensor core
    # drops the low 13 bits), not by cvt.rna, which ptxas emulates in four instructions
    assert "cvt.rna.tf32.f32" not in ptx
    counts = ks[0].cost["counts"]
    rounding_adds = re.findall(r"add\.s32\s+%r\d+, %r\d+, 4096;", ptx)
    assert len(rounding_adds) == counts["cvt.tf32"] > 0
    counts = ks[0].cost["counts"]
    assert counts["wgmma.wait"] == 2
    if k_split == 1:
        assert "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32" in ptx
        assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in ptx
        # the state stays in registers: no shared-memory stores in the kernel
        assert "st.shared" not in ptx
        assert counts["wgmma"] == 128 // 8 + 64 // 8
    else:
        # each warpgroup: w·S over its 64 rows of S (m64n64, 8 k-steps), then its 64 rows of
        # krᵀ·v' (m64n64, 8 k-steps); the partials of w·S meet through shared memory at one
        # named barrier of the two consumer warpgroups, fenced before the ring stage is freed
        assert "m64n128k8" not in ptx and ptx.count("m64n64k8.f32.tf32.tf32") == 16
        assert counts["wgmma"] == 64 // 8 + 64 // 8
        assert "bar.sync \t1, 256;" in ptx and "fence.proxy.async.shared::cta" in ptx
        assert counts["st.shared"] == 32 and counts["bar.sync"] == 1
    (tmp_path / "k.ptx").write_text(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                        str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "0 bytes spill stores" in r.stderr


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("split", ["state", "all"])
def test_a_split_doubles_the_products_whose_register_operand_it_splits(tmp_path, split):
    """scan_a_split: each split product issues a lo and a hi wgmma per k block on the same B
    descriptor; "state" splits only w·S (A = the carried state), "all" krᵀ·v' as well. The lo
    part is x minus x's TF32 value (its dropped bits cleared by one and), rounded by the same
    add of half a TF32 ulp. With the state rows split over two warpgroups nothing spills."""
    import subprocess

    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module("kda_fwd", {}, pipeline="chip", chip="sm_90a")
    opts = LowerOptions(path="native", dot="tf32", scan_k_split=2, scan_a_split=split)
    (k,) = [k for k in lower_program(mod, t, options=opts) if k.path == "sm90-register-scan"]
    ptx = driver.ptx_of(k.module, t, k.name)
    # per warpgroup, unsplit: 8 k-steps of w·S over its 64 state rows + 8 of krᵀ·v'
    split_steps = 8 if split == "state" else 16
    assert k.cost["counts"]["wgmma"] == 16 + split_steps
    assert ptx.count("m64n64k8.f32.tf32.tf32") == 16 + split_steps
    masks = re.findall(r"and\.b32\s+%r\d+, %r\d+, -8192;", ptx)
    assert len(masks) == 4 * split_steps          # one per hi register (4 per k block)
    (tmp_path / "k.ptx").write_text(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                        str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "0 bytes spill stores" in r.stderr


def test_a_split_takes_only_its_three_values():
    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.plan import LoweringError
    from kdagen.target import TARGETS
    mod = driver.build_module("kda_fwd", {}, pipeline="chip", chip="sm_90a")
    with pytest.raises(LoweringError, match="scan_a_split: 'yes'; use 'off', 'state' or 'all'"):
        lower_program(mod, TARGETS["sm_90a"], options=LowerOptions(path="native",
                                                                    scan_a_split="yes"))


@pytest.mark.parametrize("rows,cols", [(64, 128), (128, 64)])
def test_k_split_slice_starts_are_the_operand_block_starts(rows, cols):
    """A K-split scan's warpgroup reads its K slice / N rows of a B tile from a shifted base with
    the unsplit descriptors: the shift must be exactly where `operand_start_and_strides` puts
    the block at the slice's first K row / N row."""
    from kdagen.codegen.common.layouts import SmemLayout
    from kdagen.codegen.lower.register_scan import SWIZZLE, TF32_K, slice_start
    from kdagen.codegen.sm90.wgmma import operand_start_and_strides
    lay = SmemLayout(rows, cols, 4, SWIZZLE)
    k_local, n_local = cols // 2, rows // 2
    for part in range(2):
        for kb in range(k_local // TF32_K):
            whole = operand_start_and_strides(lay, "b", True, 0, part * k_local + kb * TF32_K)
            local = operand_start_and_strides(lay, "b", True, 0, kb * TF32_K)
            assert whole[0] == slice_start(lay, "k", part, k_local) + local[0]
            assert whole[1:] == local[1:]
        for kb in range(cols // TF32_K):
            whole = operand_start_and_strides(lay, "b", True, part * n_local, kb * TF32_K)
            local = operand_start_and_strides(lay, "b", True, 0, kb * TF32_K)
            assert whole[0] == slice_start(lay, "n", part, n_local) + local[0]


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd", "gdn_fwd", "gdn_bwd"])
def test_k128_scans_split_the_state_rows_over_two_warpgroups(program):
    """At K = 128 every serial scan splits S's rows over two warpgroups of one value block: the
    product summing over S's rows (w·S forward, kr·dS reverse) is the one exchange, and it meets
    in its own ring tile; at K = 64 the partials do not fit there and the scan stays unsplit.
    A bf16x3 scan (KDA's backward) meets in the hi part of the tile only, half its bytes, where
    the partials do not fit at K = 128 either: unsplit."""
    _, groups, plans = _plans(program, k_split=2)
    for rp in plans.values():
        if rp.precision == "bf16x3":
            assert program == "kda_bwd" and rp.k_split == 1
            continue
        assert rp.k_split == 2 and rp.block_threads == 384 and rp.grid[0] == "HV * 2"
        want = "kr_ws" if rp.scan.attrs.get("reverse") else "w_ws"
        assert [s.tensor for s in rp.exchanges.values()] == [want]
        carried = rp.scan.body.args[1]
        assert carried in rp.split_values
        assert rp.scan.body.nodes[-1].operands[0] in rp.split_values
    _, _, plans64 = _plans(program, k_split=2, head_k_dim=64, head_v_dim=64)
    assert plans64 and all(rp.k_split == 1 and rp.block_threads == 256 for rp in plans64.values())


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd", "gdn_fwd", "gdn_bwd"])
def test_carried_checkpoints_are_staged_for_tma_stores(program):
    """Every serial scan stores its per-chunk checkpoint of the carried value (S_c forward,
    dS_c reverse) through one 128B-swizzled staging tile after the ring, with its own store
    tensor map (box: one 32-column panel of the K rows); nothing else is staged."""
    _, _, plans = _plans(program)
    assert plans
    for rp in plans.values():
        carried = rp.scan.body.args[1]
        ckpt = [n for n in rp.scan.body.nodes
                if n.op == "kda.store_chunk" and n.operands[2] is carried]
        assert [st.node for st in rp.stores] == ckpt and len(ckpt) == 1
        st = rp.stores[0]
        assert st.offset % 1024 == 0 and st.offset >= rp.ring_bytes + 16 * rp.depth
        assert rp.smem_bytes == st.offset + st.nbytes <= 227 * 1024
        assert (st.rows, st.cols, st.nbytes) == (rp.K, rp.V // rp.v_ctas, rp.K * st.cols * 4)
        spec = rp.tensor_maps()[st.param]
        assert spec == {"tensor": st.tensor, "dtype": "f32", "flatten": 2,
                        "box": [1, rp.K, 32], "swizzle": 128}


def test_staged_checkpoint_offsets_are_a_permutation_of_the_staging_tile():
    """The staging writes (one pointer per swizzle phase, 8-row groups as immediates) put the
    128 threads' 64 registers of S [128, 64] on distinct words covering the whole tile, each at
    the address the 128B-swizzled layout (what the TMA store reads) gives its (row, column)."""
    from kdagen.codegen.common.layouts import SmemLayout, lane_group, lane_in_group
    from kdagen.codegen.lower.register_scan import SWIZZLE
    lay = SmemLayout(128, 64, 4, SWIZZLE)
    seen = {}
    for tid in range(128):
        warp, lane = tid // 32, tid % 32
        g, t = lane_group(lane), lane_in_group(lane)
        for i in range(64):
            h, q, j = i % 2, (i // 2) % 2, i // 4
            row, col = t + 8 * j + 4 * h, warp * 16 + g + 8 * q
            got = lay.byte_offset(t + 4 * h, warp * 16 + g + 8 * q) + 8 * j * lay.row_pitch
            assert got == lay.byte_offset(row, col)
            seen[got] = (row, col)
    assert sorted(seen) == list(range(0, 128 * 64 * 4, 4))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_staged_checkpoint_kernel_assembles_without_spills(tmp_path):
    import subprocess

    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module("kda_fwd", {}, pipeline=F32_CHECKPOINTS, chip="sm_90a")
    ks = [k for k in lower_program(mod, t, options=LowerOptions(path="native", dot="auto"))
          if k.path == "sm90-register-scan"]
    ptx = driver.ptx_of(ks[0].module, t, ks[0].name)
    # two panel copies per step from thread 0 only, no branch; S's 64 registers go to shared
    # memory, the global stores left are v' (32) and the final state (64)
    assert ptx.count("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group") == 2
    assert ptx.count("st.shared.b32") == 64 and ptx.count("st.global.b32") == 32 + 64
    assert "cp.async.bulk.wait_group.read" in ptx and "bar.sync \t2, 128;" in ptx
    counts = ks[0].cost["counts"]
    assert counts["tma.store"] == 2 and counts["st.global"] == 32
    (tmp_path / "k.ptx").write_text(ptx)
    r = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                        str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "0 bytes spill stores" in r.stderr and "C7517" not in r.stderr


@pytest.mark.parametrize("first", [False, True])
def test_checkpoints_first_stores_before_the_ring_wait(first):
    """scan_checkpoints_first: the step stages and copies out the carried value's checkpoint
    (here with fp16 checkpoints' column scale: its sums' shuffles too) before it waits for the
    chunk's ring tiles; off, after that wait. The step's only consumer mbarrier wait is the
    ring's."""
    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module("gdn_fwd", {}, pipeline="chip+kda-narrow-checkpoints{dtype=fp16}",
                              chip="sm_90a")
    opts = LowerOptions(path="native", dot="auto", scan_checkpoints_first=first)
    (k,) = [k for k in lower_program(mod, t, options=opts) if k.path == "sm90-register-scan"]
    ptx = driver.ptx_of(k.module, t, k.name)
    copy_out = ptx.index("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group")
    first_shuffle = ptx.index("shfl.sync.bfly")
    waits = [m.start() for m in re.finditer(r"mbarrier\.try_wait\.parity", ptx)]
    # the producer's wait for a free stage comes first in the text; the consumer's ring wait
    # is the last one before the step's first product
    ring_wait = max(w for w in waits if w < ptx.index("wgmma.mma_async"))
    if first:
        assert first_shuffle < copy_out < ring_wait
    else:
        assert ring_wait < first_shuffle < copy_out


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd", "gdn_bwd"])
def test_step_schedule_issues_products_early(program):
    """schedule_step: a topological order of the step in which the reads of the carried value
    come before any product (no C7517 wait) and, in the reverse scan, the product that does not
    depend on the first one (qdᵀ·do) is issued before anything waits for the first (kr·dS), so
    the two overlap; the third accumulates onto the second after the first's result is used."""
    from kdagen.codegen.lower.register_scan import schedule_step
    _, _, plans = _plans(program)
    for rp in plans.values():
        body = rp.scan.body
        nodes, carried = body.nodes[:-1], body.args[1]
        order = schedule_step(nodes, carried)
        assert sorted(map(id, order)) == sorted(map(id, nodes))
        pos = {id(n): i for i, n in enumerate(order)}
        producer = {r: n for n in nodes for r in n.results}
        for n in order:
            for o in n.operands:
                if o in producer:
                    assert pos[id(producer[o])] < pos[id(n)]
        dots = [n for n in order if n.op == "kda.dot"]
        reads = [n for n in order if n.op in ("kda.mul", "kda.add", "kda.sub")
                 and carried in n.operands]
        assert reads and all(pos[id(r)] < pos[id(dots[0])] for r in reads)
        if rp.scan.attrs.get("reverse"):
            assert len(dots) == 3
            first = dots[0]
            result = first.results[0]
            users = [n for n in order if result in n.operands]
            if (len(users) == 1 and users[0].op == "kda.add"
                    and all(producer.get(o) is None or pos[id(producer[o])] < pos[id(first)]
                            for o in users[0].operands if o is not result)):
                # the product accumulates onto a value emitted before it (GDN's backward:
                # dv' = kr·dS + (q·k) ⊙ do): that add waits for nothing, its users do
                result = users[0].results[0]
            waiting = [n for n in order if result in n.operands]   # + dv' (a ring tile)
            assert waiting and pos[id(dots[1])] < min(pos[id(n)] for n in waiting)


def test_descriptor_series_matches_encoding_each_address():
    """`wgmma.make_descriptors` adds each block's offset to the address field computed once;
    that equals encoding each address anew (`descriptor_bits`) for every CTA-local shared
    address of sm_90 (below 228 KB), including addresses carrying cluster bits above bit 18,
    which both forms mask off. Checked on the integer arithmetic the emitted code performs."""
    from kdagen.codegen.sm90.wgmma import descriptor_bits
    rng = np.random.default_rng(3)
    lbo, sbo, swz = 16, 1024, 128
    const = descriptor_bits(0, lbo, sbo, swz)
    for _ in range(2000):
        local = int(rng.integers(0, 228 * 1024 // 16 - 2048)) * 16
        cluster = int(rng.integers(0, 16)) << 24
        base = cluster | local
        deltas = [int(d) * 16 for d in rng.integers(0, 2048, size=4)]
        field = (base >> 4) & 0x3FFF
        for d in deltas:
            series = const | (field + (d >> 4))
            assert series == descriptor_bits(base + d, lbo, sbo, swz)


def _half_a_coord(warp, lane, j, h):
    """(row, col) of half ``h`` (0: bits 0-15) of register ``j`` of a wgmma m64nNk16 16-bit A
    fragment (PTX's register layout): a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..),
    a3 (g + 8, 2t + 8..)."""
    g, t = lane // 4, lane % 4
    return 16 * warp + g + 8 * (j % 2), 2 * t + 8 * (j // 2) + h


@pytest.mark.parametrize("M,Kd", [(64, 128), (128, 64)])
def test_bf16x3_product_in_natural_order(M, Kd):
    """(L·X)ᵀ as the bf16x3 scan computes it — A = Xᵀ packed from X's own accumulator registers
    (`acc_regs_for_half_a`), B = L's rows as stored (no view), hi and lo parts of both, three
    products per 16-deep block — is a fragment in natural column order, to ~16 bits."""
    from kdagen.codegen.common.layouts import acc_regs_for_half_a

    def bf16(x):
        b = np.asarray(x, np.float32).view(np.uint32)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000     # round to nearest even
        return b.view(np.float32).astype(np.float64)

    rng = np.random.default_rng(1)
    X = rng.standard_normal((Kd, 64))
    L = rng.standard_normal((M, Kd))
    xc = _acc_coords(Kd)
    x_regs = [[X[c, r] for (r, c) in xc[tid]] for tid in range(128)]   # column n = row n
    L_hi = bf16(L)
    L_lo = bf16(L - L_hi)
    D = np.zeros((64, M))
    for kb in range(Kd // 16):
        A_hi, A_lo = np.zeros((64, 16)), np.zeros((64, 16))
        for tid in range(128):
            for j in range(4):
                for h, reg in enumerate(acc_regs_for_half_a(kb, j)):
                    r, c = _half_a_coord(tid // 32, tid % 32, j, h)
                    x = x_regs[tid][reg]
                    A_hi[r, c] = bf16(x)
                    A_lo[r, c] = bf16(x - A_hi[r, c])
        b_hi, b_lo = L_hi[:, 16 * kb:16 * kb + 16], L_lo[:, 16 * kb:16 * kb + 16]
        D += A_hi @ b_lo.T + A_lo @ b_hi.T + A_hi @ b_hi.T
    want = (L @ X).T
    assert np.abs(D - want).max() < 2e-4 * np.abs(want).max()
    # the plain product would be ~100x further off: the test sees the lo parts
    assert np.abs(bf16(X).T @ bf16(L).T - want).max() > 1e-3 * np.abs(want).max()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_kda_backward_scans_take_bf16x3(tmp_path):
    """KDA's backward scans (kda-assign-precision's state path): three m64nNk16 bf16 wgmma per
    16-deep block and no TF32 one; their B operands stored by the writing kernels as bf16 hi and
    lo tiles (MemRef.split) and loaded as two bf16 parts, rows in natural order (no
    interleave8_rows view); the kernels assemble without spills.""" 
    import subprocess

    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    _, _, plans = _plans("kda_bwd")
    for rp in plans.values():
        assert rp.precision == "bf16x3" and rp.natural_order
        for mem, st in rp.workspace_storage().items():
            if any(s.mem is mem and s.operand for s in rp.slots):
                assert st["split"] == "bf16_hi_lo" and st["round"] is None
        for s in rp.slots:
            spec = s.tensor_map()
            if s.operand:
                assert spec["dtype"] == "bf16" and spec["parts"] == 2 and "view" not in spec
                assert s.nbytes == 2 * s.part_bytes
    mod = driver.build_module("kda_bwd", {}, pipeline="chip", chip="sm_90a")
    ks = [k for k in lower_program(mod, t, options=LowerOptions(path="native", dot="auto"))
          if k.path == "sm90-register-scan"]
    assert len(ks) == 2
    for k in ks:
        ptx = driver.ptx_of(k.module, t, k.name)
        assert "k8.f32.tf32" not in ptx
        n16 = len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx))
        assert n16 == k.cost["counts"]["wgmma"] > 0 and n16 % 3 == 0
        (tmp_path / "k.ptx").write_text(ptx)
        r = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                            str(tmp_path / "k.cubin")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "0 bytes spill stores" in r.stderr, r.stderr
        # the scan commits and waits for the first fence group's products before packing the
        # second's A (LowerOptions.scan_a_group, scan_group_wait): ptxas inserts no wait
        assert "C7517" not in r.stderr and "C7518" not in r.stderr, r.stderr


def test_tensor_map_of_two_parts_doubles_the_tile_rows():
    """A bf16x3 operand's map (MapSpec.parts = 2) sees an f32 workspace of [.., R, K] tiles as
    [.., 2R, K] bf16: hi rows then lo rows in the bytes of each tile; a bf16 tensor is refused."""
    import torch

    from kdagen.runtime.tensormap import MapSpec, TensorMapError, map_dims
    ws = torch.zeros(6, 4, 64, 128)                 # [chunks, heads, R, K] f32
    spec = MapSpec("bf16", 2, (1, 64, 64), 128, None, False, 2)
    assert map_dims(ws.shape, ws.element_size(), spec, "w") == (24, 128, 128)
    spec_t = MapSpec("bf16", 2, (1, 128, 64), 128, None, True, 2)
    assert map_dims(ws.shape, ws.element_size(), spec_t, "kr") == (24, 256, 64)
    with pytest.raises(TensorMapError, match="two 16-bit parts of an f32 tensor"):
        map_dims(ws.shape, 2, spec, "w")


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("acquire", ["start", "products"])
@pytest.mark.parametrize("program", ["kda_bwd", "gdn_bwd"])
def test_slot_barriers_refill_a_one_stage_ring_slot_by_slot(program, acquire):
    """scan_slot_barriers: the reverse scan (a one-stage ring) takes a full and an empty
    barrier per slot; the producer refills the slots in the order the step frees them, each
    with its own byte count; the step releases the slot its first products read once their
    group completes, before the products that read the others are issued; the kernel
    assembles without spills or serialised wgmma. The other scans keep their stage
    barriers."""
    from kdagen import driver
    from kdagen.codegen import ptxas
    from kdagen.codegen.lower.kernel import lower_program, prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.program import read_program
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module(program, {}, pipeline="chip", chip="sm_90a")
    opts = LowerOptions(path="native", dot="auto", scan_slot_barriers=True,
                        scan_slot_acquire=acquire, tuned=False)
    scans = [pk for pk in prepare(read_program(mod), t, program, opts)
             if pk.launch.get("path") == "sm90-register-scan"]
    assert len(scans) == 2
    by_depth = {pk.emitter.rplan.depth: pk for pk in scans}
    assert set(by_depth) == {1, 2}
    assert not by_depth[2].emitter.rplan.slot_barriers
    em = by_depth[1].emitter
    rp = em.rplan
    assert rp.slot_barriers and rp.barrier_pairs == len(rp.slots) > 2
    order = em._refill_order()
    assert sorted(order) == list(range(len(rp.slots)))
    k = [k for k in lower_program(mod, t, options=opts)
         if k.name.endswith(by_depth[1].name.split("__")[-1])][0]
    ptx = driver.ptx_of(k.module, t, k.name)
    # the producer: one expect_tx per slot with that slot's bytes, in the refill order
    expect = re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64 %rd\d+, "
                        r"\[__kdagen_dyn_smem\+(\d+)\], %r\d+;", ptx)
    full = [rp.barrier_offset + 8 * i for i in order]
    assert [int(x) for x in expect] == full
    # the consumer: a mid-step release (an arrive on an empty barrier between wgmma groups)
    body = ptx[ptx.index("setmaxnreg.inc"):]
    first_commit, last_commit = body.index("wgmma.commit_group"), body.rindex("wgmma.commit_group")
    mid = body[first_commit:last_commit]
    assert "mbarrier.arrive.shared.b64" in mid
    r = ptxas.assemble(ptx, "sm_90a", ptxas.find_ptxas())
    assert r.ok and "0 bytes spill stores" in r.log, r.log
    assert "C7517" not in r.log and "C7518" not in r.log, r.log
    # the consumer's waits: "start", every slot before the first product; "products", the
    # later products' slots together after the first product group
    waits = [m.start() for m in re.finditer(r"mbarrier\.try_wait", body)]
    assert len(waits) == len(rp.slots)
    late = [w for w in waits if w > first_commit]
    if acquire == "start":
        assert not late
    else:
        assert len(late) == 2 and body.find("wgmma.commit_group", late[0], late[1]) < 0
    # the cost model's exposed refill: the slots freed at the step's end that the step waits
    # for at its start, not the slot freed mid-step (with stage barriers: the whole stage)
    refill = k.cost["counts"]["ring.refill_bytes"]
    assert 0 < refill < rp.stage_bytes_tx
    plain = [k for k in lower_program(mod, t, options=LowerOptions(path="native", dot="auto",
                                                                   tuned=False))
             if k.name.endswith(by_depth[1].name.split("__")[-1])][0]
    assert plain.cost["counts"]["ring.refill_bytes"] == rp.stage_bytes_tx


def test_slot_acquire_option_is_checked():
    from kdagen.codegen.lower.kernel import prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.plan import LoweringError
    from kdagen.target import TARGETS
    prog, _, _ = _plans("kda_bwd")
    with pytest.raises(LoweringError, match="scan_slot_acquire: 'late'.*'start', 'products'"):
        prepare(prog, TARGETS["sm_90a"], "kda_bwd",
                LowerOptions(path="native", dot="auto", scan_slot_acquire="late"))
