"""CLI: help for every command, emit + check on all three chips, failure paths."""
import json

import pytest
from click.testing import CliRunner

from kdagen.cli import main
from kdagen.codegen import ptxas as ptxas_mod

from conftest import requires_ptxas

COMMANDS = ["emit", "check", "show", "opt", "list"]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_top_level_help_lists_commands():
    result = run("--help")
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Usage: main " + command in result.output or f"Usage: kdagen {command}" in result.output


@requires_ptxas
def test_emit_then_check_all_three_chips(tmp_path):
    out = tmp_path / "bundle"
    result = run("emit", "-o", str(out), "--op", "gate-cumsum")
    assert result.exit_code == 0, result.output
    for chip in ("sm_90a", "sm_100a", "sm_120a"):
        assert chip in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    chips = {k["chip"] for k in manifest["kernels"]}
    assert chips == {"sm_90a", "sm_100a", "sm_120a"}
    for kernel in manifest["kernels"]:
        ptx = (out / kernel["ptx_file"]).read_text()
        assert f".target {kernel['chip']}" in ptx
        assert "ex2.approx" in ptx            # fast intrinsics, not libdevice calls
        assert "__nv_" not in ptx
        assert kernel["resources"]["registers"] > 0
        assert (out / kernel["cubin_file"]).stat().st_size > 0
    checked = run("check", str(out))
    assert checked.exit_code == 0, checked.output
    assert "3/3 kernels assembled (sm_100a, sm_120a, sm_90a)" in checked.output


@requires_ptxas
def test_emit_is_deterministic(tmp_path):
    run("emit", "-o", str(tmp_path / "a"), "--arch", "sm_90a", "--op", "kda", "--head-dim", "64")
    run("emit", "-o", str(tmp_path / "b"), "--arch", "sm_90a", "--op", "kda", "--head-dim", "64")
    ptx_a = sorted((tmp_path / "a").glob("*.ptx"))
    assert ptx_a
    for path in ptx_a:
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes()


@requires_ptxas
def test_check_fails_on_broken_ptx(tmp_path):
    out = tmp_path / "bundle"
    run("emit", "-o", str(out), "--arch", "sm_90a", "--op", "gate-cumsum")
    ptx = next(out.glob("*.ptx"))
    ptx.write_text(ptx.read_text().replace("ret;", "this_is_not_ptx;"))
    result = run("check", str(out))
    assert result.exit_code == 1
    assert "FAIL" in result.output


def test_check_without_manifest(tmp_path):
    result = run("check", str(tmp_path))
    assert result.exit_code == 1
    assert "no manifest.json" in result.output and "kdagen emit" in result.output


@requires_ptxas
def test_check_reports_missing_ptxas(tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    run("emit", "-o", str(out), "--arch", "sm_120a", "--op", "gate-cumsum")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("KDAGEN_PTXAS", raising=False)
    monkeypatch.setattr(ptxas_mod, "FALLBACK_LOCATIONS", ())
    result = run("check", str(out))
    assert result.exit_code == 1
    assert "ptxas not found" in result.output and "KDAGEN_PTXAS" in result.output


def test_emit_rejects_unknown_arch(tmp_path):
    result = run("emit", "-o", str(tmp_path), "--arch", "sm_90")
    assert result.exit_code == 2
    assert "unknown chip 'sm_90'" in result.output and "sm_90a" in result.output


def test_emit_rejects_bad_head_dim(tmp_path):
    result = run("emit", "-o", str(tmp_path), "--head-dim", "96")
    assert result.exit_code == 2
    assert "96" in result.output


@requires_ptxas
@pytest.mark.parametrize("op,head_dim", [("kda", "64"), ("kda", "128"), ("gdn", "64"), ("gdn", "128")])
def test_emit_programs_every_op_chip_and_head_dim(tmp_path, op, head_dim):
    """The DSL programs (forward + backward) go through the passes and the lowering to PTX that
    ptxas assembles for all three chips; the manifest says which path each kernel took."""
    out = tmp_path / "bundle"
    result = run("emit", "-o", str(out), "--op", op, "--head-dim", head_dim)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    kernels = manifest["kernels"]
    for program in (f"{op}_fwd", f"{op}_bwd"):
        for chip in ("sm_90a", "sm_100a", "sm_120a"):
            assert any(k["name"].startswith(program) and k["chip"] == chip for k in kernels), (program, chip)
    for kernel in kernels:
        ptx = (out / kernel["ptx_file"]).read_text()
        tile = kernel["launch"].get("kind") == "tile"
        if kernel["chip"] == "sm_90a" and tile:
            # the native path: TMA producer warpgroup, wgmma consumer, register split
            assert kernel["path"] == "sm90-native", kernel["name"]
            for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg",
                                "mbarrier.try_wait"):
                assert instruction in ptx, (kernel["name"], instruction)
            assert kernel["launch"]["block"][0] == 256 and kernel["launch"]["tensor_maps"]
        else:
            assert kernel["path"].startswith("portable"), (kernel["name"], kernel["path"])
        assert kernel["resources"]["registers"] > 0
        if kernel["chip"] == "sm_90a" and head_dim == "128":
            spilled = kernel["resources"]["spill_stores"] + kernel["resources"]["spill_loads"]
            assert spilled == 0, f"{kernel['name']} spills {spilled} bytes on sm_90a"
        assert "__nv_" not in ptx
        if kernel["chip"] == "sm_120a":
            assert "wgmma" not in ptx and "tcgen05" not in ptx
    checked = run("check", str(out))
    assert checked.exit_code == 0, checked.output
    assert f"{len(kernels)}/{len(kernels)} kernels assembled (sm_100a, sm_120a, sm_90a)" in checked.output


def test_emit_rejects_a_gate_of_the_other_op(tmp_path):
    result = run("emit", "-o", str(tmp_path), "--op", "gdn", "--gate", "lower_bound")
    assert result.exit_code == 1
    assert "not a GDN gate" in result.output
