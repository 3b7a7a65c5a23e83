"""What a cheaper precision for the serial scans' state products would cost in accuracy,
measured in the CPU simulator on one case of the GPU check.

``python -m tools.scan_precision_probe kda_fwd --head-dim 64 --case "B1_T1000 weak" --state-products bf16``

Builds the program with a chip's pass pipeline (``--chip``, sm_90a by default: its fp32
workspaces), sets ``kda.precision`` of every product in a serial scan that reads the carried
state (the forward's w·S) to ``--state-products`` (``keep``: leave what kda-assign-precision
chose), runs the portable lowering of it in the lockstep simulator on the check's case and seed,
and prints each output's relative error against the float64 reference and its rounding floor.
The simulator reproduces the H200's errors of the same case to a few percent (TF32 everywhere,
kda K = 64, weak decay: o 1.742e-3 simulated, 1.74e-3 on the GPU).
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile

import numpy as np
import torch

from kdagen._mlir import ir
from kdagen.bundle_writer import write_bundle
from kdagen.codegen.lower.options import LowerOptions
from kdagen.codegen.lower.sim import SimLibrary
from kdagen.driver import build_module
from kdagen.ir.precision import PRECISIONS
from kdagen.ir.transforms import walk
from kdagen.runtime.launch import LoweredProgram

from . import gpu_check


def set_state_products(module, precision: str) -> int:
    """Set the precision of the products of serial scans that read a carried value; returns
    how many."""
    count = 0
    with module.context:
        for op in walk(module):
            if op.name != "kda.scan" or "parallel" not in op.attributes \
                    or ir.BoolAttr(op.attributes["parallel"]).value:
                continue
            carried = list(op.regions[0].blocks[0].arguments)[1:]
            for inner in walk(op):
                if inner.name == "kda.dot" and any(o in carried for o in inner.operands):
                    inner.attributes["kda.precision"] = ir.StringAttr.get(precision)
                    count += 1
    return count


class SimulatedProgram:
    """``program`` with ``options`` lowered with ``dot`` through ``chip``'s pipeline, ready to
    run the GPU check's cases (``cases``: their dicts, in the check's order, which is also
    each case's seed) in the CPU simulator; ``edit(module)`` changes the module first;
    ``lower``: lowering options (LowerOptions fields) over the defaults; ``pipeline``: the pass
    pipeline ("chip", or "chip+PASS{KEY=VALUE}").
    ``out``: where the bundle's manifest goes (a fresh temporary folder by default)."""

    def __init__(self, program: str, options: dict, dot: str, chip: str, edit=None, out=None,
                 quick: bool = False, lower: dict | None = None, pipeline: str = "chip"):
        out = pathlib.Path(out) if out is not None else pathlib.Path(tempfile.mkdtemp())
        res = write_bundle(out, [(program, options, {"dot": dot, "pipeline": pipeline})], [chip],
                           assemble=False)
        (vname,) = res["variants"]
        self.program, self.chip = program, chip
        self.spec = res["variants"][vname]
        module = build_module(program, options, pipeline, chip)
        if edit is not None:
            edit(module)
        lib = SimLibrary(out, {vname: module}, chip, options=LowerOptions(dot=dot, **(lower or {})))
        self.lowered = LoweredProgram(out, vname, library=lib)
        self.cases = gpu_check._cases(self.spec, quick=quick)

    @property
    def labels(self) -> list[str]:
        return [c["label"] for c in self.cases]

    def run(self, case: str) -> list:
        """The GPU check's rows (``tensor``, ``err``, ``bar``, ``floor``, ...) for case
        ``case``, with that case's seed."""
        if case not in self.labels:
            raise ValueError(f"case {case!r} is not one of {self.program}'s GPU-check cases: "
                             f"{', '.join(self.labels)}")
        seed = self.labels.index(case)
        np.seterr(all="ignore")
        return gpu_check.run_case(lambda **kw: self.lowered(chip=self.chip, **kw), self.spec,
                                  self.cases[seed], torch.device("cpu"), seed)


def check_case(program: str, options: dict, dot: str, case: str, chip: str,
               edit=None, out=None) -> list:
    """The GPU check's rows for its case ``case`` of ``program`` (:class:`SimulatedProgram`)."""
    return SimulatedProgram(program, options, dot, chip, edit, out).run(case)


def probe(program: str, head_dim: int, case: str, state_products: str, chip: str,
          gate: str = "softplus") -> dict:
    options = dict(head_k_dim=head_dim, head_v_dim=head_dim, gate=gate)
    changed = []

    def edit(module):
        if state_products != "keep":
            changed.append(set_state_products(module, state_products))
    rows = check_case(program, options, "auto", case, chip, edit)
    return {"changed": sum(changed), "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("program")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--case", default="B1_T1000 weak")
    ap.add_argument("--state-products", default="keep", choices=("keep", *PRECISIONS))
    ap.add_argument("--chip", default="sm_90a")
    a = ap.parse_args(argv)
    res = probe(a.program, a.head_dim, a.case, a.state_products, a.chip)
    print(f"{a.program} K={a.head_dim} {a.case}: {res['changed']} state products set to "
          f"{a.state_products}")
    for r in res["rows"]:
        print(f"  {r['tensor']:12s} {r['err']:.3e}  (floor {r['floor']:.2e}, bar {r['bar']})")


if __name__ == "__main__":
    main()
