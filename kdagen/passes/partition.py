"""``kda-partition``: split each chunk scan into a chunk-parallel kernel and a state-scan kernel.

Inside a ``kda.scan`` body, an op is *state-dependent* when it (transitively) uses a carried
value (the [K, V] state, or an adjoint carried by a reverse scan). Everything else depends only
on the chunk's inputs and can run for all chunks at once. The pass

1. moves the state-independent ops into a new scan with no carried values (kernel
   ``<program>_chunk``, attribute ``parallel``), which stores every value the state part needs
   into a per-chunk workspace (``kda.workspace`` + ``kda.store_chunk``);
2. keeps the state-dependent ops in a scan that loads those workspaces
   (``kda.load_chunk``) — kernel ``<program>_state``;
3. fuses instead of storing where that moves fewer bytes: sources (constants, scalars, masks,
   input loads) are re-emitted in the state kernel, and shape-expanding or type-changing
   producers (``broadcast``, ``convert``, ``neg``) are re-emitted there so the smaller operand
   crosses instead (e.g. the per-channel chunk decay [K] rather than its [K, V] broadcast).

Workspaces hold ``workspace_dtype`` (fp32 by default: the backward recomputes from them and the
forward's accuracy target is close to bf16 rounding of the float64 result). Each kernel scan gets
``kda.hbm_bytes_per_token``: bytes moved to/from global memory per token and value head,
counted from its loads and stores (tile bytes per chunk / chunk rows; per-sequence state loads
and stores are excluded as they do not scale with T).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .._mlir import ir
from .base import ModulePass, PassError, register_pass

SOURCE_OPS = frozenset({"kda.constant", "kda.scalar", "kda.valid_rows", "kda.load", "kda.load_head"})
SHRINKING_REMAT_OPS = frozenset({"kda.broadcast", "kda.convert", "kda.neg"})
SIDE_EFFECT_OPS = frozenset({"kda.store", "kda.store_chunk", "kda.store_state"})
_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i1": 1, "i32": 4, "i64": 8}
_WORKSPACE_TYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def _element(t: ir.Type) -> str:
    return str(ir.ShapedType(t).element_type)


def _shape(t: ir.Type) -> list[int]:
    return list(ir.ShapedType(t).shape)


def tile_bytes(t: ir.Type) -> int:
    return math.prod(_shape(t)) * _ELEMENT_BYTES[_element(t)]


def _elt_type(name: str) -> ir.Type:
    return {"f32": ir.F32Type.get, "bf16": ir.BF16Type.get, "f16": ir.F16Type.get}[name]()


def _attributes(op) -> dict:
    names = [a if isinstance(a, str) else a.name for a in op.attributes]
    return {n: op.attributes[n] for n in names}


def _clone(op, mapping: dict, ip) -> ir.Operation:
    new = ir.Operation.create(
        op.name, results=[r.type for r in op.results],
        operands=[mapping.get(v, v) for v in op.operands],
        attributes=_attributes(op), loc=op.location, ip=ip)
    for old, fresh in zip(op.results, new.results):
        mapping[old] = fresh
    return new


def _chunk_rows(scan) -> int:
    """Rows per chunk of a scan: the leading dim of the tiles its body loads or stores."""
    for op in scan.regions[0].blocks[0].operations:
        if op.operation.name in ("kda.load", "kda.store", "kda.valid_rows"):
            value = op.results[0] if op.operation.name != "kda.store" else op.operands[2]
            return _shape(value.type)[0]
    raise PassError("kda-partition: cannot tell the chunk size of a scan without token loads")


def hbm_bytes_per_token(scan) -> float:
    rows = _chunk_rows(scan)
    total = 0
    for op in scan.regions[0].blocks[0].operations:
        name = op.operation.name
        if name in ("kda.load", "kda.load_chunk"):
            total += tile_bytes(op.results[0].type)
        elif name in ("kda.store", "kda.store_chunk"):
            total += tile_bytes(op.operands[2].type)
    return total / rows


@register_pass
@dataclass
class PartitionPass(ModulePass):
    name = "kda-partition"
    summary = "split chunk scans into chunk-parallel and state-scan kernels; fuse; plan workspaces"
    workspace_dtype: str = "fp32"
    fuse: bool = True

    def run(self, module: ir.Module) -> None:
        if self.workspace_dtype not in _WORKSPACE_TYPES:
            raise PassError(f"kda-partition: workspace_dtype={self.workspace_dtype!r}; choose "
                            f"{', '.join(_WORKSPACE_TYPES)}")
        from ..interpreter import program_func
        with module.context, ir.Location.unknown():
            func = program_func(module)
            program = ir.StringAttr(func.attributes["sym_name"]).value
            scans = [op.operation for op in func.regions[0].blocks[0].operations
                     if op.operation.name == "kda.scan"]
            for index, scan in enumerate(scans):
                suffix = "" if len(scans) == 1 else f"{index}"
                self._split(scan, f"{program}{suffix}")

    def _split(self, scan, kernel_prefix: str) -> None:
        block = scan.regions[0].blocks[0]
        args = list(block.arguments)
        carried = set(args[1:])
        body = [op.operation for op in block.operations]
        terminator, body = body[-1], body[:-1]
        dependent: set = set(carried)
        dep_ops, indep_ops = [], []
        for op in body:
            if any(v in dependent for v in op.operands):
                dep_ops.append(op)
                dependent.update(op.results)
            else:
                indep_ops.append(op)
        if not carried or not dep_ops or not any(o.name not in SOURCE_OPS for o in indep_ops):
            self._mark(scan, f"{kernel_prefix}_scan", parallel=not carried)
            return
        # Values the state part needs from the independent part; re-emit cheap producers.
        remat: list = []
        needed_by_state = self._needed(dep_ops + [terminator], dependent)
        if self.fuse:
            changed = True
            while changed:
                changed = False
                for value in list(needed_by_state):
                    producer = value.owner.operation if not isinstance(value, ir.BlockArgument) else None
                    if producer is None or producer in remat:
                        continue
                    if producer.name in SOURCE_OPS or producer.name in SHRINKING_REMAT_OPS:
                        remat.append(producer)
                        changed = True
                needed_by_state = self._needed(dep_ops + remat + [terminator], dependent,
                                               exclude=set(v for o in remat for v in o.results))
        crossing = [v for v in (r for o in indep_ops for r in o.results) if v in needed_by_state]
        remat = [o for o in indep_ops if o in remat]          # keep program order

        chunk_ip = ir.InsertionPoint(scan)
        workspaces = {}
        _names: dict = {}
        for value in crossing:
            shape = _shape(value.type)
            elt = _elt_type(_WORKSPACE_TYPES[self.workspace_dtype])
            dyn = ir.ShapedType.get_dynamic_size()
            mem_t = ir.MemRefType.get([dyn, dyn] + shape, elt)
            name = _value_name(value) or f"x{len(workspaces)}"
            _names[value] = name
            ws = ir.Operation.create("kda.workspace", results=[mem_t], attributes={
                "name": ir.StringAttr.get(f"{name}_ws"), "layout": ir.StringAttr.get("chunk")},
                loc=ir.Location.name(f"{name}_ws"), ip=chunk_ip)
            workspaces[value] = ws.results[0]

        # kernel 1: every chunk at once, stores the crossing values
        par = ir.Operation.create("kda.scan", results=[], operands=[],
                                  attributes={"reverse": scan.attributes["reverse"]},
                                  regions=1, loc=scan.location, ip=chunk_ip)
        par_block = par.regions[0].blocks.append(ir.IndexType.get())
        mapping = {args[0]: par_block.arguments[0]}
        par_ip = ir.InsertionPoint(par_block)
        for op in indep_ops:
            _clone(op, mapping, par_ip)
        for value in crossing:
            stored = mapping[value]
            if _element(value.type) != _WORKSPACE_TYPES[self.workspace_dtype]:
                stored = ir.Operation.create(
                    "kda.convert", results=[ir.RankedTensorType.get(_shape(value.type), _elt_type(
                        _WORKSPACE_TYPES[self.workspace_dtype]))], operands=[stored], ip=par_ip).results[0]
            ir.Operation.create("kda.store_chunk", results=[], operands=[
                workspaces[value], par_block.arguments[0], stored],
                attributes={"name": ir.StringAttr.get(_names[value])}, ip=par_ip)
        ir.Operation.create("gpu.yield", results=[], operands=[], ip=par_ip)
        _remove_unused(par_block)
        self._mark(par, f"{kernel_prefix}_chunk", parallel=True)

        # kernel 2: the state scan, reading the workspaces
        state = ir.Operation.create("kda.scan", results=[r.type for r in scan.results],
                                    operands=list(scan.operands),
                                    attributes=_attributes(scan),
                                    regions=1, loc=scan.location, ip=chunk_ip)
        st_block = state.regions[0].blocks.append(*[a.type for a in args])
        mapping = {a: b for a, b in zip(args, st_block.arguments)}
        st_ip = ir.InsertionPoint(st_block)
        for value in crossing:
            loaded = ir.Operation.create("kda.load_chunk", results=[ir.RankedTensorType.get(
                _shape(value.type), _elt_type(_WORKSPACE_TYPES[self.workspace_dtype]))],
                operands=[workspaces[value], st_block.arguments[0]],
                attributes={"name": ir.StringAttr.get(_names[value])},
                loc=ir.Location.name(_names[value]), ip=st_ip).results[0]
            if _element(value.type) != _WORKSPACE_TYPES[self.workspace_dtype]:
                loaded = ir.Operation.create("kda.convert", results=[value.type], operands=[loaded],
                                             ip=st_ip).results[0]
            mapping[value] = loaded
        for op in body:
            if op in remat or op in dep_ops:
                _clone(op, mapping, st_ip)
        _clone(terminator, mapping, st_ip)
        self._mark(state, f"{kernel_prefix}_state", parallel=False)
        for old, new in zip(scan.results, state.results):
            old.replace_all_uses_with(new)
        scan.erase()

    @staticmethod
    def _needed(users, dependent, exclude=frozenset()) -> set:
        return {v for op in users for v in op.operands
                if v not in dependent and v not in exclude and not isinstance(v, ir.BlockArgument)
                and v.owner.operation.parent == users[0].parent}

    @staticmethod
    def _mark(scan, kernel: str, parallel: bool) -> None:
        scan.attributes["kda.kernel"] = ir.StringAttr.get(kernel)
        scan.attributes["parallel"] = ir.BoolAttr.get(parallel)
        scan.attributes["kda.hbm_bytes_per_token"] = ir.FloatAttr.get(
            ir.F64Type.get(), hbm_bytes_per_token(scan))


def _value_name(value) -> str | None:
    from ..ir.dsl import value_name
    return value_name(value)


def _remove_unused(block) -> None:
    changed = True
    while changed:
        changed = False
        for op in reversed([o.operation for o in block.operations]):
            if op.name.startswith("kda.") and op.name not in SIDE_EFFECT_OPS and op.results \
                    and all(len(list(r.uses)) == 0 for r in op.results):
                op.erase()
                changed = True


def kernel_report(module: ir.Module) -> list[tuple[str, bool, float]]:
    """(kernel, parallel, HBM bytes per token and value head) for every kernel scan."""
    out = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    inner = inner.operation
                    if inner.name == "kda.scan" and "kda.kernel" in inner.attributes:
                        out.append((ir.StringAttr(inner.attributes["kda.kernel"]).value,
                                    bool(ir.BoolAttr(inner.attributes["parallel"]).value),
                                    ir.FloatAttr(inner.attributes["kda.hbm_bytes_per_token"]).value))
                    visit(inner)

    visit(module.operation)
    return out
