"""kda-share-chunk-values: the backward's later chunk kernels load the inverse, w and u that its
prologue computed (golden kernel contents), and the program computes the same gradients before
and after the pass (the float64 interpreter: equal up to the order of a few additions, as the
loaded values are the recomputed ones; rows past a sequence end load as 0 and are never
stored)."""
import pytest
import torch

from kdagen import interpreter
from kdagen.ir.dialect import print_module
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.registry import parse_pipeline
from kdagen.reference import rel_err

BEFORE = "kda-stable-reassociate,kda-partition{workspace_dtype=fp32}"
AFTER = BEFORE + ",kda-share-chunk-values"


def _kernels(module) -> dict:
    """kernel name -> the text of its scan body."""
    text = print_module(module)
    out, start = {}, 0
    for part in text.split('kda.kernel = "')[1:]:
        name = part.split('"', 1)[0]
        body = text[start:text.index(f'kda.kernel = "{name}"')]
        out[name] = body[body.rfind('"kda.scan"'):]
        start = text.index(f'kda.kernel = "{name}"') + 1
    return out


def _backward_inputs(family, case):
    fwd = build_program(f"{family}_fwd", **case.options)
    res = interpreter.run(fwd, case.inputs)
    gen = torch.Generator().manual_seed(3)
    x = dict(case.inputs, do=torch.randn(res["o"].shape, generator=gen, dtype=torch.float64))
    if "final_state" in res:
        x["dht"] = torch.randn(res["final_state"].shape, generator=gen, dtype=torch.float64)
    return x


@pytest.mark.parametrize("family,spec", [
    ("kda", dict(gate="softplus", lengths=[1, 70, 64], H=1, HV=2)),
    ("kda", dict(gate="lower_bound", lower_bound=-5.0, B=1, T=130, H=1, HV=1)),
    ("gdn", dict(gate="gdn_softplus", lengths=[64, 3, 100], H=1, HV=2)),
])
def test_sharing_computes_the_same_gradients(family, spec):
    _same_gradients(family, spec, BEFORE, AFTER)


def _same_gradients(family, spec, before_passes: str, after_passes: str) -> None:
    """The backward under ``after_passes`` differs from, and computes what, ``before_passes``
    does (float64 interpreter)."""
    case = make_case(family, seed=11, **spec)
    x = _backward_inputs(family, case)
    before = build_program(f"{family}_bwd", **case.options)
    run_pipeline(before, parse_pipeline(before_passes))
    after = build_program(f"{family}_bwd", **case.options)
    run_pipeline(after, parse_pipeline(after_passes))
    assert str(after) != str(before)
    ref, got = interpreter.run(before, x), interpreter.run(after, x)
    assert set(got) == set(ref)
    for key in ref:
        assert rel_err(got[key], ref[key]) <= 1e-14, key


def test_backward_kernels_after_the_scans_no_longer_invert():
    module = build_program("kda_bwd")                 # K = V = 128, C = 64
    run_pipeline(module, parse_pipeline(AFTER))
    kernels = _kernels(module)
    assert "kda.tril_inv" in kernels["kda_bwd0_chunk"]
    for name in ("kda_bwd1_chunk", "kda_bwd1_out"):
        assert "kda.tril_inv" not in kernels[name], name
        # u from a workspace of its own, not the u_ws the recompute scan reads
        assert '"kda.load_chunk"(%u1_ws' in kernels[name]
        assert '"kda.load_chunk"(%w_ws' not in kernels[name]
    assert '"kda.load_chunk"(%w1_ws' in kernels["kda_bwd1_chunk"]
    # the dk kernel still needs the inverse and the decay product itself: loaded, not recomputed
    assert '{name = "Akk_inv"}' in kernels["kda_bwd1_out"]
    assert kernels["kda_bwd1_out"].count('"kda.decay_dot"') == 0
    # the prologue stores them once, in fp32
    assert kernels["kda_bwd0_chunk"].count('{name = "Akk_inv"}') == 1
    assert 'name = "Akk_inv_ws"} : () -> memref<?x?x64x64xf32>' in print_module(module)


def test_forward_has_nothing_to_share():
    """The forward's out kernel needs only cheap chunk values (q·k decay products it alone
    computes): the pass leaves it as it is."""
    module = build_program("kda_fwd")
    run_pipeline(module, parse_pipeline(BEFORE))
    text = str(module)
    run_pipeline(module, parse_pipeline("kda-share-chunk-values"))
    assert str(module) == text


def test_shared_workspaces_have_names_of_their_own():
    """The runtime allocates workspaces by name: a shared value must not land in a buffer that
    another workspace of the program (kda-partition names the forward recompute's and the
    reverse scan's copies of w both ``w_ws``) also means."""
    import re
    before = build_program("kda_bwd")
    run_pipeline(before, parse_pipeline(BEFORE))
    after = build_program("kda_bwd")
    run_pipeline(after, parse_pipeline(AFTER))
    names = lambda m: re.findall(r'"kda.workspace"\(\) \{layout = "chunk", name = "(\w+)"\}',
                                  print_module(m))
    new = [n for n in names(after) if n not in names(before)]
    assert {"Akk_inv_ws", "w1_ws", "u1_ws"} <= set(new)
    assert len(new) == len(set(new)) and not set(new) & set(names(before))


def test_dk_kernel_loads_what_the_dq_kernel_computed_from_the_checkpoints():
    """The dq kernel and the dk kernel both read the state checkpoints S, w and u, which no
    kernel writes between them (the reverse scan between them writes dS and dv'): the products
    both compute from them (w S, do v'ᵀ, do Sᵀ and the dq decay product) are computed once, in
    the dq kernel, and the dk kernel loads them; what needs dS stays in the dk kernel."""
    module = build_program("kda_bwd")
    run_pipeline(module, parse_pipeline(AFTER))
    kernels = _kernels(module)
    dq, dk = kernels["kda_bwd1_chunk"], kernels["kda_bwd1_out"]
    for name in ("dAqk", "dqd", "dqn", "dot"):
        assert dq.count(f'{{name = "{name}"}} : (memref') == 1, name
        assert f'"kda.load_chunk"(%{name}_ws' in dk, name
    assert '"kda.load_chunk"(%w1_ws' not in dk            # w S arrives whole
    assert dk.count('"kda.decay_matmul"') == 3            # dk's own three (dq's is loaded)
    assert dq.count('"kda.decay_matmul"') == 1
    assert '"kda.load_chunk"(%dS_chunks' in dk and '"kda.load"(%do' not in dk


HOIST = BEFORE + ",kda-share-chunk-values{hoist_products=true}"


@pytest.mark.parametrize("family,spec", [
    ("kda", dict(gate="softplus", lengths=[1, 70, 64], H=1, HV=2)),
    ("gdn", dict(gate="gdn_softplus", lengths=[64, 3, 100], H=1, HV=2)),
])
def test_hoisted_products_compute_the_same_gradients(family, spec):
    """hoist_products: the same gradients (float64 interpreter) as without the option."""
    _same_gradients(family, spec, AFTER, HOIST)


def test_hoisted_products_run_in_the_prologue():
    """hoist_products: the query-key decay product, which the dq kernel computed from the
    chunk's inputs alone, runs in the prologue beside Akk's (with the query load and norm it
    needs), and so does its product with do, which the dq kernel then loads (stored right
    after it, not at the kernel's end); the decay product itself no kernel loads, so it is not
    stored. Products of the checkpoints (written by the recompute scan after the prologue)
    stay where they were."""
    module = build_program("kda_bwd")
    run_pipeline(module, parse_pipeline(HOIST))
    kernels = _kernels(module)
    pro, dq, dk = kernels["kda_bwd0_chunk"], kernels["kda_bwd1_chunk"], kernels["kda_bwd1_out"]
    assert pro.count('"kda.decay_dot"') == 2 and '"kda.load"(%q' in pro
    assert '"kda.decay_dot"' not in dq and '"kda.decay_dot"' not in dk
    lines = pro.splitlines()
    stores = [i for i, line in enumerate(lines) if '"kda.store_chunk"(%dv_new1_ws' in line]
    assert len(stores) == 1
    stored = lines[stores[0]].split(", ")[2].split(")")[0]
    assert f"{stored} = " in lines[stores[0] - 1]              # right after it
    assert '"kda.load_chunk"(%dv_new1_ws' in dq
    assert sum('"kda.store_chunk"(%decay_dot' in line for line in lines) == 1   # Akk's, for dk
    assert dq.count('"kda.decay_matmul"') == 1 and '"kda.load_chunk"(%S_chunks' in dq


def test_forward_hoists_the_output_kernels_decay_product():
    """In the forward the output kernel's q·k decay product moves to the prologue; the output
    kernel keeps the rest (the gate's cumsum for q ⊙ 2^Γ) and loads the product."""
    module = build_program("kda_fwd")
    run_pipeline(module, parse_pipeline(HOIST))
    kernels = _kernels(module)
    assert kernels["kda_fwd_chunk"].count('"kda.decay_dot"') == 2
    assert '"kda.decay_dot"' not in kernels["kda_fwd_out"]
    assert '"kda.cumsum"' in kernels["kda_fwd_out"]
