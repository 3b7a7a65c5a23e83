"""The ops' eager autograd path (kdagen.ops.EAGER, kdagen.ops.eager_ok): an eager call runs
the same forward and backward as the custom op (kdagen::{kda,gdn}_fwd with its registered
autograd) without torch.library's dispatch. Both paths give the same outputs and gradients
(CPU interpreter); the path is left to the custom op under FakeTensorMode, on the meta
device, for tensor subclasses and when switched off."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kdagen
from kdagen import ops

from test_api import make_inputs


def _run(family, eager: bool, **gate):
    x, flags = make_inputs(family, dtype=torch.float32, T=70, H=1, HV=2, **gate)
    fn = kdagen.chunk_kda if family == "kda" else kdagen.chunk_gated_delta_rule
    calls = []
    original = ops.EAGER[family].apply

    def counted(*args):
        calls.append(1)
        return original(*args)
    old = ops.EAGER_AUTOGRAD
    ops.EAGER_AUTOGRAD = eager
    try:
        ops.EAGER[family].apply = counted
        o, ht = fn(**x, **flags)
        (o.square().mean() + 0.5 * ht.square().mean()).backward()
    finally:
        ops.EAGER_AUTOGRAD = old
        del ops.EAGER[family].apply          # back to torch.autograd.Function.apply
    grads = {n: t.grad for n, t in x.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    return o.detach(), ht.detach(), grads, len(calls)


@pytest.mark.parametrize("family, gate", [("kda", {}), ("gdn", {}),
                                          ("gdn", {"gate": "softplus"})])
def test_the_eager_path_matches_the_custom_op(family, gate):
    o1, ht1, g1, eager_calls = _run(family, True, **gate)
    o2, ht2, g2, op_calls = _run(family, False, **gate)
    assert eager_calls == 1 and op_calls == 0          # each run took the path it was meant to
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)
    assert g1.keys() == g2.keys() and len(g1) >= 5
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


def test_eager_ok_leaves_fakes_meta_and_subclasses_to_the_custom_op(monkeypatch):
    x = torch.zeros(2)
    monkeypatch.setattr(ops, "EAGER_AUTOGRAD", True)
    assert ops.eager_ok(x, None)
    assert not ops.eager_ok(torch.zeros(2, device="meta"))
    with FakeTensorMode():
        assert not ops.eager_ok(torch.zeros(2))

    class Sub(torch.Tensor):
        pass
    assert not ops.eager_ok(x.as_subclass(Sub))
    monkeypatch.setattr(ops, "EAGER_AUTOGRAD", False)      # switched off (KDAGEN_EAGER_AUTOGRAD=0)
    assert not ops.eager_ok(x)
