"""Chunk-ready flags (kdagen.codegen.lower.chunk_flags): which kernels pair, what each side
emits, and how the runtime fills the flags. The overlap itself (a second stream) and its
numerics run on the GPU (tools.gpu_check, bench/calls/ab_flags_stop51.sh)."""
from __future__ import annotations

import json

import pytest

from kdagen.codegen.lower.chunk_flags import FLAGS_PARAM, pair_kernels


@pytest.fixture(scope="module")
def lowered():
    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    out = {}
    for program in ("kda_fwd", "kda_bwd"):
        mod = driver.build_module(program, {}, pipeline="chip", chip="sm_90a")
        for flags in ("forward", "all", "off"):
            opts = LowerOptions(path="native", dot="auto", chunk_flags=flags)
            out[program, flags] = [
                (k, driver.ptx_of(k.module, TARGETS["sm_90a"], k.name))
                for k in lower_program(mod, TARGETS["sm_90a"], options=opts, cost=True)]
    return out


def _roles(kernels):
    return [k.launch.get("chunk_flags") for k, _ in kernels]


@pytest.mark.parametrize("program, flags, roles", [
    ("kda_fwd", "forward", ["publish", "wait", None]),
    ("kda_fwd", "all", ["publish", "wait", None]),
    # prologue -> recompute scan; with "all" also dq kernel -> reverse scan. The dk kernel
    # reads the reverse scan's dS and so waits for the whole scan (a chunk kernel never waits
    # on a flag)
    ("kda_bwd", "forward", ["publish", "wait", None, None, None, None, None, None]),
    ("kda_bwd", "all", ["publish", "wait", "publish", "wait", None, None, None, None]),
])
def test_each_register_scan_pairs_with_the_chunk_kernel_that_feeds_it(lowered, program, flags,
                                                                      roles):
    kernels = lowered[program, flags]
    assert _roles(kernels) == roles
    for (k, ptx), role in zip(kernels, roles):
        has_param = FLAGS_PARAM in [p.name for p in k.params]
        assert has_param == (role is not None)
        # the producer releases after a GPU-scope fence; the consumer acquires, then orders
        # the TMA loads after it with a proxy fence
        assert ("st.release.gpu.global.u32" in ptx) == (role == "publish")
        assert ("fence.acq_rel.gpu" in ptx) == (role == "publish")
        assert ("ld.acquire.gpu.global.u32" in ptx) == (role == "wait")
        assert ("fence.proxy.async.global" in ptx) == (role == "wait")
        if role == "wait":
            assert k.path == "sm90-register-scan"
            assert k.launch["overlaps"] == kernels[kernels.index((k, ptx)) - 1][0].name
            assert k.cost["producer"].get("flag.wait", 0) == 1
        if role == "publish":
            assert k.launch["parallel_chunks"]
            assert k.cost["counts"].get("flag.publish", 0) == 1
        if role is not None:
            # the k-th pair of the call publishes and waits for k (one zeroed array per call)
            ordinal = roles[:kernels.index((k, ptx)) + 1].count(role)
            assert (f"st.release.gpu.global.u32 [%rd" in ptx) == (role == "publish")
            assert (f"], {ordinal};" in ptx if role == "publish"
                    else f"setp.lt.u32 p, f, {ordinal};" in ptx)


@pytest.mark.parametrize("program", ["kda_fwd", "kda_bwd"])
def test_without_flags_no_kernel_publishes_or_waits(lowered, program):
    for k, ptx in lowered[program, "off"]:
        assert "chunk_flags" not in k.launch and FLAGS_PARAM not in [p.name for p in k.params]
        assert "ld.acquire.gpu" not in ptx and "st.release.gpu" not in ptx
    # kernels outside a pair are the kernels without flags, byte for byte
    for (k, ptx), (k_off, ptx_off) in zip(lowered[program, "forward"], lowered[program, "off"]):
        if "chunk_flags" not in k.launch:
            assert ptx == ptx_off.replace(k_off.name, k.name)


def test_chunk_flags_option_is_checked():
    from kdagen.codegen.lower.kernel import chunk_flag_directions
    from kdagen.codegen.lower.plan import LoweringError
    assert chunk_flag_directions("forward") == {False} and chunk_flag_directions(True) == {
        False, True} and not chunk_flag_directions("off")
    with pytest.raises(LoweringError, match="chunk_flags: 'both'.*'forward', 'all' or 'off'"):
        chunk_flag_directions("both")


class _Obj:
    """An IR stand-in (hashed by identity, as the lowering's nodes and values are)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def _kernel(reads=(), ring=(), writes=(), reverse=False, parallel=True):
    """A prepared-kernel stand-in: a scan whose body loads ``ring`` through the producer role,
    reads ``reads`` any other way and stores ``writes``."""
    def mem(name):
        return _MEMS.setdefault(name, _Obj(kind="memref", name=name))
    body = [_Obj(op="kda.load_chunk", operands=[mem(m)], attrs={"kda.role": "producer"},
                            body=None) for m in ring]
    body += [_Obj(op="kda.load_chunk", operands=[mem(m)], attrs={"kda.role": "consumer"},
                             body=None) for m in reads]
    body += [_Obj(op="kda.store_chunk", operands=[mem(m)], attrs={}, body=None)
             for m in writes]
    scan = _Obj(op="kda.scan", operands=[], attrs={"reverse": reverse},
                           body=_Obj(nodes=body))
    return _Obj(group=_Obj(nodes=[scan], scans=[scan], parallel=parallel),
                           kind="chunk" if parallel else "scan")


_MEMS: dict = {}


def _pairs(*kernels):
    return pair_kernels(list(kernels), lambda k: k.kind == "chunk", lambda k: k.kind == "scan")


def test_a_scan_reading_the_chunk_kernel_only_through_its_ring_pairs():
    assert _pairs(_kernel(writes=["w"]), _kernel(ring=["w", "x"], writes=["S"],
                                                 parallel=False)) == [(0, 1)]


@pytest.mark.parametrize("consumer", [
    _kernel(ring=["w"], reads=["w"], parallel=False),       # a read the flag does not order
    _kernel(ring=["w"], writes=["u"], parallel=False),      # writes what the chunk kernel reads
    _kernel(ring=["w"], reverse=True, parallel=False),      # walks the chunks the other way
    _kernel(ring=["x"], parallel=False),                    # nothing of the chunk kernel's
    _kernel(ring=["w"]),                                    # not a serial scan
])
def test_pairs_only_where_the_flags_order_every_dependence(consumer):
    assert _pairs(_kernel(reads=["u"], writes=["w"]), consumer) == []


class _RecordingKernel:
    def __init__(self, entry, log):
        self.entry, self.log = entry, log

    def launch(self, grid, args, stream=None):
        self.log.append((self.entry.name, tuple(grid), list(args)))


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.name))


def test_launcher_gives_both_kernels_one_zeroed_flag_array(tmp_path, monkeypatch):
    """The flags: i32, one per (chunk row, value head), zero at every call's start (a NaN
    poison must not reach them), the same array for the publishing and the waiting kernel when
    the two overlap (the scan on the side stream after a fork event, the main stream joining
    it); a null pointer for both when they run in order (the kernels then skip the flags)."""
    import torch

    from kdagen.runtime import launch as L
    from kdagen.runtime.bundle import KernelEntry
    args = [dict(name="q", role="input", layout="token", heads="v", dtype="bf16", tail=[128])]
    (tmp_path / L.LOWERED).write_text(json.dumps({"variants": {"v": dict(
        program="p", args=args, workspaces=[], kernels=["prod", "cons"], chips={},
        chunk_size=64, gva_ratio=1)}}))
    log = []
    kernels = {
        name: _RecordingKernel(KernelEntry(
            name, "sm_90a", "sm90-native", f"{name}.ptx",
            params=[{"name": "q", "kind": "ptr"}, {"name": FLAGS_PARAM, "kind": "ptr"}],
            launch={"grid": grid, "block": [128, 1, 1], "scratch_bytes_per_cta": 0,
                    "chunk_flags": role}), log)
        for name, grid, role in (("prod", ["HV", "N", "ceil_div(T, 64)"], "publish"),
                                 ("cons", ["HV * 2", "N", 1], "wait"))}

    class Library:
        def get(self, name, device):
            return kernels[name]

    prog = L.LoweredProgram(tmp_path, "v", library=Library())
    # in order (no GPU): both kernels get a null flag pointer
    prog(chip="sm_90a", q=torch.randn(2, 130, 3, 128).bfloat16())
    assert [(name, a[1]) for name, _, a in log] == [("prod", 0), ("cons", 0)]

    # overlapped: a stand-in for the streams and events (no GPU here)
    class Event:
        count = 0

        def __init__(self):
            Event.count += 1
            self.name = f"e{Event.count}"

        def record(self, stream):
            log.append(("record", stream.name, self.name))
    events = []
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(L, "_overlap_ok", lambda grid, device: True)
    monkeypatch.setattr(L, "_side_stream", lambda device, which=0: _Stream("side", events))
    for T in (130, 64):
        log.clear()
        prog(chip="sm_90a", stream=_Stream("main", log), q=torch.randn(2, T, 3, 128).bfloat16())
        launches = [x for x in log if x[0] in ("prod", "cons")]
        flags = [a[1] for _, _, a in launches]
        assert [x[0] for x in launches] == ["prod", "cons"] and flags[0] is flags[1]
        assert flags[0].dtype == torch.int32 and tuple(flags[0].shape) == (2 * -(-T // 64), 3)
        assert int(flags[0].abs().sum()) == 0
        # fork before the publisher, the scan's join recorded on the side stream, main waits
        fork, join = [x for x in log if x[0] == "record"]
        assert fork[1] == "main" and join[1] == "side"
        assert log.index(fork) < log.index(launches[0]) and log[-1] == ("wait", "main", join[2])
    assert events[-1] == ("wait", "side", fork[2])


def test_overlap_needs_the_scan_to_leave_most_sms_free(monkeypatch):
    import torch

    from kdagen.runtime import chips
    from kdagen.runtime import launch as L
    monkeypatch.setattr(chips, "sm_count", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert L._overlap_ok((32, 1, 1), cuda) and L._overlap_ok((66, 1, 1), cuda)
    assert not L._overlap_ok((64, 2, 1), cuda)         # 128 waiting CTAs: most SMs held
    assert not L._overlap_ok((32, 1, 1), torch.device("cpu"))
    monkeypatch.setattr(L, "OVERLAP", False)
    assert not L._overlap_ok((32, 1, 1), cuda)


@pytest.mark.skipif(__import__("shutil").which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("program", ["kda_bwd", "gdn_bwd"])
def test_flag_waiting_scans_keep_their_wgmma_asynchronous(program):
    """A register scan whose producer waits on flags must leave ptxas no wgmma wait to insert:
    ptxas places such a wait on the producer's divergent path and then serialises every wgmma
    of the kernel (C7518; the reverse scans ran 4.06 -> 5.60 us per step in order, H200). The
    scans wait where ptxas would (LowerOptions.scan_group_wait); without that the serialisation
    comes back, which is what this test would see."""
    from kdagen import driver
    from kdagen.codegen import ptxas
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    t = TARGETS["sm_90a"]
    mod = driver.build_module(program, {}, pipeline="chip", chip="sm_90a")

    def scan_logs(**opts):
        kernels = lower_program(mod, t, options=LowerOptions(path="native", dot="auto",
                                                             chunk_flags="all", **opts))
        logs = {}
        for k in kernels:
            if k.launch.get("chunk_flags") == "wait":
                r = ptxas.assemble(driver.ptx_of(k.module, t, k.name), "sm_90a",
                                   ptxas.find_ptxas())
                assert r.ok, r.log
                logs[k.name] = r.log
        assert len(logs) == 2                   # the recompute scan and the reverse scan
        return logs

    for name, log in scan_logs().items():
        assert "C7517" not in log and "C7518" not in log, (name, log)
    assert any("C7518" in log for log in scan_logs(scan_group_wait=False).values())


@pytest.mark.parametrize("fence", ["each", "one"])
def test_flag_fence_placement(fence):
    """LowerOptions.flag_fence: "each" has every thread fence before the barrier that precedes
    the publish; "one" has the barrier first and the publishing thread alone fence, right
    before its st.release (the PTX of gdn_fwd's prologue, a register-tile chunk kernel)."""
    import re

    from kdagen import driver
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    mod = driver.build_module("gdn_fwd", {}, pipeline="chip", chip="sm_90a")
    opts = LowerOptions(path="native", dot="auto", flag_fence=fence)
    k = lower_program(mod, TARGETS["sm_90a"], options=opts, cost=False)[0]
    assert k.launch.get("chunk_flags") == "publish"
    ptx = driver.ptx_of(k.module, TARGETS["sm_90a"], k.name)
    lines = [ln.strip() for ln in ptx.splitlines()
             if re.match(r"\s*(@%p\d+ bra|bar\.sync|fence\.acq_rel\.gpu|st\.release\.gpu)", ln)]
    publish = max(i for i, ln in enumerate(lines) if ln.startswith("st.release.gpu"))
    fence_at = max(i for i, ln in enumerate(lines[:publish]) if ln.startswith("fence.acq_rel"))
    barrier_at = max(i for i, ln in enumerate(lines[:publish]) if ln.startswith("bar.sync"))
    assert ptx.count("fence.acq_rel.gpu") == 1
    if fence == "each":
        assert fence_at < barrier_at, lines[fence_at:publish + 1]
    else:
        # bar.sync, the branch that leaves the other threads out, then fence and publish
        assert barrier_at < fence_at == publish - 1, lines[barrier_at:publish + 1]
        assert any(ln.endswith("bra") or " bra " in ln for ln in lines[barrier_at:fence_at])


def test_flag_fence_option_is_checked():
    from kdagen.codegen.lower.chunk_flags import publish_chunk_ready
    with pytest.raises(ValueError, match="flag_fence='all'.*'each' or 'one'"):
        publish_chunk_ready(None, None, 0, 1, None, None, "all")
