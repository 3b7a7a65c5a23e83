"""The research gates of examples/gates/: each loads from its file, equals its torch
counterpart, and its derived forward and backward programs match autograd of that torch
counterpart in the float64 interpreter, at weak and strong decay (varlen included)."""
import math
from pathlib import Path

import pytest
import torch

from kdagen import interpreter
from kdagen.ir import gates
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.reference import rel_err

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "gates"
FILES = sorted(p.name for p in EXAMPLES.glob("*.py"))


def load(name):
    (gate,) = gates.load_gate_file(EXAMPLES / name)
    module = __import__("sys").modules[gate.fn.__module__]
    return gate, module


def test_there_are_three_research_gates_beyond_the_builtins():
    assert len(FILES) >= 3
    families = {load(f)[0].family for f in FILES}
    assert families == {"kda", "gdn"}
    kinds = [sorted(load(f)[0].params.values()) for f in FILES]
    assert ["channel", "channel"] in kinds          # a KDA gate with two per-channel params


@pytest.mark.parametrize("name", FILES)
def test_gate_equals_its_torch_counterpart(name):
    gate, mod = load(name)
    gen = torch.Generator().manual_seed(3)
    HV, K = 3, 8
    shape = (2, 5, HV, K) if gate.family == "kda" else (2, 5, HV)
    for decay in ("weak", "strong"):
        params = mod.sample_params(HV, K, decay, gen)
        g_raw = torch.randn(*shape, generator=gen, dtype=torch.float64) * 3
        got = gate.torch(g_raw, params)
        lo, hi = gate.enforced_range()
        want = mod.torch_reference(g_raw, **params).clamp(lo, hi)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-300), (name, decay)
        assert (got <= 0).all()


def _fwd_bwd(case, seed=0):
    family = case.family
    fwd = build_program(f"{family}_fwd", **case.options)
    bwd = build_program(f"{family}_bwd", **case.options)
    out = interpreter.run(fwd, case.inputs)
    o_ref, ht_ref = case.reference()
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(ht_ref.shape, generator=gen, dtype=torch.float64)
    grads = interpreter.run(bwd, dict(case.inputs, do=do, dht=dht))
    return out, (o_ref, ht_ref), grads, case.reference_grads(do, dht)


@pytest.mark.parametrize("decay", ["weak", "strong"])
@pytest.mark.parametrize("name", FILES)
def test_forward_and_backward_match_autograd_of_the_torch_counterpart(name, decay):
    gate, mod = load(name)
    varlen = decay == "strong"
    shape = dict(lengths=[1, 30, 45]) if varlen else dict(B=1, T=70)
    case = make_case(gate.family, gate=gate, gate_fn=mod.torch_reference, H=1, HV=2,
                     seed=21, **shape)
    case.inputs.update(mod.sample_params(2, 64, decay, torch.Generator().manual_seed(5)))
    g_ref = gate.torch(case.inputs["g_raw"], {p: case.inputs[p] for p in gate.params})
    if decay == "weak":
        assert g_ref.abs().max() < 5e-3
    else:
        assert g_ref.min() < -2.0
    out, (o_ref, ht_ref), grads, ref = _fwd_bwd(case)
    assert rel_err(out["o"], o_ref) <= 1e-10
    assert rel_err(out["final_state"], ht_ref) <= 1e-10
    want = {"dq", "dk", "dv", "dg_raw", "dbeta_raw", "dh0", *("d" + p for p in gate.params)}
    assert set(grads) == want
    for k in want:
        assert rel_err(grads[k], ref[k]) <= 1e-9, k


def test_reloading_an_edited_gate_file_changes_its_digest(tmp_path):
    src = (EXAMPLES / "sq_sigmoid.py").read_text()
    path = tmp_path / "my_gate.py"
    path.write_text(src.replace('"sq_sigmoid"', '"my_sq_sigmoid"'))
    (first,) = gates.load_gate_file(path)
    again = gates.load_gate_file(path)[0]
    assert again.digest == first.digest
    path.write_text(path.read_text().replace("** 2", "** 3"))
    (edited,) = gates.load_gate_file(path)
    assert edited.digest != first.digest and gates.get_gate("my_sq_sigmoid") is edited
    # kernels built for the old gate are refused for the new one, not silently reused
    from kdagen.ir.programs import ProgramOptionError
    with pytest.raises(ProgramOptionError, match="edited"):
        build_program("kda_fwd", gate="my_sq_sigmoid", gate_digest=first.digest)
    assert 'kda.gate_digest = "' + edited.digest in str(
        build_program("kda_fwd", gate="my_sq_sigmoid", gate_digest=edited.digest))
    gates.GATES.pop("my_sq_sigmoid")


def test_gate_file_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(gates.GateFileError, match="does not exist"):
        gates.load_gate_file(tmp_path / "missing.py")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(gates.GateFileError, match="defines no gate"):
        gates.load_gate_file(empty)
    broken = tmp_path / "broken.py"
    broken.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(gates.GateFileError, match="failed to load.*nonexistent_module_xyz"):
        gates.load_gate_file(broken)
    clash = tmp_path / "clash.py"
    clash.write_text("from kdagen.ir.gates import define_gate\n"
                     "@define_gate('softplus', range=(-1, 0))\n"
                     "def f(g_raw, A_log, dt_bias):\n    return g_raw\n")
    with pytest.raises(gates.GateFileError, match="built-in"):
        gates.load_gate_file(clash)
    assert gates.get_gate("softplus").builtin


def test_parameter_names_that_collide_with_program_arguments_are_refused():
    with pytest.raises(ValueError, match="taken"):
        gates.define_gate("bad_gate", register=False)(lambda g_raw, beta: -beta * g_raw)
    with pytest.raises(ValueError, match="range"):
        gates.define_gate("bad_range", range=(0.0, -1.0), register=False)


def test_gate_files_and_their_torch_reference_need_no_compiler():
    """A GPU machine that runs bundles has no MLIR: gate files must load and evaluate there."""
    import subprocess
    import sys
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.startswith('numba_cuda_mlir'): raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch\n"
        "from kdagen.ir.gates import load_gate_file\n"
        f"(g,) = load_gate_file({str(EXAMPLES / 'kda_channel_rate.py')!r})\n"
        "x = torch.randn(1, 4, 2, 8, dtype=torch.float64)\n"
        "p = {'rate': torch.zeros(2, 8, dtype=torch.float64), 'sharpness': torch.zeros(2, 8, dtype=torch.float64)}\n"
        "print(g.torch(x, p).shape, g.digest)\n"
        "assert not any(m.startswith('numba_cuda_mlir') for m in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "torch.Size([1, 4, 2, 8])" in res.stdout
