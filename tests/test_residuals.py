"""save_residuals: the forward writes the chunk products its backward would recompute, the
derived backward loads them instead (kdagen/ir/autodiff.py), and autograd passes them along.

- interpreter: the backward fed the forward's residuals gives the plain backward's gradients;
- the chip pipeline: the residual backward's kernels hold no inverse and fewer decay products,
  the residual forward stores them;
- options: clear errors where residuals make no sense;
- the API on CPU: training with residuals equals training without (KDAGEN_SAVE_RESIDUALS=0),
  and from a bundle without the residual variants training runs the plain pair;
- kdagen emit --residuals lists the pair.
"""
from unittest import mock

import pytest
import torch

from kdagen import interpreter
from kdagen.driver import Compilation
from kdagen.ir.programs import RESIDUALS, ProgramOptionError, build_program
from kdagen.ir.testing import make_case
from kdagen.reference import rel_err

CASES = {
    "kda_softplus_gva2_batch": dict(family="kda", gate="softplus", B=2, T=80, H=1, HV=2),
    "kda_lowerbound_strong_varlen": dict(family="kda", gate="lower_bound", lower_bound=-5.0,
                                         lengths=[1, 17, 64, 70], H=1, HV=2, decay="strong"),
    "gdn_softplus_varlen_c32": dict(family="gdn", gate="gdn_softplus", lengths=[1, 45, 33],
                                    H=1, HV=2, chunk_size=32, allow_neg_eigval=True),
}


def _grads(family, case, module_of):
    """(plain backward, backward fed the residual forward's residuals) on ``case``."""
    fwd = interpreter.run(module_of(f"{family}_fwd", save_residuals=True), case.inputs,
                          dtype=torch.float64)
    assert set(RESIDUALS) <= set(fwd)
    gen = torch.Generator().manual_seed(1)
    extra = {"do": torch.randn(fwd["o"].shape, generator=gen, dtype=torch.float64)}
    if case.options["output_final_state"]:
        extra["dht"] = torch.randn(fwd["final_state"].shape, generator=gen, dtype=torch.float64)
    plain = interpreter.run(module_of(f"{family}_bwd"), dict(case.inputs, **extra),
                            dtype=torch.float64)
    fed = interpreter.run(module_of(f"{family}_bwd", save_residuals=True),
                          dict(case.inputs, **extra, **{r: fwd[r] for r in RESIDUALS}),
                          dtype=torch.float64)
    return plain, fed


@pytest.mark.parametrize("name", list(CASES))
def test_backward_fed_residuals_equals_the_plain_backward(name):
    spec = dict(CASES[name])
    family = spec.pop("family")
    case = make_case(family, seed=5, **spec)
    plain, fed = _grads(family, case,
                        lambda program, **extra: build_program(program, **case.options, **extra))
    assert set(fed) == set(plain)
    for k in plain:
        assert rel_err(fed[k], plain[k]) <= 1e-12, k


def test_after_the_chip_pipeline_too():
    """The same through sm_90a's pipeline (partition, shared chunk values, ...)."""
    case = make_case("kda", seed=2, gate="softplus", B=1, T=70, H=1, HV=1)

    def module_of(program, **extra):
        return Compilation(program, dict(case.options, **extra), chip="sm_90a").run_passes().module
    plain, fed = _grads("kda", case, module_of)
    for k in plain:
        assert rel_err(fed[k], plain[k]) <= 1e-12, k


def _kernel_ops(program, **options):
    module = Compilation(program, dict(head_k_dim=64, head_v_dim=64, **options),
                         chip="sm_90a").run_passes().module
    text = str(module).split("kda.primal")[0]       # the program, not its kept primal
    return text


def test_the_residual_backward_recomputes_no_inverse():
    plain, fed = _kernel_ops("kda_bwd"), _kernel_ops("kda_bwd", save_residuals=True)
    assert plain.count('"kda.tril_inv"') >= 1 and fed.count('"kda.tril_inv"') == 0
    assert fed.count('"kda.decay_dot"') < plain.count('"kda.decay_dot"')
    for res in RESIDUALS:
        assert f'name = "{res}"' in fed            # loaded where the backward needs it
    fwd = _kernel_ops("kda_fwd", save_residuals=True)
    for res in RESIDUALS:
        assert f'"kda.store_chunk"' in fwd and f'name = "{res}"' in fwd


def test_option_errors_name_the_option():
    with pytest.raises(ProgramOptionError, match="^save_residuals: not with output_chunk_states"):
        build_program("kda_fwd", save_residuals=True, output_chunk_states=True)
    with pytest.raises(ProgramOptionError, match="^save_residuals: not an option of kda_decode"):
        build_program("kda_decode", save_residuals=True)
    with pytest.raises(ProgramOptionError, match="^save_residuals: expected true or false"):
        build_program("kda_fwd", save_residuals="yes")


def test_api_training_with_and_without_residuals(monkeypatch):
    import kdagen
    from kdagen import ops
    fed = []
    real = ops._add_residuals

    def spy(opts, inputs, residuals):        # which backward ran: with residuals or without
        real(opts, inputs, residuals)
        fed.append(bool(opts.get("save_residuals")))
    monkeypatch.setattr(ops, "_add_residuals", spy)
    gen = torch.Generator().manual_seed(0)
    B, T, H, K = 1, 70, 2, 64
    base = [torch.randn(B, T, H, K, generator=gen) for _ in range(4)]
    base += [torch.randn(B, T, H, generator=gen), torch.randn(H, generator=gen),
             torch.randn(H * K, generator=gen)]
    results = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("KDAGEN_SAVE_RESIDUALS", flag)
        xs = [x.clone().requires_grad_() for x in base]
        q, k, v, g, beta, A_log, dt_bias = xs
        o, ht = kdagen.chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias,
                                 use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True,
                                 use_beta_sigmoid_in_kernel=True, output_final_state=True)
        (o.square().sum() + ht.sum()).backward()
        results[flag] = [o.detach()] + [x.grad for x in xs]
    assert fed == [True, False]
    for a, b in zip(results["1"], results["0"]):
        assert a.abs().max() > 0
        assert rel_err(a.double(), b.double()) <= 1e-6


def test_missing_residual_variants_fall_back_to_the_plain_pair(monkeypatch):
    """An executor (a bundle) without the save_residuals variants: the forward runs the plain
    variant, saves nothing, and the backward recomputes (same results, no error)."""
    import kdagen
    from kdagen.runtime import backends
    from kdagen.runtime.backends import BundleNotFoundError
    from kdagen.runtime.executors import Executor

    cpu = backends.get_executor("cpu")
    calls = []

    class WithoutResiduals(Executor):
        name = "without-residuals"

        def run(self, program, options, inputs, outputs):
            calls.append((program, bool(options.get("save_residuals")), sorted(inputs)))
            if options.get("save_residuals"):
                raise BundleNotFoundError(f"no variant of {program} with save_residuals")
            return cpu.run(program, options, inputs, outputs)

    old = backends.executors()["cpu"]
    backends.register_executor("cpu", WithoutResiduals())
    try:
        gen = torch.Generator().manual_seed(3)
        xs = [torch.randn(1, 40, 1, 64, generator=gen) for _ in range(3)]
        xs += [-torch.rand(1, 40, 1, 64, generator=gen), torch.rand(1, 40, 1, generator=gen)]
        xs = [x.requires_grad_() for x in xs]
        o, ht = kdagen.chunk_kda(*xs, output_final_state=True)
        (o.sum() + ht.sum()).backward()
    finally:
        backends.register_executor("cpu", old)
    assert [(p, r) for p, r, _ in calls] == [("kda_fwd", True), ("kda_fwd", False),
                                             ("kda_bwd", False)]
    assert not any(n in RESIDUALS for n in calls[-1][2])
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in xs)


def test_emit_lists_the_residual_pair_by_default():
    """The default bundle holds what the API runs when a gradient is needed (the pair that
    saves and reads residuals) besides the plain pair; --no-residuals leaves it out."""
    from click.testing import CliRunner

    from kdagen.cli import main
    from kdagen.emit import program_variants
    both = program_variants(["kda", "gdn"], 128, None)
    plain = program_variants(["kda", "gdn"], 128, None, residuals=False)
    assert not any(o.get("save_residuals") for _, o in plain)
    extra = [(p, o) for p, o in both if o.get("save_residuals")]
    assert sorted(p for p, _ in extra) == ["gdn_bwd", "gdn_fwd", "kda_bwd", "kda_fwd"]
    assert len(both) == 2 * len(plain)
    seen = {}

    def spy(ops, head_dim, gate, decode=False, residuals=True, target=None):
        seen["residuals"] = residuals
        raise ValueError("spy: stop before compiling")
    for flag, expected in (([], True), (["--no-residuals"], False)):
        with mock.patch("kdagen.emit.program_variants", spy):
            result = CliRunner().invoke(main, ["emit", "-q", "-o", "unused", *flag])
        assert "spy: stop before compiling" in result.output, result.output
        assert seen.pop("residuals") is expected
