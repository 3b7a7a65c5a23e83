"""The tuning table (kdagen.codegen.lower.tuning): per-kernel lowering options measured faster
than the defaults. An entry changes only its kernel of its program and head dims on its chip,
only options left at their defaults, nothing with ``tuned=False``; the lowered kernel records
what was applied; kda_bwd at K = V = 64 assembles for sm_90a without spills (its dk kernel
spilled 8 bytes at load_batch 8)."""
from __future__ import annotations

from kdagen.codegen.lower.options import LowerOptions
from kdagen.codegen.lower.tuning import TUNED, tuned_options

from conftest import requires_ptxas


def test_an_entry_applies_to_its_kernel_only_and_only_over_defaults():
    entry = TUNED[0]
    name, value = entry.options[0]
    opts, applied = tuned_options(LowerOptions(), entry.chip, entry.path, entry.program,
                                  entry.head_dims, entry.kernel)
    assert applied == {name: value} and getattr(opts, name) == value
    for other in ((entry.chip, entry.path, entry.program, entry.head_dims, "k2_scan2"),
                  ("sm_120a", entry.path, entry.program, entry.head_dims, entry.kernel),
                  (entry.chip, "portable", entry.program, entry.head_dims, entry.kernel),
                  (entry.chip, entry.path, "gdn_bwd", entry.head_dims, entry.kernel),
                  (entry.chip, entry.path, entry.program, (32, 32), entry.kernel)):
        opts, applied = tuned_options(LowerOptions(), *other)
        assert applied == {} and opts == LowerOptions()
    explicit = LowerOptions(**{name: 4})                   # the caller's value wins
    assert tuned_options(explicit, entry.chip, entry.path, entry.program, entry.head_dims,
                         entry.kernel) == (explicit, {})
    off = LowerOptions(tuned=False)
    assert tuned_options(off, entry.chip, entry.path, entry.program, entry.head_dims,
                         entry.kernel) == (off, {})


def test_every_entry_names_real_options_and_its_evidence():
    fields = set(LowerOptions.__dataclass_fields__)
    for entry in TUNED:
        assert {n for n, _ in entry.options} <= fields
        assert "bench/results/" in entry.evidence


def _lowered(K: int, **lower):
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    comp = Compilation("kda_bwd", dict(head_k_dim=K, head_v_dim=K), "sm_90a",
                       lower=dict(DEFAULT_LOWERING, **lower))
    comp.run(until="gpu")
    return comp


def test_the_lowered_kernels_record_the_options_applied():
    kernels = {k.name.split("__")[-1]: k for k in _lowered(64).kernels}
    assert kernels["k4_scan4"].launch.get("tuned") == {"load_batch": 2}
    assert all("tuned" not in k.launch for n, k in kernels.items() if n != "k4_scan4")
    off = {k.name.split("__")[-1]: k for k in _lowered(64, tuned=False).kernels}
    assert "tuned" not in off["k4_scan4"].launch
    # and the cost report (kdagen show --stage cost) says so
    from kdagen.codegen.lower.cost_model import format_report
    assert "tuning table's (kdagen.codegen.lower.tuning) load_batch=2" in \
        format_report("k4", kernels["k4_scan4"].cost)
    assert "tuning table" not in format_report("k4", off["k4_scan4"].cost)


@requires_ptxas
def test_kda_bwd_k64_assembles_without_spills():
    comp = _lowered(64)
    comp.run(until="cubin")
    for name, res in comp.assembled.items():
        assert res.ok, name
        assert all(r.spills == 0 for r in res.resources.values()), name


def test_register_scans_take_their_entries_too():
    """The serial register-scan kernels take the table's entries for their own path
    (sm90-register-scan): gdn_bwd's reverse scan is lowered with slot barriers and two
    consumer warpgroups per CTA, as if the options were given (its static cost report equal
    to that lowering's, and unlike the one without); kda_bwd's with two warpgroups only."""
    from kdagen.driver import DEFAULT_LOWERING, Compilation

    def kernels(program, **lower):
        comp = Compilation(program, dict(head_k_dim=128, head_v_dim=128), "sm_90a",
                           lower=dict(DEFAULT_LOWERING, **lower))
        comp.run(until="gpu")
        return {k.name.split("__")[-1]: k for k in comp.kernels}

    def step(k):
        return {key: v for key, v in k.cost.items() if key not in ("tuned",)}

    gdn = kernels("gdn_bwd")
    assert gdn["k3_scan3"].launch["path"] == "sm90-register-scan"
    assert gdn["k3_scan3"].launch.get("tuned") == {"scan_slot_barriers": True,
                                                    "scan_warpgroups": 2}
    assert gdn["k3_scan3"].launch["grid"][0] == "HV"          # one CTA per head
    # the other entries of gdn_bwd: its recompute prologue on register tiles
    assert {n for n, k in gdn.items() if "tuned" in k.launch} == {"k0_scan0", "k3_scan3"}
    given = kernels("gdn_bwd", tuned=False, scan_slot_barriers=True,
                    scan_warpgroups=2)["k3_scan3"]
    without = kernels("gdn_bwd", tuned=False)["k3_scan3"]
    assert step(gdn["k3_scan3"]) == step(given) != step(without)
    kda = kernels("kda_bwd")
    assert kda["k3_scan3"].launch.get("tuned") == {"scan_warpgroups": 2}


def test_tune_entries_apply_to_their_kernel_over_any_option():
    from kdagen.codegen.lower.tuning import parse_tune
    text = ("gdn_bwd.k2_scan2:register_tiles=true+register_tile_warpgroups=2,"
            "gdn_fwd.k0_scan0:register_tile_ctas_per_sm=1")
    assert parse_tune(text) == {
        ("gdn_bwd", "k2_scan2"): {"register_tiles": True, "register_tile_warpgroups": 2},
        ("gdn_fwd", "k0_scan0"): {"register_tile_ctas_per_sm": 1}}
    base = LowerOptions(tune=text, register_tiles=False)     # an explicit value: tune wins
    opts, applied = tuned_options(base, "sm_90a", "sm90-native", "gdn_bwd", (128, 128),
                                  "k2_scan2")
    assert applied == {"register_tiles": True, "register_tile_warpgroups": 2}
    assert opts.register_tiles is True and opts.register_tile_warpgroups == 2
    opts, applied = tuned_options(base, "sm_90a", "sm90-native", "gdn_bwd", (128, 128),
                                  "k4_scan4")
    assert applied == {} and opts == base                   # another kernel: untouched
    off = LowerOptions(tune=text, tuned=False)              # the table off, tune still applies
    assert tuned_options(off, "sm_120a", "portable", "gdn_fwd", (64, 64),
                         "k0_scan0")[1] == {"register_tile_ctas_per_sm": 1}


def test_bad_tune_entries_are_refused_naming_the_entry():
    import pytest

    from kdagen.codegen.lower.tuning import parse_tune
    assert parse_tune("") == {}
    for bad, match in (("gdn_bwd:load_batch=2", "PROGRAM.KERNEL"),
                       ("gdn_bwd.k2_scan2", "PROGRAM.KERNEL"),
                       ("gdn_bwd.k2_scan2:no_such=1", "no_such"),
                       ("gdn_bwd.k2_scan2:load_batch=two", "not a number"),
                       ("gdn_bwd.k2_scan2:tune=x", "cannot be tuned")):
        with pytest.raises(ValueError, match=match):
            parse_tune(bad)
