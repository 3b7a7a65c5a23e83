"""Program options: defaults, validation with clear errors, and the attributes that record them."""
import pytest

from kdagen.ir.dialect import print_module
from kdagen.ir.programs import (DEFAULT_OPTIONS, PROGRAMS, ProgramOptionError, build_program,
                                program_options)


def test_defaults():
    assert DEFAULT_OPTIONS["chunk_size"][0] == 64
    assert DEFAULT_OPTIONS["head_k_dim"][0] == DEFAULT_OPTIONS["head_v_dim"][0] == 128
    text = print_module(build_program("kda_fwd"))
    assert "kda.chunk_size = 64" in text and 'kda.gate = "softplus"' in text
    assert "tensor<64x128xf32>" in text
    assert 'kda.gate = "gdn_softplus"' in print_module(build_program("gdn_fwd"))
    assert program_options("gdn_fwd")["gate"][0] == "gdn_softplus"


@pytest.mark.parametrize("opts, match", [
    (dict(head_k_dim=96), r"head_k_dim: 96 is not one of \[64, 128, 256\]"),
    (dict(head_v_dim=32), r"head_v_dim: 32 is not one of \[64, 128\]"),
    (dict(chunk_size=48), r"chunk_size: 48 is not one of"),
    (dict(dtype="fp8"), r"dtype: 'fp8'"),
    (dict(gva_ratio=0), r"gva_ratio"),
    (dict(varlen="yes"), r"varlen: expected true or false"),
    (dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=False), r"allow_neg_eigval"),
    (dict(gate="nope"), r"unknown gate 'nope'"),
    (dict(frobnicate=1), r"unknown option 'frobnicate'"),
])
def test_invalid_options_name_the_option(opts, match):
    with pytest.raises(ValueError, match=match):
        build_program("kda_fwd", **opts)


def test_unknown_program():
    with pytest.raises(KeyError, match="unknown program"):
        build_program("kda_sideways")


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_options_are_recorded_and_shape_the_arguments(name):
    decode = name.endswith("_decode")        # one token per scan step: no chunk_size option
    C = 1 if decode else 32
    m = build_program(name, **({} if decode else {"chunk_size": C}), head_k_dim=64,
                      head_v_dim=128, dtype="fp16", gva_ratio=4, varlen=True,
                      use_initial_state=False, output_final_state=False)
    text = print_module(m)
    assert f"kda.chunk_size = {C}" in text and "kda.gva_ratio = 4" in text and "kda.varlen = true" in text
    assert "%cu_seqlens: memref<?xi64>" in text
    assert "memref<?x?x?x64xf16>" in text and f"tensor<{C}x128xf32>" in text
    assert "%initial_state" not in text
    assert "%final_state" not in text and "%dh0" not in text


def test_in_kernel_flags_change_the_program():
    plain = print_module(build_program("kda_fwd", use_qk_l2norm_in_kernel=False,
                                       use_beta_sigmoid_in_kernel=False, gate="precomputed"))
    full = print_module(build_program("kda_fwd", allow_neg_eigval=True))
    assert '"kda.rsqrt"' not in plain and '"kda.sigmoid"' not in plain and "%beta:" in plain and "%g:" in plain
    assert '"kda.rsqrt"' in full and '"kda.sigmoid"' in full and "%beta_raw:" in full and "%g_raw:" in full
    assert "%A_log:" in full and "%dt_bias:" in full and "%A_log:" not in plain
