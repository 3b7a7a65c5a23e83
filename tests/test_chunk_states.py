"""The forward's optional chunk_states output (FLA's return_intermediate_states): the state
entering every chunk, one row per chunk with sequences' chunks numbered consecutively."""
import pytest
import torch

from kdagen import interpreter
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case

C = 64


def _prefix_state(case, n, t):
    """The float64 reference's state of sequence n after its first t tokens (h0 for t = 0)."""
    x = case.inputs
    h0 = x.get("initial_state")
    if t == 0:
        return h0[n]
    cu = x.get("cu_seqlens")
    start = int(cu[n]) if cu is not None else 0
    b = 0 if cu is not None else n
    sub = {k: (v[b:b + 1, start:start + t] if k in ("q", "k", "v", "g", "g_raw", "beta", "beta_raw")
               else v) for k, v in x.items() if k != "cu_seqlens"}
    sub["initial_state"] = h0[n:n + 1]
    _, ht = case._call(**sub)
    return ht[0]


@pytest.mark.parametrize("family,lengths,B,T", [("kda", [1, 70, 130], 1, None),
                                                 ("gdn", None, 2, 129)])
def test_chunk_states_are_the_states_entering_each_chunk(family, lengths, B, T):
    kw = dict(lengths=lengths) if lengths else dict(B=B, T=T)
    case = make_case(family, H=1, HV=2, **kw)
    opts = dict(case.options, output_chunk_states=True, dtype="fp32")
    out = interpreter.run(build_program(f"{family}_fwd", **opts), case.inputs)
    seq_lens = lengths or [T] * B
    row = 0
    for n, L in enumerate(seq_lens):
        for c in range(-(-L // C)):
            want = _prefix_state(case, n, c * C)
            got = out["chunk_states"][row]
            assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), (n, c)
            row += 1
    assert out["chunk_states"].shape[0] == row
    o_ref, _ = case.reference()
    assert torch.allclose(out["o"], o_ref, rtol=1e-9, atol=1e-9)
