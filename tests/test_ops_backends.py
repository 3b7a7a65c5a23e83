"""Executors (kdagen.runtime.backends): the registry, the CPU interpreter executor's program
cache (registered by kdagen.compiler_hooks), and the CUDA bundle executor's lookup logic — cache keys, atomic cache writes, corrupt
entries, KDAGEN_BUNDLE, compile-on-miss, and the errors — all without a GPU."""
import json
import os
import threading
import warnings

import pytest
import torch

from kdagen.runtime.bundle import MANIFEST, KernelEntry, Manifest, write_atomic
from kdagen import compiler_hooks
from kdagen.compiler_hooks import InterpreterExecutor
from kdagen.runtime import backends
from kdagen.runtime.backends import (BundleCache, BundleExecutor, BundleNotFoundError,
                                     KernelLaunchNotImplemented, OutSpec, cache_key,
                                     cache_key_fields)
from kdagen.version import source_hash

OPTS = dict(chunk_size=64, head_k_dim=128, head_v_dim=128, gate="softplus", gva_ratio=1,
            dtype="bf16", use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            allow_neg_eigval=False, use_initial_state=True, output_final_state=True, varlen=False)
KEY_ARGS = dict(program="kda_fwd", options=OPTS, chip="sm_90a", device_name="NVIDIA H200",
                ptxas_version="13.0.48", source_hash="abc123")


def key(**over):
    return cache_key(**{**KEY_ARGS, **over})


# ------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------


def test_executor_per_device_type():
    assert isinstance(backends.get_executor(torch.device("cpu")), InterpreterExecutor)
    assert isinstance(backends.get_executor("cuda"), BundleExecutor)
    assert backends.get_executor("cpu") is backends.get_executor("cpu")   # one instance


def test_register_executor_replaces_and_restores():
    old = backends.executors()["cpu"]
    sentinel = backends.Executor()
    try:
        backends.register_executor("cpu", sentinel)
        assert backends.get_executor("cpu") is sentinel
    finally:
        backends.register_executor("cpu", old)
    assert isinstance(backends.get_executor("cpu"), InterpreterExecutor)


def test_interpreter_executor_caches_programs_and_casts_outputs():
    from test_api import make_inputs
    compiler_hooks.stable_program.cache_clear()
    x, flags = make_inputs("gdn", dtype=torch.float16, T=10)
    inputs = {"q": x["q"].detach(), "k": x["k"].detach(), "v": x["v"].detach(), "g": x["g"].detach(),
              "beta": x["beta"].detach(), "initial_state": x["initial_state"].detach(), "scale": 0.125}
    opts = dict(OPTS, head_k_dim=64, head_v_dim=64, gate="gdn_precomputed", dtype="fp16",
                use_beta_sigmoid_in_kernel=False)
    ex = InterpreterExecutor()
    outs = {"o": OutSpec((1, 10, 1, 64), torch.float16), "final_state": OutSpec((1, 1, 64, 64), torch.float32)}
    r1 = ex.run("gdn_fwd", opts, inputs, outs)
    r2 = ex.run("gdn_fwd", dict(reversed(list(opts.items()))), inputs, outs)   # same options, other order
    info = compiler_hooks.stable_program.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert r1["o"].dtype == torch.float16 and r1["final_state"].dtype == torch.float32
    assert torch.equal(r1["o"], r2["o"])
    # the module went through kda-stable-reassociate: every exp2 carries its proven bound
    text = str(compiler_hooks.stable_program("gdn_fwd", backends.freeze_options(opts)))
    assert '"kda.exp2"' in text and "exp_bound" in text
    with pytest.raises(RuntimeError, match="expected \\[1, 10, 1, 32\\]"):
        ex.run("gdn_fwd", opts, inputs, {"o": OutSpec((1, 10, 1, 32), torch.float16)})


# ------------------------------------------------------------------------------------------
# cache keys
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,value", [
    ("program", "kda_bwd"), ("chip", "sm_100a"), ("device_name", "NVIDIA H100 80GB HBM3"),
    ("ptxas_version", "12.8.93"), ("ptxas_version", None), ("source_hash", "abc124"),
])
def test_every_key_field_changes_the_key(field, value):
    assert key(**{field: value}) != key()


@pytest.mark.parametrize("option", sorted(OPTS) + ["lower_bound"])
def test_every_option_changes_the_key(option):
    value = OPTS.get(option)
    new = {bool: lambda v: not v, int: lambda v: v * 2, str: lambda v: v + "_x",
           type(None): lambda v: -2.0}[type(value)](value)
    assert key(options={**OPTS, option: new}) != key()


def test_key_is_stable_and_order_independent():
    assert key() == key() == key(options=dict(reversed(list(OPTS.items()))))
    assert len(key()) == 32 and int(key(), 16) >= 0
    fields = cache_key_fields(**{**KEY_ARGS, "source_hash": None})
    assert fields["source_hash"] == source_hash()          # defaults to kdagen's own source hash
    assert fields["ptxas_version"] == "13.0.48" and fields["chip"] == "sm_90a"


# ------------------------------------------------------------------------------------------
# the on-disk cache
# ------------------------------------------------------------------------------------------


def write_bundle(folder, name="kda_fwd_k1", chip="sm_90a", hash_=None):
    write_atomic(folder / f"{name}.{chip}.ptx", "// ptx\n")
    m = Manifest(kdagen_version="0", source_hash=hash_ or source_hash(), ptxas_version=None,
                 kernels=[KernelEntry(name=name, chip=chip, path="portable", ptx_file=f"{name}.{chip}.ptx",
                                      params=[], launch={"block": [128, 1, 1]})])
    write_atomic(folder / MANIFEST, m.to_json())


def fields_for(**over):
    return cache_key_fields(**{**KEY_ARGS, "source_hash": source_hash(), **over})


def test_store_is_atomic_and_lookup_finds_it(tmp_path):
    cache = BundleCache(tmp_path)
    fields = fields_for()
    k = key(source_hash=source_hash())
    final = cache.path("kda_fwd", k)
    seen = {}

    def build(tmp):
        write_bundle(tmp)
        seen["final_exists_during_build"] = final.exists()
        seen["tmp"] = tmp
        assert tmp.parent == final.parent and tmp != final

    assert cache.lookup("kda_fwd", k, fields) is None
    path = cache.store("kda_fwd", k, fields, build)
    assert path == final and seen["final_exists_during_build"] is False
    assert not seen["tmp"].exists()                                    # renamed into place
    assert json.loads((final / "kdagen-cache-key.json").read_text()) == json.loads(json.dumps(fields))
    assert cache.lookup("kda_fwd", k, fields) == final
    assert [p.name for p in final.parent.iterdir()] == [k]              # no leftovers


def test_failed_build_leaves_nothing(tmp_path):
    cache = BundleCache(tmp_path)

    def build(tmp):
        write_bundle(tmp)
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.store("kda_fwd", "k1", fields_for(), build)
    assert list((tmp_path / "kda_fwd").iterdir()) == []

    with pytest.raises(RuntimeError, match="incomplete"):       # a build that writes no bundle
        cache.store("kda_fwd", "k1", fields_for(), lambda tmp: None)
    assert list((tmp_path / "kda_fwd").iterdir()) == []


@pytest.mark.parametrize("damage", ["manifest", "key_file", "kernel_file", "other_hash", "other_key"])
def test_corrupt_entry_is_ignored_and_replaced(tmp_path, damage):
    cache = BundleCache(tmp_path)
    fields = fields_for()
    entry = cache.path("kda_fwd", "k1")
    entry.mkdir(parents=True)
    write_bundle(entry, hash_="stale" if damage == "other_hash" else None)
    key_fields = fields_for(chip="sm_120a") if damage == "other_key" else fields
    (entry / "kdagen-cache-key.json").write_text(json.dumps(key_fields))
    if damage == "manifest":
        (entry / MANIFEST).write_text("{ not json")
    elif damage == "key_file":
        (entry / "kdagen-cache-key.json").write_text("")
    elif damage == "kernel_file":
        (entry / "kda_fwd_k1.sm_90a.ptx").unlink()
    with pytest.warns(RuntimeWarning, match="ignoring corrupt cache entry"):
        assert cache.lookup("kda_fwd", "k1", fields) is None
    path = cache.store("kda_fwd", "k1", fields, write_bundle)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.lookup("kda_fwd", "k1", fields) == path == entry
    assert sorted(p.name for p in entry.parent.iterdir()) == ["k1"]


def test_concurrent_stores_agree(tmp_path):
    cache = BundleCache(tmp_path)
    fields = fields_for()
    results, errors = [], []

    def worker():
        try:
            results.append(cache.store("kda_fwd", "k1", fields, write_bundle))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert cache.lookup("kda_fwd", "k1", fields) == results[0]
    assert sorted(p.name for p in (tmp_path / "kda_fwd").iterdir()) == ["k1"]


def test_cache_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "c"))
    assert backends.cache_root() == tmp_path / "c"
    monkeypatch.delenv("KDAGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert backends.cache_root() == tmp_path / "x" / "kdagen"
    assert backends.cache_root(tmp_path / "arg") == tmp_path / "arg"


# ------------------------------------------------------------------------------------------
# the bundle executor's lookup order (chip and device name given: no GPU needed)
# ------------------------------------------------------------------------------------------


def executor(tmp_path, *, mlir=False, compiler=None, bundle=None):
    return BundleExecutor(bundle=bundle, cache_dir=tmp_path / "cache", mlir_available=lambda: mlir,
                          compiler=compiler, ptxas_version=lambda: "13.0.48")


def test_explicit_bundle_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("KDAGEN_BUNDLE", raising=False)
    bundle = tmp_path / "bundle"
    write_bundle(bundle)
    assert executor(tmp_path, bundle=bundle).bundle_dir("kda_fwd", OPTS, "sm_90a", "H200") == bundle
    monkeypatch.setenv("KDAGEN_BUNDLE", str(bundle))
    assert executor(tmp_path).bundle_dir("kda_fwd", OPTS, "sm_90a", "H200") == bundle


def test_env_bundle_without_manifest_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_BUNDLE", str(tmp_path / "empty"))
    with pytest.raises(BundleNotFoundError) as info:
        executor(tmp_path).bundle_dir("kda_fwd", OPTS, "sm_90a", "H200")
    msg = str(info.value)
    assert "no manifest.json" in msg and "kdagen emit --arch sm_90a -o DIR" in msg


def test_no_bundle_and_no_compiler_says_how_to_emit_one(tmp_path, monkeypatch):
    monkeypatch.delenv("KDAGEN_BUNDLE", raising=False)
    with pytest.raises(BundleNotFoundError) as info:
        executor(tmp_path).bundle_dir("kda_bwd", OPTS, "sm_100a", "NVIDIA B200")
    msg = str(info.value)
    for frag in ("kda_bwd", "sm_100a", "NVIDIA B200", "numba-cuda-mlir",
                 "`kdagen emit --arch sm_100a -o DIR`", "KDAGEN_BUNDLE=DIR", str(tmp_path / "cache")):
        assert frag in msg, (frag, msg)


def test_compile_on_miss_then_cache_hit(tmp_path, monkeypatch):
    monkeypatch.delenv("KDAGEN_BUNDLE", raising=False)
    calls = []

    def compiler(program, options, chip, out_dir):
        calls.append((program, chip))
        write_bundle(out_dir, chip=chip)

    ex = executor(tmp_path, mlir=True, compiler=compiler)
    p1 = ex.bundle_dir("kda_fwd", OPTS, "sm_90a", "NVIDIA H200")
    p2 = ex.bundle_dir("kda_fwd", OPTS, "sm_90a", "NVIDIA H200")
    assert p1 == p2 and calls == [("kda_fwd", "sm_90a")]
    assert p1.parent.parent == tmp_path / "cache"
    # another process (a fresh executor without a compiler) finds the cached entry
    assert executor(tmp_path).bundle_dir("kda_fwd", OPTS, "sm_90a", "NVIDIA H200") == p1
    # other options or another chip are another entry
    ex.bundle_dir("kda_fwd", dict(OPTS, dtype="fp16"), "sm_90a", "NVIDIA H200")
    ex.bundle_dir("kda_fwd", OPTS, "sm_120a", "RTX PRO 6000")
    assert len(calls) == 3


def test_hooks_raise_clearly_without_a_launcher_or_a_registered_compiler(tmp_path, monkeypatch):
    import sys

    from kdagen.runtime import compile_hook
    # as if the launcher could not be imported (None in sys.modules makes the import fail)
    monkeypatch.setitem(sys.modules, "kdagen.runtime.launch", None)
    with pytest.raises(KernelLaunchNotImplemented, match="kdagen.runtime.launch"):
        backends.launch_bundle(None, tmp_path, "kda_fwd", OPTS, {}, "cuda:0", "sm_90a")
    assert issubclass(KernelLaunchNotImplemented, NotImplementedError)
    # the runtime alone: no compiler registered
    monkeypatch.setattr(compile_hook, "_COMPILER", None)
    assert not compile_hook.compiler_available() and compile_hook.toolchain_version() is None
    with pytest.raises(KernelLaunchNotImplemented, match="kdagen emit --arch sm_90a -o DIR"):
        backends.compile_bundle("kda_fwd", OPTS, "sm_90a", tmp_path)
    compile_hook.toolchain_version.cache_clear()


def test_the_compiler_registers_its_hooks():
    from kdagen.runtime import compile_hook
    assert compile_hook.registered_compiler() is compiler_hooks.COMPILER
    assert compile_hook.compiler_available()          # the MLIR bindings are installed here
    assert backends.executors()["cpu"] is InterpreterExecutor


def write_lowered(folder, variants):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lowered.json").write_text(json.dumps({"variants": variants}))


def test_find_variant_by_resolved_options(tmp_path):
    attrs = dict(OPTS, gate_options={"A_log_max": 2.77})
    lb_attrs = dict(OPTS, gate="lower_bound", gate_options={"lower_bound": -5.0})
    write_lowered(tmp_path, {
        "fwd_fp16": {"program": "kda_fwd", "attrs": dict(attrs, dtype="fp16")},
        "fwd_bf16": {"program": "kda_fwd", "attrs": attrs},
        "bwd_bf16": {"program": "kda_bwd", "attrs": attrs},
        "fwd_lb5": {"program": "kda_fwd", "attrs": lb_attrs},
        "fwd_opts_only": {"program": "gdn_fwd", "options": {"gate": "gdn_precomputed"}},
    })
    assert backends.find_variant(tmp_path, "kda_fwd", OPTS) == "fwd_bf16"
    assert backends.find_variant(tmp_path, "kda_bwd", OPTS) == "bwd_bf16"
    assert backends.find_variant(tmp_path, "kda_fwd", dict(OPTS, dtype="fp16")) == "fwd_fp16"
    lb = dict(OPTS, gate="lower_bound", lower_bound=-5.0)
    assert backends.find_variant(tmp_path, "kda_fwd", lb) == "fwd_lb5"
    assert backends.find_variant(tmp_path, "gdn_fwd", {"gate": "gdn_precomputed"}) == "fwd_opts_only"
    with pytest.raises(BundleNotFoundError) as info:
        backends.find_variant(tmp_path, "kda_fwd", dict(lb, lower_bound=-2.0), "sm_100a")
    msg = str(info.value)
    assert "no variant of kda_fwd" in msg and "fwd_lb5" in msg and "kdagen emit --arch sm_100a" in msg
    with pytest.raises(BundleNotFoundError, match="no readable lowered.json"):
        backends.find_variant(tmp_path / "nothing", "kda_fwd", OPTS)


def test_find_variant_skips_a_variant_built_with_an_option_the_call_leaves_out(tmp_path):
    """A bundle holding a precomputed-gate variant with lower_bound = -5 (a clamp of g) and
    one without: a call without lower_bound must get the second, whatever the names' order
    (the first was taken before: FLA's steep-gate D = 100 case failed on the H200)."""
    fp32_gate = dict(OPTS, gate="precomputed", gate_dtype="fp32")
    write_lowered(tmp_path, {
        "a_clamped": {"program": "kda_fwd", "options": dict(fp32_gate, lower_bound=-5.0),
                      "attrs": dict(fp32_gate, gate_options={"lower_bound": -5.0})},
        "b_split": {"program": "kda_decode", "options": dict(OPTS, value_split=4),
                    "attrs": dict(OPTS, value_split=4)},
        "c_plain": {"program": "kda_fwd", "options": fp32_gate, "attrs": fp32_gate},
        "d_plain": {"program": "kda_decode", "options": dict(OPTS), "attrs": dict(OPTS)},
    })
    assert backends.find_variant(tmp_path, "kda_fwd", fp32_gate) == "c_plain"
    assert backends.find_variant(tmp_path, "kda_fwd", dict(fp32_gate, lower_bound=-5.0)) \
        == "a_clamped"
    assert backends.find_variant(tmp_path, "kda_decode", OPTS) == "d_plain"
    assert backends.find_variant(tmp_path, "kda_decode", dict(OPTS, value_split=4)) == "b_split"


def test_find_variant_uses_the_variant_name(tmp_path):
    from kdagen.runtime.bundle import variant_name
    name = variant_name("kda_fwd", OPTS)
    write_lowered(tmp_path, {name: {"program": "kda_fwd", "attrs": {}}})   # matched by name alone
    assert backends.find_variant(tmp_path, "kda_fwd", OPTS) == name


def test_backends_module_imports_no_mlir():
    import subprocess
    import sys
    code = ("import sys, kdagen.runtime.backends, kdagen.ops, kdagen.api; "
            "assert not any(m.startswith('numba_cuda_mlir') for m in sys.modules); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_recording_lists_the_variants_a_model_needs():
    import kdagen
    from test_api import make_inputs
    before = backends.executors()["cpu"]
    with backends.recording("cpu") as rec:
        for _ in range(2):                                   # repeated calls: one variant each
            x, flags = make_inputs("kda", dtype=torch.bfloat16, T=300, H=2, HV=4, K=128, V=128,
                                   gate="lower_bound", lower_bound=-3.0)
            o, ht = kdagen.chunk_kda(**x, **flags)
            (o.float().sum() + ht.sum()).backward()
    assert backends.executors()["cpu"] is before
    assert [p for p, _ in rec.variants()] == ["kda_fwd", "kda_bwd"] and len(rec.calls) == 4
    opts = rec.variants()[0][1]
    assert opts["gate"] == "lower_bound" and opts["lower_bound"] == -3.0 and opts["gva_ratio"] == 2
    assert opts["head_k_dim"] == 128 and opts["dtype"] == "bf16"


def test_bundle_executor_run_with_a_stub_launcher(tmp_path, monkeypatch):
    """BundleExecutor.run end to end without a GPU: device queries and the launcher stubbed.
    The bundle is resolved once, the variant found in lowered.json, the runner reused, inputs
    passed by program name, and outputs cast to the requested dtypes."""
    import sys
    import types

    from kdagen.runtime import chips

    monkeypatch.delenv("KDAGEN_BUNDLE", raising=False)
    monkeypatch.setattr(chips, "chip_for_device", lambda index: "sm_90a")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    made, calls = [], []

    class StubProgram:
        def __init__(self, bundle_dir, variant, library=None):
            made.append(variant)

        def __call__(self, device=None, poison=True, **tensors):
            calls.append(sorted(tensors))
            return {"o": torch.ones(tensors["v"].shape, dtype=torch.bfloat16),
                    "final_state": torch.ones(1, 1, 64, 64)}

    stub = types.ModuleType("kdagen.runtime.launch")
    stub.LoweredProgram = StubProgram
    monkeypatch.setitem(sys.modules, "kdagen.runtime.launch", stub)

    def compiler(program, options, chip, out_dir):
        write_bundle(out_dir, chip=chip)
        write_lowered(out_dir, {"v1": {"program": program, "attrs": dict(options)}})

    ex = BundleExecutor(cache_dir=tmp_path, mlir_available=lambda: True, compiler=compiler,
                        ptxas_version=lambda: "13.0")
    monkeypatch.setattr(ex, "library", lambda path: object())
    v = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    inputs = {"q": v, "k": v, "v": v, "g": v, "beta": None, "scale": 0.125}
    outs = {"o": OutSpec((1, 8, 1, 64), torch.float32), "final_state": OutSpec((1, 1, 64, 64), torch.float32)}
    for _ in range(2):
        r = ex.run("kda_fwd", OPTS, inputs, outs)
    assert r["o"].dtype == torch.float32 and torch.equal(r["o"], torch.ones(1, 8, 1, 64))
    assert made == ["v1"] and len(calls) == 2
    assert calls[0] == ["g", "k", "q", "scale", "v"]                 # None inputs are dropped
    with pytest.raises(RuntimeError, match="returned no \\['dq'\\]"):
        ex.run("kda_fwd", OPTS, inputs, {"dq": OutSpec((1,), torch.float32)})


def test_find_variant_keeps_calling_conventions_apart(tmp_path):
    """A decode variant on a state pool (or with per-token states) takes other arguments: it
    is found only when the call asks for it, and a plain call never lands on it (sorted first
    here, it would match every option a plain call names)."""
    attrs = dict(OPTS)
    write_lowered(tmp_path, {
        "a_pool": {"program": "kda_decode", "attrs": dict(attrs, state_pool=True,
                                                          slot_dtype="i64")},
        "b_plain": {"program": "kda_decode", "attrs": attrs},
        "c_tokens": {"program": "kda_decode", "attrs": dict(attrs, output_token_states=True)},
    })
    assert backends.find_variant(tmp_path, "kda_decode", OPTS) == "b_plain"
    assert backends.find_variant(tmp_path, "kda_decode", dict(OPTS, state_pool=True)) == "a_pool"
    assert backends.find_variant(tmp_path, "kda_decode",
                                 dict(OPTS, output_token_states=True)) == "c_tokens"
    with pytest.raises(BundleNotFoundError):
        backends.find_variant(tmp_path, "kda_decode",
                              dict(OPTS, state_pool=True, output_token_states=True))
