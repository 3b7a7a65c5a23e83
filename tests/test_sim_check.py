"""tools.sim_check: the GPU check's cases run in the CPU simulator of a program's kernels."""
import pytest

pytest.importorskip("kdagen._mlir")

from tools import sim_check  # noqa: E402


def test_lists_the_gpu_check_cases():
    from tools.scan_precision_probe import SimulatedProgram
    sim = SimulatedProgram("gdn_bwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_softplus"),
                           "auto", "sm_90a")
    assert "B1_T200 correlated steep" in sim.labels and "B2_T1" in sim.labels
    with pytest.raises(ValueError, match="not one of gdn_bwd's GPU-check cases"):
        sim.run("no such case")


def test_one_case_prints_every_gradient_against_bar_and_goal(capsys):
    assert sim_check.main(["gdn_bwd", "--head-dim", "64", "--case", "B2_T1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("B2_T1")]
    assert sorted(r[1] for r in rows) == sorted(
        ["dq", "dk", "dv", "dg_raw", "dbeta_raw", "dA_log", "ddt_bias", "dh0"])
    for r in rows:
        err, bar, floor, goal = map(float, r[2:6])
        assert 0 < err <= bar and goal in (1e-3, 2e-3), r
        # every output is ok, or over its goal but still under the GPU check's bar
        assert " ".join(r[6:]) in ("ok", "over goal"), r


def test_unknown_case_is_an_error(capsys):
    assert sim_check.main(["kda_bwd", "--head-dim", "64", "--case", "no such case"]) == 1
    assert "no case of kda_bwd matches" in capsys.readouterr().err


def test_kernel_threads_gives_the_named_kernels_their_thread_counts():
    """--kernel-threads k2=256: the portable lowering runs kernel k2 on 256 threads (its launch
    block, which the simulator runs), the others on the options' 128."""
    from kdagen.codegen.lower.kernel import prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.program import read_program
    from kdagen.driver import build_module
    program = read_program(build_module("kda_bwd", dict(head_k_dim=64, head_v_dim=64), "chip",
                                        "sm_90a"))
    with sim_check.kernel_threads(sim_check._kernel_counts("k2=256,k4=512")):
        blocks = {pk.name.split("__")[1].split("_")[0]: pk.launch["block"][0]
                  for pk in prepare(program, None, "t", LowerOptions(dot="auto"))
                  if pk.group.kind != "global"}
    assert blocks["k2"] == 256 and blocks["k4"] == 512 and blocks["k0"] == 128, blocks
    after = {pk.name.split("__")[1].split("_")[0]: pk.launch["block"][0]
             for pk in prepare(program, None, "t", LowerOptions(dot="auto"))
             if pk.group.kind != "global"}
    assert set(after.values()) == {128}                       # the patch is undone


@pytest.mark.parametrize("bad", ["k2", "2=256", "k2=100", "k2=x"])
def test_kernel_threads_rejects_what_it_cannot_run(bad):
    with pytest.raises(SystemExit, match="--kernel-threads"):
        sim_check._kernel_counts(bad)


def test_kernel_dot_gives_the_named_kernels_their_product_precision():
    """--kernel-dot k0=tf32x3: kernel k0 is lowered with dot=tf32x3 (every product), the others
    with the options' dot; the patch is undone afterwards."""
    from kdagen.codegen.lower.kernel import prepare
    from kdagen.codegen.lower.options import LowerOptions
    from kdagen.codegen.lower.program import read_program
    from kdagen.driver import build_module
    program = read_program(build_module("kda_bwd", dict(head_k_dim=64, head_v_dim=64), "chip",
                                        "sm_90a"))

    def dots():
        return {pk.name.split("__")[1].split("_")[0]: pk.emitter.opts.dot
                for pk in prepare(program, None, "t", LowerOptions(dot="auto"))
                if pk.group.kind != "global"}
    with sim_check.kernel_threads({}, sim_check.kernel_dots("k0=tf32x3,k3=bf16x3")):
        inside = dots()
    assert inside["k0"] == "tf32x3" and inside["k3"] == "bf16x3", inside
    assert inside["k2"] == "auto", inside
    assert set(dots().values()) == {"auto"}                    # the patch is undone


@pytest.mark.parametrize("bad", ["k0", "0=tf32", "k0=tf33", "kx=tf32"])
def test_kernel_dot_rejects_unknown_precisions(bad):
    with pytest.raises(SystemExit, match="--kernel-dot"):
        sim_check.kernel_dots(bad)


def test_check_bundle_rejects_a_bad_kernel_dot(tmp_path):
    """tools.check_bundle --kernel-dot takes the same values as sim_check's (and says so)."""
    from tools import check_bundle
    with pytest.raises(SystemExit, match="--kernel-dot"):
        check_bundle.main([str(tmp_path / "b"), "--only", "no such variant",
                           "--kernel-dot", "k0=fp64"])


def test_pipeline_option_builds_the_simulated_program_with_it(capsys):
    """--pipeline: the program goes through that pipeline (here fp16 checkpoints: the output
    kernel reads an f16 workspace) and the report names it; a pass outside the chip's pipeline
    is refused by the parser."""
    from tools.scan_precision_probe import SimulatedProgram
    pipeline = "chip+kda-narrow-checkpoints{dtype=fp16}"
    sim = SimulatedProgram("gdn_fwd", dict(head_k_dim=64, head_v_dim=64, gate="gdn_softplus"),
                           "auto", "sm_90a", pipeline=pipeline)
    workspaces = {w["name"]: w["elt"] for w in sim.spec["workspaces"]}
    assert workspaces["S_chunks"] == "f16" and workspaces["w_ws"] == "f32", workspaces
    assert sim_check.main(["gdn_fwd", "--head-dim", "64", "--case", "B2_T1",
                           "--pipeline", pipeline]) == 0
    out = capsys.readouterr().out
    assert f"pipeline {pipeline}" in out
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("B2_T1")] == \
        ["ok", "ok"]
    with pytest.raises(SystemExit):
        sim_check.main(["gdn_fwd", "--pipeline", "chip+kda-nonsense{x=1}"])
