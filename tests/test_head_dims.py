"""Head dims the kernels are not built for (kdagen.head_pad): any K, V up to the largest built
size, K != V included, run zero-padded to the next built size; a larger V runs in parts of
the value columns (kdagen.api._call_value_parts). On CPU (the interpreter):
outputs and every gradient against the float64 reference at the reference's own K, V (bf16
bars and the fp32 bar), a researcher's gate with per-channel parameters, FLA's intermediate
states and state_v_first, and the errors past the largest size."""
import pytest
import torch

import kdagen
from kdagen import ops
from kdagen import reference as R
from kdagen.head_pad import plan
from kdagen.validation import KdagenInputError

from test_api import BARS, FP32_BAR, make_inputs, run_and_compare
from test_api_gates import _load


@pytest.mark.parametrize("family,K,V,gate,dtype", [
    ("kda", 60, 100, "softplus", "bf16"),      # FLA's test sizes, K != V, in-kernel gate
    ("kda", 32, 64, "precomputed", "bf16"),    # padded K, built V
    ("kda", 128, 100, "lower_bound", "bf16"),  # built K, padded V
    ("gdn", 100, 48, "precomputed", "bf16"),
    ("kda", 60, 60, "softplus", "fp32"),       # the fp32 bar: the padding changes nothing
    ("gdn", 32, 100, "softplus", "fp32"),
    # V past the largest built size: one call per part of the value columns
    ("kda", 64, 256, "softplus", "bf16"),      # FLA's V = 256: two parts of 128
    ("kda", 60, 200, "precomputed", "fp32"),   # 128 + 72 (padded), padded K, the fp32 bar
    ("gdn", 64, 192, "softplus", "bf16"),
])
def test_unbuilt_head_dims_match_the_reference(family, K, V, gate, dtype):
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    x, flags = make_inputs(family, dtype=dt, T=70, H=1, HV=2, K=K, V=V, gate=gate,
                           beta_sigmoid=gate != "precomputed")
    bar = (lambda n: FP32_BAR) if dtype == "fp32" else (lambda n: BARS[n])
    run_and_compare(family, x, flags, bar)


def test_padding_plan_picks_the_next_built_size_per_dim():
    p = plan(60, 100, (64, 128))
    assert (p.Kp, p.Vp, p.active) == (64, 128, True)
    assert not plan(64, 128, (64, 128)).active
    assert plan(1, 2, (64, 128)).Kp == 64


def test_a_researchers_channel_gate_at_an_unbuilt_head_dim():
    """gate= with [HV, K] parameters: they are padded with the keys, their gradients cut."""
    gate, mod = _load("kda_channel_rate.py")
    K, HV, T = 60, 2, 40
    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen)   # noqa: E731
    x = dict(q=r(1, T, 1, K), k=r(1, T, 1, K), v=r(1, T, HV, 48), g=r(1, T, HV, K) - 1.0,
             beta=r(1, T, HV), initial_state=r(1, HV, K, 48) * 0.3)
    params = {n: t.float() for n, t in mod.sample_params(HV, K, "strong", gen).items()}
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              output_final_state=True)
    leaves = {n: t.clone().requires_grad_(True) for n, t in {**x, **params}.items()}
    o, ht = kdagen.chunk_kda(**{n: leaves[n] for n in x}, gate=gate.name,
                             gate_params={n: leaves[n] for n in params}, **kw)
    assert o.shape == (1, T, HV, 48) and ht.shape == (1, HV, K, 48)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    torch.autograd.backward([o, ht], [do, dht])
    ref = R.reference_grads(lambda **a: R.chunk_kda(**{n: a[n] for n in x}, gate=gate,
                                                    gate_params={n: a[n] for n in params}, **kw),
                            {**x, **params}, do, dht)
    assert R.rel_err(o, ref["o"]) < 1e-5 and R.rel_err(ht, ref["final_state"]) < 1e-5
    for n, leaf in leaves.items():
        assert leaf.grad.shape == leaf.shape and R.rel_err(leaf.grad, ref[n]) < 1e-4, n


@pytest.mark.parametrize("K,V", [(60, 100), (64, 160)])   # padded; V in parts (128 + 32)
def test_intermediate_states_and_v_first_come_back_at_the_callers_dims(K, V):
    x, flags = make_inputs("kda", dtype=torch.bfloat16, T=130, H=1, HV=2, K=K, V=V)
    x = {n: t.detach() for n, t in x.items()}
    with torch.inference_mode():
        o, ht, h = kdagen.chunk_kda(**x, **flags, return_intermediate_states=True)
        o2, htv = kdagen.chunk_kda(**dict(x, initial_state=x["initial_state"].transpose(-1, -2)),
                                   **flags, state_v_first=True)
    assert o.shape == (1, 130, 2, V) and o.is_contiguous()
    assert ht.shape == (1, 2, K, V) and h.shape == (1, 3, 2, K, V)
    assert torch.equal(h[0, 0].float(), x["initial_state"][0].to(h.dtype).float())
    assert torch.equal(o, o2) and torch.equal(htv, ht.transpose(-1, -2))


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_key_dims_past_the_largest_built_size_name_the_argument(family):
    big = max(ops.SUPPORTED_KEY_DIMS) * 2
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    x, flags = make_inputs(family, dtype=torch.bfloat16, T=8, K=big, V=64, h0=False)
    with pytest.raises(KdagenInputError) as info:
        fn(**x, **flags)
    msg = str(info.value)
    assert msg.startswith("q:") and f"= {big}" in msg, msg
    assert f"up to {max(ops.SUPPORTED_KEY_DIMS)}" in msg and "split the head" in msg


# --- decode (kdagen.decode): the same padding; a pool of unbuilt dims goes through torch -----

def _decode_inputs(family, B, T, K, V, HV=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)   # noqa: E731
    x = dict(q=r(B, T, 1, K), k=r(B, T, 1, K), v=r(B, T, HV, V),
             beta=torch.rand(B, T, HV, generator=gen))
    x["g"] = (-torch.rand(B, T, HV, K, generator=gen) * 0.5 if family == "kda"
              else -torch.rand(B, T, HV, generator=gen) * 0.5)
    return x


@pytest.mark.parametrize("K,V", [(60, 100), (64, 192)])    # padded; V in parts (128 + 64)
@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_decode_at_unbuilt_head_dims_matches_the_reference(family, K, V):
    from test_decode_api import _ref_inputs
    from kdagen.decode_reference import decode_pool_step
    fn = kdagen.fused_recurrent_kda if family == "kda" else kdagen.fused_recurrent_gated_delta_rule
    x = _decode_inputs(family, 3, 2, K, V)
    h0 = torch.randn(3, 2, K, V) * 0.3
    o, ht = fn(**x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref = R.chunk_kda if family == "kda" else R.chunk_gated_delta_rule
    o_ref, ht_ref = ref(*(t.double() for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])),
                        initial_state=h0.double(), output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
    assert o.shape == (3, 2, 2, V) and ht.shape == (3, 2, K, V)
    assert R.rel_err(o, o_ref) < 1e-5 and R.rel_err(ht, ht_ref) < 1e-5
    # the initial state updated in place
    h = h0.clone()
    o2, out = fn(**x, initial_state=h, inplace_final_state=True, use_qk_l2norm_in_kernel=True)
    assert out is h and torch.equal(o2, o) and torch.equal(h, ht)
    # an fp32 pool in place, one sequence skipped, per-token (speculative) writes
    pool = torch.randn(8, 2, K, V) * 0.3
    idx = torch.tensor([[0, 1], [-1, 3], [4, 5]])
    want_o, want_pool = decode_pool_step(*_ref_inputs(x, 1, 2), state_pool=pool.double(),
                                         ssm_state_indices=idx)
    before = pool.clone()
    o, out = fn(**x, initial_state=pool, use_qk_l2norm_in_kernel=True, ssm_state_indices=idx,
                inplace_final_state=True)
    assert out is pool and R.rel_err(o, want_o) < 1e-5 and R.rel_err(pool, want_pool) < 1e-5
    assert torch.equal(pool[[2, 3, 6, 7]], before[[2, 3, 6, 7]])
