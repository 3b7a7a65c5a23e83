"""kda-partition: golden IR, semantics, and HBM bytes per token against FLA's kernel sequence."""
import pytest
import torch

from filecheck_util import filecheck
from kdagen import interpreter
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.base import parse_pipeline
from kdagen.passes.partition import kernel_report
from kdagen.passes.pipeline import run_pipeline
from kdagen.reference import rel_err

PIPELINE = "kda-stable-reassociate,kda-partition"

# FLA (fla-core 0.6) KDA forward, K = V = 128, C = 64, bf16 inputs, counted per token and value
# head from its four kernels' reads + writes (gate+cumsum 768; intra: q, k, v, g, beta in,
# w, u, kg, Aqk, Akk out 2372; fwd_h: w, u, kg, g_last in, h per chunk + v_new out 1544;
# fwd_o: q, v_new, g, h, Aqk in, o out 2048).
FLA_KDA_FWD_BYTES_PER_TOKEN = 6732


GOLDEN = r"""
// CHECK: "kda.workspace"() {layout = "chunk", name = "qd_ws"}
// CHECK: "kda.workspace"() {layout = "chunk", name = "w_ws"}
// CHECK: "kda.workspace"() {layout = "chunk", name = "u_ws"}
// The chunk-parallel kernel: no carried values, stores what the state scan needs.
// CHECK: "kda.scan"() ({
// CHECK: "kda.decay_dot"
// CHECK: "kda.tril_inv"
// CHECK: "kda.store_chunk"({{.*}}) {name = "w"}
// CHECK: "kda.store_chunk"({{.*}}) {name = "u"}
// CHECK: kda.kernel = "kda_fwd_chunk", parallel = true
// The state scan: loads the workspaces, keeps only state-dependent math.
// CHECK: "kda.scan"(%{{.*}}) ({
// CHECK: "kda.load_chunk"({{.*}}) {name = "w"}
// CHECK-NOT: "kda.tril_inv"
// CHECK-NOT: "kda.decay_dot"
// CHECK-NOT: "kda.load"(
// CHECK: "kda.store"({{.*}}) {name = "o"}
// CHECK: kda.kernel = "kda_fwd_state", parallel = false
"""


def test_golden_partition_kda_fwd():
    module = build_program("kda_fwd", gate="lower_bound", lower_bound=-5.0)
    run_pipeline(module, parse_pipeline(PIPELINE))
    filecheck(str(module), GOLDEN)


@pytest.mark.parametrize("family,spec", [
    ("kda", dict(gate="lower_bound", lower_bound=-5.0, lengths=[1, 70, 130], H=1, HV=2)),
    ("kda", dict(gate="softplus", B=2, T=65, H=1, HV=1, use_initial_state=False)),
    ("gdn", dict(gate="gdn_softplus", lengths=[64, 3, 100], H=1, HV=2)),
])
def test_partition_preserves_semantics(family, spec):
    case = make_case(family, seed=5, **spec)
    module = build_program(f"{family}_fwd", **case.options)
    before = interpreter.run(module, case.inputs)
    run_pipeline(module, parse_pipeline(PIPELINE))
    after = interpreter.run(module, case.inputs)
    assert set(after) == set(before)
    for key in before:
        assert rel_err(after[key], before[key]) <= 1e-10, key
    kernels = [name for name, _, _ in kernel_report(module)]
    assert kernels == [f"{family}_fwd_chunk", f"{family}_fwd_state"]


def test_fused_forward_moves_fewer_bytes_than_fla():
    module = build_program("kda_fwd")            # K = V = 128, C = 64, bf16
    run_pipeline(module, parse_pipeline(PIPELINE))
    report = dict((name, nbytes) for name, _, nbytes in kernel_report(module))
    # chunk kernel: q, k, v, g_raw (bf16 [C, 128]), beta_raw in; qd, kr, w, u (fp32 [C, 128]),
    # Aqk (fp32 [C, C]) and the chunk decay (fp32 [128]) out
    assert report["kda_fwd_chunk"] == pytest.approx((4 * 128 * 2 + 2) + 4 * 128 * 4 + 64 * 4 + 128 * 4 / 64)
    total = sum(report.values())
    assert total < FLA_KDA_FWD_BYTES_PER_TOKEN, (total, FLA_KDA_FWD_BYTES_PER_TOKEN)
    bf16 = build_program("kda_fwd")
    run_pipeline(bf16, parse_pipeline(PIPELINE + "{workspace_dtype=bf16}"))
    assert sum(n for _, _, n in kernel_report(bf16)) < total


def test_fusion_rematerialises_broadcasts_instead_of_storing_them():
    def workspaces(fuse):
        module = build_program("kda_fwd")          # K = V = 128, C = 64
        run_pipeline(module, parse_pipeline(f"kda-stable-reassociate,kda-partition{{fuse={fuse}}}"))
        lines = [l for l in str(module).splitlines() if '"kda.workspace"' in l]
        return lines, sum(n for _, _, n in kernel_report(module))

    fused, fused_bytes = workspaces("true")
    unfused, unfused_bytes = workspaces("false")
    # fused: the chunk decay crosses as [K] and is broadcast to [K, V] inside the state kernel
    assert not any("memref<?x?x128x128xf32>" in l for l in fused)
    assert any("memref<?x?x128xf32>" in l for l in fused)
    # unfused: the [K, V] broadcast itself crosses kernels
    assert any("memref<?x?x128x128xf32>" in l for l in unfused)
    assert unfused_bytes > fused_bytes
