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
