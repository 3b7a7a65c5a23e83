"""kda-assign-layouts: the layouts it gives the real programs' kernels (the register-resident
scans' orientation and workspace contract come out of its cost choices), conversions only
where layouts meet, semantics unchanged, and the kernels lowered from its output identical."""
import re

import pytest

from kdagen import interpreter
from kdagen.ir.programs import build_program
from kdagen.ir.testing import make_case
from kdagen.passes.assign_layouts import conversion_bytes
from kdagen.passes.pipeline import run_pipeline
from kdagen.passes.pipelines import PIPELINES
from kdagen.passes.registry import parse_pipeline
from kdagen.reference import rel_err

BEFORE = ",".join(p for p in PIPELINES["sm_90a"] if p not in ("kda-assign-layouts",))


def _laid_out(program, chip="sm_90a", **options):
    module = build_program(program, **options)
    run_pipeline(module, parse_pipeline(",".join(PIPELINES[chip])))
    return module


def _kernel(module, name):
    func = module.body.operations[0]
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "kda.scan" and "kda.kernel" in op.attributes and \
                str(op.attributes["kda.kernel"]).strip('"') == name:
            return op
    raise KeyError(name)


def _layout(op):
    return str(op.attributes["kda.tile_layout"]).strip('"')


def _body(scan):
    return [o.operation for o in scan.regions[0].blocks[0].operations]


def _workspace_layouts(module):
    func = module.body.operations[0]
    out = {}
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "kda.workspace":
            name = str(op.attributes["name"]).strip('"')
            out[name] = (_layout(op) if "kda.tile_layout" in op.attributes else "smem")
    return out


def test_forward_state_scan_is_register_resident():
    """The forward recurrence: the state carried as Sᵀ in accumulators (acc_t), w·S computed
    as Sᵀ·wᵀ with the state as the register A operand, v' reused in place as the A operand of
    kᵀ·v', kr stored transposed by the kernel that writes it; the one conversion of the step is
    u read from shared memory into v''s fragments."""
    module = _laid_out("kda_fwd")
    scan = _kernel(module, "kda_fwd_state")
    assert [str(a).strip('"') for a in scan.attributes["kda.carried_layouts"]] == ["acc_t"]
    ops = _body(scan)
    dots = [o for o in ops if o.name == "kda.dot"]
    assert [_layout(d) for d in dots] == ["acc_t", "acc_t"]
    conversions = [o for o in ops if o.name == "kda.convert_layout"]
    assert len(conversions) == 1 and _layout(conversions[0]) == "acc_t"
    loaded = conversions[0].operands[0].owner
    loaded = loaded.operation if hasattr(loaded, "operation") else loaded
    assert loaded.name == "kda.pipeline_wait"
    # no conversion feeds either product
    for d in dots:
        for v in d.operands:
            owner = v.owner.operation if hasattr(v.owner, "operation") else v.owner
            assert getattr(owner, "name", "") != "kda.convert_layout"
    assert _workspace_layouts(module)["kr_ws"] == "smem_t"
    assert _workspace_layouts(module)["w_ws"] == "smem"


def test_reverse_scan_takes_the_transposed_operands_stored_transposed():
    """The backward's reverse dS scan: qdᵀ·(do·scale) and wᵀ·dv' read qd and w stored
    transposed (the register scan's workspace contract), kr·dS reads kr as stored, and the
    element-wise do·scale runs in the fragments its product takes."""
    module = _laid_out("kda_bwd")
    scan = _kernel(module, "kda_bwd1_state")
    assert [str(a).strip('"') for a in scan.attributes["kda.carried_layouts"]] == ["acc_t"]
    layouts = {}
    for o in _body(scan):
        if o.name == "kda.load_chunk":
            layouts[str(o.attributes["name"]).strip('"')] = _layout(o)
    assert layouts["qd"] == layouts["w"] == "smem_t" and layouts["kr"] == "smem"
    # do is read from shared memory straight into the fragments qdᵀ·(do·scale) takes as the A
    # of its transposed product; the step's only other conversion reads dv' into v''s
    conversions = [o for o in _body(scan) if o.name == "kda.convert_layout"]
    assert sorted(_layout(o) for o in conversions) == ["acc_t", "acc_t"]
    assert scan.attributes["kda.layout_cost"]["conversion_bytes"].value == 64 * 128 * (2 + 4)


def test_row_sums_and_broadcasts_stay_on_the_accumulator():
    """A reduction of an accumulator over its columns is a row vector, and its broadcast back
    is an accumulator again: an L2-norm-like chain on a product needs no conversion."""
    text = """
module {
  func.func @rows(%a: tensor<64x32xf32>, %b: tensor<32x16xf32>) -> tensor<64x16xf32> {
    %p = "kda.dot"(%a, %b) {kda.precision = "tf32", transpose_lhs = false, transpose_rhs = false} : (tensor<64x32xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
    %s = "kda.reduce_sum"(%p) {dims = array<i64: 1>} : (tensor<64x16xf32>) -> tensor<64xf32>
    %r = "kda.rsqrt"(%s) : (tensor<64xf32>) -> tensor<64xf32>
    %bc = "kda.broadcast"(%r) {dims = array<i64: 1>} : (tensor<64xf32>) -> tensor<64x16xf32>
    %n = "kda.mul"(%p, %bc) : (tensor<64x16xf32>, tensor<64x16xf32>) -> tensor<64x16xf32>
    return %n : tensor<64x16xf32>
  }
}"""
    from kdagen.ir.dialect import parse_module
    module = parse_module(text)
    run_pipeline(module, parse_pipeline("kda-assign-layouts{atom=wgmma}"))
    out = str(module)
    # the product's operands come from global memory (blocked) into shared memory, K-major;
    # nothing after the product converts
    assert re.findall(r'kda.tile_layout = "(\w+)"', out) == [
        "smem", "smem_t", "acc", "row", "row", "acc", "acc"]
    assert out.count("kda.convert_layout") == 2


def test_conversion_bytes():
    assert conversion_bytes("acc", "acc", 100) == 0
    assert conversion_bytes("any", "acc_t", 100) == 0
    assert conversion_bytes("smem", "acc", 100) == 100          # a read
    assert conversion_bytes("acc", "smem_t", 100) == 100        # a write
    assert conversion_bytes("acc", "blocked", 100) == 200       # through shared memory
    assert conversion_bytes("smem", "smem_t", 100) == 200


@pytest.mark.parametrize("family,gate", [("kda", "softplus"), ("gdn", "gdn_softplus")])
def test_semantics_preserved(family, gate):
    """Forward and backward programs through the whole pipeline: the values before and after
    the pass agree (every conversion is an identity)."""
    import torch
    case = make_case(family, gate=gate, lengths=[5, 64, 90], H=1, HV=2, seed=3)
    fwd = build_program(f"{family}_fwd", **case.options)
    o = interpreter.run(fwd, case.inputs)["o"]
    gen = torch.Generator().manual_seed(1)
    x = dict(case.inputs, do=torch.randn(o.shape, generator=gen, dtype=torch.float64))
    ht = interpreter.run(fwd, case.inputs)["final_state"]
    x["dht"] = torch.randn(ht.shape, generator=gen, dtype=torch.float64)
    for program, inputs in ((f"{family}_fwd", case.inputs), (f"{family}_bwd", x)):
        module = build_program(program, **case.options)
        run_pipeline(module, parse_pipeline(BEFORE))
        before = interpreter.run(module, inputs)
        run_pipeline(module, parse_pipeline("kda-assign-layouts"))
        assert "kda.convert_layout" in str(module)
        after = interpreter.run(module, inputs)
        assert set(after) == set(before)
        for key in before:
            assert rel_err(after[key], before[key]) <= 1e-10, (program, key)


def test_the_lowering_emits_the_same_kernels():
    """Today's tile lowering keeps each tile in its own buffers: with the layouts assigned it
    emits exactly the PTX it emits without them."""
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    ptx = []
    for pipeline in (",".join(PIPELINES["sm_90a"]), BEFORE):
        comp = Compilation("kda_fwd", dict(head_k_dim=64, head_v_dim=64), "sm_90a",
                           pipeline=pipeline, lower=DEFAULT_LOWERING)
        comp.run(until="ptx")
        ptx.append(comp.ptx)
        if pipeline == BEFORE:
            assert all("layouts" not in (k.cost or {}) for k in comp.kernels)
        else:
            # the cost report carries each kernel's conversions: the state scan reads u into
            # v''s fragments every chunk (64 x 64 fp32 at K = V = 64) and takes its initial
            # state into Sᵀ's once per CTA (through shared memory: twice 64 x 64 x 4 bytes)
            from kdagen.codegen.lower.cost_model import format_report
            state = comp.kernels[1]
            lay = state.cost["layouts"]
            assert {k: lay[k] for k in ("conversions", "conversion_bytes", "init_conversions",
                                        "init_bytes")} == {"conversions": 1, "conversion_bytes": 16384,
                                                           "init_conversions": 1, "init_bytes": 32768}
            # live at once in the step, at most: Sᵀ, Sᵀ·decay and kᵀ·v' (3 x 16 KB), v' and u
            # read into its fragments (2 x 16 KB), and the fp16 checkpoints' column norms
            # ([V] vectors)
            assert lay["register_bytes"] <= 5 * 64 * 64 * 4 + 2 * 64 * 4
            assert lay["registers_per_thread"] > 0
            assert "layouts (kda-assign-layouts): per chunk 1 conversions, 16384 bytes" in \
                format_report(state.name, state.cost)
    assert ptx[0] == ptx[1] and ptx[0]
