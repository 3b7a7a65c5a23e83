"""Intra-card context parallelism (kdagen.runtime.segments), on the CPU: the chaining of the
segments' start states against a sequential affine recurrence (forward and reverse), the
runner's protocol on a toy program whose "kernels" are torch functions (segmented outputs
equal the whole-sequence run's, start states handed back and reused), the segment-count
rule, and the refusals. The GPU kernels under it: tests/test_segments_gpu.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kdagen.runtime import segments as seg


def _affine_chain(start, Ms, Es, reverse):
    """Sequential: the state entering each segment (reverse: the state at each segment's end
    walking backwards), the [B, P, ...] start states a segmented run must reproduce."""
    P = Ms.shape[1]
    order = range(P - 1, -1, -1) if reverse else range(P)
    s, out = start, [None] * P
    for p in order:
        out[p] = s
        s = torch.matmul(Ms[:, p], s) + Es[:, p]
    return torch.stack(out, 1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("P", [2, 3, 8])
def test_chain_starts_matches_the_sequential_recurrence(reverse, P):
    gen = torch.Generator().manual_seed(P + 10 * reverse)
    B, H, K, V = 2, 3, 5, 4
    Ms = torch.randn(B, P, H, K, K, generator=gen, dtype=torch.float64) * 0.5
    Es = torch.randn(B, P, H, K, V, generator=gen, dtype=torch.float64)
    start = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    first = P - 1 if reverse else 0
    ends = Es.clone()                                  # from zero, except the first segment
    ends[:, first] = torch.matmul(Ms[:, first], start) + Es[:, first]
    got = seg.chain_starts(start, ends, Ms, reverse)
    torch.testing.assert_close(got, _affine_chain(start, Ms, Es, reverse))


# ------------------------------------------------------------------------------------------
# a toy program run by the segmented runner: the scan's state map per chunk is affine, as the
# real kernels' (S <- A_c S + B_c, A_c and B_c from the chunk's tokens); a chunk-parallel
# "output kernel" reads the checkpoints the scan wrote
# ------------------------------------------------------------------------------------------

C, HV, K = 4, 2, 3


def _chunk_maps(x):
    """x [B', T', HV, K] -> per chunk A [B', n, HV, K, K] (contracting) and Bc [B', n, HV, K, K]."""
    Bp, Tp = x.shape[:2]
    xc = x.view(Bp, Tp // C, C, HV, K).permute(0, 1, 3, 2, 4)        # [B', n, HV, C, K]
    A = torch.eye(K, dtype=x.dtype) * 0.9 - 0.1 * torch.tanh(xc.transpose(-1, -2) @ xc) / C
    Bc = xc.transpose(-1, -2) @ torch.sin(xc)
    return A, Bc


class _ToyKernel:
    """A launch of the call plan (kdagen.runtime.launch._Launch): name, kernel.entry.launch,
    grid, chunk-ready flags ("publish" / "wait" / None), scan_first (the scan launched first)."""
    def __init__(self, name, launch, fn, flags=None, grid=(1, 1, 1)):
        self.kernel = SimpleNamespace(entry=SimpleNamespace(launch=launch))
        self.name, self.fn, self.flags, self.grid = name, fn, flags, grid
        self.scan_first = launch.get("overlap_order") == "scan"


class ToyProgram:
    """The surface of kdagen.runtime.launch.LoweredProgram that run_segmented uses."""
    variant = "toy"

    def __init__(self, reverse=False, scan_final=True):
        self.C, self.reverse = C, reverse
        init, final = ("dht", "dh0") if reverse else ("initial_state", "final_state")
        self.init, self.final = init, final
        self.args = [dict(name="x", role="input", layout="token", heads="v"),
                     dict(name=init, role="input", layout="state", heads=None),
                     dict(name="y", role="output", layout="token", heads="v")]
        if scan_final:
            self.args.append(dict(name=final, role="output", layout="state", heads=None))
        carry = {"init": init, "final": final if scan_final else None, "reverse": reverse}
        self.launches = [
            _ToyKernel("scan", {"carry": carry}, self._scan),
            _ToyKernel("out", {"parallel_chunks": True}, self._out)]
        self.calls, self.together, self.flagged, self.asked_fit = [], [], [], []
        self.fit = 0

    def with_publisher(self, fit):
        """A chunk kernel before the scan that publishes chunk-ready flags it waits for."""
        self.launches[0].flags, self.launches[0].grid = "wait", (4, 2, 1)
        self.launches.insert(0, _ToyKernel("chunk", {"parallel_chunks": True},
                                           lambda a: None, flags="publish"))
        self.fit = fit
        return self

    def bind(self, device, poison, tensors):
        x = tensors["x"]
        Bp, Tp = x.shape[:2]
        values = {"x": x, self.init: tensors[self.init].to(torch.float64)}
        outputs = {"y": torch.full_like(x, float("nan"))}
        if any(a["name"] == self.final for a in self.args):
            outputs[self.final] = torch.full((Bp, HV, K, K), float("nan"), dtype=torch.float64)
        values.update(outputs)
        return torch.device("cpu"), {"B": Bp, "T": Tp}, values, outputs

    def prepare_launches(self, device, sz, values, poison, stream, chip):
        values["S_chunks"] = torch.full((sz["B"], sz["T"] // C, HV, K, K), float("nan"),
                                        dtype=torch.float64)
        return SimpleNamespace(launches=self.launches), None

    def _args(self, la, values, device, aside=False, flags=False, side=0):
        return dict(values, _flags=flags)

    def _launch(self, la, args, stream, profile, timed):
        self.calls.append(la.name)
        la.fn(args)

    def launch_beside(self, first, first_args, beside, device, stream, profile,
                      scan_first=False):
        self.together.append([first.name] + [la.name for la, _ in beside])
        self.flagged.append([first_args.get("_flags")] + [a.get("_flags") for _, a in beside])
        self._launch(first, first_args, stream, profile, False)
        for la, args in beside:
            self._launch(la, args, stream, profile, False)

    def fits_beside(self, ctas, device):
        self.asked_fit.append(ctas)
        return ctas <= self.fit

    def _scan(self, a):
        A, Bc = _chunk_maps(a["x"])
        S = a[self.init].clone()
        n = A.shape[1]
        for c in (range(n - 1, -1, -1) if self.reverse else range(n)):
            a["S_chunks"][:, c] = S
            S = A[:, c] @ S + Bc[:, c]
        if self.final in a:
            a[self.final].copy_(S)

    def _out(self, a):
        Bp, Tp = a["x"].shape[:2]
        xc = a["x"].view(Bp, Tp // C, C, HV, K)
        y = torch.einsum("bnchk,bnhkj->bnchj", xc, a["S_chunks"])
        a["y"].copy_(y.reshape(Bp, Tp, HV, K))

    def whole(self, **tensors):
        device, sz, values, outputs = self.bind(None, False, tensors)
        plan, _ = self.prepare_launches(device, sz, values, False, None, None)
        for la in plan.launches:
            self._launch(la, self._args(la, values, device), None, None, False)
        return outputs


def _toy_inputs(B, T, reverse, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64)
    s0 = torch.randn(B, HV, K, K, generator=gen, dtype=torch.float64)
    return {"x": x, ("dht" if reverse else "initial_state"): s0}


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("P", [2, 4])
def test_segmented_run_equals_the_whole_sequence_run(reverse, P):
    B, T = 2, 8 * C * P
    inputs = _toy_inputs(B, T, reverse, seed=P)
    whole = ToyProgram(reverse).whole(**inputs)
    prog = ToyProgram(reverse)
    got = seg.run_segmented(prog, P, (), dict(inputs))
    torch.testing.assert_close(got["y"], whole["y"], rtol=1e-9, atol=1e-9)
    final = prog.final
    torch.testing.assert_close(got[final], whole[final], rtol=1e-9, atol=1e-9)
    # two chaining runs beside each other, then the true run, then the output kernel
    assert prog.calls == ["scan", "scan", "scan", "out"]
    starts = got[f"segment_{prog.init}"]
    assert starts.shape == (B * P, HV, K, K)
    first = P - 1 if reverse else 0
    torch.testing.assert_close(starts.view(B, P, HV, K, K)[:, first], inputs[prog.init])


def test_known_start_states_run_the_scan_once():
    """A backward's recompute scan gets the forward's segment start states and no chaining:
    one run, the same outputs as the whole sequence (its end state is not stored)."""
    B, P, T = 1, 4, 16 * C
    inputs = _toy_inputs(B, T, False, seed=3)
    fwd = seg.run_segmented(ToyProgram(), P, (), dict(inputs))
    prog = ToyProgram(scan_final=False)
    known = dict(inputs, initial_state=fwd["segment_initial_state"])
    got = seg.run_segmented(prog, P, ("initial_state",), known)
    whole = ToyProgram(scan_final=False).whole(**inputs)
    torch.testing.assert_close(got["y"], whole["y"], rtol=1e-9, atol=1e-9)
    assert prog.calls == ["scan", "out"]


def test_refusals_name_the_reason():
    inputs = _toy_inputs(1, 16 * C, False)
    with pytest.raises(seg.SegmentsUnsupported, match="multiple of"):
        seg.run_segmented(ToyProgram(), 3, (), dict(inputs))
    with pytest.raises(seg.SegmentsUnsupported, match="stores no end state"):
        seg.run_segmented(ToyProgram(scan_final=False), 2, (), dict(inputs))
    prog = ToyProgram()
    prog.launches[0].kernel.entry.launch = {"carries_state": True}
    with pytest.raises(seg.SegmentsUnsupported, match="cannot chain"):
        seg.run_segmented(prog, 2, (), dict(inputs))


@pytest.mark.parametrize("B,T,HV,expect", [
    (1, 32768, 4, 8),      # 2·1·4·2 = 16 CTAs per run: 8 segments fill 128 of 132 SMs
    (1, 32768, 2, 16),
    (1, 32768, 8, 1),      # four segments only (MIN_SEGMENTS)
    (1, 32768, 16, 1),
    (1, 16384, 4, 8),      # segments of 32 chunks
    (1, 8192, 4, 1),       # 128 chunks: 8 segments would hold 16
    (1, 2048, 2, 1),
    (8, 4096, 32, 1),
])
def test_segments_for_rule(B, T, HV, expect):
    assert seg.segments_for(B, T, HV, 128, 128, 64, 132, "auto") == expect


def test_segments_for_setting():
    assert seg.segments_for(1, 32768, 4, 128, 128, 64, 132, "off") == 1
    assert seg.segments_for(1, 32768, 4, 128, 64, 64, 132, "auto") == 1       # K != V
    assert seg.segments_for(1, 32768, 16, 128, 128, 64, 132, "4") == 4        # forced
    assert seg.segments_for(1, 8192, 16, 128, 128, 64, 132, "8") == 4         # 32 chunks each
    with pytest.raises(seg.SegmentsUnsupported, match="power of two"):
        seg.segments_for(1, 32768, 4, 128, 128, 64, 132, "6")


# ------------------------------------------------------------------------------------------
# the ops: where the rule chooses segments but they cannot run (a bundle without the variant
# with both states, a program the runtime cannot chain), the call runs whole, saying so once
# ------------------------------------------------------------------------------------------


class _RefusingSegments:
    """The CPU executor, except that a call asked for segments raises ``error`` (before any
    kernel runs, as the bundle executor's variant lookup and the runner's checks do)."""

    def __init__(self, error):
        self.error, self.asked = error, []
        self.inner = __import__("kdagen.runtime.backends", fromlist=["x"]).executors()["cpu"]()

    def run(self, program, options, inputs, outputs):
        self.asked.append((program, "segments" in inputs))
        if "segments" in inputs:
            raise self.error
        return self.inner.run(program, options, inputs, outputs)


@pytest.mark.parametrize("error", [
    seg.SegmentsUnsupported("segments: k1 carries a state the runtime cannot chain"),
    "bundle"])
def test_ops_run_whole_where_segments_cannot_run(monkeypatch, error):
    import warnings

    from kdagen import ops
    from kdagen.runtime import backends
    from test_api import make_inputs
    if error == "bundle":
        error = backends.BundleNotFoundError("no variant with use_initial_state")
    x, flags = make_inputs("kda", dtype=torch.float32, T=128, H=1, HV=2, h0=False)

    def grads():
        xs = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
        o, ht = kdagen_api.chunk_kda(**xs, **flags)
        return [o, ht, *torch.autograd.grad(o.sum() + ht.sum(), list(xs.values()))]

    import kdagen as kdagen_api
    whole = grads()
    monkeypatch.setattr(ops, "segments_of", lambda q, v, cu: 2)
    ops._UNSEGMENTED.clear()
    refusing = _RefusingSegments(error)
    old = backends.executors()["cpu"]
    backends.register_executor("cpu", lambda: refusing)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = grads()
            grads()
    finally:
        backends.register_executor("cpu", old)
    # the forward tried segments, then ran whole; the backward, without segment states, whole
    assert refusing.asked[:3] == [("kda_fwd", True), ("kda_fwd", False), ("kda_bwd", False)]
    for a, b in zip(got, whole):
        torch.testing.assert_close(a, b)
    said = [str(w.message) for w in caught if "running whole sequences" in str(w.message)]
    assert len(said) == 1 and str(error) in said[0]


def test_ops_backward_runs_whole_where_its_segments_cannot_run(monkeypatch):
    """A backward handed a segmented forward's start states whose segmented run fails runs
    whole: the same gradients as a backward without them."""
    from kdagen import ops
    from kdagen.runtime import backends
    from test_api import make_inputs
    from test_ops import fwd_args
    x, flags = make_inputs("kda", dtype=torch.float32, T=128, H=1, HV=2)
    flags["output_final_state"] = True
    args = fwd_args("kda", x, flags, save_residuals=True)
    o, ht, residuals = ops.kda_fwd(*args)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    bwd_args = (do, dht, *args[:10], *args[11:17])
    plain = ops.kda_bwd(*bwd_args, residuals=list(residuals))
    B, HV, K, V = ht.shape
    fake_states = torch.zeros(B * 2, HV, K, V)
    refusing = _RefusingSegments(backends.BundleNotFoundError("no such variant"))
    old = backends.executors()["cpu"]
    backends.register_executor("cpu", lambda: refusing)
    ops._UNSEGMENTED.clear()
    try:
        with pytest.warns(UserWarning, match="running whole sequences"):
            got = ops.kda_bwd(*bwd_args, residuals=list(residuals[:-1]) + [fake_states])
    finally:
        backends.register_executor("cpu", old)
    assert refusing.asked == [("kda_bwd", True), ("kda_bwd", False)]
    for a, b in zip(got, plain):
        torch.testing.assert_close(a, b)


def test_a_refused_call_launches_nothing():
    """Checks that depend on the bound tensors (a state per sequence, K = V) run before the
    first launch, so the ops can run the call whole from the start."""
    prog = ToyProgram()
    inputs = _toy_inputs(1, 16 * C, False)
    inputs["initial_state"] = torch.zeros(2, HV, K, K, dtype=torch.float64)   # 2 states, B = 1
    with pytest.raises(seg.SegmentsUnsupported, match="one per sequence"):
        seg.run_segmented(prog, 2, (), inputs)
    assert prog.calls == []


def test_the_fake_forward_promises_the_segment_states_of_training_calls(monkeypatch):
    """torch.compile traces the ops with their fake kernels: a training forward (a backward
    follows, save_residuals) the rule segments promises the segments' start states
    [B·P, HV, K, V]; a forward alone, and the gated ops, promise none."""
    from kdagen import ops
    monkeypatch.setattr(ops, "segments_of", lambda q, v, cu: 4)
    B, T, H, HV, K, V = 2, 256, 1, 2, 64, 64
    q = torch.empty(B, T, H, K)
    v = torch.empty(B, T, HV, V)
    g = torch.empty(B, T, HV, K)
    beta = torch.empty(B, T, HV)
    args = ("kda", q, q, v, g, beta, None, None, None, None, 0.125, True)
    *_, res = ops._fwd_fake(*args, save_residuals=True)
    assert tuple(res[-1].shape) == (B * 4, HV, K, V) and res[-1].dtype == torch.float32
    *_, res = ops._fwd_fake(*args, save_residuals=False)
    assert tuple(res[-1].shape) == (0,)
    *_, res = ops._fwd_fake(*args, save_residuals=True, segmented=False)
    assert tuple(res[-1].shape) == (0,)


# ------------------------------------------------------------------------------------------
# packed sequences (cu_seqlens): the offsets cut on the device, empty segments where a
# sequence has fewer chunks than segments
# ------------------------------------------------------------------------------------------


def test_split_cu_seqlens_cuts_whole_chunks():
    cu = torch.tensor([0, 3, 200, 456, 457], dtype=torch.int32)     # 3, 197, 256 and 1 tokens
    got = seg.split_cu_seqlens(cu, 4, 64)
    assert got.dtype == torch.int32
    # 1 chunk: one segment of it, three empty; 4 chunks: one each; 4 chunks of 256; 1 token
    assert got.tolist() == [0, 3, 3, 3,
                            3, 67, 131, 195,
                            200, 264, 328, 392,
                            456, 457, 457, 457, 457]
    lens = torch.diff(torch.tensor(got.tolist()))
    assert (lens >= 0).all() and got[-1] == cu[-1]


class ToyVarlenProgram(ToyProgram):
    """The toy with packed sequences: x [1, T, HV, K], cu_seqlens; a sequence's last chunk may
    be partial (its rows past the end count as zeros, as the kernels mask them)."""

    def __init__(self, reverse=False):
        super().__init__(reverse)
        self.args.append(dict(name="cu_seqlens", role="input", layout="seqlens", heads=None))

    def bind(self, device, poison, tensors):
        x, cu = tensors["x"], tensors["cu_seqlens"]
        N = int(cu.shape[0]) - 1
        values = {"x": x, "cu_seqlens": cu, self.init: tensors[self.init].to(torch.float64)}
        outputs = {"y": torch.full_like(x, float("nan")),
                   self.final: torch.full((N, HV, K, K), float("nan"), dtype=torch.float64)}
        values.update(outputs)
        return torch.device("cpu"), {"B": N, "T": int(x.shape[1])}, values, outputs

    def prepare_launches(self, device, sz, values, poison, stream, chip):
        values["S_chunks"] = torch.full((-(-sz["T"] // C) + sz["B"], HV, K, K), float("nan"),
                                        dtype=torch.float64)
        return SimpleNamespace(launches=self.launches), None

    def _sequences(self, a):
        cu = a["cu_seqlens"].tolist()
        row = 0
        for n in range(len(cu) - 1):
            s, e = cu[n], cu[n + 1]
            chunks = -(-(e - s) // C)
            xs = torch.zeros(1, chunks * C, HV, K, dtype=a["x"].dtype)
            xs[0, :e - s] = a["x"][0, s:e]
            yield n, s, e, row, xs
            row += chunks

    def _scan(self, a):
        for n, s, e, row, xs in self._sequences(a):
            A, Bc = _chunk_maps(xs)
            S = a[self.init][n].clone()
            nc = A.shape[1]
            for c in (range(nc - 1, -1, -1) if self.reverse else range(nc)):
                a["S_chunks"][row + c] = S
                S = A[0, c] @ S + Bc[0, c]
            a[self.final][n] = S

    def _out(self, a):
        for n, s, e, row, xs in self._sequences(a):
            nc = xs.shape[1] // C
            xc = xs.view(nc, C, HV, K)
            y = torch.einsum("nchk,nhkj->nchj", xc, a["S_chunks"][row:row + nc])
            a["y"][0, s:e] = y.reshape(nc * C, HV, K)[:e - s]


@pytest.mark.parametrize("reverse", [False, True])
def test_segmented_packed_sequences_equal_the_whole_run(reverse):
    gen = torch.Generator().manual_seed(7 + reverse)
    lengths = [5 * C + 3, 1, 2 * C, 9 * C]        # one sequence shorter than a chunk
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lengths)))
    x = torch.randn(1, int(cu[-1]), HV, K, generator=gen, dtype=torch.float64)
    init = "dht" if reverse else "initial_state"
    s0 = torch.randn(len(lengths), HV, K, K, generator=gen, dtype=torch.float64)
    inputs = {"x": x, "cu_seqlens": cu, init: s0}
    whole = ToyVarlenProgram(reverse).whole(**inputs)
    prog = ToyVarlenProgram(reverse)
    got = seg.run_segmented(prog, 4, (), dict(inputs))
    final = prog.final
    torch.testing.assert_close(got["y"], whole["y"], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[final], whole[final], rtol=1e-9, atol=1e-9)
    assert got[f"segment_{init}"].shape == (len(lengths) * 4, HV, K, K)


def test_segments_for_packed_sequences():
    # 2 sequences of 32k tokens in all, HV = 2: by the average sequence (256 chunks)
    assert seg.segments_for(2, 32768, 2, 128, 128, 64, 132, "auto", varlen=True) == 8
    assert seg.segments_for(2, 32768 + 17, 2, 128, 128, 64, 132, "auto", varlen=True) == 8
    assert seg.segments_for(2, 32768 + 17, 2, 128, 128, 64, 132, "auto") == 1


@pytest.mark.parametrize("fit", [16, 15])
def test_chaining_runs_beside_the_chunk_kernel_they_wait_for(fit):
    """beside=True: the two chaining runs (2 x 8 CTAs here) go beside the chunk kernel that
    publishes their flags where they fit (flags live), else everything in order (no flags);
    the outputs are the whole run's either way."""
    B, P, T = 1, 4, 16 * C
    inputs = _toy_inputs(B, T, False, seed=5)
    whole = ToyProgram().with_publisher(0).whole(**inputs)
    prog = ToyProgram().with_publisher(fit)
    got = seg.run_segmented(prog, P, (), dict(inputs), beside=True)
    torch.testing.assert_close(got["y"], whole["y"], rtol=1e-9, atol=1e-9)
    assert prog.calls == ["chunk", "scan", "scan", "scan", "out"]
    assert prog.asked_fit == [16]
    if fit >= 16:
        assert prog.together == [["chunk", "scan", "scan"]]
        assert prog.flagged == [[True, True, True]]
    else:
        assert prog.together == [["scan", "scan"]] and prog.flagged == [[False, False]]


def test_a_known_start_scan_runs_beside_its_chunk_kernel():
    B, P, T = 1, 4, 16 * C
    inputs = _toy_inputs(B, T, False, seed=6)
    fwd = seg.run_segmented(ToyProgram(), P, (), dict(inputs))
    prog = ToyProgram(scan_final=False).with_publisher(8)
    known = dict(inputs, initial_state=fwd["segment_initial_state"])
    got = seg.run_segmented(prog, P, ("initial_state",), known, beside=True)
    whole = ToyProgram(scan_final=False).whole(**inputs)
    torch.testing.assert_close(got["y"], whole["y"], rtol=1e-9, atol=1e-9)
    assert prog.together == [["chunk", "scan"]] and prog.calls == ["chunk", "scan", "out"]


def test_segments_for_beside():
    # 2·1·4·2 = 16 CTAs per segment pair: 4 segments fill 64 of the 66 SMs that may wait
    assert seg.segments_for(1, 32768, 4, 128, 128, 64, 132, "beside") == 4
    assert seg.segments_for(1, 32768, 2, 128, 128, 64, 132, "beside") == 8
    assert seg.segments_for(1, 32768, 16, 128, 128, 64, 132, "beside") == 1
    assert seg.beside_wanted("beside") and not seg.beside_wanted("auto")
