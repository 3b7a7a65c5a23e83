"""FLA drop-in behaviour of kdagen.chunk_kda / chunk_gated_delta_rule (CPU: the interpreter):
strided inputs, FLA's argument forms (A_log [1, 1, HV, 1], dt_bias None, A_log None with the
lower-bound gate, bf16 states, state_v_first, cu_seqlens as a list, chunk_size), layout
mix-up hints, and the error without the compiler package."""
import functools
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import kdagen
from kdagen.validation import KdagenInputError

B, T, H, HV, K, V = 1, 20, 1, 2, 64, 64


def inputs(family="kda", seed=0, T=T, N=B, **over):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    gshape = (B, T, HV, K) if family == "kda" else (B, T, HV)
    x = dict(q=rnd(B, T, H, K).bfloat16(), k=rnd(B, T, H, K).bfloat16(),
             v=rnd(B, T, HV, V).bfloat16(),
             g=-torch.rand(*gshape, generator=gen) * 0.5,
             beta=torch.rand(B, T, HV, generator=gen),
             initial_state=rnd(N, HV, K, V) * 0.3)
    x.update(over)
    return x


def run(fn=kdagen.chunk_kda, grads=(), **kw):
    o, ht = fn(**kw, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if grads:
        (o.float().square().sum() + ht.square().sum()).backward()
    return o, ht


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def test_non_contiguous_inputs_equal_contiguous_ones_with_gradients():
    """q/k/v split from a fused projection (strided rows) and a transposed gate give exactly
    the results of their contiguous copies, and gradients reach the strided leaves."""
    x = inputs()
    fused = leaf(torch.cat([x["q"], x["k"]], dim=-1))              # [B, T, H, 2K]
    q_s, k_s = fused[..., :K], fused[..., K:]
    g_t = leaf(x["g"].transpose(-1, -2).contiguous())              # [B, T, K, HV] storage
    g_s = g_t.transpose(-1, -2)
    assert not q_s.is_contiguous() and not g_s.is_contiguous()
    o1, h1 = run(**dict(x, q=q_s, k=k_s, g=g_s), grads=True)
    ref = {n: leaf(t) for n, t in x.items()}
    o2, h2 = run(**ref, grads=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    assert torch.equal(fused.grad[..., :K], ref["q"].grad)
    assert torch.equal(fused.grad[..., K:], ref["k"].grad)
    assert torch.equal(g_t.grad.transpose(-1, -2), ref["g"].grad)


def test_cu_seqlens_as_a_list():
    x = inputs(initial_state=torch.randn(2, HV, K, V) * 0.3)
    o1, h1 = run(**x, cu_seqlens=[0, 7, T])
    o2, h2 = run(**x, cu_seqlens=torch.tensor([0, 7, T]))
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    with pytest.raises(KdagenInputError, match="^cu_seqlens: expected strictly increasing"):
        run(**x, cu_seqlens=[0, 7, 7, T])
    with pytest.raises(KdagenInputError, match="^cu_seqlens: expected integer offsets"):
        run(**x, cu_seqlens=[0, 7.5, T])
    with pytest.raises(KdagenInputError, match="^cu_seqlens: expected a 1-D"):
        run(**x, cu_seqlens="0,7,20")


def test_fla_gate_parameter_forms():
    """A_log [1, 1, HV, 1] is read as [HV] (its gradient keeps its shape); dt_bias None is no
    bias; with safe_gate + lower_bound, A_log None is A_log = 0 (FLA)."""
    x = inputs(g=torch.randn(B, T, HV, K))
    A_log, dt_bias = torch.randn(HV) * 0.3, torch.randn(HV, K) * 0.3
    flags = dict(use_gate_in_kernel=True)
    a4 = leaf(A_log.reshape(1, 1, HV, 1))
    o1, _ = run(**x, **flags, A_log=a4, dt_bias=dt_bias, grads=True)
    a1 = leaf(A_log)
    o2, _ = run(**x, **flags, A_log=a1, dt_bias=dt_bias, grads=True)
    assert torch.equal(o1, o2)
    assert a4.grad.shape == (1, 1, HV, 1) and torch.equal(a4.grad.reshape(HV), a1.grad)

    o3, _ = run(**x, **flags, A_log=A_log, dt_bias=None)
    o4, _ = run(**x, **flags, A_log=A_log, dt_bias=torch.zeros(HV, K))
    assert torch.equal(o3, o4)

    lb = dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-3.0)
    o5, _ = run(**x, **lb, A_log=None, dt_bias=dt_bias)
    o6, _ = run(**x, **lb, A_log=torch.zeros(HV), dt_bias=dt_bias)
    assert torch.equal(o5, o6)
    with pytest.raises(KdagenInputError, match="^A_log: required"):
        run(**x, use_gate_in_kernel=True, A_log=None, dt_bias=dt_bias)   # softplus needs A_log


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_initial_state_is_computed_in_fp32(dtype):
    x = inputs()
    h0 = leaf(x["initial_state"].to(dtype))
    o1, h1 = run(**dict(x, initial_state=h0), grads=True)
    h0_32 = leaf(h0.detach().float())
    o2, h2 = run(**dict(x, initial_state=h0_32), grads=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2) and h1.dtype == torch.float32
    assert h0.grad.dtype == dtype and torch.equal(h0.grad, h0_32.grad.to(dtype))


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_state_v_first(family):
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    x = inputs(family)
    h0 = x["initial_state"]
    hv = leaf(h0.transpose(-1, -2).contiguous())                   # [N, HV, V, K]
    o1, h1 = run(fn, **dict(x, initial_state=hv), state_v_first=True, grads=True)
    hk = leaf(h0)
    o2, h2 = run(fn, **dict(x, initial_state=hk), grads=True)
    assert torch.equal(o1, o2)
    assert h1.shape == (B, HV, V, K) and torch.equal(h1, h2.transpose(-1, -2))
    assert torch.equal(hv.grad, hk.grad.transpose(-1, -2))
    with pytest.raises(KdagenInputError, match="^initial_state: expected a 4-D"):
        run(fn, **dict(x, initial_state=h0[0]), state_v_first=True)


@pytest.mark.parametrize("family,good,bad", [("kda", [32, 64], [16, 128, 0, True]),
                                             ("gdn", [16, 32, 64], [8, 128])])
def test_chunk_size_takes_flas_values(family, good, bad):
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    x = inputs(family)
    base, _ = run(fn, **x)
    for c in good:
        o, _ = run(fn, **x, chunk_size=c)
        assert torch.equal(o, base)
    for c in bad:
        with pytest.raises(KdagenInputError, match="^chunk_size: expected one of"):
            run(fn, **x, chunk_size=c)


def test_gdn_positional_order_is_flas():
    """FLA's chunk_gated_delta_rule takes use_beta_sigmoid_in_kernel as the 10th positional."""
    x = inputs("gdn", beta=torch.randn(B, T, HV))
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    o1, _ = kdagen.chunk_gated_delta_rule(*args, None, x["initial_state"], True, True, True)
    o2, _ = kdagen.chunk_gated_delta_rule(*args, initial_state=x["initial_state"],
                                          output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          use_beta_sigmoid_in_kernel=True)
    assert torch.equal(o1, o2)


def test_head_first_layout_is_named():
    """[B, H, T, K] tensors passed as [B, T, H, K]: a warning with a precomputed gate (every
    shape is consistent), and the A_log error says what is likely wrong with the gate in the
    kernel."""
    Hh, Tt = 2, 100
    q = torch.randn(1, Hh, Tt, K, dtype=torch.bfloat16)           # head-first
    v = torch.randn(1, Hh, Tt, V, dtype=torch.bfloat16)
    g = -torch.rand(1, Hh, Tt, K)
    beta = torch.rand(1, Hh, Tt)
    with pytest.warns(UserWarning, match=r"head-first \[B, H, T, K\].*transpose\(1, 2\)"):
        kdagen.chunk_kda(q, q, v, g, beta)
    with pytest.warns(UserWarning), \
            pytest.raises(KdagenInputError, match=r"^A_log: .*T = 2 < H = 100.*head-first"):
        kdagen.chunk_kda(q, q, v, torch.randn(1, Hh, Tt, K), beta, use_gate_in_kernel=True,
                         A_log=torch.zeros(Hh), dt_bias=torch.zeros(Hh * K))
    with warnings.catch_warnings():                                # T >= H, or T = 1: no warning
        warnings.simplefilter("error")
        x = inputs()
        kdagen.chunk_kda(**x)


def test_without_the_compiler_cpu_tensors_name_the_install():
    """A machine without numba-cuda-mlir: the CPU path says what to install (no bare
    ModuleNotFoundError)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["numba_cuda_mlir"] = None      # as if it were not installed
        import torch, kdagen
        q = torch.randn(1, 4, 1, 64)
        try:
            kdagen.chunk_kda(q, q, q, -torch.rand(1, 4, 1, 64), torch.rand(1, 4, 1))
        except ModuleNotFoundError as err:
            print(type(err).__name__, "|", err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "CompilerNotInstalledError" in out.stdout, out.stdout + out.stderr
    assert "pip install 'kdagen[compiler]'" in out.stdout
    assert "interpreter" in out.stdout


def test_fp32_gate_and_beta_keep_their_storage_type():
    """bf16 q/k/v with fp32 g/beta (FLA's habit): the programs asked for store g and beta in
    fp32 (gate_dtype/beta_dtype), so nothing rounds them to bf16; a bf16 gate names no option."""
    from kdagen.runtime.backends import recording
    x = inputs()
    with recording("cpu") as rec:
        kdagen.chunk_kda(**x)
        kdagen.chunk_kda(**dict(x, g=x["g"].bfloat16(), beta=x["beta"].bfloat16()))
    (_, fp32_opts), (_, bf16_opts) = rec.variants()
    assert fp32_opts["dtype"] == "bf16"
    assert fp32_opts["gate_dtype"] == "fp32" and fp32_opts["beta_dtype"] == "fp32"
    assert "gate_dtype" not in bf16_opts and "beta_dtype" not in bf16_opts
    # the interpreter with the fp32 gate differs from the same gate rounded to bf16
    o32, _ = run(**x)
    o16, _ = run(**dict(x, g=x["g"].bfloat16().float()))
    assert not torch.equal(o32, o16)


def prefix_states(fn, x, lengths, **flags):
    """(sequence n, chunk c, the state entering chunk c) in h's row order: the initial state,
    else the final state of ``fn`` on the sequence's tokens before the chunk (x packed, B = 1)."""
    start = 0
    for n, L in enumerate(lengths):
        for c in range(-(-L // 64)):
            if c == 0:
                yield n, c, x["initial_state"][n]
                continue
            sub = {k: (t[:, start:start + 64 * c] if k != "initial_state" else t[n:n + 1])
                   for k, t in x.items()}
            with torch.inference_mode():
                _, ht = fn(**sub, **dict(flags, cu_seqlens=None, output_final_state=True))
            yield n, c, ht[0]
        start += L


@pytest.mark.parametrize("family,varlen", [("kda", False), ("kda", True), ("gdn", True)])
def test_return_intermediate_states(family, varlen):
    """h[:, i] is the state entering chunk i (64 tokens): the final state of the same call on
    the tokens before it; FLA's shapes [B, NT, HV, K, V] (varlen: B = 1, NT over all
    sequences), q's dtype, state_v_first transposes it."""
    api = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    fn = functools.partial(api, use_qk_l2norm_in_kernel=True)   # unnormalised keys diverge
    Tl = 150
    lens = [70, 80] if varlen else [Tl]
    x = inputs(family, T=Tl, N=len(lens))
    cu = [0, 70, Tl] if varlen else None
    with torch.inference_mode():
        o, ht, h = fn(**x, cu_seqlens=cu, output_final_state=True, return_intermediate_states=True)
        o2, ht2 = fn(**x, cu_seqlens=cu, output_final_state=True)
        _, _, hv = fn(**dict(x, initial_state=x["initial_state"].transpose(-1, -2).contiguous()),
                      cu_seqlens=cu, return_intermediate_states=True, state_v_first=True)
    NT = sum(-(-n // 64) for n in lens)
    assert h.shape == (1, NT, HV, K, V) and h.dtype == x["q"].dtype
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    assert torch.equal(hv, h.transpose(-1, -2))
    for row, (n, c, want) in enumerate(prefix_states(fn, x, lens)):
        got = h[0, row].float()
        assert torch.allclose(got, want.to(h.dtype).float(), rtol=2e-2, atol=2e-2), (n, c)
    with pytest.raises(KdagenInputError, match="^return_intermediate_states: .*inference_mode"):
        fn(**{n: leaf(t) for n, t in x.items()}, cu_seqlens=cu, return_intermediate_states=True)


def test_cli_without_the_compiler_names_the_install():
    code = textwrap.dedent("""
        import sys
        sys.modules["numba_cuda_mlir"] = None      # as if it were not installed
        from kdagen.cli import main
        main(["emit", "-o", sys.argv[1], "--arch", "sm_90a", "--op", "kda"])
    """)
    import tempfile
    out = subprocess.run([sys.executable, "-c", code, tempfile.mkdtemp()], capture_output=True,
                         text=True)
    assert out.returncode == 1, out
    assert out.stderr.startswith("Error: this needs kdagen's compiler"), out.stderr
    assert "pip install 'kdagen[compiler]'" in out.stderr and "Traceback" not in out.stderr


def test_recording_sees_every_call_even_when_the_api_is_imported_inside_it():
    """The compiler registers its CPU executor when kdagen.ops is first imported; that default
    must not replace an executor registered meanwhile (recording() used before any call)."""
    code = textwrap.dedent("""
        import torch
        from kdagen.runtime.backends import recording
        import kdagen
        q = torch.randn(1, 4, 1, 64)
        with recording("cpu") as rec:
            kdagen.chunk_kda(q, q, q, -torch.rand(1, 4, 1, 64), torch.rand(1, 4, 1))
        print(len(rec.variants()))
        o, _ = kdagen.chunk_kda(q, q, q, -torch.rand(1, 4, 1, 64), torch.rand(1, 4, 1),
                                use_qk_l2norm_in_kernel=True)
        print(bool(torch.isfinite(o).all()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "True"], out.stdout + out.stderr
