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
    result = run("emit", "-o", str(out))
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
    run("emit", "-o", str(tmp_path / "a"), "--arch", "sm_90a")
    run("emit", "-o", str(tmp_path / "b"), "--arch", "sm_90a")
    ptx_a = sorted((tmp_path / "a").glob("*.ptx"))
    assert ptx_a
    for path in ptx_a:
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes()


@requires_ptxas
def test_check_fails_on_broken_ptx(tmp_path):
    out = tmp_path / "bundle"
    run("emit", "-o", str(out), "--arch", "sm_90a")
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
    run("emit", "-o", str(out), "--arch", "sm_120a")
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
