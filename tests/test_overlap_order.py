"""LowerOptions.overlap_order: which kernel of an overlapped pair (chunk_flags) the runtime
launches first. The option reaches the scan's launch entry; the runtime launches the scan
first where it says "scan" (and the chunk kernel first otherwise), and in both orders the
main stream waits for the scan only after both are launched (a chunk kernel that waited for
its own scan would deadlock); a bad value is refused."""
from __future__ import annotations

import pytest

from kdagen.codegen.lower.plan import LoweringError
from kdagen.runtime import launch as launch_mod


def _gdn_fwd_launches(**lower):
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    comp = Compilation("gdn_fwd", dict(head_k_dim=128, head_v_dim=128), "sm_90a",
                       lower=dict(DEFAULT_LOWERING, **lower))
    comp.run(until="gpu")
    return {k.name.split("__")[-1]: k.launch for k in comp.kernels}


def test_the_order_reaches_the_scans_launch_entry():
    default = _gdn_fwd_launches()
    scan_first = _gdn_fwd_launches(overlap_order="scan")
    assert default["k1_scan1"]["chunk_flags"] == "wait"
    assert "overlap_order" not in default["k1_scan1"]
    assert scan_first["k1_scan1"]["overlap_order"] == "scan"
    assert "overlap_order" not in scan_first["k0_scan0"]         # the publisher's is untouched


def test_a_bad_order_is_refused():
    with pytest.raises(LoweringError, match="overlap_order.*'chunk' or 'scan'"):
        _gdn_fwd_launches(overlap_order="first")


class _Recorder:
    """What launch_beside does, in order, without a GPU."""

    def __init__(self):
        self.log = []

    def event(self):
        rec = self

        class Event:
            def record(self, stream):
                rec.log.append(("record", stream))

        return Event()


@pytest.mark.parametrize("scan_first", [False, True])
def test_launch_beside_orders_the_launches_and_joins_after_both(monkeypatch, scan_first):
    rec = _Recorder()

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, event):
            rec.log.append(("wait", self.name))

        def __repr__(self):
            return self.name

    side = Stream("side")
    monkeypatch.setattr(launch_mod.torch.cuda, "Event", rec.event)
    monkeypatch.setattr(launch_mod, "_side_stream", lambda device, k=0: side)

    class Prog:
        launch_beside = launch_mod.LoweredProgram.launch_beside

        def _launch(self, la, args, stream, profile, timed):
            rec.log.append(("launch", la, stream.name))

    main = Stream("main")
    Prog().launch_beside("chunk", [], [("scan", [])], None, main, None, scan_first=scan_first)
    launches = [e[1] for e in rec.log if e[0] == "launch"]
    assert launches == (["scan", "chunk"] if scan_first else ["chunk", "scan"])
    # the main stream waits for the side stream only after its own launch
    main_wait = rec.log.index(("wait", "main"))
    assert main_wait > rec.log.index(("launch", "chunk", "main"))
    assert rec.log.index(("wait", "side")) < rec.log.index(("launch", "scan", "side"))
