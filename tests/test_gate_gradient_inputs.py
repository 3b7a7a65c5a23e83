"""kda-assign-precision{gate_gradient_inputs=true} (off: it helps some cases, not all): the
plain products whose results the gate-parameter gradient's kernel loads (the backward
prologue's u = (I + Akk)^-1 (v ⊙ β), the dq kernel's w·S) take that kernel's precision, per
kernel, and the sm_90a lowering takes it; measured without the state-path rule
(state_path_products=tf32), which gives those kernels bf16x3 by default. In the CPU simulator
KDA K = 64 "B1_T65" dA_log meets the 1e-3 goal with the default state path, not without it."""
import pytest

pytest.importorskip("kdagen._mlir")

from kdagen._mlir import ir  # noqa: E402
from kdagen.driver import build_module  # noqa: E402
from kdagen.ir.transforms import walk  # noqa: E402
from kdagen.passes import pipelines  # noqa: E402

OPTS = dict(head_k_dim=64, head_v_dim=64)


def _pipeline(on: bool) -> str:
    return ",".join(_passes(on))


def _passes(on: bool) -> list:
    return list(
        n if not n.startswith("kda-assign-precision")
        else (f"kda-assign-precision{{gate_gradient_inputs={str(on).lower()},"
              "state_path_products=tf32}")
        for n in pipelines.PIPELINES["sm_90a"])


def _dot_precisions(module) -> dict:
    """{kernel name: sorted set of its kda.dot precisions}"""
    out = {}
    for op in walk(module):
        if op.name == "kda.scan" and "kda.kernel" in op.attributes:
            name = ir.StringAttr(op.attributes["kda.kernel"]).value
            out[name] = sorted({ir.StringAttr(d.attributes["kda.precision"]).value
                                for d in walk(op) if d.name == "kda.dot"})
    return out


def test_the_kernels_feeding_the_gate_gradient_kernel_take_its_precision():
    off = _dot_precisions(build_module("kda_bwd", OPTS, _pipeline(False), "sm_90a"))
    on = _dot_precisions(build_module("kda_bwd", OPTS, _pipeline(True), "sm_90a"))
    assert off["kda_bwd0_chunk"] == ["tf32"] and off["kda_bwd1_chunk"] == ["tf32"]
    assert on["kda_bwd0_chunk"] == ["bf16x3"] and on["kda_bwd1_chunk"] == ["bf16x3"]
    assert on["kda_bwd1_out"] == off["kda_bwd1_out"] == ["bf16x3"]   # the summing kernel
    assert on["kda_bwd0_state"] == off["kda_bwd0_state"]               # the scans unchanged


@pytest.mark.parametrize("program", ["kda_bwd", "gdn_bwd"])
def test_the_native_lowering_takes_one_precision_per_kernel(program):
    from kdagen.codegen.lower.kernel import lower_program
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.target import TARGETS
    module = build_module(program, OPTS, _pipeline(True), "sm_90a")
    kernels = lower_program(module, TARGETS["sm_90a"], options=LowerOptions(path="native",
                                                                             dot="auto"),
                            cost=False)
    chunk = [k for k in kernels if k.name.endswith(("k0_scan0", "k2_scan2"))]
    assert chunk and all(k.launch.get("wgmma_precision") == "bf16x3" for k in chunk)


def test_kda_k64_b1_t65_dA_log_meets_the_goal_with_the_state_path(monkeypatch):
    """KDA K = 64 "B1_T65" in the CPU simulator of the sm_90a kernels: the default pipeline
    (kda-assign-precision's bf16x3 state path, ordered sums) puts dA_log under the 1e-3 goal
    (1.9e-4); with the state path at TF32 it misses (gate_gradient_inputs alone does not
    bring it back: 4.8e-3 with ordered sums)."""
    from tools.scan_precision_probe import SimulatedProgram
    options = dict(OPTS, gate="softplus")

    def dA_log() -> float:
        rows = SimulatedProgram("kda_bwd", options, "auto", "sm_90a").run("B1_T65")
        return next(r["err"] for r in rows if r["tensor"] == "dA_log")
    default = dA_log()
    monkeypatch.setitem(pipelines.PIPELINES, "sm_90a", _passes(False))
    tf32_state_path = dA_log()
    assert default < 1e-3 < tf32_state_path, (default, tf32_state_path)
