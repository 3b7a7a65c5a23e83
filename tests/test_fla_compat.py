"""FLA's own test matrix for the chunked ops, run with kdagen's drop-ins (skipped without CUDA).

Source: the chunked-op tests of flash-linear-attention's ``tests/ops/test_kda.py`` and
``tests/ops/test_gdn.py`` (the tests are not shipped in the fla-core 0.6.0 wheel; they were
read from the repository's main branch at bc3b101d, the newest snapshot available to us next to
that release; its naive references are identical to the wheel's). Every FLA test there that calls
``chunk_kda`` / ``chunk_gated_delta_rule`` has a counterpart here, named as in FLA
(``TestKDA::test_chunk[<FLA's id>]``), with FLA's shapes, keywords, input distributions (same
torch calls, seed 42, drawn on the CPU), references and per-tensor tolerances:

- where FLA compares against a PyTorch/Triton reference (``naive_recurrent_kda``,
  ``naive_kda_gate``/``naive_kda_lowerbound_gate``, ``naive_recurrent_gated_delta_rule``,
  ``naive_gdn_gate``, ``fused_recurrent_kda`` in fp64), that reference comes from the
  installed ``fla`` (the test skips without it);
- where FLA compares its chunked op with itself under another spelling of the same computation
  (state_v_first, in-kernel beta sigmoid, GDN's in-kernel gate), both sides are kdagen's: the
  state_v_first and beta-sigmoid tests need no ``fla``; the GDN gate-in-kernel tests take
  FLA's ``naive_gdn_gate`` for the precomputed side, as FLA does.

FLA skips its GVA cases of the GDN tests when its TileLang backend is dispatched; kdagen has no
such restriction, so they run here.

The comparison rule (:class:`Comparison`): a tensor passes if max|ref - out| <= 1e-6, else it
must hold no NaN and RMS(ref - out) / (RMS(ref) + 1e-8) must be below the tolerance FLA uses for
it. Where FLA only warns (``dA`` of KDA's test_chunk / test_chunk_varlen) a miss is a warning
here too; FLA's extra leniency under its CI environment variable is not taken over.

Cases whose key head dim exceeds the largest of ``kdagen.ops.SUPPORTED_KEY_DIMS`` (read at run
time; smaller dims run zero-padded, kdagen.head_pad) are skipped, saying so. Backend plumbing
tests (FlashKDA/FlashQLA dispatch spies and verifiers, Triton-Ascend routing, autotuner
guards) are not ported; the FlashKDA/FlashQLA *parity* tests
are, as plain calls of kdagen's function with the same arguments and gold reference.

Kernels: ``python tests/test_fla_compat.py DIR [CHIP]`` writes (on any machine, no GPU) one
bundle with every program variant these tests ask for; run them with ``KDAGEN_BUNDLE=DIR``.
``python tests/test_fla_compat.py --list`` only lists the variants.
"""
from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import kdagen

from conftest import requires_gpu
from gpu_bundle import kernels_or_skip

pytestmark = [requires_gpu, pytest.mark.gpu]

DEVICE = "cuda"   # where the tests run kdagen and the references


# ------------------------------------------------------------------------------------------
# the comparison rule, the head-dim envelope, fla's references, the launcher
# ------------------------------------------------------------------------------------------

EXACT_ENOUGH = 1e-6   # a largest absolute difference at or below this passes outright
FLA_LABELS = {"dbeta": "db"}   # gradient names as FLA's messages spell them


def _rms(x: torch.Tensor) -> float:
    return x.double().square().mean().sqrt().item()


class Comparison:
    """Collects the per-tensor verdicts of one test case; :meth:`verdict` asserts them all at once
    (so a failure lists every tensor that missed, not just the first)."""

    def __init__(self, label: str):
        self.label = label
        self.lines: list[str] = []
        self.failures: list[str] = []

    def __call__(self, name: str, ref, out, tol: float, warn_only: bool = False) -> None:
        if ref is None or out is None:
            self.failures.append(f"{name}: missing ({'ref' if ref is None else 'kdagen'} is None)")
            return
        name = FLA_LABELS.get(name, name)
        ref, out = ref.detach(), out.detach()
        if tuple(ref.shape) != tuple(out.shape):
            self.failures.append(f"{name}: shape {list(out.shape)}, expected {list(ref.shape)}")
            return
        diff = ref.double() - out.double()
        max_abs = diff.abs().max().item() if diff.numel() else 0.0
        if max_abs <= EXACT_ENOUGH:
            self.lines.append(f"{name:>8}: max|diff| {max_abs:.2e} (<= {EXACT_ENOUGH:g}) ok")
            return
        if torch.isnan(ref).any() or torch.isnan(out).any():
            which = "reference" if torch.isnan(ref).any() else "kdagen"
            self.failures.append(f"{name}: NaN in the {which} result")
            return
        ratio = _rms(diff) / (_rms(ref) + 1e-8)
        line = f"{name:>8}: max|diff| {max_abs:.2e}, rms ratio {ratio:.2e} (tolerance {tol:g})"
        ok = ratio < tol
        self.lines.append(line + ("" if ok else " MISS" + (" (warning only, as in FLA)"
                                                            if warn_only else "")))
        if not ok:
            if warn_only:
                warnings.warn(f"{self.label}: {line}")
            else:
                self.failures.append(line.strip())

    def verdict(self) -> None:
        print(f"{self.label}\n" + "\n".join(self.lines))
        assert not self.failures, f"{self.label}:\n" + "\n".join(self.failures)


def _head_dims_supported(K: int, V: int) -> bool:
    """Built key dims, and any below the largest (zero-padded: kdagen.head_pad); any V (a V
    past the largest built value dim runs in value parts)."""
    from kdagen.ops import SUPPORTED_KEY_DIMS
    return K <= max(SUPPORTED_KEY_DIMS)


def _skip_outside_envelope(K: int, V: int) -> None:
    if not _head_dims_supported(K, V):
        from kdagen.ops import SUPPORTED_KEY_DIMS
        pytest.skip(f"head dim K={K} is outside kdagen's envelope "
                    f"(kdagen.ops.SUPPORTED_KEY_DIMS = {tuple(SUPPORTED_KEY_DIMS)})")


@pytest.fixture(scope="module")
def fla():
    """FLA's reference functions (from the installed fla-core)."""
    try:
        pytest.importorskip("fla")
    except pytest.skip.Exception:
        raise
    except Exception as err:   # fla present but failing to import for another reason
        pytest.skip(f"fla is not importable: {err}")
    try:
        from fla.ops.gated_delta_rule.gate import naive_gdn_gate
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
        from fla.ops.kda import fused_recurrent_kda
        from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
        from fla.ops.kda.naive import naive_recurrent_kda
    except Exception as err:   # e.g. triton missing: fla is present but not usable here
        pytest.skip(f"fla's reference functions are not importable: {err}")
    return SimpleNamespace(
        naive_recurrent_kda=naive_recurrent_kda, naive_kda_gate=naive_kda_gate,
        naive_kda_lowerbound_gate=naive_kda_lowerbound_gate,
        fused_recurrent_kda=fused_recurrent_kda,
        naive_recurrent_gated_delta_rule=naive_recurrent_gated_delta_rule,
        naive_gdn_gate=naive_gdn_gate)


# ------------------------------------------------------------------------------------------
# shared helpers: cases, leaves, gradients
# ------------------------------------------------------------------------------------------


def _cases(names: str, idfmt: str, rows: list) -> list[tuple[str, dict]]:
    """FLA's parameter rows as (FLA's id, {name: value})."""
    keys = names.split()
    return [(idfmt.format(*row), dict(zip(keys, row))) for row in rows]


def _params(cases):
    return [pytest.param(case, id=case_id) for case_id, case in cases]


def _leaves(device, grad: bool = True, **tensors) -> dict:
    """CPU-drawn tensors moved to ``device``; with ``grad`` they are leaves requiring grad."""
    out = {}
    for name, t in tensors.items():
        t = t.to(device)
        out[name] = t.requires_grad_(True) if grad else t
    return out


def _grads(pairs, wrt: dict) -> dict:
    """Gradients of sum((y * dy).sum()) (FLA's loss) w.r.t. the tensors of ``wrt``, named
    ``"d" + name`` (None where a tensor got no gradient)."""
    loss = sum((y * dy).sum() for y, dy in pairs)
    names = list(wrt)
    gs = torch.autograd.grad(loss, [wrt[n] for n in names], allow_unused=True)
    return {"d" + n: gr for n, gr in zip(names, gs)}


def _norm(x):
    return F.normalize(x, p=2, dim=-1)


def _rep(x, G: int):
    """[B, T, H, D] -> [B, T, H * G, D], each head repeated G times (FLA's GVA expansion)."""
    return x.repeat_interleave(G, dim=2)


def _pick(x: dict, *names) -> dict:
    return {n: x[n] for n in names if n in x}


# ==========================================================================================
# KDA (FLA tests/ops/test_kda.py)
# ==========================================================================================

KDA_CHUNK = _cases(
    "B T H HV D scale gate_logit_normalizer mask_p use_qk_l2norm_in_kernel use_gate_in_kernel "
    "dtype safe_gate disable_recompute chunk_size",
    "B{}-T{}-H{}-HV{}-D{}-scale{}-gate_logit_normalizer{}-mask_p{}-use_qk_l2norm{}-use_gate{}-{}"
    "-safe_gate{}-disable_recompute{}-chunk_size{}",
    [
        (1, 63, 1, 1, 64, 1, 1, 0, False, False, torch.float16, True, False, 64),
        (2, 500, 3, 3, 60, 1, 1, 0, False, False, torch.float16, True, True, 64),
        (2, 1000, 3, 3, 64, 0.1, 1, 0.5, False, False, torch.float16, False, True, 64),
        (3, 1024, 4, 4, 100, 1, 0.1, 0, False, False, torch.float16, False, False, 64),
        (4, 1024, 4, 4, 128, 0.1, 1, 0, False, False, torch.float16, True, True, 64),
        (4, 1024, 4, 4, 128, 0.1, 1, 0, True, False, torch.float16, True, False, 64),
        (2, 1500, 4, 4, 128, 0.1, 10, 0, False, True, torch.float16, False, True, 64),
        (4, 2048, 8, 8, 64, 0.1, 1, 0, False, True, torch.float16, True, True, 64),
        (2, 1024, 2, 4, 64, 0.1, 1, 0, False, False, torch.float16, False, False, 64),
        (2, 1024, 2, 8, 64, 0.1, 1, 0, False, True, torch.float16, False, False, 64),
        (2, 1024, 4, 8, 128, 0.1, 1, 0, True, True, torch.float16, False, False, 64),
        (2, 160, 2, 4, 64, 0.1, 1, 0, False, True, torch.float16, True, True, 32),
        (2, 1024, 2, 4, 64, 0.1, 1, 0, True, True, torch.bfloat16, True, False, 64),
        (2, 1024, 2, 4, 64, 0.1, 1, 0, False, True, torch.bfloat16, False, False, 64),
        (2, 160, 2, 4, 64, 0.1, 1, 0, False, True, torch.bfloat16, True, True, 32),
        (2, 1024, 2, 8, 128, 0.1, 1, 0, True, True, torch.bfloat16, False, False, 64),
    ])


def _kda_chunk_inputs(c, device):
    torch.manual_seed(42)
    B, T, H, HV, D, dtype = c["B"], c["T"], c["H"], c["HV"], c["D"], c["dtype"]
    gate_in_kernel = c["use_gate_in_kernel"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    g = torch.randn(B, T, HV, D, dtype=dtype if gate_in_kernel else torch.float)
    gate_params = {}
    if gate_in_kernel:
        gate_params = dict(A_log=torch.randn(HV, dtype=torch.float),
                           dt_bias=torch.randn(HV * D, dtype=torch.float))
    else:
        g = F.logsigmoid(g) / c["gate_logit_normalizer"]
        g = g * (torch.rand_like(g) > c["mask_p"])
    if c["safe_gate"] and not gate_in_kernel:
        g = g.clamp(-5, 0)
    beta = torch.randn(B, T, HV, dtype=dtype).sigmoid()
    h0 = torch.randn(B, HV, D, D, dtype=torch.float32)
    x = _leaves(device, q=q, k=k, v=v, g=g, beta=beta, h0=h0, **gate_params)
    x["do"] = torch.randn_like(v).to(device)
    x["dht"] = torch.randn_like(h0).to(device)
    return x


def _run_kda_chunk(c, device):
    x = _kda_chunk_inputs(c, device)
    l2 = c["use_qk_l2norm_in_kernel"]
    o, ht = kdagen.chunk_kda(
        q=x["q"] if l2 else _norm(x["q"]), k=x["k"] if l2 else _norm(x["k"]), v=x["v"], g=x["g"],
        beta=x["beta"], A_log=x.get("A_log"), dt_bias=x.get("dt_bias"), scale=c["scale"],
        initial_state=x["h0"], output_final_state=True, use_qk_l2norm_in_kernel=l2,
        use_gate_in_kernel=c["use_gate_in_kernel"], safe_gate=c["safe_gate"],
        lower_bound=-5.0 if c["safe_gate"] else None, disable_recompute=c["disable_recompute"],
        chunk_size=c["chunk_size"])
    wrt = _pick(x, "q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
    return x, dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


KDA_STATE_V_FIRST = _cases(
    "B T H D scale gate_logit_normalizer dtype",
    "B{}-T{}-H{}-D{}-scale{}-gate_logit_normalizer{}-{}",
    [
        (1, 63, 1, 64, 1, 1, torch.float16),
        (2, 500, 3, 60, 1, 1, torch.float16),
        (3, 1024, 4, 128, 0.1, 1, torch.float16),
        (4, 2048, 8, 64, 0.1, 1, torch.float16),
    ])


def _run_kda_state_v_first(c, device):
    """Both sides kdagen: the V-first state layout against the default one."""
    torch.manual_seed(42)
    B, T, H, D, dtype = c["B"], c["T"], c["H"], c["D"], c["dtype"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, H, D, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, H, D, dtype=torch.float)) / c["gate_logit_normalizer"]
    beta = torch.randn(B, T, H, dtype=dtype).sigmoid()
    h0_kv = torch.randn(B, H, D, D, dtype=torch.float32)
    h0_vk = h0_kv.transpose(-1, -2).contiguous()
    x = _leaves(device, q=q, k=k, v=v, g=g, beta=beta, h0_kv=h0_kv, h0_vk=h0_vk)
    do = torch.randn_like(v).to(device)
    dht_vk = torch.randn(B, H, D, D, dtype=torch.float32).to(device)
    dht_kv = dht_vk.transpose(-1, -2).contiguous()
    res = {}
    for side, h0, dht, v_first in (("tri", "h0_vk", dht_vk, True), ("ref", "h0_kv", dht_kv, False)):
        o, ht = kdagen.chunk_kda(
            q=_norm(x["q"]), k=_norm(x["k"]), v=x["v"], g=x["g"], beta=x["beta"],
            scale=c["scale"], initial_state=x[h0], output_final_state=True,
            use_qk_l2norm_in_kernel=False, state_v_first=v_first)
        wrt = dict(_pick(x, "q", "k", "v", "g", "beta"), h0=x[h0])
        res[side] = dict(o=o, ht=ht, **_grads([(o, do), (ht, dht)], wrt))
    return x, res


KDA_BETA_SIGMOID = _cases(
    "B T H D allow_neg_eigval dtype",
    "B{}-T{}-H{}-D{}-allow_neg_eigval{}-{}",
    [
        (1, 8192, 96, 128, False, torch.bfloat16),
        (1, 8192, 96, 128, True, torch.bfloat16),
        (2, 96, 2, 64, True, torch.float16),
    ])


def _run_kda_beta_sigmoid(c, device):
    """Both sides kdagen: raw beta with the in-kernel sigmoid against beta activated outside."""
    torch.manual_seed(42)
    B, T, H, D, dtype = c["B"], c["T"], c["H"], c["D"], c["dtype"]
    neg = c["allow_neg_eigval"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, H, D, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, H, D, dtype=torch.float))
    beta_raw = torch.randn(B, T, H, dtype=dtype)
    beta_post = beta_raw.float().sigmoid()
    h0 = torch.randn(B, H, D, D, dtype=torch.float32)
    x = _leaves(device, q=q, k=k, v=v, g=g, beta_post=beta_post, beta_raw=beta_raw, h0=h0)
    do = torch.randn_like(v).to(device)
    dht = torch.randn_like(h0).to(device)
    res = {}
    for side, beta, in_kernel in (("ref", x["beta_post"] * (2 if neg else 1), False),
                                  ("tri", x["beta_raw"], True)):
        o, ht = kdagen.chunk_kda(
            q=_norm(x["q"]), k=_norm(x["k"]), v=x["v"], g=x["g"], beta=beta, scale=None,
            initial_state=x["h0"], output_final_state=True,
            use_beta_sigmoid_in_kernel=in_kernel, allow_neg_eigval=neg if in_kernel else False)
        wrt = dict(_pick(x, "q", "k", "v", "g", "h0"),
                   beta=x["beta_raw"] if in_kernel else x["beta_post"])
        res[side] = dict(o=o, ht=ht, **_grads([(o, do), (ht, dht)], wrt))
    return x, res


KDA_VARLEN = _cases(
    "H D mask_p cu_seqlens dtype use_gate_in_kernel safe_gate disable_recompute chunk_size",
    "H{}-D{}-mask_p{}-cu_seqlens{}-{}-gate{}-safe_gate{}-disable_recompute{}-chunk_size{}",
    [
        (4, 60, 0.1, [0, 15], torch.float16, True, False, False, 64),
        (4, 64, 0.9, [0, 256, 500, 1000], torch.float16, True, False, False, 64),
        (4, 128, 0.5, [0, 256, 500, 1000], torch.float16, False, False, False, 64),
        (4, 100, 0, [0, 15, 100, 300, 1200, 2000], torch.float16, True, False, False, 64),
        (4, 256, 0, [0, 100, 300, 1200, 3000, 4096], torch.float16, False, True, True, 64),
        (4, 60, 0.1, [0, 31, 96, 160], torch.float16, True, False, True, 32),
    ])

KDA_VARLEN_PREFILL = _cases(
    "H D mask_p cu_seqlens dtype use_gate_in_kernel safe_gate disable_recompute",
    "H{}-D{}-mask_p{}-cu_seqlens{}-{}-gate{}-safe_gate{}-disable_recompute{}",
    [
        (4, 60, 0.1, [0, 8192], torch.float16, True, False, False),
        (4, 64, 0.9, [0, 256, 500, 1000], torch.float16, True, False, False),
        (4, 128, 0.5, [0, 256, 500, 1000], torch.float16, False, False, False),
        (4, 100, 0, [0, 15, 100, 300, 1200, 2000], torch.float16, True, False, False),
        (4, 256, 0, [0, 100, 300, 1200, 3000, 4096], torch.float16, False, True, True),
    ])


def _kda_varlen_inputs(c, device, grad: bool):
    """test_chunk_varlen's inputs (and, with grad=False, test_chunk_varlen_prefill's)."""
    torch.manual_seed(42)
    H, D, dtype, mask_p = c["H"], c["D"], c["dtype"], c["mask_p"]
    gate_in_kernel = c["use_gate_in_kernel"]
    cu = c["cu_seqlens"]
    T, N = cu[-1], len(cu) - 1
    q = torch.randn(1, T, H, D, dtype=dtype)
    k = F.normalize(torch.randn(1, T, H, D, dtype=torch.float32), p=2, dim=-1).to(dtype)
    v = torch.randn(1, T, H, D, dtype=dtype)
    g = torch.randn(1, T, H, D, dtype=dtype if gate_in_kernel else torch.float)
    gate_params = {}
    if gate_in_kernel:
        gate_params = dict(
            A_log=torch.log(torch.randn(1, 1, H, 1, dtype=torch.float32).uniform_(1, 16)),
            dt_bias=torch.randn(H * D, dtype=torch.float32))
    else:
        g = F.logsigmoid(g)
        g = g * (torch.rand_like(g) > mask_p)
    mask = torch.rand_like(g) > mask_p
    g = g * mask + (~mask) * (-1000)
    if c["safe_gate"]:
        assert not gate_in_kernel
        g = g.clamp(-5, 0)
    beta = torch.rand(1, T, H, dtype=dtype).sigmoid()
    h0 = torch.randn(N, H, D, D, dtype=torch.float32)
    x = _leaves(device, grad, q=q, k=k, v=v, g=g, beta=beta, h0=h0, **gate_params)
    x["cu_seqlens"] = torch.LongTensor(cu).to(device)
    if grad:
        x["do"] = torch.randn_like(v).to(device)
        x["dht"] = torch.rand_like(h0).to(device)
    return x


def _kda_varlen_call(c, x, **extra):
    gate_in_kernel = c["use_gate_in_kernel"]
    return kdagen.chunk_kda(
        q=_norm(x["q"]), k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
        A_log=x["A_log"] if gate_in_kernel else None,
        dt_bias=x["dt_bias"] if gate_in_kernel else None,
        initial_state=x["h0"], output_final_state=True, cu_seqlens=x["cu_seqlens"],
        cu_seqlens_cpu=x["cu_seqlens"].cpu(), use_gate_in_kernel=gate_in_kernel,
        safe_gate=c["safe_gate"], disable_recompute=c["disable_recompute"], **extra)


def _run_kda_varlen(c, device):
    x = _kda_varlen_inputs(c, device, grad=True)
    o, ht = _kda_varlen_call(c, x, chunk_size=c["chunk_size"])
    wrt = _pick(x, "q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
    return x, dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


def _run_kda_varlen_prefill(c, device):
    with torch.inference_mode():
        x = _kda_varlen_inputs(c, device, grad=False)
        o, ht = _kda_varlen_call(c, x)
    return x, dict(o=o, ht=ht)


def _kda_varlen_reference(fla, c, x):
    cu = c["cu_seqlens"]
    os_, hts = [], []
    for i in range(len(cu) - 1):
        s = slice(cu[i], cu[i + 1])
        g = x["g"][:, s]
        if c["use_gate_in_kernel"]:
            g = fla.naive_kda_gate(g.to(torch.float), x["A_log"].to(torch.float),
                                   x["dt_bias"].to(torch.float))
        o, ht = fla.naive_recurrent_kda(
            q=_norm(x["q"][:, s]), k=x["k"][:, s], v=x["v"][:, s], beta=x["beta"][:, s], g=g,
            initial_state=x["h0"][i], output_final_state=True)
        os_.append(o)
        hts.append(ht)
    return torch.cat(os_, 1), torch.cat(hts, 0)


KDA_RETURN_STATES_DTYPES = [torch.bfloat16]


def _run_kda_return_intermediate_states(dtype, device):
    """FLA's shapes-only test: (o, final_state, h) with h [B, NT, H, K, V] in q's dtype."""
    torch.manual_seed(42)
    B, T, H, D = 2, 1024, 4, 128
    res = {}
    with torch.inference_mode():
        q, k, v, g = (torch.randn(B, T, H, D, dtype=dtype).to(device) for _ in range(4))
        beta = torch.rand(B, T, H, dtype=dtype).to(device)
        res["dense"] = kdagen.chunk_kda(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=None, output_final_state=True,
            return_intermediate_states=True, disable_recompute=False)
        total = 1024
        cu = torch.tensor([0, total // 2, total], dtype=torch.long).to(device)
        q, k, v, g = (torch.randn(1, total, H, D, dtype=dtype).to(device) for _ in range(4))
        beta = torch.rand(1, total, H, dtype=dtype).to(device)
        res["varlen"] = kdagen.chunk_kda(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=None, output_final_state=True,
            cu_seqlens=cu, return_intermediate_states=True, disable_recompute=False)
    return dict(B=B, T=T, H=H, D=D, N=2, total=total), res


FLASH_KDA = _cases("B T H D", "B{}-T{}-H{}-D{}",
                   [(1, 1024, 4, 128), (2, 2048, 8, 128), (1, 4096, 16, 128)])
FLASH_KDA_VARLEN = _cases("H D cu_seqlens", "H{}-D{}-cu{}", [
    (4, 128, [0, 256, 500, 1000]),
    (8, 128, [0, 100, 300, 1200, 2000]),
    (16, 128, [0, 101, 303, 1205, 3007, 4096]),
])
# the keywords FLA's FlashKDA tests call chunk_kda with
FLASH_KDA_KWARGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                        use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                        state_v_first=True)


def _run_flash_kda(c, device):
    """FLA's FlashKDA parity tests (inference): the fully fused configuration, V-first state."""
    torch.manual_seed(42)
    dtype = torch.bfloat16
    H, D = c["H"], c["D"]
    varlen = "cu_seqlens" in c
    if varlen:
        B, T, N = 1, c["cu_seqlens"][-1], len(c["cu_seqlens"]) - 1
        draw = torch.randn
    else:
        B, T, N = c["B"], c["T"], c["B"]
        draw = torch.rand
    q, k, v = (draw(B, T, H, D, dtype=dtype) for _ in range(3))
    g = torch.randn(B, T, H, D, dtype=dtype)
    beta = torch.randn(B, T, H, dtype=dtype)
    A_log = torch.log(torch.empty(H, dtype=torch.float32).uniform_(1, 16))
    dt_bias = torch.randn(H * D, dtype=torch.float32)
    h0 = torch.randn(N, H, D, D, dtype=torch.float32)
    x = _leaves(device, False, q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, h0=h0)
    x["scale"] = D ** -0.5
    extra = {}
    if varlen:
        x["cu_seqlens"] = extra["cu_seqlens"] = torch.LongTensor(c["cu_seqlens"]).to(device)
    with torch.inference_mode():
        o, ht = kdagen.chunk_kda(
            q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], A_log=x["A_log"],
            dt_bias=x["dt_bias"], scale=x["scale"], initial_state=x["h0"].clone(),
            output_final_state=True, **extra, **FLASH_KDA_KWARGS)
    return x, dict(o=o, ht=ht)


def _flash_kda_gold(fla, x):
    f64 = torch.float64
    extra = {"cu_seqlens": x["cu_seqlens"]} if "cu_seqlens" in x else {}
    return fla.fused_recurrent_kda(
        q=x["q"].to(f64), k=x["k"].to(f64), v=x["v"].to(f64), g=x["g"].to(f64),
        beta=torch.sigmoid(x["beta"].to(f64)), A_log=x["A_log"].to(f64),
        dt_bias=x["dt_bias"].to(f64), scale=x["scale"], initial_state=x["h0"].to(f64),
        output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
        lower_bound=-5.0, state_v_first=True, **extra)


class TestKDA:
    """FLA tests/ops/test_kda.py, the tests that call chunk_kda."""

    def test_chunk_invalid_chunk_size(self):
        B, T, H, D = 1, 64, 1, 64
        _skip_outside_envelope(D, D)
        torch.manual_seed(42)
        q, k, v, g = (torch.randn(B, T, H, D, dtype=torch.float).to(DEVICE) for _ in range(4))
        beta = torch.randn(B, T, H, dtype=torch.float).to(DEVICE)
        with pytest.raises(ValueError, match="chunk_size"):
            kdagen.chunk_kda(q, k, v, g, beta, chunk_size=16)

    @pytest.mark.parametrize("case", _params(KDA_CHUNK))
    def test_chunk(self, case, fla):
        c = case
        _skip_outside_envelope(c["D"], c["D"])
        with kernels_or_skip():
            x, tri = _run_kda_chunk(c, DEVICE)
        gate_in_kernel = c["use_gate_in_kernel"]
        gate_fn = fla.naive_kda_lowerbound_gate if c["safe_gate"] else fla.naive_kda_gate
        o, ht = fla.naive_recurrent_kda(
            q=_norm(x["q"]), k=_norm(x["k"]), v=x["v"],
            g=gate_fn(x["g"], x["A_log"], x["dt_bias"]) if gate_in_kernel else x["g"],
            beta=x["beta"], scale=c["scale"], initial_state=x["h0"], output_final_state=True)
        wrt = _pick(x, "q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
        ref = dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))
        check = Comparison("kda test_chunk")
        check("o", ref["o"], tri["o"], 0.005)
        check("ht", ref["ht"], tri["ht"], 0.005)
        check("dq", ref["dq"], tri["dq"], 0.008)
        check("dk", ref["dk"], tri["dk"], 0.008)
        check("dv", ref["dv"], tri["dv"], 0.008)
        check("dg", ref["dg"], tri["dg"], 0.02)
        check("db", ref["dbeta"], tri["dbeta"], 0.02)
        if gate_in_kernel:
            check("dA", ref["dA_log"], tri["dA_log"], 0.003, warn_only=True)
            check("dbias", ref["ddt_bias"], tri["ddt_bias"], 0.008)
        check("dh0", ref["dh0"], tri["dh0"], 0.008)
        check.verdict()

    @pytest.mark.parametrize("case", _params(KDA_STATE_V_FIRST))
    def test_chunk_state_v_first(self, case):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            _, res = _run_kda_state_v_first(case, DEVICE)
        tri, ref = res["tri"], res["ref"]
        check = Comparison("kda test_chunk_state_v_first")
        check("o", ref["o"], tri["o"], 1e-4)
        check("ht", ref["ht"], tri["ht"].transpose(-1, -2), 1e-4)
        for n, label in (("dq", "dq"), ("dk", "dk"), ("dv", "dv"), ("dg", "dg"), ("dbeta", "db")):
            check(label, ref[n], tri[n], 1e-4)
        check("dh0", ref["dh0"], tri["dh0"].transpose(-1, -2), 1e-4)
        check.verdict()

    @pytest.mark.parametrize("case", _params(KDA_BETA_SIGMOID))
    def test_chunk_use_beta_sigmoid_in_kernel(self, case):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, res = _run_kda_beta_sigmoid(case, DEVICE)
        tri, ref = res["tri"], res["ref"]
        s = x["beta_post"].detach().float()
        ref_db_raw = (ref["dbeta"] * s * (1 - s)).to(tri["dbeta"].dtype)
        check = Comparison("kda test_chunk_use_beta_sigmoid_in_kernel")
        for n in ("o", "ht", "dq", "dk", "dv", "dg", "dh0"):
            check(n, ref[n], tri[n], 1e-4)
        check("db_raw", ref_db_raw, tri["dbeta"], 1e-4)
        check.verdict()

    @pytest.mark.parametrize("case", _params(KDA_VARLEN))
    def test_chunk_varlen(self, case, fla):
        c = case
        _skip_outside_envelope(c["D"], c["D"])
        with kernels_or_skip():
            x, tri = _run_kda_varlen(c, DEVICE)
        o, ht = _kda_varlen_reference(fla, c, x)
        wrt = _pick(x, "q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
        ref = dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))
        check = Comparison("kda test_chunk_varlen")
        check("o", ref["o"], tri["o"], 0.005)
        check("ht", ref["ht"], tri["ht"], 0.005)
        check("dq", ref["dq"], tri["dq"], 0.007)
        check("dk", ref["dk"], tri["dk"], 0.008)
        check("dv", ref["dv"], tri["dv"], 0.007)
        check("dg", ref["dg"], tri["dg"], 0.015)
        check("db", ref["dbeta"], tri["dbeta"], 0.015)
        check("dh0", ref["dh0"], tri["dh0"], 0.007)
        if c["use_gate_in_kernel"]:
            check("dA", ref["dA_log"], tri["dA_log"], 0.008, warn_only=True)
            check("dbias", ref["ddt_bias"], tri["ddt_bias"], 0.005)
        check.verdict()

    @pytest.mark.parametrize("case", _params(KDA_VARLEN_PREFILL))
    def test_chunk_varlen_prefill(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_kda_varlen_prefill(case, DEVICE)
        with torch.inference_mode():
            o, ht = _kda_varlen_reference(fla, case, x)
        check = Comparison("kda test_chunk_varlen_prefill")
        check("o", o, tri["o"], 0.005)
        check("ht", ht, tri["ht"], 0.005)
        check.verdict()

    @pytest.mark.parametrize("dtype", KDA_RETURN_STATES_DTYPES)
    def test_chunk_return_intermediate_states(self, dtype):
        _skip_outside_envelope(128, 128)
        with kernels_or_skip():
            s, res = _run_kda_return_intermediate_states(dtype, DEVICE)
        B, T, H, D, N, total = s["B"], s["T"], s["H"], s["D"], s["N"], s["total"]
        out = res["dense"]
        assert isinstance(out, tuple) and len(out) == 3, "expected (o, final_state, h)"
        o, final_state, h = out
        assert o.shape == (B, T, H, D)
        assert final_state.shape == (B, H, D, D)
        assert h.shape == (B, math.ceil(T / 64), H, D, D), f"h shape {tuple(h.shape)}"
        assert h.dtype == dtype
        out = res["varlen"]
        assert isinstance(out, tuple) and len(out) == 3, "expected (o, final_state, h)"
        o, final_state, h = out
        assert o.shape == (1, total, H, D)
        assert final_state.shape == (N, H, D, D)
        assert h.shape[0] == 1 and h.shape[2:] == (H, D, D), f"h shape {tuple(h.shape)}"
        assert h.dtype == dtype

    @pytest.mark.parametrize("case", _params(FLASH_KDA))
    def test_flash_kda_chunk(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_flash_kda(case, DEVICE)
        ref_o, ref_ht = _flash_kda_gold(fla, x)
        check = Comparison("kda test_flash_kda_chunk")
        check("o", ref_o, tri["o"], 0.006)
        check("ht", ref_ht, tri["ht"], 0.006)
        check.verdict()

    @pytest.mark.parametrize("case", _params(FLASH_KDA_VARLEN))
    def test_flash_kda_chunk_varlen(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_flash_kda(case, DEVICE)
        ref_o, ref_ht = _flash_kda_gold(fla, x)
        check = Comparison("kda test_flash_kda_chunk_varlen")
        check("o", ref_o, tri["o"], 0.006)
        check("ht", ref_ht, tri["ht"], 0.006)
        check.verdict()


# ==========================================================================================
# GDN (FLA tests/ops/test_gdn.py)
# ==========================================================================================

GDN_CHUNK = _cases(
    "B T H HV D scale gate_logit_normalizer mask_p use_qk_l2norm_in_kernel dtype",
    "B{}-T{}-H{}-HV{}-D{}-scale{}-gate_logit_normalizer{}-mask_p{}-use_qk_l2norm_in_kernel{}-{}",
    [
        (4, 1024, 4, 4, 128, 0.1, 1, 1.0, False, torch.float16),
        (2, 75, 4, 4, 64, 1, 0.01, 0, False, torch.float16),
        (2, 500, 3, 3, 60, 1, 1, 0, False, torch.float16),
        (2, 1000, 3, 3, 64, 0.1, 1, 0.5, False, torch.float16),
        (3, 1024, 4, 4, 100, 1, 0.1, 0, False, torch.float16),
        (4, 1024, 4, 4, 128, 0.1, 1, 0, True, torch.float16),
        (2, 1500, 4, 4, 128, 0.1, 10, 0, False, torch.float16),
        (4, 2048, 8, 8, 64, 0.1, 1, 0, False, torch.float16),
        (2, 256, 2, 4, 64, 1, 1, 0, False, torch.float16),
        (2, 512, 2, 8, 64, 1, 0.1, 0, True, torch.float16),
        (2, 1024, 4, 8, 128, 0.1, 1, 0, False, torch.float16),
    ])


def _run_gdn_chunk(c, device):
    torch.manual_seed(42)
    B, T, H, HV, D, dtype = c["B"], c["T"], c["H"], c["HV"], c["D"], c["dtype"]
    l2 = c["use_qk_l2norm_in_kernel"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    beta = torch.rand(B, T, HV, dtype=torch.float).sigmoid()
    g = F.logsigmoid(torch.rand(B, T, HV, dtype=torch.float32)) / c["gate_logit_normalizer"]
    g = g * (torch.rand_like(g) > c["mask_p"])
    h0 = torch.zeros(B, HV, D, D, dtype=torch.float32)
    x = _leaves(device, q=q, k=k, v=v, beta=beta, g=g, h0=h0)
    x["do"] = torch.randn_like(v).to(device)
    x["dht"] = torch.randn_like(h0).to(device)
    o, ht = kdagen.chunk_gated_delta_rule(
        q=x["q"] if l2 else _norm(x["q"]), k=x["k"] if l2 else _norm(x["k"]), v=x["v"],
        g=x["g"], beta=x["beta"], scale=c["scale"], initial_state=x["h0"],
        output_final_state=True, use_qk_l2norm_in_kernel=l2)
    wrt = _pick(x, "q", "k", "v", "beta", "g", "h0")
    return x, dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


GDN_CHUNK_SIZE = _cases(
    "B T H HV D scale gate_logit_normalizer dtype chunk_size",
    "B{}-T{}-H{}-HV{}-D{}-scale{}-gate{}-{}-chunk{}",
    [(1, 64, 2, 4, 32, 0.1, 1.0, torch.float32, chunk_size) for chunk_size in (16, 32, 64)])


def _run_gdn_chunk_size(c, device):
    torch.manual_seed(42)
    B, T, H, HV, D, dtype = c["B"], c["T"], c["H"], c["HV"], c["D"], c["dtype"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    beta = torch.rand(B, T, HV, dtype=torch.float32).sigmoid()
    g = F.logsigmoid(torch.rand(B, T, HV, dtype=torch.float32)) / c["gate_logit_normalizer"]
    h0 = torch.zeros(B, HV, D, D, dtype=torch.float32)
    x = _leaves(device, q=q, k=k, v=v, beta=beta, g=g, h0=h0)
    x["do"] = torch.randn_like(v).to(device)
    x["dht"] = torch.randn_like(h0).to(device)
    o, ht = kdagen.chunk_gated_delta_rule(
        q=_norm(x["q"]), k=_norm(x["k"]), v=x["v"], beta=x["beta"], g=x["g"], scale=c["scale"],
        initial_state=x["h0"], output_final_state=True, chunk_size=c["chunk_size"])
    wrt = _pick(x, "q", "k", "v", "beta", "g", "h0")
    return x, dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


def _gdn_naive_with_grads(fla, x, scale, G):
    o, ht = fla.naive_recurrent_gated_delta_rule(
        q=_norm(_rep(x["q"], G)), k=_norm(_rep(x["k"], G)), v=x["v"], beta=x["beta"], g=x["g"],
        scale=scale, output_final_state=True, initial_state=x["h0"])
    wrt = _pick(x, "q", "k", "v", "beta", "g", "h0")
    return dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


GDN_BETA_SIGMOID = _cases(
    "B T H HV D scale use_qk_l2norm_in_kernel allow_neg_eigval dtype",
    "B{}-T{}-H{}-HV{}-D{}-scale{}-use_qk_l2norm_in_kernel{}-allow_neg_eigval{}-{}",
    [
        (2, 500, 4, 4, 64, 1, False, False, torch.float16),
        (3, 1024, 4, 4, 128, 0.1, True, True, torch.float16),
        (2, 1024, 4, 8, 128, 0.1, False, True, torch.float16),
        (4, 2048, 8, 8, 64, 0.1, True, False, torch.float16),
    ])


def _run_gdn_beta_sigmoid(c, device):
    """Both sides kdagen: raw beta with the in-kernel sigmoid against beta activated outside."""
    torch.manual_seed(42)
    B, T, H, HV, D, dtype = c["B"], c["T"], c["H"], c["HV"], c["D"], c["dtype"]
    l2, neg = c["use_qk_l2norm_in_kernel"], c["allow_neg_eigval"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    beta = torch.randn(B, T, HV, dtype=torch.float)
    g = F.logsigmoid(torch.rand(B, T, HV, dtype=torch.float32))
    h0 = torch.zeros(B, HV, D, D, dtype=torch.float32)
    x = _leaves(device, q=q, k=k, v=v, beta=beta, g=g, h0=h0)
    do = torch.randn_like(v).to(device)
    dht = torch.randn_like(h0).to(device)
    res = {}
    for side, in_kernel in (("tri", True), ("ref", False)):
        o, ht = kdagen.chunk_gated_delta_rule(
            q=x["q"] if l2 else _norm(x["q"]), k=x["k"] if l2 else _norm(x["k"]), v=x["v"],
            g=x["g"], beta=x["beta"] if in_kernel else x["beta"].sigmoid() * (2 if neg else 1),
            scale=c["scale"], initial_state=x["h0"], output_final_state=True,
            use_qk_l2norm_in_kernel=l2, use_beta_sigmoid_in_kernel=in_kernel,
            allow_neg_eigval=neg if in_kernel else False)
        wrt = _pick(x, "q", "k", "v", "beta", "g", "h0")
        res[side] = dict(o=o, ht=ht, **_grads([(o, do), (ht, dht)], wrt))
    return x, res


GDN_STATE_V_FIRST = _cases(
    "B T H D scale gate_logit_normalizer dtype",
    "B{}-T{}-H{}-D{}-scale{}-gate_logit_normalizer{}-{}",
    [
        (1, 63, 1, 64, 1, 1, torch.float16),
        (2, 500, 3, 60, 1, 1, torch.float16),
        (3, 1024, 4, 128, 0.1, 1, torch.float16),
        (4, 2048, 8, 64, 0.1, 1, torch.float16),
    ])


def _run_gdn_state_v_first(c, device):
    """Both sides kdagen: the V-first state layout against the default one."""
    torch.manual_seed(42)
    B, T, H, D, dtype = c["B"], c["T"], c["H"], c["D"], c["dtype"]
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, H, D, dtype=dtype)
    beta = torch.rand(B, T, H, dtype=dtype).sigmoid()
    g = F.logsigmoid(torch.rand(B, T, H, dtype=torch.float32)) / c["gate_logit_normalizer"]
    h0_kv = torch.randn(B, H, D, D, dtype=torch.float32)
    h0_vk = h0_kv.transpose(-1, -2).contiguous()
    x = _leaves(device, q=q, k=k, v=v, beta=beta, g=g, h0_kv=h0_kv, h0_vk=h0_vk)
    do = torch.randn_like(v).to(device)
    dht_vk = torch.randn(B, H, D, D, dtype=torch.float32).to(device)
    dht_kv = dht_vk.transpose(-1, -2).contiguous()
    res = {}
    for side, h0, dht, v_first in (("tri", "h0_vk", dht_vk, True), ("ref", "h0_kv", dht_kv, False)):
        o, ht = kdagen.chunk_gated_delta_rule(
            q=_norm(x["q"]), k=_norm(x["k"]), v=x["v"], g=x["g"], beta=x["beta"],
            scale=c["scale"], initial_state=x[h0], output_final_state=True,
            state_v_first=v_first)
        wrt = dict(_pick(x, "q", "k", "v", "beta", "g"), h0=x[h0])
        res[side] = dict(o=o, ht=ht, **_grads([(o, do), (ht, dht)], wrt))
    return x, res


GDN_VARLEN = _cases(
    "H HV D mask_p cu_seqlens dtype", "H{}-HV{}-D{}-mask_p{}-cu_seqlens{}-{}",
    [
        (4, 4, 60, 0, [0, 15], torch.float16),
        (4, 4, 64, 0, [0, 256, 500, 1000], torch.float16),
        (4, 4, 64, 0.5, [0, 256, 500, 1000], torch.float16),
        (4, 4, 100, 0, [0, 15, 100, 300, 1200, 2000], torch.float16),
        (2, 4, 64, 0, [0, 256, 500, 1000], torch.float16),
        (2, 8, 64, 0, [0, 256, 500, 1000], torch.float16),
    ])


def _run_gdn_varlen(c, device):
    torch.manual_seed(42)
    H, HV, D, dtype, cu = c["H"], c["HV"], c["D"], c["dtype"], c["cu_seqlens"]
    T, N = cu[-1], len(cu) - 1
    q = torch.randn(1, T, H, D, dtype=dtype)
    k = F.normalize(torch.randn(1, T, H, D, dtype=torch.float32), p=2, dim=-1).to(dtype)
    v = torch.randn(1, T, HV, D, dtype=dtype)
    g = F.logsigmoid(torch.rand(1, T, HV, dtype=dtype))
    g = g * (torch.rand_like(g) > c["mask_p"])
    beta = torch.rand(1, T, HV, dtype=torch.float).sigmoid()
    h0 = torch.randn(N, HV, D, D, dtype=dtype)
    x = _leaves(device, q=q, k=k, v=v, beta=beta, g=g, h0=h0)
    x["cu_seqlens"] = torch.LongTensor(cu).to(device)
    x["do"] = torch.randn_like(v).to(device)
    x["dht"] = torch.rand_like(h0).to(device)
    o, ht = kdagen.chunk_gated_delta_rule(
        q=x["q"], k=x["k"], v=x["v"], beta=x["beta"], g=x["g"], initial_state=x["h0"],
        output_final_state=True, cu_seqlens=x["cu_seqlens"])
    wrt = _pick(x, "q", "k", "v", "beta", "g", "h0")
    return x, dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


GDN_VARLEN_PREFILL = _cases(
    "H D mask_p cu_seqlens dtype", "H{}-D{}-mask_p{}-cu_seqlens{}-{}",
    [
        (4, 60, 0, [0, 8192], torch.float16),
        (4, 60, 0, [0, 15], torch.float16),
        (4, 64, 0, [0, 256, 500, 1000], torch.float16),
        (4, 64, 0.5, [0, 256, 500, 1000], torch.float16),
        (4, 100, 0, [0, 15, 100, 300, 1200, 2000], torch.float16),
    ])


def _run_gdn_varlen_prefill(c, device):
    torch.manual_seed(42)
    H, D, dtype, cu = c["H"], c["D"], c["dtype"], c["cu_seqlens"]
    T, N = cu[-1], len(cu) - 1
    with torch.inference_mode():
        q = torch.randn(1, T, H, D, dtype=dtype)
        k = F.normalize(torch.randn(1, T, H, D, dtype=torch.float32), p=2, dim=-1).to(dtype)
        v = torch.randn(1, T, H, D, dtype=dtype)
        g = F.logsigmoid(torch.rand(1, T, H, dtype=dtype))
        g = g * (torch.rand_like(g) > c["mask_p"])
        beta = torch.rand(1, T, H, dtype=dtype).sigmoid()
        h0 = torch.randn(N, H, D, D, dtype=dtype)
        x = _leaves(device, False, q=q, k=k, v=v, beta=beta, g=g, h0=h0)
        x["cu_seqlens"] = torch.LongTensor(cu).to(device)
        o, ht = kdagen.chunk_gated_delta_rule(
            q=x["q"], k=x["k"], v=x["v"], beta=x["beta"], g=x["g"], initial_state=x["h0"],
            output_final_state=True, cu_seqlens=x["cu_seqlens"])
    return x, dict(o=o, ht=ht)


def _gdn_varlen_reference(fla, x, cu, G=1, scale=None, normalize=False):
    os_, hts = [], []
    for i in range(len(cu) - 1):
        s = slice(cu[i], cu[i + 1])
        q, k = _rep(x["q"][:, s], G), _rep(x["k"][:, s], G)
        if normalize:
            q, k = _norm(q), _norm(k)
        o, ht = fla.naive_recurrent_gated_delta_rule(
            q=q, k=k, v=x["v"][:, s], beta=x["beta"][:, s], g=x["g"][:, s], scale=scale,
            initial_state=x["h0"][i], output_final_state=True)
        os_.append(o)
        hts.append(ht)
    return torch.cat(os_, 1), torch.cat(hts, 0)


GDN_GATE_IN_KERNEL = _cases(
    "B T H D scale has_dt_bias use_qk_l2norm_in_kernel dtype",
    "B{}-T{}-H{}-D{}-scale{}-has_dt_bias{}-use_qk_l2norm{}-{}",
    [
        (2, 75, 4, 64, 1, True, True, torch.float16),
        (2, 500, 3, 60, 1, False, False, torch.float16),
        (2, 1000, 3, 64, 0.1, True, False, torch.float16),
        (3, 1024, 4, 100, 1, True, True, torch.float16),
        (4, 1024, 4, 128, 0.1, False, True, torch.float16),
        (4, 2048, 8, 64, 0.1, True, False, torch.float16),
    ])
GDN_GATE_IN_KERNEL_GQA = _cases(
    "B T Hq H D scale has_dt_bias dtype", "B{}-T{}-Hq{}-H{}-D{}-scale{}-has_dt_bias{}-{}",
    [
        (2, 256, 2, 4, 64, 1, True, torch.float16),
        (2, 512, 1, 4, 64, 0.1, False, torch.float16),
        (2, 512, 2, 8, 64, 1, True, torch.float16),
        (2, 1024, 4, 8, 128, 0.1, True, torch.float16),
    ])
GDN_GATE_IN_KERNEL_VARLEN = _cases(
    "H D has_dt_bias cu_seqlens dtype", "H{}-D{}-has_dt_bias{}-cu_seqlens{}-{}",
    [
        (4, 60, True, [0, 15], torch.float16),
        (4, 64, False, [0, 256, 500, 1000], torch.float16),
        (4, 64, True, [0, 256, 500, 1000], torch.float16),
        (4, 100, True, [0, 15, 100, 300, 1200, 2000], torch.float16),
    ])


def _gdn_gate_standin(g, A_log, dt_bias=None):
    """For the variant enumeration only (no fla there): a precomputed fp32 gate of the shape
    FLA's naive_gdn_gate returns; its values do not matter to which programs run."""
    g = g.float() if dt_bias is None else g.float() + dt_bias.float()
    return -A_log.float().exp() * F.softplus(g)


def _run_gdn_gate_in_kernel(c, device, gdn_gate=_gdn_gate_standin):
    """Both sides kdagen: the raw gate activated in the kernel against a gate precomputed with
    ``gdn_gate`` (FLA's naive_gdn_gate in the test). Serves FLA's three gate-in-kernel tests."""
    torch.manual_seed(42)
    varlen = "cu_seqlens" in c
    if varlen:
        cu = c["cu_seqlens"]
        B, T, N, H, HV, D = 1, cu[-1], len(cu) - 1, c["H"], c["H"], c["D"]
        draw, l2, scale = torch.randn, True, None
    else:
        B, T, D, scale = c["B"], c["T"], c["D"], c["scale"]
        H, HV = (c["Hq"], c["H"]) if "Hq" in c else (c["H"], c["H"])
        N, draw = B, torch.rand
        l2 = c.get("use_qk_l2norm_in_kernel", True)
    dtype = c["dtype"]
    q = draw(B, T, H, D, dtype=dtype)
    k = draw(B, T, H, D, dtype=dtype)
    v = draw(B, T, HV, D, dtype=dtype)
    beta = torch.rand(B, T, HV, dtype=torch.float).sigmoid()
    g_raw = torch.randn(B, T, HV, dtype=torch.float32)
    A_log = torch.randn(HV, dtype=torch.float32)
    bias = {"dt_bias": torch.randn(HV, dtype=torch.float32)} if c["has_dt_bias"] else {}
    h0 = (torch.randn if varlen else torch.zeros)(N, HV, D, D, dtype=torch.float32)
    x = _leaves(device, q=q, k=k, v=v, beta=beta, g=g_raw, h0=h0, A_log=A_log, **bias)
    extra = {}
    if varlen:
        x["cu_seqlens"] = extra["cu_seqlens"] = torch.LongTensor(cu).to(device)
    x["do"] = torch.randn_like(v).to(device)
    x["dht"] = (torch.rand_like if varlen else torch.randn_like)(h0).to(device)
    res = {}
    for side, in_kernel in (("tri", True), ("ref", False)):
        if in_kernel:
            gate = dict(g=x["g"], use_gate_in_kernel=True, A_log=x["A_log"],
                        dt_bias=x.get("dt_bias"))
        else:
            gate = dict(g=gdn_gate(x["g"], x["A_log"], x.get("dt_bias")))
        o, ht = kdagen.chunk_gated_delta_rule(
            q=x["q"] if l2 else _norm(x["q"]), k=x["k"] if l2 else _norm(x["k"]), v=x["v"],
            beta=x["beta"], scale=scale, initial_state=x["h0"], output_final_state=True,
            use_qk_l2norm_in_kernel=l2, **gate, **extra)
        wrt = _pick(x, "q", "k", "v", "beta", "g", "h0", "A_log", "dt_bias")
        res[side] = dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))
    return x, res


FLASH_QLA = _cases("B T H HV D dtype", "B{}-T{}-H{}-HV{}-D{}-{}", [
    (1, 1024, 4, 4, 128, torch.bfloat16),
    (2, 2048, 8, 8, 128, torch.bfloat16),
    (1, 4096, 16, 16, 128, torch.bfloat16),
    (1, 1024, 4, 4, 128, torch.float16),
    (2, 2048, 8, 8, 128, torch.float16),
    (1, 1024, 2, 8, 128, torch.bfloat16),
    (2, 2048, 4, 16, 128, torch.bfloat16),
])
FLASH_QLA_VARLEN = _cases("H D cu_seqlens", "H{}-D{}-cu{}", [
    (4, 128, [0, 256, 500, 1000]),
    (8, 128, [0, 100, 300, 1200, 2000]),
    (16, 128, [0, 101, 303, 1205, 3007, 4096]),
])
FLASH_QLA_STATE_V_FIRST = _cases("B T H D", "B{}-T{}-H{}-D{}", [
    (1, 1024, 4, 128),
    (2, 2048, 8, 128),
])
FLASH_QLA_FORWARD_ONLY = _cases("B T H HV D dtype", "B{}-T{}-H{}-HV{}-D{}-{}", [
    (1, 1024, 4, 4, 128, torch.bfloat16),
    (2, 2048, 8, 8, 128, torch.bfloat16),
    (1, 1024, 4, 4, 128, torch.float16),
    (1, 1024, 2, 8, 128, torch.bfloat16),
])
FLASH_QLA_RTOL = 0.008


def _flash_qla_inputs(c, device, grad: bool):
    """FLA's FlashQLA parity tests' inputs (randn q/k/v, logsigmoid gate, fp32 beta and state)."""
    torch.manual_seed(42)
    varlen = "cu_seqlens" in c
    dtype = c.get("dtype", torch.bfloat16)
    H, D = c["H"], c["D"]
    HV = c.get("HV", H)
    if varlen:
        B, T, N = 1, c["cu_seqlens"][-1], len(c["cu_seqlens"]) - 1
    else:
        B, T, N = c["B"], c["T"], c["B"]
    q = torch.randn(B, T, H, D, dtype=dtype)
    k = torch.randn(B, T, H, D, dtype=dtype)
    v = torch.randn(B, T, HV, D, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, HV, dtype=torch.float32))
    beta = torch.randn(B, T, HV, dtype=torch.float32).sigmoid()
    h0 = torch.randn(N, HV, D, D, dtype=torch.float32)
    x = _leaves(device, grad, q=q, k=k, v=v, g=g, beta=beta, h0=h0)
    x["scale"] = D ** -0.5
    if varlen:
        x["cu_seqlens"] = torch.LongTensor(c["cu_seqlens"]).to(device)
    if grad:
        # test_flash_qla_chunk draws do like its fp32 reference output, the others like v
        do_dtype = torch.float32 if ("HV" in c and not varlen) else dtype
        x["do"] = torch.randn(B, T, HV, D, dtype=do_dtype).to(device)
        x["dht"] = torch.randn(N, HV, D, D, dtype=torch.float32).to(device)
    return x


def _flash_qla_call(x, **extra):
    if "cu_seqlens" in x:
        extra["cu_seqlens"] = x["cu_seqlens"]
    return kdagen.chunk_gated_delta_rule(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=x["scale"],
        output_final_state=True, use_qk_l2norm_in_kernel=True, **extra)


def _run_flash_qla(c, device):
    x = _flash_qla_inputs(c, device, grad=True)
    o, ht = _flash_qla_call(x, initial_state=x["h0"])
    wrt = _pick(x, "q", "k", "v", "g", "beta", "h0")
    return x, dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))


def _run_flash_qla_state_v_first(c, device):
    """Both sides kdagen (FLA asks for identical results: tolerance 0)."""
    x = _flash_qla_inputs(c, device, grad=True)
    h0_kv = x["h0"]
    h0_vk = h0_kv.detach().transpose(-1, -2).contiguous().requires_grad_(True)
    dht_vk = x["dht"]
    dht_kv = dht_vk.transpose(-1, -2).contiguous()
    res = {}
    for side, h0, dht, v_first in (("tri", h0_vk, dht_vk, True), ("ref", h0_kv, dht_kv, False)):
        o, ht = _flash_qla_call(x, initial_state=h0, state_v_first=v_first)
        wrt = dict(_pick(x, "q", "k", "v", "g", "beta"), h0=h0)
        res[side] = dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, dht)], wrt))
    return x, res


def _run_flash_qla_forward_only(c, device):
    with torch.no_grad():
        x = _flash_qla_inputs(c, device, grad=False)
        o, ht = _flash_qla_call(x, initial_state=x["h0"])
    return x, dict(o=o, ht=ht)


class TestGDN:
    """FLA tests/ops/test_gdn.py, the tests that call chunk_gated_delta_rule."""

    @pytest.mark.parametrize("case", _params(GDN_CHUNK))
    def test_chunk(self, case, fla):
        c = case
        _skip_outside_envelope(c["D"], c["D"])
        with kernels_or_skip():
            x, tri = _run_gdn_chunk(c, DEVICE)
        ref = _gdn_naive_with_grads(fla, x, c["scale"], c["HV"] // c["H"])
        check = Comparison("gdn test_chunk")
        check("o", ref["o"], tri["o"], 0.005)
        check("ht", ref["ht"], tri["ht"], 0.005)
        check("dq", ref["dq"], tri["dq"], 0.008)
        check("dk", ref["dk"], tri["dk"], 0.008)
        check("dv", ref["dv"], tri["dv"], 0.008)
        check("db", ref["dbeta"], tri["dbeta"], 0.02)
        check("dg", ref["dg"], tri["dg"], 0.02)
        check("dh0", ref["dh0"], tri["dh0"], 0.008)
        check.verdict()

    @pytest.mark.parametrize("case", _params(GDN_CHUNK_SIZE))
    def test_chunk_with_chunk_size(self, case, fla):
        c = case
        _skip_outside_envelope(c["D"], c["D"])
        with kernels_or_skip():
            x, tri = _run_gdn_chunk_size(c, DEVICE)
        ref = _gdn_naive_with_grads(fla, x, c["scale"], c["HV"] // c["H"])
        cs = c["chunk_size"]
        check = Comparison(f"gdn test_chunk_with_chunk_size@{cs}")
        for n, tol in (("o", 0.005), ("ht", 0.005), ("dq", 0.005), ("dk", 0.005), ("dv", 0.005),
                       ("dbeta", 0.01), ("dg", 0.01), ("dh0", 0.005)):
            check(f"{n}@{cs}", ref[n], tri[n], tol)
        check.verdict()

    @pytest.mark.parametrize("case", _params(GDN_BETA_SIGMOID))
    def test_chunk_beta_sigmoid_in_kernel(self, case):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            _, res = _run_gdn_beta_sigmoid(case, DEVICE)
        tri, ref = res["tri"], res["ref"]
        check = Comparison("gdn test_chunk_beta_sigmoid_in_kernel")
        for n, tol in (("o", 0.005), ("ht", 0.005), ("dq", 0.008), ("dk", 0.008), ("dv", 0.008),
                       ("dbeta", 0.02), ("dg", 0.008), ("dh0", 0.008)):
            check(n, ref[n], tri[n], tol)
        check.verdict()

    @pytest.mark.parametrize("case", _params(GDN_STATE_V_FIRST))
    def test_chunk_state_v_first(self, case):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            _, res = _run_gdn_state_v_first(case, DEVICE)
        tri, ref = res["tri"], res["ref"]
        check = Comparison("gdn test_chunk_state_v_first")
        check("o", ref["o"], tri["o"], 1e-4)
        check("ht", ref["ht"], tri["ht"].transpose(-1, -2), 1e-4)
        for n in ("dq", "dk", "dv", "dbeta", "dg"):
            check(n, ref[n], tri[n], 1e-4)
        check("dh0", ref["dh0"], tri["dh0"].transpose(-1, -2), 1e-4)
        check.verdict()

    @pytest.mark.parametrize("case", _params(GDN_VARLEN))
    def test_chunk_varlen(self, case, fla):
        c = case
        _skip_outside_envelope(c["D"], c["D"])
        with kernels_or_skip():
            x, tri = _run_gdn_varlen(c, DEVICE)
        o, ht = _gdn_varlen_reference(fla, x, c["cu_seqlens"], G=c["HV"] // c["H"])
        wrt = _pick(x, "q", "k", "v", "beta", "g", "h0")
        ref = dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))
        check = Comparison("gdn test_chunk_varlen")
        for n, tol in (("o", 0.005), ("ht", 0.005), ("dq", 0.007), ("dk", 0.008), ("dv", 0.007),
                       ("dbeta", 0.015), ("dg", 0.015), ("dh0", 0.007)):
            check(n, ref[n], tri[n], tol)
        check.verdict()

    @pytest.mark.parametrize("case", _params(GDN_VARLEN_PREFILL))
    def test_chunk_varlen_prefill(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_gdn_varlen_prefill(case, DEVICE)
        with torch.inference_mode():
            o, ht = _gdn_varlen_reference(fla, x, case["cu_seqlens"])
        check = Comparison("gdn test_chunk_varlen_prefill")
        check("o", o, tri["o"], 0.005)
        check("ht", ht, tri["ht"], 0.005)
        check.verdict()

    def _gate_in_kernel(self, case, fla, label):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            _, res = _run_gdn_gate_in_kernel(case, DEVICE, gdn_gate=fla.naive_gdn_gate)
        tri, ref = res["tri"], res["ref"]
        check = Comparison(f"gdn {label}")
        for n, tol in (("o", 0.005), ("ht", 0.005), ("dq", 0.008), ("dk", 0.008), ("dv", 0.008),
                       ("dbeta", 0.02), ("dg", 0.02), ("dh0", 0.008), ("dA_log", 0.02)):
            check(n, ref[n], tri[n], tol)
        if case["has_dt_bias"]:
            check("ddt_bias", ref["ddt_bias"], tri["ddt_bias"], 0.02)
        check.verdict()

    @pytest.mark.parametrize("case", _params(GDN_GATE_IN_KERNEL))
    def test_chunk_gate_in_kernel(self, case, fla):
        self._gate_in_kernel(case, fla, "test_chunk_gate_in_kernel")

    @pytest.mark.parametrize("case", _params(GDN_GATE_IN_KERNEL_GQA))
    def test_chunk_gate_in_kernel_gqa(self, case, fla):
        self._gate_in_kernel(case, fla, "test_chunk_gate_in_kernel_gqa")

    @pytest.mark.parametrize("case", _params(GDN_GATE_IN_KERNEL_VARLEN))
    def test_chunk_gate_in_kernel_varlen(self, case, fla):
        self._gate_in_kernel(case, fla, "test_chunk_gate_in_kernel_varlen")

    def _flash_qla_gold(self, fla, x, grad: bool):
        if "cu_seqlens" in x:
            cu = x["cu_seqlens"].tolist()
            o, ht = _gdn_varlen_reference(fla, x, cu, scale=x["scale"], normalize=True)
        else:
            G = x["v"].shape[2] // x["q"].shape[2]
            o, ht = fla.naive_recurrent_gated_delta_rule(
                q=_norm(_rep(x["q"], G)), k=_norm(_rep(x["k"], G)), v=x["v"], g=x["g"],
                beta=x["beta"], scale=x["scale"], initial_state=x["h0"], output_final_state=True)
        if not grad:
            return dict(o=o, ht=ht)
        wrt = _pick(x, "q", "k", "v", "g", "beta", "h0")
        return dict(o=o, ht=ht, **_grads([(o, x["do"]), (ht, x["dht"])], wrt))

    def _flash_qla_check(self, label, ref, tri):
        check = Comparison(f"gdn {label}")
        for n, tol in (("o", FLASH_QLA_RTOL), ("ht", FLASH_QLA_RTOL), ("dq", FLASH_QLA_RTOL),
                       ("dk", FLASH_QLA_RTOL), ("dv", FLASH_QLA_RTOL), ("dg", 0.035),
                       ("dbeta", 0.008), ("dh0", FLASH_QLA_RTOL)):
            check(n, ref[n], tri[n], tol)
        check.verdict()

    @pytest.mark.parametrize("case", _params(FLASH_QLA))
    def test_flash_qla_chunk(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_flash_qla(case, DEVICE)
        self._flash_qla_check("test_flash_qla_chunk", self._flash_qla_gold(fla, x, True), tri)

    @pytest.mark.parametrize("case", _params(FLASH_QLA_VARLEN))
    def test_flash_qla_chunk_varlen(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_flash_qla(case, DEVICE)
        self._flash_qla_check("test_flash_qla_chunk_varlen",
                              self._flash_qla_gold(fla, x, True), tri)

    @pytest.mark.parametrize("case", _params(FLASH_QLA_STATE_V_FIRST))
    def test_flash_qla_chunk_state_v_first(self, case):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            _, res = _run_flash_qla_state_v_first(case, DEVICE)
        tri, ref = res["tri"], res["ref"]
        check = Comparison("gdn test_flash_qla_chunk_state_v_first")
        check("o", ref["o"], tri["o"], 0.0)
        check("ht", ref["ht"], tri["ht"].transpose(-1, -2), 0.0)
        for n in ("dq", "dk", "dv", "dg", "dbeta"):
            check(n, ref[n], tri[n], 0.0)
        check("dh0", ref["dh0"], tri["dh0"].transpose(-1, -2), 0.0)
        check.verdict()

    @pytest.mark.parametrize("case", _params(FLASH_QLA_FORWARD_ONLY))
    def test_flash_qla_chunk_forward_only(self, case, fla):
        _skip_outside_envelope(case["D"], case["D"])
        with kernels_or_skip():
            x, tri = _run_flash_qla_forward_only(case, DEVICE)
        with torch.no_grad():
            ref = self._flash_qla_gold(fla, x, False)
        B, T, HV, D = case["B"], case["T"], case["HV"], case["D"]
        assert tri["o"].shape == (B, T, HV, D)
        assert tri["ht"].shape == x["h0"].shape
        assert torch.isfinite(tri["o"]).all() and torch.isfinite(tri["ht"]).all()
        check = Comparison("gdn test_flash_qla_chunk_forward_only")
        check("o", ref["o"], tri["o"], FLASH_QLA_RTOL)
        check("ht", ref["ht"], tri["ht"], FLASH_QLA_RTOL)
        check.verdict()


# ------------------------------------------------------------------------------------------
# `python tests/test_fla_compat.py DIR [CHIP]`: emit, on a machine without a GPU, one bundle
# with every program variant these tests ask kdagen for; then run them with KDAGEN_BUNDLE=DIR.
# `python tests/test_fla_compat.py --list`: only list the variants.
# ------------------------------------------------------------------------------------------

# (label, runner(case, device), cases): every kdagen call the tests make goes through these
# runners, so the enumeration replays exactly the tests' calls (on CPU tensors).
ENUMERATED = [
    ("TestKDA::test_chunk", _run_kda_chunk, KDA_CHUNK),
    ("TestKDA::test_chunk_state_v_first", _run_kda_state_v_first, KDA_STATE_V_FIRST),
    ("TestKDA::test_chunk_use_beta_sigmoid_in_kernel", _run_kda_beta_sigmoid, KDA_BETA_SIGMOID),
    ("TestKDA::test_chunk_varlen", _run_kda_varlen, KDA_VARLEN),
    ("TestKDA::test_chunk_varlen_prefill", _run_kda_varlen_prefill, KDA_VARLEN_PREFILL),
    ("TestKDA::test_chunk_return_intermediate_states", _run_kda_return_intermediate_states,
     [(str(d), d) for d in KDA_RETURN_STATES_DTYPES]),
    ("TestKDA::test_flash_kda_chunk", _run_flash_kda, FLASH_KDA),
    ("TestKDA::test_flash_kda_chunk_varlen", _run_flash_kda, FLASH_KDA_VARLEN),
    ("TestGDN::test_chunk", _run_gdn_chunk, GDN_CHUNK),
    ("TestGDN::test_chunk_with_chunk_size", _run_gdn_chunk_size, GDN_CHUNK_SIZE),
    ("TestGDN::test_chunk_beta_sigmoid_in_kernel", _run_gdn_beta_sigmoid, GDN_BETA_SIGMOID),
    ("TestGDN::test_chunk_state_v_first", _run_gdn_state_v_first, GDN_STATE_V_FIRST),
    ("TestGDN::test_chunk_varlen", _run_gdn_varlen, GDN_VARLEN),
    ("TestGDN::test_chunk_varlen_prefill", _run_gdn_varlen_prefill, GDN_VARLEN_PREFILL),
    ("TestGDN::test_chunk_gate_in_kernel", _run_gdn_gate_in_kernel, GDN_GATE_IN_KERNEL),
    ("TestGDN::test_chunk_gate_in_kernel_gqa", _run_gdn_gate_in_kernel, GDN_GATE_IN_KERNEL_GQA),
    ("TestGDN::test_chunk_gate_in_kernel_varlen", _run_gdn_gate_in_kernel,
     GDN_GATE_IN_KERNEL_VARLEN),
    ("TestGDN::test_flash_qla_chunk", _run_flash_qla, FLASH_QLA),
    ("TestGDN::test_flash_qla_chunk_varlen", _run_flash_qla, FLASH_QLA_VARLEN),
    ("TestGDN::test_flash_qla_chunk_state_v_first", _run_flash_qla_state_v_first,
     FLASH_QLA_STATE_V_FIRST),
    ("TestGDN::test_flash_qla_chunk_forward_only", _run_flash_qla_forward_only,
     FLASH_QLA_FORWARD_ONLY),
]


def _head_dim_of(case) -> int:
    return case["D"] if isinstance(case, dict) else 128   # return_intermediate_states: D = 128


def variants_used(verbose: bool = False) -> tuple[list, list[str]]:
    """(the distinct (program, options) the tests need, the cases whose kdagen calls failed)."""
    from kdagen.runtime.backends import recording
    failures = []
    with recording("cpu") as rec:
        for label, run, cases in ENUMERATED:
            for case_id, case in cases:
                D = _head_dim_of(case)
                if not _head_dims_supported(D, D):
                    continue
                before = len(rec.calls)
                try:
                    run(case, "cpu")
                except Exception as err:   # an API keyword or layout kdagen lacks so far
                    failures.append(f"{label}[{case_id}]: {type(err).__name__}: {err}")
                if verbose:
                    print(f"{label}[{case_id}]: {len(rec.calls) - before} program calls",
                          flush=True)
    return rec.variants(), failures


if __name__ == "__main__":
    import sys

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    list_only = "--list" in sys.argv[1:]
    if not list_only and not args:
        sys.exit("usage: python tests/test_fla_compat.py DIR [CHIP]  |  --list")
    variants, failures = variants_used(verbose="--verbose" in sys.argv[1:])
    if list_only:
        for program, options in variants:
            print(program, options)
        print(f"{len(variants)} variants")
    else:
        from gpu_bundle import write_variants_bundle
        write_variants_bundle(variants, args[0], args[1] if len(args) > 1 else "sm_90a")
    if failures:
        print(f"\n{len(failures)} case(s) could not be enumerated (their kdagen calls failed on "
              f"CPU, so they will fail on the GPU too):", file=sys.stderr)
        for line in failures:
            print("  " + line, file=sys.stderr)
        sys.exit(1)
