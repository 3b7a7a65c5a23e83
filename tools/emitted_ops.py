"""What the lowering emits for each kernel, weighted by loop trips: a histogram of the
gpu-stage ops (before LLVM and ptxas) one thread executes, both sides of every branch counted.

``python -m tools.emitted_ops kda_fwd --arch sm_90a [--head-dim 128] [--top 20]``

The cost report (``kdagen show --stage cost``) counts the events the lowering declares (loads,
stores, fp32 ALU, barriers, tensor-core issues); this counts every op, the integer index
arithmetic included, which the cost report leaves out. Each ``scf.for`` is weighted by its trip
count (constant bounds, else the ``kda.trips`` the lowering recorded; ``chunks``, the dynamic
chunk loop of a serial scan, counts once: per chunk step); a branch marked ``kda.cold`` (a
fallback expected not to run) counts 0. ``--by-op`` groups the counts by the program op each
emitted op came from (its location). Pre-LLVM counts: constant folding and
CSE later remove some of the integer ops, so compare two lowerings, not against the GPU.
"""
from __future__ import annotations

import argparse
from collections import Counter

#: the op names summed into each class of the summary
CLASSES = {
    "int": ("arith.addi", "arith.subi", "arith.muli", "arith.shli", "arith.shrui", "arith.shrsi",
            "arith.andi", "arith.ori", "arith.xori", "arith.divui", "arith.remui", "arith.cmpi",
            "arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.select",
            "llvm.getelementptr"),
    "f32": ("arith.addf", "arith.subf", "arith.mulf", "arith.negf", "arith.maximumf",
            "arith.minimumf", "arith.divf", "llvm.intr.fma", "arith.cmpf", "arith.extf",
            "arith.truncf"),
    "memory": ("llvm.load", "llvm.store"),
}
#: op name prefixes that emit no instruction (left out of the summary's "all")
FREE = ("arith.constant", "scf.yield", "llvm.mlir.", "llvm.extractvalue", "llvm.insertvalue",
        "llvm.bitcast")


def _trips(op) -> float:
    attrs = op.attributes
    if "kda.trips" in attrs:
        text = str(attrs["kda.trips"]).strip('"')
        return 1.0 if text == "chunks" else float(text)
    bounds = []
    for v in list(op.operands)[:3]:
        owner = v.owner
        name = getattr(owner, "name", None)
        if name != "arith.constant":
            return 1.0
        bounds.append(int(str(owner.attributes["value"]).split(":")[0]))
    lo, hi, step = bounds
    return max(0, -(-(hi - lo) // step))


def _label(op) -> str:
    """The program op an emitted op came from (its name location, set by the lowering's
    ``op_scope``), else "-"."""
    text = str(op.location)
    if text.startswith('loc("'):
        return text[5:text.index('"', 5)]
    return "-"


def weighted_ops(func_op, by_op: dict | None = None) -> Counter:
    """{op name: executions} of one kernel function (loop bodies times their trips);
    ``by_op``: also filled, {program op label: Counter} (see :func:`_label`)."""
    out = Counter()

    def visit(op, weight):
        name = op.name
        out[name] += weight
        if by_op is not None:
            by_op.setdefault(_label(op), Counter())[name] += weight
        inner = weight * _trips(op) if name == "scf.for" else weight
        if name == "scf.if" and "kda.cold" in op.attributes:
            inner = 0.0             # a fallback the lowering expects not to run
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    visit(child.operation if hasattr(child, "operation") else child, inner)
    visit(func_op, 1.0)
    return out


def summary(counts: Counter) -> dict:
    out = {k: 0.0 for k in CLASSES}
    for name, n in counts.items():
        for k, names in CLASSES.items():
            if name in names:
                out[k] += n
    out["all"] = sum(n for name, n in counts.items()
                     if not name.startswith(FREE) and name not in ("scf.for", "scf.if"))
    return {k: round(v) for k, v in out.items()}


def kernel_counts(program: str, arch: str, options: dict, lower: dict | None = None,
                  canonical: bool = True) -> dict:
    """{kernel name: (summary, Counter)} of ``program`` compiled for ``arch`` (``canonical``:
    after MLIR's canonicalizer and CSE)."""
    from kdagen.driver import DEFAULT_LOWERING, Compilation
    comp = Compilation(program, options, arch, lower={**DEFAULT_LOWERING, **(lower or {})},
                       keep_stages=False)
    comp.run("gpu")
    from kdagen._mlir import passmanager
    from kdagen.ir.transforms import walk
    res = {}
    for k in comp.kernels:
        module = k.module
        if canonical:           # what LLVM would see first: constants folded, repeats shared
            with module.context:
                module = module.operation.clone()       # keeps the ops' locations
                passmanager.PassManager.parse(
                    "builtin.module(gpu.module(canonicalize,cse))").run(module)
                module = module.opview
        funcs = [op for op in walk(module) if op.name == "gpu.func"]
        total, by_op = Counter(), {}
        for f in funcs:
            total.update(weighted_ops(f, by_op))
        res[k.name] = (summary(total), total, by_op)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("program")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--top", type=int, default=0, help="also list the N most executed ops")
    ap.add_argument("--by-op", type=int, default=0, metavar="N",
                    help="also list the N program ops whose lowering emits the most")
    a = ap.parse_args(argv)
    opts = {"head_k_dim": a.head_dim, "head_v_dim": a.head_dim}
    for name, (summ, counts, by_op) in kernel_counts(a.program, a.arch, opts).items():
        print(f"{name}: " + "  ".join(f"{k} {v}" for k, v in summ.items()))
        for op, n in counts.most_common(a.top):
            print(f"    {op:28s} {n:10.0f}")
        rows = sorted(((summary(c), label) for label, c in by_op.items()),
                      key=lambda r: -r[0]["all"])
        for summ_op, label in rows[:a.by_op]:
            print(f"    {label:44s} " + "  ".join(f"{k} {v}" for k, v in summ_op.items()))


if __name__ == "__main__":
    main()
