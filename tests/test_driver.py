"""The compile driver: named stages (kda, each pass, gpu, ptx, cubin), each kept and dumpable,
the target bound on the module, and `kdagen show --stage gpu|ptx` through it."""
import pytest
from click.testing import CliRunner

from conftest import requires_ptxas
from kdagen.cli import main
from kdagen.driver import BACKEND_STAGES, DEFAULT_LOWERING, Compilation
from kdagen.ir.accessors import module_target

OPTS = dict(head_k_dim=64, head_v_dim=64)


def test_stage_names_follow_the_chip_pipeline():
    comp = Compilation("gdn_fwd", OPTS, "sm_120a")
    assert comp.stage_names() == ["kda", "kda-bind-target", "verify", "kda-stable-reassociate",
                                  "kda-partition", "kda-share-chunk-values",
                                  "kda-narrow-broadcasts", "kda-narrow-reductions",
                                  "kda-assign-precision", "kda-narrow-checkpoints",
                                  "kda-fold-row-decay", "kda-warp-specialize",
                                  "kda-assign-layouts", "verify",
                                  *BACKEND_STAGES]
    stable = Compilation("gdn_fwd", OPTS, "sm_120a", pipeline="stable")
    assert stable.stage_names() == ["kda", "kda-stable-reassociate", *BACKEND_STAGES]
    with pytest.raises(ValueError, match="not a stage"):
        comp.run("kda-nonsense")


def test_every_stage_is_kept_and_the_target_rides_on_the_module(tmp_path):
    comp = Compilation("gdn_fwd", OPTS, "sm_120a", lower=DEFAULT_LOWERING).run("ptx")
    kept = [s.name for s in comp.stages]
    assert kept == comp.stage_names()[:-1]                      # all but cubin
    assert 'kda.target' not in comp.output("kda")               # as the DSL built it
    assert 'kda.target = "sm_120a"' in comp.output("kda-bind-target")
    assert module_target(comp.module).chip == "sm_120a"
    # the pass read its budget from the target: one consumer warpgroup on sm_120a
    assert "consumer_warpgroups = 1" in comp.output("kda-warp-specialize")
    assert comp.output("gpu").count("// ----- kernel ") == len(comp.kernels) >= 2
    assert "gpu.module @" in comp.output("gpu") and "nvvm." in comp.output("gpu")
    ptx = comp.output("ptx")
    assert ptx.count(".target sm_120a") == len(comp.kernels) and "wgmma" not in ptx
    paths = comp.dump(tmp_path)
    assert [p.name for p in paths][:2] == ["00-kda.mlir", "01-kda-bind-target.mlir"]
    assert paths[-1].name.endswith("-ptx.ptx") and paths[-1].read_text() == ptx


def test_a_pass_stage_stops_after_that_pass():
    comp = Compilation("kda_fwd", OPTS, "sm_90a").run("kda-stable-reassociate")
    assert [s.name for s in comp.stages] == ["kda", "kda-bind-target", "verify",
                                             "kda-stable-reassociate"]
    assert "kda.kernel" not in comp.output("kda-stable-reassociate")


@requires_ptxas
def test_cubin_stage_reports_ptxas():
    comp = Compilation("gdn_fwd", OPTS, "sm_100a", lower=DEFAULT_LOWERING).run("cubin")
    assert set(comp.assembled) == {k.name for k in comp.kernels}
    assert all(r.ok and r.cubin for r in comp.assembled.values())
    assert "Used" in comp.output("cubin") and "registers" in comp.output("cubin")


def test_show_prints_the_lowered_stages():
    runner = CliRunner()
    ptx = runner.invoke(main, ["show", "kda_fwd", "--stage", "ptx", "--arch", "sm_90a"])
    assert ptx.exit_code == 0, ptx.output
    assert ".target sm_90a" in ptx.output and "wgmma.mma_async" in ptx.output
    assert ptx.output.count("// ----- kernel kda_fwd__k") == 3
    gpu = runner.invoke(main, ["show", "gdn_fwd", "--stage", "gpu", "--arch", "sm_120a",
                               "--option", "head_k_dim=64", "--option", "head_v_dim=64"])
    assert gpu.exit_code == 0, gpu.output
    assert "gpu.module @gdn_fwd__k0_scan0_module" in gpu.output
    bad = runner.invoke(main, ["show", "kda_fwd", "--stage", "ptxx"])
    assert bad.exit_code == 1 and "gpu, cost, ptx, cubin" in bad.output


def test_emit_dumps_every_stage(tmp_path):
    from kdagen.emit import emit_programs
    from kdagen.target import get_target
    rows = emit_programs(tmp_path / "bundle", [get_target("sm_120a")], ["gdn"], head_dim=64,
                         dump_dir=tmp_path / "stages", residuals=False)
    folders = sorted(p.name for p in (tmp_path / "stages").iterdir())
    assert len(folders) == 2 and all(f.endswith(".sm_120a") for f in folders)
    for folder in folders:
        names = sorted(p.name for p in (tmp_path / "stages" / folder).iterdir())
        assert names[0] == "00-kda.mlir" and any(n.endswith("-ptx.ptx") for n in names)
        ptx = next(p for p in (tmp_path / "stages" / folder).iterdir() if p.name.endswith(".ptx"))
        for row in rows:
            if row["variant"] == folder.rsplit(".", 1)[0]:
                assert (tmp_path / "bundle" / f"{row['kernel']}.sm_120a.ptx").read_text() \
                    in ptx.read_text()


def test_chip_pipeline_with_a_pass_option():
    """"chip+PASS{KEY=VALUE}": the chip's pipeline with that pass's option set, nothing else
    changed; a pass outside the chip's pipeline, or an unknown one, is an error naming it."""
    from kdagen.driver import pipeline_passes, validate_pipeline
    plain = pipeline_passes("chip", "sm_90a")
    tuned = pipeline_passes("chip+kda-assign-precision{gate_gradient_inputs=true}", "sm_90a")
    assert [p.name for p in tuned] == [p.name for p in plain]
    changed = [(a, b) for a, b in zip(plain, tuned) if a != b]
    assert len(changed) == 1 and changed[0][1].gate_gradient_inputs is True
    with pytest.raises(ValueError, match="'canonicalize' is not a pass of sm_90a's pipeline"):
        validate_pipeline("chip+canonicalize")
    with pytest.raises(ValueError, match="unknown pass 'kda-nonsense'"):
        validate_pipeline("chip+kda-nonsense")
    assert validate_pipeline("chip") == "chip"
