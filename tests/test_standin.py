"""Stand-ins (kdagen.driver.standin_lowering): what sm_100a and sm_120a would run, compiled
for sm_90a so that an H100/H200 can check it. The stand-in's kernels must be planned exactly
as the chip's own compile plans them (storage, shared memory, threads, path)."""
from __future__ import annotations

import pytest

from kdagen.codegen.lower.kernel import LowerOptions, prepare
from kdagen.codegen.lower.program import read_program
from kdagen.driver import DEFAULT_LOWERING, Compilation, standin_lowering
from kdagen.target import get_target


def _plans(program: str, options: dict, chip: str, pipeline: str, lower: dict) -> dict:
    module = Compilation(program, options, chip, pipeline=pipeline).run_passes().module
    opts = LowerOptions(**{k: v for k, v in lower.items() if k != "pipeline"})
    out = {}
    for pk in prepare(read_program(module), get_target(chip), "k", opts):
        launch = pk.launch
        out[pk.name.split("__")[-1]] = (pk.storage, launch.get("dynamic_shared_memory"),
                                        tuple(launch["block"]),
                                        launch.get("scratch_bytes_per_cta"),
                                        launch.get("path", "portable"))
    return out


@pytest.mark.parametrize("chip,program,options", [
    ("sm_120a", "kda_bwd", dict(head_k_dim=64, head_v_dim=64, gate="softplus")),
    ("sm_120a", "gdn_fwd", dict(head_k_dim=128, head_v_dim=128, gate="gdn_softplus")),
    ("sm_100a", "kda_fwd", dict(head_k_dim=128, head_v_dim=128, gate="lower_bound",
                                gva_ratio=2, varlen=True)),
])
def test_standin_plans_match_the_chips_own(chip, program, options):
    own = _plans(program, options, chip, "chip", DEFAULT_LOWERING)
    lower = standin_lowering(chip)
    standin = _plans(program, options, "sm_90a", lower["pipeline"], lower)
    assert own and standin == own
    if chip == "sm_120a":            # its 99 KB: no kernel asks for more
        assert all(p[1] <= 99 * 1024 for p in standin.values())


def test_a_larger_chip_cannot_stand_in_on_a_smaller_one():
    with pytest.raises(ValueError, match="more shared memory"):
        standin_lowering("sm_90a", host="sm_120a")


def test_check_set_names_the_chip_and_takes_its_pipeline():
    from tools.check_bundle import STANDIN_PROGRAMS, standin_set
    items = standin_set(("sm_100a", "sm_120a"))
    assert len(items) == 2 * len(STANDIN_PROGRAMS)
    for program, options, lower, name in items:
        chip = name.rsplit("_as_", 1)[1]
        assert lower["pipeline"].startswith(f"kda-bind-target{{chip={chip}}}")
        assert lower["path"] == "portable"
    assert len({it[3] for it in items}) == len(items)
