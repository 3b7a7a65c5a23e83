"""LowerOptions.ordered_sums reaches the tile lowering: kda_fwd's sm_90a prologue kernel (256
consumer threads) sums its [64, 128] gate cumsum in four 16-row segments instead of the two
its threads fill, so its code changes, while the state scan (no cumsum, no reduction) does
not. The orders themselves are tested in
the simulator (tests/test_tile_emitters_sim.py: bitwise equal at 128-512 threads)."""
import pytest

pytest.importorskip("kdagen._mlir")

from kdagen.driver import DEFAULT_LOWERING, Compilation  # noqa: E402

OPTS = dict(head_k_dim=128, head_v_dim=128)


def _gpu_text(ordered: bool) -> dict:
    lower = dict(DEFAULT_LOWERING, ordered_sums=ordered)
    comp = Compilation("kda_fwd", OPTS, "sm_90a", lower=lower).run("gpu")
    text = comp.output("gpu")
    return {part.split("\n", 1)[0]: part for part in text.split("// ----- kernel ")[1:]}


def test_ordered_sums_change_the_prologue_kernel_only_where_it_cumsums():
    default, ordered = _gpu_text(False), _gpu_text(True)
    assert default.keys() == ordered.keys()
    prologue = [k for k in default if "k0" in k]
    assert prologue and all(default[k] != ordered[k] for k in prologue)
    scans = [k for k in default if "k1" in k]
    assert scans and all(default[k] == ordered[k] for k in scans)
