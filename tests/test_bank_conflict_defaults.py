"""The shared-memory defaults that keep the chunk kernels' element loops free of bank conflicts
(H100 profile of kda_bwd: 45% of the dq kernel's shared wavefronts were excess): every 2-D tile
buffer's rows are 16-byte aligned (LowerOptions.smem_pad_all), so no element loop falls back to
4-byte accesses 16 bytes apart across a warp (the cost report's strided.smem), and a transposed
workspace store reads its tile along rows in 16-byte vectors (transposed_store_order
"stored_vec"), not down a column 4 bytes a lane."""
from __future__ import annotations

import pytest

pytest.importorskip("kdagen._mlir")

from kdagen.driver import DEFAULT_LOWERING, Compilation  # noqa: E402

K128 = dict(head_k_dim=128, head_v_dim=128)


def _counts(**lower) -> dict:
    comp = Compilation("kda_bwd", K128, "sm_90a", lower=dict(DEFAULT_LOWERING, **lower))
    comp.run("cost")
    return {k.name.split("__")[-1]: k.cost["counts"] for k in comp.kernels if k.cost}


@pytest.fixture(scope="module")
def defaults():
    return _counts()


def test_no_element_loop_falls_back_to_strided_shared_accesses(defaults):
    unpadded = _counts(smem_pad_all=False)
    assert sum(c.get("strided.smem", 0) for c in unpadded.values()) > 0
    assert all(c.get("strided.smem", 0) == 0 for c in defaults.values())


def test_transposed_stores_read_their_tiles_in_vectors(defaults):
    """The dq kernel re-stores w (loaded from the prologue's workspace into the TMA ring, an
    unpadded tile) transposed for the reverse scan: stored_vec reads it 16 bytes a lane."""
    columns = _counts(transposed_store_order="stored")
    for kernel in ("k0_scan0", "k2_scan2"):
        assert defaults[kernel]["ld.shared"] < columns[kernel]["ld.shared"], kernel
    assert defaults["k2_scan2"]["st.global"] == columns["k2_scan2"]["st.global"]
