"""kda-autodiff as a pass: golden IR of the derived backward, and its gradients vs autograd."""
import pytest
import torch
from click.testing import CliRunner

from filecheck_util import filecheck
from kdagen import interpreter
from kdagen.cli import main
from kdagen.ir.dialect import print_module
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.registry import parse_pipeline
from kdagen.passes.pipeline import PassFailure, run_pipeline
from kdagen.reference import rel_err

GOLDEN = r"""
// CHECK-LABEL: func.func @gdn_bwd
// recompute scan: chunk-start states stored for the reverse scan
// CHECK: "kda.store_chunk"(%S_chunks, {{.*}}) {name = "S"}
// reverse scan carrying dS
// CHECK: reverse = true
// explicit reductions for the per-head parameters
// CHECK: "kda.sum_seqs"
// CHECK-LABEL: func.func @gdn_fwd_primal
"""


def test_autodiff_pass_golden_and_gradients(tmp_path):
    case = make_case("gdn", gate="gdn_lower_bound", lower_bound=-3.0, B=1, T=70, H=1, HV=1, seed=4)
    module = build_program("gdn_fwd", **case.options)
    run_pipeline(module, parse_pipeline("kda-autodiff{program=gdn_bwd}"))
    filecheck(print_module(module), GOLDEN)
    gen = torch.Generator().manual_seed(0)
    do = torch.randn(case.inputs["v"].shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(case.inputs["initial_state"].shape, generator=gen, dtype=torch.float64)
    out = interpreter.run(module, dict(case.inputs, do=do, dht=dht))
    for name, ref in case.reference_grads(do, dht).items():
        assert rel_err(out[name], ref) <= 1e-9, name
    with pytest.raises(PassFailure, match="already a backward program"):
        run_pipeline(module, parse_pipeline("kda-autodiff"))


def test_opt_derives_a_backward_from_a_forward_file(tmp_path):
    path = tmp_path / "fwd.mlir"
    path.write_text(print_module(build_program("kda_fwd", head_k_dim=64, head_v_dim=64)))
    result = CliRunner().invoke(main, ["opt", str(path), "-p", "kda-stable-reassociate,kda-autodiff"])
    assert result.exit_code == 0, result.output
    assert "func.func @kda_bwd" in result.output and '"kda.decay_matmul"' in result.output
