"""Run a lowered program on the CPU: the kernels' emitter code executed by the simulator
backend (backend.SimBackend), one CTA at a time, over numpy copies of the program's tensors.

This is how the lowering is tested without a GPU: ``simulate(module, inputs)`` returns the
same outputs the GPU kernels would write (up to the float32 rounding of ex2/lg2/rcp, which the
simulator computes exactly-rounded), so it can be compared with the interpreter and the float64
reference; and the simulator raises :class:`backend.SimError` on shared-scratch races, barriers
in divergent code and out-of-bounds accesses.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from kdagen.runtime.launch import eval_rule

from . import backend as B
from .cost import NullCounter
from .emitter import workspace_specs
from .kernel import LowerOptions, prepare
from .program import read_program
from .sim_backend import BankCounter, SimBackend, SimMemory, SimPtr

__all__ = ["simulate", "program_sizes"]


def _to_storage(x: torch.Tensor, elt: str) -> np.ndarray:
    if elt == "bf16":
        return x.detach().to(torch.bfloat16).to(torch.float32).cpu().numpy().copy()
    if elt == "f16":
        return x.detach().to(torch.float16).to(torch.float32).cpu().numpy().copy()
    if elt in ("i32", "i64"):                  # ints are held as int64 (loads read them so)
        return x.detach().to(torch.int64).cpu().numpy().copy()
    return x.detach().to(torch.float32).cpu().numpy().copy()


def program_sizes(program, inputs: dict) -> dict:
    """B, T, H, HV, N, varlen, total_chunks, per-sequence lengths from the inputs."""
    tok = None
    for a in program.args:
        if a.role == "input" and a.layout == "token" and a.heads == "v" and a.name in inputs:
            tok = inputs[a.name]
            break
    if tok is None:
        raise ValueError("no value-head token input to size the launch")
    Bsz, T, HV = (int(d) for d in tok.shape[:3])
    ratio = program.gva_ratio
    H = HV // ratio
    C = program.chunk_size
    cu = inputs.get("cu_seqlens")
    if cu is not None:
        cu_l = [int(x) for x in cu.tolist()]
        lengths = [b - a for a, b in zip(cu_l[:-1], cu_l[1:])]
        N = len(lengths)
    else:
        lengths = [T] * Bsz
        N = Bsz
    total_chunks = sum((n + C - 1) // C for n in lengths)
    return dict(B=Bsz, T=T, H=H, HV=HV, N=N, C=C, varlen=cu is not None, lengths=lengths,
                total_chunks=total_chunks, tokens=Bsz * T,
                max_chunks=max([(n + C - 1) // C for n in lengths] + [0]))


def _alloc(layout, tail, sz, heads):
    tail = tuple(int(d) for d in tail)
    if layout == "token":
        lead = (sz["B"], sz["T"], sz["H"] if heads == "qk" else sz["HV"])
    elif layout == "state":
        lead = (sz["N"], sz["HV"])
    elif layout == "chunk":
        lead = (sz["total_chunks"], sz["HV"])
    elif layout == "head":
        lead = (sz["HV"],)
    else:
        raise ValueError(layout)
    return np.full(lead + tail, np.nan, np.float32)


def simulate(module, inputs: dict, *, options: LowerOptions | None = None, storage: str = "global",
             check_races: bool = True, return_workspaces: bool = False,
             banks: dict | None = None) -> dict:
    """Execute the lowered kernels of ``module`` on the CPU; returns ``{output: tensor}``.

    ``storage`` forces where tile buffers live ("global" scratch or "smem"); both run the same
    code except for the scratch base pointer. ``banks``: a dict that receives, per kernel
    name, a :class:`BankCounter` of its shared-memory accesses (per op of the program).
    """
    opts = options or LowerOptions(storage=storage)
    if options is None:
        opts.storage = storage
    program = read_program(module)
    sz = program_sizes(program, inputs)
    mems: dict = {}
    given: dict = {}            # id of an input tensor -> its memory (one tensor, one memory)
    for a in program.args:
        if a.layout == "scalar":
            continue
        if a.role == "input" or a.layout == "pool":
            # a pool output is written into the tensor given under its name (in place when
            # it is also an input: the kernels then read and write one memory, as on a GPU)
            if a.name not in inputs:
                raise ValueError(f"missing {a.role} {a.name!r}" + (
                    " (a state pool: pass the tensor it writes into)" if a.role == "output"
                    else ""))
            x = inputs[a.name]
            mem = given.get(id(x))
            if mem is None:
                mem = given[id(x)] = SimMemory(a.name, _to_storage(x, a.elt), a.elt)
            mems[a.name] = mem
        else:
            mems[a.name] = SimMemory(a.name, _alloc(a.layout, a.tail, sz, a.heads), a.elt)
    for w in workspace_specs(program):
        mems[w["name"]] = SimMemory(w["name"], _alloc(w["layout"], w["tail"], sz, w["heads"]), w["elt"])
    scalars = {}
    for a in program.args:
        if a.layout == "scalar":
            v = inputs.get(a.name, a.default)
            scalars[a.name] = np.float32(float(v))
    base_p = {"T": sz["T"], "N": sz["N"], "HV": sz["HV"], **scalars}
    for pk in prepare(program, None, "sim", opts):
        em = pk.emitter
        counter = None
        if banks is not None and pk.group.kind != "global":
            counter = banks.setdefault(pk.name, BankCounter())
            em.cost = _OpLabels(counter)
        p = dict(base_p)
        for prm in em.params():
            if prm.kind == "ptr" and prm.name != "scratch":
                p[prm.name] = SimPtr(mems[prm.name])
        if pk.group.kind == "global":
            block = pk.launch["block"][0]
            size = _global_size(pk.launch["grid"][0], sz)
            for bx in range(-(-size // block)):
                be = SimBackend(block, check_races)
                with B.use(be):
                    em.body(p, dict(tid=be.lanes, bx=bx))
            continue
        elems = max(1, em.scratch_elems)
        gz = sz["max_chunks"] if pk.group.parallel else 1
        gx = eval_rule(pk.launch["grid"][0], sz)     # HV, or HV * value_split
        for z in range(gz):
            for n in range(sz["N"]):
                for hv in range(gx):
                    be = SimBackend(pk.launch["block"][0], check_races, counter)
                    cta = (z * sz["N"] + n) * gx + hv
                    base = None
                    if em.uses_global:
                        scratch = SimMemory("scratch", np.full(elems, np.nan, np.float32), "f32",
                                              track=True)
                        p["scratch"] = SimPtr(scratch, -cta * elems)
                    if em.uses_smem:
                        base = SimPtr(SimMemory("smem", np.full(max(1, em.smem_elems), np.nan,
                                                                    np.float32), "f32", track=True))
                    with B.use(be):
                        em.body(p, dict(tid=be.lanes, hv=hv, n=n, z=z, grid=(gx, sz["N"])),
                                base)
    out = {}
    for a in program.args:
        if a.role == "output":
            shape = inputs[a.name].shape if a.layout == "pool" else _shape_of(a, sz)
            out[a.name] = torch.from_numpy(mems[a.name].data.reshape(shape).copy())
    if return_workspaces:
        for w in workspace_specs(program):
            out["workspace:" + w["name"]] = torch.from_numpy(mems[w["name"]].data.copy())
    return out


class _OpLabels(NullCounter):
    """The emitter's cost counter in a bank count: counts nothing, names the op being emitted
    (run) for the :class:`BankCounter`."""

    def __init__(self, banks: BankCounter):
        super().__init__()
        self._banks = banks

    @contextmanager
    def op(self, label: str):
        outer = self._banks.label
        if outer is None:
            self._banks.label = label
        try:
            yield
        finally:
            self._banks.label = outer


def _shape_of(a, sz):
    return _alloc(a.layout, a.tail, sz, a.heads).shape


def _global_size(rule: str, sz: dict) -> int:
    # rule: "ceil_div(<expr>, <block>)"
    inner = rule[len("ceil_div("):-1]
    expr, _, block = inner.rpartition(",")
    env = dict(tokens=sz["tokens"], H=sz["H"], HV=sz["HV"], N=sz["N"], T=sz["T"])
    return int(eval(expr, {"__builtins__": {}}, env))


# ------------------------------------------------------------------------------------------
# a stand-in for runtime.loader.KernelLibrary (tests the launcher's calling convention on CPU)
# ------------------------------------------------------------------------------------------


class SimKernel:
    def __init__(self, entry, prepared, nthreads: int, check_races: bool):
        self.entry = entry
        self.prepared = prepared
        self.nthreads = nthreads
        self.check_races = check_races

    def launch(self, grid, args: list, stream=None) -> None:
        params = self.entry.params
        if len(args) != len(params):
            raise TypeError(f"{self.entry.name}: expected {len(params)} arguments, got {len(args)}")
        p, backs, seen = {}, [], {}
        for prm, a in zip(params, args):
            if prm["kind"] == "ptr":
                if not isinstance(a, torch.Tensor):
                    raise TypeError(f"{self.entry.name}: parameter {prm['name']} needs a tensor")
                want = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
                        "i32": torch.int32, "i64": torch.int64}[prm["elem"]]
                if a.dtype != want:
                    raise TypeError(f"{self.entry.name}: {prm['name']} is {a.dtype}, kernel takes {want}")
                if not a.is_contiguous():
                    raise TypeError(f"{self.entry.name}: {prm['name']} is not contiguous")
                key = (a.data_ptr(), a.dtype, tuple(a.shape))
                if key in seen:          # one tensor passed twice (a pool updated in place)
                    p[prm["name"]] = SimPtr(seen[key])
                    continue
                integer = prm["elem"] in ("i32", "i64")
                arr = (a.to(torch.int64) if integer else a.to(torch.float32)).numpy().copy()
                mem = SimMemory(prm["name"], arr, prm["elem"], track=prm["name"] == "scratch")
                seen[key] = mem
                p[prm["name"]] = SimPtr(mem)
                backs.append((a, mem))
            elif prm["kind"] == "i32":
                p[prm["name"]] = int(a)
            else:
                p[prm["name"]] = np.float32(a)
        pk = self.prepared
        em = pk.emitter
        if pk.group.kind == "global":
            block = pk.launch["block"][0]
            for bx in range(int(grid[0])):
                be = SimBackend(block, self.check_races)
                with B.use(be):
                    em.body(p, dict(tid=be.lanes, bx=bx))
        else:
            for z in range(int(grid[2])):
                for n in range(int(grid[1])):
                    for hv in range(int(grid[0])):
                        # each kernel's own block (the tuning table may give one kernel
                        # other threads than the options')
                        be = SimBackend(pk.launch["block"][0], self.check_races)
                        base = None
                        if em.uses_smem:
                            base = SimPtr(SimMemory("smem", np.full(max(1, em.smem_elems), np.nan,
                                                                        np.float32), "f32", track=True))
                        with B.use(be):
                            em.body(p, dict(tid=be.lanes, hv=hv, n=n, z=z,
                                            grid=(int(grid[0]), int(grid[1]))), base)
        for a, mem in backs:
            a.copy_(torch.from_numpy(mem.data.reshape(a.shape)).to(a.dtype))


class SimLibrary:
    """``KernelLibrary`` look-alike whose kernels run in the CPU simulator: built from the
    bundle's manifest (params, launch) and the modules the bundle was written from."""

    def __init__(self, bundle_dir, modules: dict, chip: str, check_races: bool = True,
                 options: LowerOptions | None = None):
        """``options``: the lowering the bundle was written with (portable path; default:
        LowerOptions(), FMA products)."""
        from kdagen.runtime.bundle import read_manifest
        from kdagen.target import get_target
        self.manifest = read_manifest(bundle_dir)
        self.chip = chip
        self.kernels = {}
        opts = options or LowerOptions()
        for vname, module in modules.items():
            program = read_program(module)
            for pk in prepare(program, get_target(chip), vname, opts):
                self.kernels[pk.name] = pk
        self.nthreads = opts.nthreads
        self.check_races = check_races

    def get(self, name: str, device=None) -> SimKernel:
        for e in self.manifest.kernels:
            if e.name == name and e.chip == self.chip:
                return SimKernel(e, self.kernels[name], self.nthreads, self.check_races)
        raise KeyError(f"no kernel {name} for {self.chip} in the bundle")
