"""The benchmark's CPU-side pieces: configs, roofline counts, CLI behaviour without a GPU."""
import pytest
import torch
from click.testing import CliRunner

from kdagen import benchmark
from kdagen.cli import main


def test_configs_cover_design_section_6():
    assert set(benchmark.CONFIGS) == {"B1_T8k_H16", "B1_T32k_H16", "B1_T32k_H32", "B8_T4k_H32",
                                      "varlen_mix_H16", "gva_H4_HV16_T8k"}
    B, T, H, HV, lengths = benchmark.CONFIGS["gva_H4_HV16_T8k"]
    assert HV == 4 * H and lengths is None


def test_roofline_counts_grow_with_the_work():
    fwd = benchmark.bytes_moved(1, 8192, 16, 16, 128, 128, "kda", backward=False)
    assert fwd == 8192 * (16 * 2 * 128 + 16 * (128 + 128 + 1 + 128)) * 2
    assert benchmark.bytes_moved(1, 8192, 16, 16, 128, 128, "kda", backward=True) > fwd
    assert benchmark.bytes_moved(1, 8192, 16, 16, 128, 128, "gdn", backward=False) < fwd
    assert benchmark.flops_per_token(128, 128, backward=True) > benchmark.flops_per_token(128, 128)


def test_make_inputs_varlen_and_gva_shapes():
    x, kw, T = benchmark.make_inputs("kda", 1, 0, 4, 16, [5, 7], "cpu")
    assert T == 12 and x["q"].shape == (1, 12, 4, 128) and x["v"].shape == (1, 12, 16, 128)
    assert kw["cu_seqlens"].tolist() == [0, 5, 12] and x["initial_state"].shape[0] == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_without_gpu_says_so():
    result = CliRunner().invoke(main, ["bench", "--ops", "kda"])
    assert result.exit_code == 2


def test_results_record_the_reference_stack():
    """Which FLA path ran depends on whether TileLang is importable: every JSON says."""
    from importlib import metadata
    stack = benchmark.reference_stack()
    assert set(stack) == {"fla-core", "flash-qla", "tilelang", "triton", "torch"}
    assert stack["torch"] == metadata.version("torch")
    for dist, version in stack.items():
        try:
            assert version == metadata.version(dist)
        except metadata.PackageNotFoundError:
            assert version is None, dist


def test_flashqla_kernels_get_the_tilelang_init_check_switched_off(tmp_path, monkeypatch):
    """FlashQLA 0.1.3's backward stops at TileLang 0.1.15's buffer-initialisation check; the
    benchmark switches the check off on every jitted kernel of the flash_qla package (a fake
    package and a fake TileLang here: neither is installed on CPU machines)."""
    import sys
    import types

    from kdagen import benchmark

    pkg = tmp_path / "flash_qla"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "fused_bwd.py").write_text(
        "class JITImpl:\n    def __init__(self, pc):\n        self.pass_configs = pc\n"
        "with_configs = JITImpl({'tl.enable_fast_math': True})\n"
        "without_configs = JITImpl(None)\n")
    (pkg / "ops" / "broken.py").write_text("raise ImportError('a part for another chip')\n")
    tilelang = types.SimpleNamespace(PassConfigKey=types.SimpleNamespace(
        TL_DISABLE_BUFFER_INIT_CHECK="tl.disable_buffer_init_check"))
    monkeypatch.setitem(sys.modules, "tilelang", tilelang)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("flash_qla")]:
        monkeypatch.delitem(sys.modules, name)
    benchmark._relax_tilelang_init_check()
    from flash_qla.ops import fused_bwd
    assert fused_bwd.with_configs.pass_configs == {"tl.enable_fast_math": True,
                                                   "tl.disable_buffer_init_check": True}
    assert fused_bwd.without_configs.pass_configs == {"tl.disable_buffer_init_check": True}
    for name in [m for m in sys.modules if m.startswith("flash_qla")]:
        monkeypatch.delitem(sys.modules, name)


def test_host_enqueue_time_is_the_median_call_and_waits_outside_it():
    """bench rows record each implementation's host time per call (``<impl>_host_ms``): the
    median over calls, each started after a synchronize, the synchronize itself not timed
    (a fake clock: the calls take 1, 5, 2, 3, 4 ms, each synchronize 10 ms)."""
    now = [0.0]
    durations = iter([0.001, 0.005, 0.002, 0.003, 0.004])
    calls, syncs = [], []

    def fn():
        calls.append(1)
        now[0] += next(durations)

    def sync():
        syncs.append(1)
        now[0] += 0.010
    ms = benchmark.host_enqueue_ms(fn, reps=5, synchronize=sync, clock=lambda: now[0])
    assert len(calls) == 5 and len(syncs) == 10
    assert ms == pytest.approx(3.0)


def test_small_head_configs_are_asked_by_name():
    """HV = 2, 4, 8 at T = 32k (the context-parallelism configs) are known to --configs but
    not in the default set; an unknown name is refused before anything runs."""
    assert set(benchmark.SMALL_HEAD_CONFIGS) == {"B1_T32k_H2", "B1_T32k_H4", "B1_T32k_H8"}
    assert all(v == (1, 32768, h, h, None) for h, v in
               zip((2, 4, 8), benchmark.SMALL_HEAD_CONFIGS.values()))
    default = benchmark.build_parser().parse_args([]).configs.split(",")
    assert set(default) == set(benchmark.CONFIGS)
    with pytest.raises(SystemExit):
        benchmark.main(["--configs", "B1_T32k_H3"])


def test_head_dim_sets_k_and_v_of_every_input():
    x, kw, _ = benchmark.make_inputs("kda", 1, 70, 2, 4, None, "cpu", head_dim=64)
    assert x["q"].shape[-1] == x["k"].shape[-1] == x["v"].shape[-1] == 64
    assert x["initial_state"].shape[-2:] == (64, 64) and kw["dt_bias"].numel() == 4 * 64
    parser = benchmark.build_parser()
    assert parser.parse_args(["--head-dim", "64"]).head_dim == 64
    assert parser.parse_args([]).head_dim == 128
    with pytest.raises(SystemExit):
        parser.parse_args(["--head-dim", "96"])


def test_summary_table_has_every_implementation_and_marks_host_bound_calls():
    """The end-to-end table takes its columns from every row (FlashQLA's GDN rows came after
    KDA's, whose references were the last family's, and lost their column), and marks a time
    whose host enqueue time is at least HOST_BOUND_SHARE of it."""
    from kdagen.benchmark import HOST_BOUND_SHARE, summary_table
    rows = [
        {"op": "gdn", "config": "B1_T8k_H16", "mode": "fwd", "kdagen_ms": 0.4,
         "kdagen_host_ms": 0.39, "fla_ms": 0.8, "fla_host_ms": 0.1, "flashqla_ms": 0.75,
         "ratio_fla_over_kdagen": 2.0, "ratio_flashqla_over_kdagen": 1.875, "floor_ms": 0.03},
        {"op": "kda", "config": "B1_T32k_H16", "mode": "fwd", "kdagen_ms": 2.5,
         "kdagen_host_ms": 1.0, "fla_error": "RuntimeError: x", "ratio_fla_over_kdagen": 1.0,
         "floor_ms": 0.15},
    ]
    header, gdn, kda, note = summary_table(rows)
    assert header.split(" | ") == ["op", "config", "mode", "kdagen ms", "fla ms", "flashqla ms",
                                   "FLA/kdagen", "FlashQLA/kdagen", "floor ms"]
    assert gdn.split(" | ")[3:6] == ["0.400*", "0.800", "0.750"]    # 0.39 >= 0.9 * 0.4
    assert kda.split(" | ")[3:6] == ["2.500", "ERR", "-"]
    assert note.startswith("* host-bound") and f"{HOST_BOUND_SHARE:.0%}" in note
    assert len(summary_table(rows[1:])) == 2                         # nothing marked: no note
