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
    assert waves[1][0] == waves[4][0]                   # the same loads ...
    assert waves[4][1] < 0.7 * waves[1][1]              # ... in far fewer passes


def test_only_buffers_a_product_reads_or_writes_are_padded():
    """The plan pads the rows of the buffers a matrix product gathers fragments from or stores
    its fragments to, and leaves the others at the odd pitch (padding costs shared memory)."""
    from kdagen.codegen.lower.kernel import prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.program import read_program
    from kdagen.codegen.lower.storage import FRAGMENT_READERS
    from kdagen.driver import build_module
    from kdagen.target import TARGETS

    program = read_program(build_module("kda_bwd", dict(head_k_dim=64, head_v_dim=64),
                                        "chip", "sm_90a"))
    kernels = prepare(program, TARGETS["sm_90a"], "kda_bwd", LowerOptions(path="native", dot="auto"))
    bufs = [b for pk in kernels if pk.plan is not None for b in pk.plan.unique_buffers()
            if len(b.value.shape) == 2]
    pads = {b.row_pad for b in bufs}
    assert pads == {1, 4}
    for b in bufs:
        readers = {u.op for u, _ in b.value.uses}
        made_by = b.value.owner.op if b.value.owner is not None else None
        assert (b.row_pad == 4) == b.mma_read
        if made_by in FRAGMENT_READERS or readers & FRAGMENT_READERS:
            assert b.row_pad == 4, (made_by, readers)
