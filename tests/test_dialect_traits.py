"""Op effects and kinds are declared once, in the dialect table; the passes, the autodiff and
the lowering derive their op sets from it."""
from kdagen.ir import autodiff, transforms
from kdagen.ir.dialect import EFFECTS, KINDS, OPS, ops_with
from kdagen.passes import partition, warp_specialize
from kdagen.codegen.lower import plan


def test_every_op_declares_an_effect_and_a_kind():
    for name, spec in OPS.items():
        assert spec.effect in EFFECTS and spec.kind in KINDS, name
        if spec.effect == "pure":
            assert spec.results and not spec.regions, name
        if spec.effect in ("write", "global"):
            assert not spec.results, name


def test_ops_with():
    assert ops_with(effect="global") == {"kda.sum_head_groups", "kda.sum_seqs"}
    assert ops_with(effect="read", kind="memory", operand="chunk") == {"kda.load", "kda.load_chunk"}
    assert ops_with(kind=("matrix", "solve")) == {"kda.dot", "kda.decay_dot", "kda.decay_matmul",
                                                   "kda.tril_inv", "kda.tril_solve"}
    assert "kda.add" in ops_with() and len(ops_with()) == len(OPS)


def test_the_sets_elsewhere_are_the_table_s():
    pure = ops_with(effect="pure")
    assert transforms.PURE_TILE_OPS == pure
    assert {"kda.decay_dot", "kda.decay_matmul"} <= pure           # pure like dot (CSE, DCE)
    assert transforms.SIDE_EFFECT_OPS >= ops_with(effect=("write", "global", "sync"))
    assert "kda.pipeline_release" in transforms.SIDE_EFFECT_OPS
    assert autodiff._STORES == plan.STORE_OPS == ops_with(effect="write")
    assert warp_specialize.PRODUCER_OPS == {"kda.load", "kda.load_chunk"}
    assert partition.RELOAD_OPS == ops_with(effect="read", kind="memory")
    assert partition.MATMUL_OPS == ops_with(kind="matrix")
    assert plan.LOAD_OPS == ops_with(effect="read") and plan.GLOBAL_OPS == ops_with(effect="global")
    assert plan.NOOP_OPS == {"kda.pipeline_release"}
    # every op of the dialect is handled by the lowering
    assert {f"kda.{n}" for n in OPS} <= plan.SUPPORTED
