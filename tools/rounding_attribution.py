"""Which op's float32 rounding costs a backward gradient its digits (CPU only).

``python -m tools.rounding_attribution [--family gdn] [--head-dim 128] [--T 200]
[--g-raw-shift 1.0] [--tensor dA_log] [--by kind|op] [--top 20]``

Runs the final backward program in the interpreter in float64 on the inputs of
``tools.program_precision`` (the GPU check's "steep" gate by default), once per op kind
(``--by kind``: every op of that kind rounded) or once per op (``--by op``: that op alone,
named by its kernel body -- the blocks' order of first execution -- and its position), with
those results rounded to float32, and lists what moves ``--tensor`` furthest from autograd of
the float64 per-token reference. Rounding every op's result reproduces the float32 program's
error. Read ``--by op`` with care: a value two kernels recompute (the gate cumsum) rounded in
one of them only is an inconsistency the float32 program never has, so it can rank high
without mattering; ``--by kind`` rounds such copies alike.

Stop 45 (GDN, K = 128, steep gate): every result rounded 1.88e-2; ``kda.add`` alone 1.35e-2,
the cumsums alone 8.9e-5. The ops that matter assemble dG in the dk kernel: the chunk-end
gate's gradient enters as +sum_i x_i on the last row and -x_i on every row (autodiff of
kr = k 2^(Γ_C - Γ)), and the reverse cumsum that turns dG into dg then takes total minus
suffix, two large sums, where the exact result sum_{s<t} x_s is small (docs/MATH.md §3).
"""
from __future__ import annotations

import argparse

import torch

from kdagen import interpreter
from kdagen.reference import rel_err

from .program_precision import GATES, steep_backward


class RoundingProbe:
    """The backward of one case, run with a chosen set of ops' results rounded to float32."""

    def __init__(self, family: str, T: int, head_dim: int, g_raw_shift: float, chip: str,
                 seed: int = 0):
        self.module, self.inputs, self.ref = steep_backward(family, T, head_dim, g_raw_shift,
                                                            chip, seed)

    def run(self, rounded) -> dict:
        """{gradient: rel_err} with the results of the ops for which ``rounded(key, node)`` is
        true rounded to float32 (key: (body index, position in it))."""
        impls, original = interpreter.OP_IMPLS, dict(interpreter.OP_IMPLS)
        executor = interpreter.Executor
        run_block = executor.run_block
        bodies: dict = {}

        def keyed_run_block(ex, block, env):
            b = bodies.setdefault(id(block), len(bodies))
            for i, n in enumerate(block.nodes):
                n.probe_key = (b, i)
            return run_block(ex, block, env)

        def to_f32(x):
            if torch.is_tensor(x) and x.dtype == torch.float64:
                return x.float().double()
            return x

        def wrap(impl):
            def rounded_impl(ex, node, *args):
                out = impl(ex, node, *args)
                if not rounded(getattr(node, "probe_key", None), node):
                    return out
                return [to_f32(x) for x in out] if isinstance(out, (list, tuple)) else to_f32(out)
            return rounded_impl

        impls.update({name: wrap(f) for name, f in original.items()})
        executor.run_block = keyed_run_block
        try:
            got = interpreter.run(self.module, self.inputs, dtype=torch.float64)
        finally:
            impls.update(original)
            executor.run_block = run_block
        return {k: rel_err(got[k].double(), self.ref[k]) for k in self.ref if k in got}

    def ops(self) -> dict:
        """{key: (op name, result types)} of every op the program executes."""
        seen = {}

        def note(key, node):
            seen.setdefault(key, (node.name, str(node.result_types)))
            return False
        self.run(note)
        return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="gdn", choices=sorted(GATES))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--T", type=int, default=200)
    ap.add_argument("--g-raw-shift", type=float, default=1.0)
    ap.add_argument("--chip", default="sm_90a")
    ap.add_argument("--tensor", default="dA_log")
    ap.add_argument("--by", default="kind", choices=("kind", "op"))
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    probe = RoundingProbe(a.family, a.T, a.head_dim, a.g_raw_shift, a.chip)
    every = probe.run(lambda key, node: True)[a.tensor]
    none = probe.run(lambda key, node: False)[a.tensor]
    print(f"{a.family}_bwd K=V={a.head_dim} T={a.T}: {a.tensor} rel_err {none:.3e} in float64, "
          f"{every:.3e} with every op's result rounded to float32")
    rows = []
    ops = probe.ops()
    if a.by == "kind":
        for name in sorted({n for n, _ in ops.values()}):
            err = probe.run(lambda k, node, name=name: node.name == name)[a.tensor]
            rows.append((err, name))
        rows.sort(key=lambda r: -r[0])
        print(f"{'rel_err':>10s}  op kind (every op of it rounded)")
        for err, name in rows[:a.top]:
            print(f"{err:10.3e}  {name}")
        return 0
    for key, (name, types) in ops.items():
        err = probe.run(lambda k, node, key=key: k == key)[a.tensor]
        rows.append((err, key, name, types))
    rows.sort(key=lambda r: -r[0])
    print(f"{'rel_err':>10s}  body  pos  op")
    for err, (body, pos), name, types in rows[:a.top]:
        print(f"{err:10.3e}  {body:4d} {pos:4d}  {name} -> {types}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
