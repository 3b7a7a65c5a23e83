"""Shared-memory bank accounting of the simulator (sim_backend.BankCounter) and the row padding
of the tile buffers it is used to choose (LowerOptions.smem_row_pad)."""
from __future__ import annotations

import numpy as np
import pytest

from kdagen.codegen.lower import backend as B
from kdagen.codegen.lower.sim_backend import BankCounter, SimBackend, SimMemory, SimPtr
from kdagen.codegen.lower.storage import buffer_strides


def _read(pattern, nthreads=32):
    """One simulated load of word ``pattern(lane)`` per lane from a shared buffer."""
    banks = BankCounter()
    be = SimBackend(nthreads, banks=banks)
    mem = SimMemory("smem", np.zeros(1 << 14, np.float32), "f32")
    with B.use(be):
        B.load(SimPtr(mem), pattern(be.lanes))
    return banks.totals()["ld"]


def test_bank_counter_counts_wavefronts_per_warp():
    assert _read(lambda t: t) == [1, 1]                  # consecutive words: one pass
    assert _read(lambda t: 0 * t) == [1, 1]              # one word, broadcast to every lane
    assert _read(lambda t: 128 * t) == [1, 32]           # a column of a 128-wide row-major tile
    assert _read(lambda t: 129 * t) == [1, 1]            # ... of a tile padded to 129
    assert _read(lambda t: 2 * t) == [1, 2]              # stride 2: two words per bank
    assert _read(lambda t: t, nthreads=64) == [2, 2]     # two warps, two requests


def test_bank_counter_ignores_global_memory():
    banks = BankCounter()
    be = SimBackend(32, banks=banks)
    mem = SimMemory("q", np.zeros(4096, np.float32), "f32")
    with B.use(be):
        B.load(SimPtr(mem), 128 * be.lanes)
    assert banks.by_op == {}


def _fragment_wavefronts(row_pad: int) -> int:
    """Wavefronts of one TF32 mma A-fragment gather (lane g = lane / 4 reads row g, column
    t = lane % 4) from a [64, 128] fp32 tile padded by ``row_pad``."""
    pitch = buffer_strides((64, 128), "smem", row_pad)[0]
    return _read(lambda lane: (lane // 4) * pitch + lane % 4)[1]


def test_a_pitch_of_four_mod_32_serves_an_mma_fragment_in_one_pass():
    assert _fragment_wavefronts(1) == 4      # rows g and columns t fold onto banks g + t
    assert _fragment_wavefronts(4) == 1      # banks 4 g + t: all 32 distinct


def test_row_padding_changes_addresses_not_results_and_cuts_conflicts():
    """The lowered kda_fwd (sm_90a pipeline, portable tile emitters on 256 threads) simulated
    with rows padded by 1 and by 4: bitwise the same outputs, and the padding of 4 serves the
    shared-memory loads in fewer wavefronts (the mma fragment gathers of the decay product
    stop conflicting)."""
    import torch
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.sim import simulate
    from kdagen.driver import build_module
    from tools.smem_banks import program_inputs

    options, x = program_inputs("kda_fwd", K=64)
    module = build_module("kda_fwd", options, "chip", "sm_90a")
    outs, waves = {}, {}
    for pad in (1, 4):
        banks: dict = {}
        outs[pad] = simulate(module, x, options=LowerOptions(nthreads=256, dot="auto",
                                                             smem_row_pad=pad), banks=banks)
        tot = [b.totals()["ld"] for b in banks.values()]
        waves[pad] = (sum(r for r, _ in tot), sum(w for _, w in tot))
    for name in outs[1]:
        assert torch.equal(outs[1][name], outs[4][name]), name
    # the same loads (fewer requests: a 16-byte aligned row takes vector loads) ...
    assert waves[4][0] <= waves[1][0]
    assert waves[4][1] < 0.7 * waves[1][1]              # ... in far fewer passes


def test_only_buffers_a_product_reads_or_writes_are_padded():
    """Without ``smem_pad_all`` the plan pads the rows of the buffers a matrix product gathers
    fragments from or stores its fragments to, and leaves the others at the odd pitch (padding
    costs shared memory); with it (the default) every 2-D buffer is padded, so every row is
    16-byte aligned for the vector loops."""
    from kdagen.codegen.lower.kernel import prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.program import read_program
    from kdagen.codegen.lower.storage import FRAGMENT_READERS
    from kdagen.driver import build_module
    from kdagen.target import TARGETS

    program = read_program(build_module("kda_bwd", dict(head_k_dim=64, head_v_dim=64),
                                        "chip", "sm_90a"))
    def buffers(**kw):
        kernels = prepare(program, TARGETS["sm_90a"], "kda_bwd",
                          LowerOptions(path="native", dot="auto", **kw))
        return [b for pk in kernels if pk.plan is not None for b in pk.plan.unique_buffers()
                if len(b.value.shape) == 2]
    assert {b.row_pad for b in buffers()} == {4}
    bufs = buffers(smem_pad_all=False)
    pads = {b.row_pad for b in bufs}
    assert pads == {1, 4}
    for b in bufs:
        readers = {u.op for u, _ in b.value.uses}
        made_by = b.value.owner.op if b.value.owner is not None else None
        assert (b.row_pad == 4) == b.mma_read
        if made_by in FRAGMENT_READERS or readers & FRAGMENT_READERS:
            assert b.row_pad == 4, (made_by, readers)


def test_vector_accesses_go_in_phases():
    """A warp's 16-byte accesses are served 8 lanes (128 bytes) at a time: consecutive vectors
    take 4 wavefronts (the minimum), a column of 4-word vectors of a 128-wide tile 32 (each
    quarter warp on one bank group), of a 132-wide one 4 again."""
    def vec(pattern, n=4):
        banks = BankCounter()
        be = SimBackend(32, banks=banks)
        mem = SimMemory("smem", np.zeros(1 << 14, np.float32), "f32")
        with B.use(be):
            B.load_vec(SimPtr(mem), pattern(be.lanes), n)
        return banks.totals()["ld"]
    assert vec(lambda t: 4 * t) == [1, 4]
    assert vec(lambda t: 128 * t) == [1, 32]
    assert vec(lambda t: 132 * t) == [1, 4]
    assert vec(lambda t: 2 * t, n=2) == [1, 2]               # 8 bytes: two 16-lane phases


@pytest.mark.parametrize("pitch", [128, 132])
def test_transposed_walk_reads_rows_in_vectors(pitch):
    """tiles.foreach_transposed writes every element of the source to its transposed place
    (consecutive threads on consecutive stored addresses) with either width; with 4 columns a
    thread it reads the source in 16-byte vectors: down a column of an unpadded 128-wide tile
    (a TMA ring tile) 4x fewer wavefronts than 4-byte reads of one column (32-way conflicts),
    and none in excess on the 132-wide tile buffers."""
    from kdagen.codegen.lower import tiles as T_
    rows, cols, threads = 64, 128, 256
    src_vals = np.arange(rows * pitch, dtype=np.float32)
    out = {}
    for n in (1, 4):
        banks = BankCounter()
        be = SimBackend(threads, banks=banks)
        mem = SimMemory("smem", src_vals.copy(), "f32")
        dst = SimMemory("dst", np.full(rows * cols, -1, np.float32), "f32")
        src = T_.BufRef(T_.Scratch(SimPtr(mem), "smem"), 0, (rows, cols), (pitch, 1))
        th = T_.Threads(tid=be.lanes, count=threads)
        with B.use(be):
            T_.foreach_transposed(th, src, lambda idx, v: B.store(
                SimPtr(dst), idx[1] * rows + idx[0], v), n)
        want = src_vals.reshape(rows, pitch)[:, :cols].T.reshape(-1)
        np.testing.assert_array_equal(dst.data, want)
        out[n] = banks.totals()["ld"]
    ideal = rows * cols // 32                            # one wavefront per 32 words
    if pitch == 128:
        assert out[1][1] == 32 * out[1][0]               # every lane on one bank
        assert out[4][1] * 4 == out[1][1]
    else:
        assert out[4][1] == ideal
