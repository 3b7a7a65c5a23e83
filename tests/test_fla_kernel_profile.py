"""bench/fla_kernel_profile.py on the CPU: kernel names are shortened to what the table prints
(no template arguments, no argument list) and, without a GPU, the script says so and fails
rather than printing an empty table."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import fla_kernel_profile as prof  # noqa: E402


@pytest.mark.parametrize("name, short", [
    ("chunk_kda_bwd_kernel_intra", "chunk_kda_bwd_kernel_intra"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::R)",
     "void at::native::reduce_kernel"),
    ("kernel_with_args(float*, int)", "kernel_with_args"),
])
def test_short_names_drop_templates_and_arguments(name, short):
    assert prof.short_name(name) == short


def test_no_gpu_is_an_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this checks the CPU-only refusal")
    assert prof.main(["--json", os.devnull]) == 1
    assert "no GPU" in capsys.readouterr().err
