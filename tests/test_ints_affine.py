"""IntVal's affine forms: ``+ - *`` by ints stay symbolic and are emitted as one variable part
plus one constant; the emitted value equals the eager expression; a materialized value is
reused only later in the same block; an address's constant becomes an immediate GEP offset."""
import pytest

pytest.importorskip("numba_cuda_mlir")

from kdagen._mlir import arith, func, ir, llvm  # noqa: E402
from kdagen.codegen.common.ints import IntVal  # noqa: E402


def _function(body, nargs=2, verify=True):
    """A func.func (i32 x nargs) -> i32 whose body(args) returns an i32 value; its IR text."""
    ctx = ir.Context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        i32 = ir.IntegerType.get_signless(32)
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ([i32] * nargs, [i32]))
            block = f.add_entry_block()
            with ir.InsertionPoint(block):
                func.ReturnOp([body([IntVal(a) for a in block.arguments], block)])
        if verify:
            assert module.operation.verify()
        return str(module)


def _ops(text, name):
    return text.count(f"= {name} ")


def test_constants_fold_and_one_product_per_atom():
    def body(args, _):
        x, y = args
        return ((x + 8) * 129 + (y + 72) + 4096 - x * 3).value
    text = _function(body)
    assert _ops(text, "arith.muli") == 1            # x * 126 only
    assert "126 : i32" in text and "5200 : i32" in text   # 129 - 3, 8*129 + 72 + 4096
    assert _ops(text, "arith.addi") == 2            # + y, + 5200


def test_values_equal_the_eager_expression():
    """The emitted form, folded by MLIR's canonicalizer on constant atoms, is the eager value
    modulo 2^32 (also where an intermediate would be negative or wrap)."""
    from kdagen._mlir import passmanager
    for x0, y0 in [(0, 0), (5, 7), (123456, 3), (2**31 - 1, 9), (1, 10**6)]:
        def body(args, _):
            i32 = ir.IntegerType.get_signless(32)
            x = IntVal(arith.constant(i32, x0))
            y = IntVal(arith.constant(i32, y0))
            return ((x + 8) * 129 - (y + 3) * 5 + 17 - 2 * x + (7 - y) * 3).value

        expected = ((x0 + 8) * 129 - (y0 + 3) * 5 + 17 - 2 * x0 + (7 - y0) * 3) % 2**32
        ctx = ir.Context()
        module = ir.Module.parse(_function(body), context=ctx)
        with ctx:
            passmanager.PassManager.parse("builtin.module(canonicalize)").run(module.operation)
        ret = list(module.body.operations[0].regions[0].blocks[0].operations)[-1]
        folded = ir.IntegerAttr(ret.operands[0].owner.attributes["value"]).value % 2**32
        assert folded == expected


def test_rsub_and_zero_results():
    def body(args, _):
        x, y = args
        assert (x - x) == 0 and (x * 0) == 0
        return (10 - x + y).value
    text = _function(body)
    assert _ops(text, "arith.subi") == 1 and _ops(text, "arith.addi") == 2


def test_other_operators_start_a_new_atom():
    def body(args, _):
        x, _y = args
        return (((x + 4) // 4) * 2 + 1).value
    text = _function(body)
    assert _ops(text, "arith.shrui") == 1 and _ops(text, "arith.shli") == 1


def test_materialized_value_reused_in_its_block_only():
    def body(args, block):
        x, y = args
        e = x * 3 + y + 1
        first = e.value
        assert e.value == first                    # same block, appending: reused
        other = block.create_after()              # another block of the region
        with ir.InsertionPoint(other):
            again = e.value
            llvm.UnreachableOp()
        assert again != first                      # a fresh copy, not the other block's
        with ir.InsertionPoint(block.operations[0]):     # inserting before an op
            before = e.value
        assert before != first
        return first
    _function(body, verify=False)


def test_split_const():
    def body(args, _):
        x, y = args
        var, const = (x * 4 + y + 36).split_const()
        assert const == 36 and var.split_const() == (var, 0)
        return var.value
    text = _function(body)
    assert "36 : i32" not in text


def test_gep_takes_the_constant_as_an_immediate():
    from kdagen.codegen.lower.mlir_backend import MlirBackend
    ctx = ir.Context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        i32 = ir.IntegerType.get_signless(32)
        ptr = ir.Type.parse("!llvm.ptr<3>")
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("g", ([ptr, i32], [ptr]))
            block = f.add_entry_block()
            with ir.InsertionPoint(block):
                p, x = block.arguments[0], IntVal(block.arguments[1])
                q = MlirBackend().gep(p, x * 129 + 72)
                func.ReturnOp([q])
        text = str(module)
    assert "72 : i32" not in text                  # no index sum with the constant
    assert "getelementptr %arg0[%" in text and "[72]" in text
    _ = arith
