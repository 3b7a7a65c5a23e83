"""Programs print as MLIR text, parse back in a kda context and verify; the dialect rejects
malformed ops."""
import pytest
import torch

from kdagen import interpreter
from kdagen.ir.dialect import (OPS, KdaVerifyError, make_context, parse_module, print_module,
                               verify)
from kdagen.ir.programs import PROGRAMS, build_program, list_programs
from kdagen.ir.testing import make_case

SMALL = dict(head_k_dim=64, head_v_dim=64)


@pytest.mark.parametrize("name", ["kda_fwd", "kda_bwd", "gdn_fwd", "gdn_bwd"])
@pytest.mark.parametrize("named", [True, False])
def test_print_parse_verify_roundtrip(name, named):
    m = build_program(name, gva_ratio=2, varlen=True)
    text = print_module(m) if named else str(m)
    m2 = parse_module(text)
    verify(m2)
    text2 = print_module(m2) if named else str(m2)
    # the op sequence survives (SSA names are cosmetic and may change in a parse)
    ops1 = [l.split("=", 1)[-1].strip().split("(")[0] for l in text.splitlines() if '"kda.' in l]
    ops2 = [l.split("=", 1)[-1].strip().split("(")[0] for l in text2.splitlines() if '"kda.' in l]
    assert ops1 == ops2 and len(ops1) > 30
    # the programs are written with kda ops (plus func/gpu structure) only
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("%"):
            assert '"kda.' in s, s


def test_names_survive_with_debug_info():
    m = build_program("kda_fwd", **SMALL)
    text = print_module(m, debug_info=True)
    m2 = parse_module(text)
    again = print_module(m2)
    for name in ("%kd", "%ki", "%qd", "%kr", "%Akk", "%Aqk", "%v_new", "%S_next", "%S_final", "%c"):
        assert name in again, name


@pytest.mark.parametrize("name", ["kda_fwd", "kda_bwd"])
def test_reparsed_program_computes_the_same(name):
    case = make_case("kda", gate="lower_bound", lower_bound=-2.0, lengths=[3, 40], H=1, HV=2)
    m = build_program(name, **case.options)
    m2 = parse_module(print_module(m))
    inputs = dict(case.inputs)
    if name.endswith("bwd"):
        o, ht = case.reference()
        inputs.update(do=torch.ones_like(o), dht=torch.ones_like(ht))
    a = interpreter.run(m, inputs)
    b = interpreter.run(m2, inputs)
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_every_op_is_in_the_dialect_and_programs_use_them():
    used = set()
    for name in PROGRAMS:
        for line in print_module(build_program(name, **SMALL)).splitlines():
            if '"kda.' in line:
                used.add(line.split('"kda.')[1].split('"')[0])
    assert used <= set(OPS)
    for op in ("scan", "load", "store", "cumsum", "dot", "tril", "tril_inv", "exp2", "select",
               "broadcast", "reduce_sum", "extract_row", "load_chunk", "store_chunk", "workspace",
               "sum_seqs", "valid_rows", "assume_range"):
        assert op in used, op


def test_list_programs():
    rows = dict(list_programs())
    assert set(rows) == {"kda_fwd", "kda_bwd", "gdn_fwd", "gdn_bwd", "kda_decode", "gdn_decode"}
    assert all(rows.values())


BAD = {
    "operand count": '''
func.func @f(%a: tensor<4x4xf32>) {
  %0 = "kda.add"(%a) : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return
}''',
    "elementwise types": '''
func.func @f(%a: tensor<4x4xf32>, %b: tensor<4x8xf32>) {
  %0 = "kda.mul"(%a, %b) : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
  return
}''',
    "dot shapes": '''
func.func @f(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) {
  %0 = "kda.dot"(%a, %b) {transpose_lhs = false, transpose_rhs = false} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}''',
    "missing attribute": '''
func.func @f(%a: tensor<4x8xf32>) {
  %0 = "kda.cumsum"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}''',
    "unknown op": '''
func.func @f(%a: tensor<4x8xf32>) {
  %0 = "kda.frobnicate"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}''',
    "broadcast dims": '''
func.func @f(%a: tensor<4xf32>) {
  %0 = "kda.broadcast"(%a) {dims = array<i64: 0>} : (tensor<4xf32>) -> tensor<4x8xf32>
  return
}''',
}


@pytest.mark.parametrize("what", list(BAD))
def test_malformed_ir_is_rejected_with_a_diagnostic(what):
    with pytest.raises(KdaVerifyError) as err:
        parse_module(BAD[what])
    assert str(err.value).strip()


def test_make_context_loads_the_dialect():
    from kdagen._mlir import ir
    ctx = make_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse('''
func.func @f(%a: tensor<4x8xf32>) {
  %0 = "kda.exp2"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}''')
        assert m.operation.verify()
