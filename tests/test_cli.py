"""CLI: help for every command, emit + check on all three chips, failure paths."""
import json

import pytest
from click.testing import CliRunner

from kdagen.cli import main
from kdagen.codegen import ptxas as ptxas_mod

from conftest import HAS_PTXAS, requires_ptxas

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
    assert "3/3 kernels assembled (sm_90a, sm_100a, sm_120a)" in checked.output


@requires_ptxas
def test_emit_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_PTX_MEMO", "0")      # lower both emits for real
    run("emit", "-o", str(tmp_path / "a"), "--arch", "sm_90a", "--op", "kda", "--head-dim", "64",
        "--no-residuals")
    run("emit", "-o", str(tmp_path / "b"), "--arch", "sm_90a", "--op", "kda", "--head-dim", "64",
        "--no-residuals")
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


def test_emit_pipeline_option_reaches_the_lowering_and_is_checked(tmp_path, monkeypatch):
    """--pipeline chip+PASS{...}: the bundle's programs go through it (emit_programs gets it in
    its lowering options); a pass outside the chip's pipeline or a bad option value is refused
    naming --pipeline, before anything compiles."""
    pytest.importorskip("kdagen._mlir")
    import kdagen.emit as emit_mod
    seen = {}

    def fake_emit_programs(out_dir, targets, ops, **kw):
        seen.update(kw)
        return []
    monkeypatch.setattr(emit_mod, "emit_programs", fake_emit_programs)
    pipeline = "chip+kda-narrow-checkpoints{dtype=fp16}"
    result = run("emit", "-o", str(tmp_path), "--op", "gdn", "--arch", "sm_90a",
                 "--pipeline", pipeline, "-q")
    assert result.exit_code == 0, result.output
    assert seen["lower"] == {"pipeline": pipeline}
    for bad in ("chip+kda-nonsense{x=1}", "chip+kda-narrow-checkpoints{dtype=fp8}", "stable"):
        result = run("emit", "-o", str(tmp_path), "--op", "gdn", "--arch", "sm_90a",
                     "--pipeline", bad, "-q")
        assert result.exit_code == 2 and "--pipeline" in result.output, (bad, result.output)


def test_emit_rejects_bad_head_dim(tmp_path):
    result = run("emit", "-o", str(tmp_path), "--head-dim", "96")
    assert result.exit_code == 2
    assert "96" in result.output


@requires_ptxas
@pytest.mark.parametrize("op,head_dim", [("kda", "64"), ("kda", "128"), ("gdn", "64"), ("gdn", "128")])
def test_emit_programs_every_op_chip_and_head_dim(tmp_path, op, head_dim):
    """The DSL programs (forward + backward) go through the passes and the lowering to PTX that
    ptxas assembles for all three chips (GDN at K = 128: sm_90a only, its native paths and no
    spills; its portable kernels are KDA's lowering with a scalar gate, assembled for every
    chip at K = 64 here and for KDA at both head dims); the manifest says which path each
    kernel took. KDA at K = 64 builds the default bundle, training's residual pair included
    (the rest leave it out to keep the run short)."""
    out = tmp_path / "bundle"
    chips = ("sm_90a",) if (op, head_dim) == ("gdn", "128") else ("sm_90a", "sm_100a", "sm_120a")
    residuals = (op, head_dim) == ("kda", "64")
    result = run("emit", "-o", str(out), "--op", op, "--head-dim", head_dim,
                 "--arch", ",".join(chips), *([] if residuals else ["--no-residuals"]))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    kernels = manifest["kernels"]
    for program in (f"{op}_fwd", f"{op}_bwd"):
        for chip in chips:
            assert any(k["name"].startswith(program) and k["chip"] == chip for k in kernels), (program, chip)
    for kernel in kernels:
        ptx = (out / kernel["ptx_file"]).read_text()
        tile = kernel["launch"].get("kind") == "tile"
        if tile and "_scan" not in kernel["name"]:
            continue            # a per-sequence kernel without chunk loop (sums over chunks)
        if kernel["chip"] == "sm_90a" and tile:
            # the native paths: TMA producer warpgroup, wgmma consumer, register split (the
            # serial scans keep their state in registers: sm90-register-scan, TF32 wgmma, or
            # bf16x3 where kda-assign-precision gives them it: KDA's backward)
            # (and the chunk kernels the tuning table puts on sm90-register-tile)
            assert kernel["path"] in ("sm90-native", "sm90-register-scan",
                                      "sm90-register-tile"), kernel["name"]
            if kernel["path"] == "sm90-register-tile":
                # one warpgroup: TMA copies on an mbarrier, wgmma products, no producer split
                for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor",
                                    "mbarrier.try_wait"):
                    assert instruction in ptx, (kernel["name"], instruction)
                continue
            if kernel["path"] == "sm90-register-scan":
                assert "wgmma.mma_async.sync.aligned" in ptx, kernel["name"]
                assert (".tf32" in ptx) != ("k16.f32.bf16.bf16" in ptx), kernel["name"]
            for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg",
                                "mbarrier.try_wait"):
                assert instruction in ptx, (kernel["name"], instruction)
            # serial scans: one consumer warpgroup + the producer (two where the tuning table
            # gives the scan scan_warpgroups=2: the reverse scans at K = V = 128);
            # chunk-parallel kernels (the default chunk_warpgroups "auto"): four consumer
            # warpgroups + the producer where tile buffers spill to the global scratch (or fit
            # only sharing buffers in place), else two; two as well where the tuning table
            # plans it for 2 CTAs per SM
            spills = (kernel["launch"]["storage"] in ("hybrid", "global")
                      or kernel["launch"].get("shared_in_place", False))
            two_ctas = kernel["launch"].get("tuned", {}).get("chunk_ctas_per_sm") == 2
            scan_wgs = kernel["launch"].get("tuned", {}).get("scan_warpgroups", 1)
            threads = ((640 if spills and not two_ctas else 384)
                       if kernel["launch"].get("parallel_chunks") else 128 * (scan_wgs + 1))
            assert kernel["launch"]["block"][0] == threads and kernel["launch"]["tensor_maps"]
        else:
            assert kernel["path"].startswith("portable"), (kernel["name"], kernel["path"])
        assert kernel["resources"]["registers"] > 0
        if kernel["chip"] == "sm_90a" and head_dim == "128":
            spilled = kernel["resources"]["spill_stores"] + kernel["resources"]["spill_loads"]
            assert spilled == 0, f"{kernel['name']} spills {spilled} bytes on sm_90a"
        assert "__nv_" not in ptx
        if kernel["chip"] == "sm_120a":
            assert "wgmma" not in ptx and "tcgen05" not in ptx
    lowered = json.loads((out / "lowered.json").read_text())["variants"]
    assert len(lowered) == (4 if residuals else 2), sorted(lowered)     # fwd, bwd (x 2)
    by_name = {(k["name"], k["chip"]): k for k in kernels}
    for variant, spec in lowered.items():
        # every program's serial scans (forward: the state; backward: recompute and reverse dS)
        register = [name for name in spec["chips"]["sm_90a"]
                    if by_name[(name, "sm_90a")]["path"] == "sm90-register-scan"]
        assert len(register) == (1 if spec["program"].endswith("_fwd") else 2), (variant, register)
    checked = run("check", str(out))
    assert checked.exit_code == 0, checked.output
    assert f"{len(kernels)}/{len(kernels)} kernels assembled ({', '.join(chips)})" in checked.output


def test_emit_rejects_a_gate_of_the_other_op(tmp_path):
    result = run("emit", "-o", str(tmp_path), "--op", "gdn", "--gate", "lower_bound")
    assert result.exit_code == 1
    assert "'lower_bound' is a KDA gate" in result.output and "--op kda" in result.output


# --- progress, table width, names that say the path taken, chip order -------------------------

@pytest.fixture(scope="module")
def kda64_bundle(tmp_path_factory):
    """One emit of the KDA programs (K = V = 64) for sm_100a and sm_90a, chips given out of
    order, shared by the tests below (the emit takes a while)."""
    if not HAS_PTXAS:
        pytest.skip("needs ptxas (CUDA toolkit)")
    out = tmp_path_factory.mktemp("kda64") / "bundle"
    result = run("emit", "-o", str(out), "--arch", "sm_100a,sm_90a", "--op", "kda",
                 "--head-dim", "64", "--no-residuals")
    assert result.exit_code == 0, result.output
    return out, result


def test_emit_table_fits_in_100_columns(kda64_bundle):
    out, result = kda64_bundle
    table = result.stdout.split("\nwrote ")[0]
    for line in table.splitlines():
        assert len(line) <= 100, line
    assert "wrote 22 kernels (2 variants) to" in result.stdout
    header = result.stdout.splitlines()[0].split()
    assert header[:5] == ["program", "K,V", "kernel", "chip", "path"]


def test_emit_reports_progress_per_kernel_on_stderr(kda64_bundle):
    out, result = kda64_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    lines = [l for l in result.stderr.splitlines() if l.startswith("kdagen emit: [")]
    assert len(lines) == len(manifest["kernels"]) == 22
    assert "[1/4]" in lines[0] and "[4/4]" in lines[-1]
    assert not any(l.startswith("kdagen emit:") for l in result.stdout.splitlines())


def test_emit_quiet_has_no_progress(tmp_path):
    if not HAS_PTXAS:
        pytest.skip("needs ptxas (CUDA toolkit)")
    result = run("emit", "-q", "-o", str(tmp_path / "b"), "--arch", "sm_90a", "--op", "gate-cumsum")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert "wrote 1 kernel (1 variant) to" in result.stdout


def test_emit_verbose_prints_whole_names(kda64_bundle, tmp_path):
    out, _ = kda64_bundle
    result = run("emit", "-v", "-q", "-o", str(tmp_path / "b"), "--arch", "sm_90a",
                 "--op", "gate-cumsum")
    assert result.exit_code == 0, result.output
    assert "kda_gate_cumsum_K128_C64_bf16" in result.stdout
    assert "spill stores" in result.stdout and "tile bytes" in result.stdout


def test_emit_lists_chips_in_fixed_order(kda64_bundle):
    out, result = kda64_bundle
    chips = [line.split()[3] for line in result.stdout.splitlines()[2:] if line.startswith("kda_")]
    assert chips == sorted(chips, key=["sm_90a", "sm_100a"].index)
    manifest = json.loads((out / "manifest.json").read_text())
    for a, b in zip(manifest["kernels"], manifest["kernels"][1:]):
        if a["name"] == b["name"]:
            assert (a["chip"], b["chip"]) == ("sm_90a", "sm_100a")


def test_kernel_names_say_the_path_taken(kda64_bundle):
    """A native variant names ..._native_... only the kernels that took the native path; its
    portable kernels (sm_100a, the global reductions) have their portable names."""
    out, _ = kda64_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    names = [(k["name"], k["chip"]) for k in manifest["kernels"]]
    assert len(set(names)) == len(names)
    for kernel in manifest["kernels"]:
        assert ("native" in kernel["name"]) == (kernel["path"] == "sm90-native"), kernel["name"]
        ptx = (out / kernel["ptx_file"]).read_text()
        assert f".entry {kernel['name']}(" in ptx
    assert any(k["path"] == "sm90-native" for k in manifest["kernels"])
    lowered = json.loads((out / "lowered.json").read_text())
    listed = {(n, chip) for v in lowered["variants"].values() for chip, ns in v["chips"].items()
              for n in ns}
    assert listed == set(names)
    # the runtime finds the variants (by their options) in the bundle
    from kdagen.runtime.backends import find_variant
    for program in ("kda_fwd", "kda_bwd"):
        name = find_variant(out, program, dict(head_k_dim=64, head_v_dim=64), "sm_100a")
        assert lowered["variants"][name]["program"] == program


def test_check_reports_progress_and_chip_order(kda64_bundle):
    out, _ = kda64_bundle
    result = run("check", str(out))
    assert result.exit_code == 0, result.output
    assert "22/22 kernels assembled (sm_90a, sm_100a)" in result.stdout
    lines = [l for l in result.stderr.splitlines() if l.startswith("kdagen check: [")]
    assert len(lines) == 22 and "[22/22]" in lines[-1]
    assert all(" sm_90a " in l for l in lines[:11]) and all(" sm_100a " in l for l in lines[11:])
    for line in result.stdout.splitlines():
        assert len(line) <= 100, line


def test_progress_bar_on_a_terminal():
    import io
    from kdagen.table import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = Progress(2, "kdagen emit", stream=stream)
    bar.status("lowering kda_fwd for sm_90a")
    bar.begin_step(2)
    bar.done("k0")
    assert "[" in stream.getvalue() and " 25%" in stream.getvalue()
    bar.done("k1")
    bar.end_step()
    assert " 50%" in stream.getvalue()
    bar.close()
    text = stream.getvalue()
    assert "\n" not in text and text.endswith("\r")     # redrawn in place, erased at the end


def test_plural():
    from kdagen.table import plural
    assert plural(1, "kernel") == "1 kernel" and plural(2, "kernel") == "2 kernels"


def test_table_cut_to_width():
    from kdagen.table import format_table
    text = format_table(["a", "b"], [["x" * 80, "y" * 40]], max_width=100, shrink=0)
    assert max(len(l) for l in text.splitlines()) <= 100
    assert "..." in text and "y" * 40 in text


# --- re-emit into a folder, several head dims, file modes, the bundle's README --------------

def _files(folder):
    return {p.name for p in folder.iterdir()}


def _listed(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    return {k[key] for k in manifest["kernels"] for key in ("ptx_file", "cubin_file") if k[key]}


def test_reemit_leaves_exactly_what_the_manifest_lists(kda64_bundle, tmp_path):
    """Emitting again replaces the bundle: the earlier kernel files and lowered.json go, the
    files kdagen did not write stay."""
    import shutil
    src, _ = kda64_bundle
    out = tmp_path / "bundle"
    shutil.copytree(src, out)
    (out / "notes.txt").write_text("mine\n")
    (out / "mine.ptx").write_text("// not from kdagen\n")
    result = run("emit", "-q", "-o", str(out), "--arch", "sm_90a", "--op", "gate-cumsum")
    assert result.exit_code == 0, result.output
    assert _files(out) == _listed(out) | {"manifest.json", "README.md", "notes.txt", "mine.ptx"}
    assert len(_listed(out)) == 2
    # and back: a program bundle again, the gate+cumsum files gone
    result = run("emit", "-q", "-o", str(out), "--arch", "sm_100a", "--op", "kda", "--head-dim", "64",
                 "--no-residuals")
    assert result.exit_code == 0, result.output
    assert _files(out) == _listed(out) | {"manifest.json", "lowered.json", "README.md",
                                          "notes.txt", "mine.ptx"}


def test_failed_emit_keeps_the_earlier_bundle(tmp_path, monkeypatch):
    from kdagen import driver as emit_mod      # the compile driver's ptx stage
    out = tmp_path / "bundle"
    assert run("emit", "-q", "-o", str(out), "--arch", "sm_90a", "--op", "gate-cumsum").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = emit_mod.lower_to_ptx, []

    def flaky(module, target):
        calls.append(target.chip)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real(module, target)

    monkeypatch.setattr(emit_mod, "lower_to_ptx", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        run("emit", "-q", "-o", str(out), "--arch", "sm_90a,sm_120a", "--op", "gate-cumsum",
            "--head-dim", "64,128")
    assert {p.name for p in out.iterdir()} == set(before)
    assert (out / "manifest.json").read_bytes() == before["manifest.json"]


def test_emit_several_head_dims_into_one_bundle(tmp_path, monkeypatch):
    """--head-dim 64,128: one variant per program and head dim in one bundle; the runtime's
    lookup finds each by the options the API passes (PTX only here, to keep it quick)."""
    from kdagen.runtime.backends import find_variant
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("KDAGEN_PTXAS", raising=False)
    monkeypatch.setattr(ptxas_mod, "FALLBACK_LOCATIONS", ())
    out = tmp_path / "bundle"
    result = run("emit", "-q", "-o", str(out), "--arch", "sm_120a", "--op", "gdn",
                 "--head-dim", "64,128", "--no-residuals")
    assert result.exit_code == 0, result.output
    assert "(4 variants)" in result.stdout
    lowered = json.loads((out / "lowered.json").read_text())["variants"]
    assert sorted((v["program"], v["attrs"]["head_k_dim"]) for v in lowered.values()) == [
        ("gdn_bwd", 64), ("gdn_bwd", 128), ("gdn_fwd", 64), ("gdn_fwd", 128)]
    full = dict(chunk_size=64, gate="gdn_softplus", gva_ratio=1, dtype="bf16",
                use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                allow_neg_eigval=False, use_initial_state=True, output_final_state=True,
                varlen=False)
    for dim in (64, 128):
        for program in ("gdn_fwd", "gdn_bwd"):
            name = find_variant(out, program, dict(full, head_k_dim=dim, head_v_dim=dim),
                                "sm_120a")
            spec = lowered[name]
            assert (spec["program"], spec["attrs"]["head_k_dim"], spec["attrs"]["head_v_dim"]) \
                == (program, dim, dim)
            for kernel in spec["chips"]["sm_120a"]:
                assert (out / f"{kernel}.sm_120a.ptx").is_file()
    assert _files(out) == _listed(out) | {"manifest.json", "lowered.json", "README.md"}


def test_emit_rejects_a_bad_head_dim_in_a_list(tmp_path):
    result = run("emit", "-o", str(tmp_path), "--head-dim", "64,96")
    assert result.exit_code == 2
    assert "96" in result.output and "64,128" in result.output


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_bundle_files_get_the_mode_of_new_files(tmp_path, umask):
    import os
    from kdagen.runtime.bundle import write_atomic
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "a.ptx", "x")
        write_atomic(tmp_path / "b.cubin", b"x")
    finally:
        os.umask(old)
    for name in ("a.ptx", "b.cubin"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask
    assert _files(tmp_path) == {"a.ptx", "b.cubin"}          # no temp file left


def test_bundle_readme_describes_the_files(tmp_path):
    out = tmp_path / "bundle"
    assert run("emit", "-q", "-o", str(out), "--arch", "sm_90a", "--op", "gate-cumsum").exit_code == 0
    text = (out / "README.md").read_text()
    for word in ("manifest.json", "lowered.json", "ptx_file", "cubin_file", "params", "launch",
                 "grid", "ceil_div", "max_chunks", "tensor_maps", "variants", "args",
                 "workspaces", "chip_workspaces", "chips", "resources"):
        assert word in text, word
    # a README.md the user put there is not overwritten (nor removed)
    (out / "README.md").write_text("my notes\n")
    assert run("emit", "-q", "-o", str(out), "--arch", "sm_90a", "--op", "gate-cumsum").exit_code == 0
    assert (out / "README.md").read_text() == "my notes\n"


# --- show / opt / list / bench -------------------------------------------------------------

def _workspace_names(text):
    import re
    return re.findall(r'"kda.workspace"\(\) \{layout = "chunk", name = "([^"]+)"\}', text)


def test_opt_keeps_the_names_of_show_output(tmp_path):
    """The README's round trip: `kdagen show` then `kdagen opt` names workspaces as the
    pipeline does on the built program (not '-_ws' from the parser's file locations)."""
    from kdagen.ir import programs
    from kdagen.ir.dialect import print_module
    from kdagen.passes.registry import parse_pipeline
    from kdagen.passes.pipeline import run_pipeline
    pipeline = "kda-stable-reassociate,kda-partition{workspace_dtype=bf16}"
    shown = run("show", "kda_fwd")
    assert shown.exit_code == 0, shown.output
    path = tmp_path / "f.mlir"
    path.write_text(shown.stdout)
    result = run("opt", str(path), "-p", pipeline)
    assert result.exit_code == 0, result.output
    module = programs.build_program("kda_fwd")
    run_pipeline(module, parse_pipeline(pipeline))
    expected = print_module(module)
    names = _workspace_names(result.stdout)
    assert names and "-_ws" not in names
    assert names == _workspace_names(expected)
    assert result.stdout.strip() == expected.strip()


@pytest.mark.parametrize("flag", ["--dump-after", "--dump-before"])
def test_dump_of_an_unknown_pass_is_an_error(tmp_path, flag):
    path = tmp_path / "f.mlir"
    path.write_text(run("show", "gdn_fwd").stdout)
    result = run("opt", str(path), "-p", "verify", flag, "nosuch")
    assert result.exit_code == 1
    assert f"{flag} nosuch: unknown pass; valid names: all, verify" in result.output
    result = run("opt", str(path), "-p", "verify", flag, "kda-partition")
    assert result.exit_code == 1 and "does not run kda-partition" in result.output
    result = run("opt", str(path), "-p", "verify", flag, "all")
    assert result.exit_code == 0, result.output
    assert "IR Dump" in result.stderr


def test_show_unknown_program_names_the_programs():
    result = run("show", "nosuch")
    assert result.exit_code == 1
    line = result.output.strip()
    assert line == ("Error: unknown program 'nosuch'; choose one of kda_fwd, kda_bwd, gdn_fwd, "
                    "gdn_bwd, kda_decode, gdn_decode (`kdagen list` describes them)")


def test_opt_checks_pass_options_when_parsing_the_pipeline(tmp_path):
    path = tmp_path / "not-even-mlir.mlir"
    path.write_text("this is not MLIR\n")
    result = run("opt", str(path), "-p", "kda-partition{workspace_dtype=fp8}")
    assert result.exit_code == 1
    assert "workspace_dtype=fp8 is not allowed; allowed values: auto, fp32, bf16, fp16" \
        in result.output
    result = run("opt", str(path), "-p", "kda-warp-specialize{depth=0}")
    assert result.exit_code == 1 and "depth=0 is too small; it must be >= 1" in result.output


def test_show_help_and_list_options_list_the_option_keys():
    from kdagen.ir.programs import program_options
    from kdagen.ir.gates import GATES
    keys = list(program_options()) + [k for g in GATES.values() for k in g.options]
    for args in (("show", "--help"), ("list", "--options")):
        result = run(*args)
        assert result.exit_code == 0, result.output
        for key in keys:
            assert f"{key}=" in result.output, (args, key)
    assert "chunk_size=64" in run("show", "--help").output


@pytest.mark.parametrize("flag", ["--help", "-h", "--help-bench"])
def test_bench_help_describes_every_option(flag):
    from kdagen.benchmark import build_parser
    result = run("bench", flag)
    assert result.exit_code == 0, result.output
    for action in build_parser()._actions:
        assert action.help, action.option_strings
        for option in action.option_strings:
            assert option in result.output
    for config in ("B1_T8k_H16", "varlen_mix_H16"):
        assert config in result.output


def test_emit_decode_adds_the_decode_program(tmp_path):
    out = tmp_path / "dec"
    result = run("emit", "-o", str(out), "--arch", "sm_120a", "--op", "gdn", "--head-dim", "64",
                 "--decode", "-q")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    programs = {k["name"].split("_K")[0] for k in manifest["kernels"]}
    assert programs == {"gdn_fwd", "gdn_bwd", "gdn_decode"}
    decode = [v for v in json.loads((out / "lowered.json").read_text())["variants"].values()
              if v["program"] == "gdn_decode"]
    # a pool kernel per storage: fp32 / bf16 rows, [K, V] / value-first
    stored = sorted((bool(v["attrs"].get("state_pool")), v["attrs"]["value_split"],
                     v["attrs"].get("state_dtype", "fp32"), v["attrs"].get("state_v_first", False))
                    for v in decode)
    assert stored == sorted([(False, p, "fp32", False) for p in (2, 4)]
                            + [(True, p, dt, vf) for p in (2, 4) for dt in ("fp32", "bf16")
                               for vf in (False, True)])


def test_show_and_emit_take_lowering_options():
    """``--lower KEY=VALUE`` reaches the lowering: an explicit option wins over the tuning
    table (kda_bwd's dk kernel at K = 64 is tuned to load_batch 2); a bad key names the keys."""
    tuned = "tuning table's (kdagen.codegen.lower.tuning) load_batch=2"
    args = ("show", "kda_bwd", "--stage", "cost", "--option", "head_k_dim=64", "--option",
            "head_v_dim=64")
    assert tuned in run(*args).output
    explicit = run(*args, "--lower", "load_batch=4")
    assert explicit.exit_code == 0 and tuned not in explicit.output
    for command in (args, ("emit", "--arch", "sm_90a", "-o", "unused")):
        bad = run(*command, "--lower", "load_bach=4")
        assert bad.exit_code == 2 and "load_batch" in bad.output and "'load_bach=4'" in bad.output


def test_lowering_options_parse_by_the_field_type():
    from kdagen.codegen.lower.options import parse_lower_option as parse
    assert parse("chunk_warpgroups=2") == ("chunk_warpgroups", 2)
    assert parse("chunk_warpgroups=auto") == ("chunk_warpgroups", "auto")
    assert parse("register_scan=false") == ("register_scan", False)
    assert parse("smem_row_pad=none") == ("smem_row_pad", None)
    assert parse("tensormap_params=grid_constant") == ("tensormap_params", "grid_constant")
    for bad in ("load_batch=two", "register_scan=maybe", "load_batch", "nosuch=1"):
        with pytest.raises(ValueError):
            parse(bad)


def test_show_cost_ops_lists_more_or_fewer_ops_per_kernel():
    """``--cost-ops N`` sets how many program ops each kernel's cost section lists (0: all of
    them), for that command only."""
    pytest.importorskip("kdagen._mlir")
    from kdagen.codegen.lower import cost_model

    def rows(*extra):
        out = run("show", "kda_fwd", "--stage", "cost", *extra).output
        section = out.split("// ----- kernel ")[1]
        table = section.split("ops with the most first):")[1].split("ESTIMATE")[0]
        return [ln for ln in table.splitlines()[2:] if ln.strip()]
    before = cost_model.BY_OP_TOP
    every, three = rows("--cost-ops", "0"), rows("--cost-ops", "3")
    assert len(three) == 3 and len(every) > len(rows()) >= 3
    assert every[:3] == three
    assert cost_model.BY_OP_TOP == before
