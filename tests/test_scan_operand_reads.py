"""LowerOptions.scan_operand_reads (off by default until measured on the GPU): a cumsum walks its
operand down the columns, one element per row, so a lazy operand that sums several product
results costs the scan a read of each of them per element; with the option such an operand is
materialised first (one vector-wide element loop) and the scan reads one buffer. kda_bwd's dk
kernel sums eight products into its gate-gradient cumsum."""
from __future__ import annotations

import pytest

pytest.importorskip("kdagen._mlir")

from kdagen.codegen.lower.kernel import LowerOptions, prepare  # noqa: E402
from kdagen.codegen.lower.program import read_program, walk  # noqa: E402
from kdagen.codegen.lower.storage import _buffers_read  # noqa: E402
from kdagen.driver import DEFAULT_LOWERING, Compilation  # noqa: E402
from kdagen.target import get_target  # noqa: E402

K128 = dict(head_k_dim=128, head_v_dim=128)


@pytest.fixture(scope="module")
def kda_bwd_program():
    return read_program(Compilation("kda_bwd", K128, "sm_90a").run_passes().module)


def _cumsum_operands(program, reads: int) -> list:
    lower = {k: v for k, v in DEFAULT_LOWERING.items() if k != "pipeline"}
    opts = LowerOptions(**lower, scan_operand_reads=reads)
    pks = prepare(program, get_target("sm_90a"), "k", opts)
    dk = next(pk for pk in pks if pk.name.endswith("k4_scan4"))
    out = []
    for scan in dk.group.scans:
        for n in walk(scan.body):
            if n.op == "kda.cumsum":
                v = n.operands[0]
                out.append((dk.plan.mode(v), _buffers_read(v, dk.plan.modes)))
    return out


def test_off_by_default_and_materialises_the_sum_of_products_when_on(kda_bwd_program):
    assert LowerOptions().scan_operand_reads == 0
    off = _cumsum_operands(kda_bwd_program, 0)
    on = _cumsum_operands(kda_bwd_program, 2)
    # the gate-gradient cumsum's operand sums more than two products and stays an expression
    # by default
    assert any(mode != "buffer" and reads > 2 for mode, reads in off)
    # with the option it has a buffer of its own; operands reading fewer products keep theirs
    assert all(mode == "buffer" for (mode, _), (_, reads) in zip(on, off) if reads > 2)
    assert [m for m, r in on if r <= 2] == [m for m, r in off if r <= 2]
