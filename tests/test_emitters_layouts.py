"""Fragment layouts and shared-memory layouts against the PTX ISA tables (pure Python, no MLIR).

The ISA formulas below are transcribed from the PTX ISA sections "Matrix Fragments for
mma.m16n8k16 with floating point type", "ldmatrix", "WGMMA ... register fragment layout for
accumulator matrix D" and the TMA swizzle modes, written in the documents' own terms (element
index ai / bi / ci, groupID, threadID_in_group), independently of kdagen.codegen.common.layouts.
"""
import itertools

import pytest

from kdagen.codegen.common import layouts as L
from kdagen.codegen.common.mma import LoadStep, operand_lane_address, warp_matmul_plan, SmemOperand

LANES = range(32)


# ---- the ISA, as written in the documentation ------------------------------------------------

def isa_a(lane, i):
    """A element a_i (i = 0..7), .f16/.bf16 m16n8k16."""
    group, tig = lane >> 2, lane % 4
    row = group if (0 <= i < 2 or 4 <= i < 6) else group + 8
    col = tig * 2 + (i & 1) if i < 4 else tig * 2 + (i & 1) + 8
    return row, col


def isa_b(lane, i):
    """B element b_i (i = 0..3)."""
    group, tig = lane >> 2, lane % 4
    row = tig * 2 + (i & 1) if i < 2 else tig * 2 + (i & 1) + 8
    return row, group


def isa_c(lane, i):
    """C/D element c_i (i = 0..3), f32 accumulators."""
    group, tig = lane >> 2, lane % 4
    row = group if i < 2 else group + 8
    return row, tig * 2 + (i & 1)


def isa_ldmatrix(lane, matrix_num, trans):
    """ldmatrix .m8n8 b16: without .trans, thread l of each 8x8 matrix receives row l/4,
    elements 2*(l%4) and 2*(l%4)+1; .trans delivers the transposed element."""
    r, c = lane // 4, 2 * (lane % 4)
    out = [(r, c), (r, c + 1)]
    return [(b, a) for a, b in out] if trans else out


def isa_wgmma_d(warp, lane, i):
    """wgmma .m64nNk16 f32 accumulator d_i: row = 16*warp + groupID (+8 for i%4 >= 2),
    col = (i/4)*8 + 2*threadID_in_group + i%2."""
    group, tig = lane >> 2, lane % 4
    row = 16 * warp + group + (8 if i % 4 >= 2 else 0)
    return row, (i // 4) * 8 + tig * 2 + (i % 2)


# ---- mma.sync fragments ----------------------------------------------------------------------

def test_mma_fragments_match_isa_tables():
    for lane in LANES:
        for i in range(8):
            assert L.mma_a_coord(lane, i // 2, i % 2) == isa_a(lane, i), (lane, i)
        for i in range(4):
            assert L.mma_b_coord(lane, i // 2, i % 2) == isa_b(lane, i), (lane, i)
            assert L.mma_c_coord(lane, i) == isa_c(lane, i), (lane, i)


def test_mma_fragment_spot_values_from_figures():
    # Figure "MMA .m16n8k16 fragment layout for matrix A": T0 holds a0,a1 at row 0 cols 0,1 and
    # a6,a7 at row 8 cols 8,9; T5 (group 1, tig 1) holds a0 at (1, 2).
    assert [L.mma_a_coord(0, r, h) for r in range(4) for h in range(2)] == \
        [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert L.mma_a_coord(5, 0, 0) == (1, 2)
    assert L.mma_b_coord(31, 1, 1) == (15, 7)
    assert L.mma_c_coord(31, 3) == (15, 7)


@pytest.mark.parametrize("kind,shape,count", [("a", (16, 16), 8), ("b", (16, 8), 4), ("c", (16, 8), 4)])
def test_every_element_held_exactly_once(kind, shape, count):
    held = {}
    for lane in LANES:
        for i in range(count):
            coord = {"a": lambda: L.mma_a_coord(lane, i // 2, i % 2),
                     "b": lambda: L.mma_b_coord(lane, i // 2, i % 2),
                     "c": lambda: L.mma_c_coord(lane, i)}[kind]()
            assert coord not in held, f"{kind} element {coord} held twice"
            held[coord] = (lane, i)
    assert set(held) == set(itertools.product(range(shape[0]), range(shape[1])))


# ---- ldmatrix ----------------------------------------------------------------------------------

@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_address_roles(num):
    roles = [L.ldmatrix_address_role(lane, num) for lane in range(8 * num)]
    assert sorted(roles) == sorted(itertools.product(range(num), range(8)))
    assert roles[:8] == [(0, r) for r in range(8)]          # threads 0-7: matrix 0 rows
    for lane in range(8 * num, 32):                          # ignored lanes stay in range
        m, r = L.ldmatrix_address_role(lane, num)
        assert 0 <= m < num and 0 <= r < 8


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_delivery_matches_isa(trans):
    for lane in LANES:
        assert [L.ldmatrix_element(lane, h, trans) for h in range(2)] == isa_ldmatrix(lane, 0, trans)


def _ldmatrix_delivers(num, transposed, operand, flip_trans=False):
    """Model: which *logical operand* element lands in (lane, reg, half), going through the lane
    addresses the emitter uses and the ISA delivery rule. Returns {(lane, reg, half): (r, c)}."""
    trans = L.ldmatrix_trans_flag(operand, transposed) != flip_trans
    row_addr = {}
    for lane in LANES:
        matrix, row = L.ldmatrix_address_role(lane, num)
        if lane < 8 * num:
            row_addr[(matrix, row)] = L.ldmatrix_operand_lane_coord(lane, num, transposed)
    out = {}
    for lane in LANES:
        for reg in range(num):
            for h in range(2):
                r, c = isa_ldmatrix(lane, reg, trans)[h]        # element (r, c) of matrix reg
                srow, scol = row_addr[(reg, r)]                 # stored row r of that matrix
                stored = (srow, scol + c)
                out[(lane, reg, h)] = stored if not transposed else (stored[1], stored[0])
    return out


@pytest.mark.parametrize("transposed", [False, True])
def test_ldmatrix_x4_gives_mma_a_fragment(transposed):
    got = _ldmatrix_delivers(4, transposed, "a")
    for (lane, reg, h), logical in got.items():
        assert logical == L.mma_a_coord(lane, reg, h), (lane, reg, h, transposed)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("num", [2, 4])
def test_ldmatrix_gives_mma_b_atoms(transposed, num):
    got = _ldmatrix_delivers(num, transposed, "b")
    for (lane, reg, h), (k, n) in got.items():
        atom, breg = divmod(reg, 2)
        assert (k, n - 8 * atom) == L.mma_b_coord(lane, breg, h), (lane, reg, h, transposed)


def test_wrong_trans_flag_breaks_the_a_fragment():
    # The consistency check can fail: with the opposite .trans flag the A fragment is wrong.
    got = _ldmatrix_delivers(4, False, "a", flip_trans=True)
    wrong = sum(logical != L.mma_a_coord(lane, reg, h) for (lane, reg, h), logical in got.items())
    assert wrong > 200


# ---- accumulator → operand register reuse -----------------------------------------------------

def test_acc_to_a_is_a_lane_local_bijection():
    seen = set()
    for lane in LANES:
        for j in range(4):
            atom, lo, hi = L.acc_to_a_source(j)
            for h, ci in enumerate((lo, hi)):
                r, c = L.mma_c_coord(lane, ci)
                elem = (r, c + 8 * atom)                     # C of the 16x16 block (two n8 atoms)
                assert elem == L.mma_a_coord(lane, j, h)     # same lane holds the same A element
                seen.add(elem)
    assert len(seen) == 256


def test_acc_to_bt_is_a_lane_local_bijection():
    seen = set()
    for lane in LANES:
        for nb in range(2):
            for reg in range(2):
                atom, lo, hi = L.acc_to_bt_source(nb, reg)
                for h, ci in enumerate((lo, hi)):
                    r, c = L.mma_c_coord(lane, ci)
                    x_row, x_col = r, c + 8 * atom            # element of X (16x16)
                    k, n = L.mma_b_coord(lane, reg, h)
                    assert (k, n + 8 * nb) == (x_col, x_row)  # B of Xᵀ
                    seen.add((x_row, x_col))
    assert len(seen) == 256


# ---- accumulator tiles and wgmma ---------------------------------------------------------------

@pytest.mark.parametrize("rows,cols,wm,wn", [(16, 16, 1, 1), (64, 64, 2, 2), (64, 128, 4, 1), (16, 128, 1, 4)])
def test_acc_layout_covers_tile_once(rows, cols, wm, wn):
    lay = L.AccLayout(rows, cols, wm, wn)
    seen = set()
    for w in range(lay.num_warps):
        for lane in LANES:
            for reg in range(lay.regs_per_lane):
                seen.add(lay.coord(w, lane, reg))
    assert len(seen) == rows * cols == lay.num_warps * 32 * lay.regs_per_lane


def test_acc_row_regs_group_exactly_the_rows_of_a_quad():
    lay = L.AccLayout(64, 64, 2, 2)
    for w in range(4):
        for slot, regs in enumerate(lay.row_regs()):
            cols = set()
            rows = set()
            for lane in range(4 * 3, 4 * 3 + 4):        # one quad
                for reg in regs:
                    r, c = lay.coord(w, lane, reg)
                    rows.add(r)
                    cols.add(c)
            assert len(rows) == 1
            assert cols == set(range(lay.warp_origin(w)[1], lay.warp_origin(w)[1] + lay.warp_cols))


@pytest.mark.parametrize("n", [8, 64, 256])
def test_wgmma_accumulator_is_acc_layout(n):
    lay = L.AccLayout(64, n, 4, 1)
    for w in range(4):
        for lane in LANES:
            for i in range(n // 2):
                assert isa_wgmma_d(w, lane, i) == L.wgmma_d_coord(w, lane, i) == lay.coord(w, lane, i)


def test_tmem_32x32b_rows():
    assert L.tmem_32x32b_coord(5, 7, 3) == (32 * 1 + 7, 3)


# ---- shared-memory layouts -------------------------------------------------------------------

def tma_swizzle_reference(row, col, cols_per_row, swizzle, elem=2):
    """TMA SWIZZLE_{32,64,128}B for a box whose rows are exactly `swizzle` bytes: the 16-byte
    chunk index within the row is XORed with (row / (128 / swizzle)) mod (swizzle / 16)."""
    chunk, within = divmod(col * elem, 16)
    rows_per_128 = 128 // swizzle
    xor = (row // rows_per_128) % (swizzle // 16)
    return row * swizzle + ((chunk ^ xor) * 16) + within


@pytest.mark.parametrize("swizzle", [32, 64, 128])
def test_swizzle_matches_tma_pattern(swizzle):
    cols = swizzle // 2
    lay = L.SmemLayout(64, cols, 2, swizzle)
    for r in range(64):
        for c in range(cols):
            assert lay.byte_offset(r, c) == tma_swizzle_reference(r, c, cols, swizzle)


@pytest.mark.parametrize("lay", [L.SmemLayout(64, 128, 2, 128), L.SmemLayout(32, 64, 2, 64),
                                 L.SmemLayout(16, 16, 2, 32), L.SmemLayout(64, 64, 2, 0, pad_bytes=16),
                                 L.SmemLayout(64, 64, 4, 128)])
def test_layout_is_a_bijection_with_contiguous_chunks(lay):
    offsets = {lay.byte_offset(r, c) for r in range(lay.rows) for c in range(lay.cols)}
    assert len(offsets) == lay.rows * lay.cols
    assert max(offsets) < lay.size_bytes
    per_chunk = 16 // lay.elem_bytes
    for r in range(lay.rows):
        for c0 in range(0, lay.cols, per_chunk):
            base = lay.byte_offset(r, c0)
            assert base % 16 == 0
            assert [lay.byte_offset(r, c0 + j) for j in range(per_chunk)] == \
                [base + lay.elem_bytes * j for j in range(per_chunk)]


def _plan_phases_conflicts(lay, transposed, operand, layout_acc, k):
    """Worst bank-group multiplicity over every 8-lane ldmatrix phase of a warp-matmul plan."""
    class T:
        def __init__(s, lay): s.layout = lay
        def byte_offset(s, r, c): return s.layout.byte_offset(r, c)
    plan = warp_matmul_plan(layout_acc, k)
    src = SmemOperand(T(lay), transposed)
    worst = 1
    for step in plan.steps:
        if not isinstance(step, LoadStep) or step.operand != operand:
            continue
        for w in range(layout_acc.num_warps):
            origin = layout_acc.warp_origin(w)
            for phase in range(step.num):
                groups = [L.bank_group(src.tile.byte_offset(*operand_lane_address(step, src, origin, lane)))
                          for lane in range(8 * phase, 8 * phase + 8)]
                worst = max(worst, max(groups.count(g) for g in groups))
    return worst


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("operand", ["a", "b"])
def test_auto_layouts_make_ldmatrix_conflict_free(transposed, operand):
    acc = L.AccLayout(64, 64, 2, 2)
    lay = L.SmemLayout.auto(64, 64)
    assert _plan_phases_conflicts(lay, transposed, operand, acc, 64) == 1
    # and the check can fail: a plain 128-byte pitch is an 8-way conflict
    assert _plan_phases_conflicts(L.SmemLayout(64, 64, 2, 0), transposed, operand, acc, 64) == 8


def test_padded_layout_is_conflict_free_too():
    acc = L.AccLayout(64, 64, 2, 2)
    lay = L.SmemLayout(64, 64, 2, 0, pad_bytes=16)
    assert _plan_phases_conflicts(lay, False, "a", acc, 64) == 1


def test_auto_layout_choices():
    assert L.SmemLayout.auto(64, 128).swizzle == 128
    assert L.SmemLayout.auto(64, 32).swizzle == 64
    assert L.SmemLayout.auto(16, 16).swizzle == 32
    with pytest.raises(ValueError, match="swizzle span"):
        L.SmemLayout(64, 16, 2, 64)
