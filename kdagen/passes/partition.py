"""``kda-partition``: split each chunk scan into a chunk-parallel kernel and a state-scan kernel.

Inside a ``kda.scan`` body, an op is *state-dependent* when it (transitively) uses a carried
value (the [K, V] state, or an adjoint carried by a reverse scan). Everything else depends only
on the chunk's inputs and can run for all chunks at once. The pass

1. moves the state-independent ops into a new scan with no carried values (kernel
   ``<program>_chunk``, attribute ``parallel``), which stores every value the state part needs
   into a per-chunk workspace (``kda.workspace`` + ``kda.store_chunk``);
2. keeps the state-dependent ops in a scan that loads those workspaces
   (``kda.load_chunk``) — kernel ``<program>_state``;
3. fuses instead of storing where that moves fewer bytes: a min cut over the data-flow graph
   decides which values cross (each costs the bytes it would move) and which the state kernel
   recomputes from cheaper ones — e.g. the per-channel chunk decay [K] crosses rather than its
   [K, V] broadcast, and inputs are re-read rather than copied.

Workspaces hold ``workspace_dtype``; ``auto`` (the default) stores a value in bf16 only when
every use of it is a matrix-product operand (the tensor cores round it to bf16 anyway) and in
fp32 otherwise (states, gate quantities, anything summed or exponentiated). Each kernel scan gets
``kda.hbm_bytes_per_token``: bytes moved to/from global memory per token and value head,
counted from its loads and stores (tile bytes per chunk / chunk rows; per-sequence state loads
and stores are excluded as they do not scale with T).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .._mlir import ir
from ..ir.accessors import module_target, program_func
from ..ir.dialect import OPS, ops_with
from ..ir.transforms import dce, walk
from .base import ModulePass, PassError, register_pass

FREE_OPS = ops_with(kind="source")
RELOAD_OPS = ops_with(effect="read", kind="memory")
SOURCE_OPS = FREE_OPS | RELOAD_OPS
# Matrix work does not move into the state kernel (see _banned_from_state): it runs once per
# chunk in sequence there, while the chunk kernel runs all chunks in parallel.
STATE_BANNED_OPS = ops_with(kind=("matrix", "solve"))
MATMUL_OPS = ops_with(kind="matrix")
# What an op recomputed in the serial kernel costs: its latency on one warpgroup of
# SERIAL_THREADS threads (cycles per element and thread; ops whose threads exchange values add a
# fixed latency), charged once per chunk step, converted into the bytes one CTA streams in that
# time (~110 GB/s per CTA at 32 CTAs on the H200, PERF.md §6, at ~2 GHz), the unit of crossing.
SERIAL_THREADS = 128
SERIAL_BYTES_PER_CYCLE = 55
TRANSCENDENTAL_OPS = frozenset({"kda.exp2", "kda.log2", "kda.sigmoid", "kda.softplus",
                                "kda.rsqrt", "kda.div"})
FREE_ELEMENTWISE_OPS = frozenset({"kda.assume_range"})
SERIAL_CYCLES_PER_ELEMENT = {"elementwise": 2, "shape": 1, "reduction": 4}
SERIAL_FIXED_CYCLES = {"reduction": 300}
# the per-chunk tiles a kernel moves through HBM (load/store, load_chunk/store_chunk)
CHUNK_LOADS = ops_with(effect="read", kind="memory", operand="chunk")
CHUNK_STORES = ops_with(effect="write", operand="chunk")


def _banned_from_state(op) -> bool:
    """Matrix work stays in the chunk kernel, except products larger than their operands
    (outer-product-like, e.g. a chunk's [K, V] contribution to dS): crossing those costs more
    than recomputing them next to the state."""
    if op.name not in STATE_BANNED_OPS:
        return False
    size = math.prod(_shape(op.results[0].type))
    return size <= max(math.prod(_shape(v.type)) for v in op.operands)


def serial_cost(op) -> int:
    """Bytes-equivalent cost of recomputing ``op`` once per step in a serial kernel."""
    if op.name in FREE_ELEMENTWISE_OPS or not op.results:
        return 0
    kind = OPS[op.name[4:]].kind if op.name.startswith("kda.") else "elementwise"
    per_thread = -(-max(math.prod(_shape(r.type)) for r in op.results) // SERIAL_THREADS)
    per_element = SERIAL_CYCLES_PER_ELEMENT.get(kind, 0)
    if op.name in TRANSCENDENTAL_OPS:
        per_element *= 4
    cycles = per_thread * per_element + SERIAL_FIXED_CYCLES.get(kind, 0)
    return cycles * SERIAL_BYTES_PER_CYCLE


def _unary_of_cycle(op, cycle_values) -> bool:
    """An elementwise op whose only in-body operand is one cycle value of its own shape."""
    if not op.name.startswith("kda.") or OPS[op.name[4:]].kind != "elementwise":
        return False
    inside = [v for v in op.operands
              if isinstance(v, ir.BlockArgument) or v.owner.operation.parent == op.parent]
    return (len(inside) == 1 and inside[0] in cycle_values
            and _shape(inside[0].type) == _shape(op.results[0].type))


def _outside_only(op) -> bool:
    """An op computed only from values defined outside the scan body (``broadcast(scale)``):
    free to recompute wherever it is used, so it never crosses kernels."""
    if op.name in RELOAD_OPS or not op.operands:
        return False
    return all(not isinstance(v, ir.BlockArgument) and v.owner.operation.parent != op.parent
               for v in op.operands)


def _state_dependent(body: list, carried: set) -> tuple[list, set]:
    """The ops of a scan body that (transitively) use a carried value, and every value they
    and the carried values define."""
    dependent, dep_ops = set(carried), []
    for op in body:
        if any(v in dependent for v in op.operands):
            dep_ops.append(op)
            dependent.update(op.results)
    return dep_ops, dependent


def _matmul_operand(op, value) -> bool:
    """Whether ``value`` enters ``op`` only as a matrix operand (not as a decay exponent)."""
    positions = [i for i, v in enumerate(op.operands) if v == value]
    return all(i < 2 for i in positions)
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
    """Rows per chunk: the program's ``kda.chunk_size`` (the func that holds the scan)."""
    op = scan
    while op is not None and op.name != "func.func":
        op = op.parent
    if op is None or "kda.chunk_size" not in op.attributes:
        raise PassError("kda-partition: the program function has no kda.chunk_size attribute")
    return int(ir.IntegerAttr(op.attributes["kda.chunk_size"]).value)


def hbm_bytes_per_token(scan) -> float:
    rows = _chunk_rows(scan)
    total = 0
    for op in scan.regions[0].blocks[0].operations:
        name = op.operation.name
        if name in CHUNK_LOADS:
            total += tile_bytes(op.results[0].type)
        elif name in CHUNK_STORES:
            total += tile_bytes(op.operands[2].type)
    return total / rows


@register_pass
@dataclass
class PartitionPass(ModulePass):
    name = "kda-partition"
    summary = "split chunk scans into chunk-parallel and state-scan kernels; fuse; plan workspaces"
    # auto | fp32 | bf16 | fp16; None: the module's target's (kda.target), else auto
    workspace_dtype: str | None = None
    fuse: bool = True
    # keep only the recurrence cycle in the serial kernel (off-cycle state-dependent work moves
    # to a chunk-parallel kernel reading per-chunk checkpoints); false: the pre-slice split
    recurrence_slice: bool = True
    # scans stepping fewer rows than this stay one kernel: a per-token program (decode, 1..8
    # steps per sequence) has almost no serial chain to shorten, and the split would add two
    # launches and a round trip of the state per token through memory
    min_chunk_rows: int = 2
    # the off-cycle kernel (``_out``) loads chunk values the chunk kernel computes where the
    # min cut says crossing moves less than recomputing (``_min_cut``: matrix products always
    # cross); false: it recomputes every chunk value it needs from the inputs
    out_crossing: bool = False

    def run(self, module: ir.Module) -> None:
        if self.workspace_dtype is None:
            target = module_target(module)
            replace(self, workspace_dtype=target.workspace_dtype if target else "auto").run(module)
            return
        if self.workspace_dtype not in _WORKSPACE_TYPES and self.workspace_dtype != "auto":
            raise PassError(f"kda-partition: workspace_dtype={self.workspace_dtype!r}; choose "
                            f"auto, {', '.join(_WORKSPACE_TYPES)}")
        with module.context, ir.Location.unknown():
            func = program_func(module)
            program = ir.StringAttr(func.attributes["sym_name"]).value
            scans = [op.operation for op in func.regions[0].blocks[0].operations
                     if op.operation.name == "kda.scan"]
            for index, scan in enumerate(scans):
                suffix = "" if len(scans) == 1 else f"{index}"
                if _chunk_rows(scan) < self.min_chunk_rows:
                    # one kernel: the whole scan, serial
                    self._mark(scan, f"{program}{suffix}_whole", parallel=False)
                    continue
                if self.recurrence_slice:
                    self._slice_recurrence(scan, f"{program}{suffix}")
                self._split(scan, f"{program}{suffix}")

    def _slice_recurrence(self, scan, kernel_prefix: str) -> None:
        """Move the state-dependent ops off the recurrence cycle into a chunk-parallel scan.

        The cycle is what the next carried value needs: the ops reachable from a carried value
        that also reach the yield. Every other op using a carried value (the output in a
        forward scan, the input gradients in a reverse one) runs after the scan, for all chunks
        at once, from per-chunk checkpoints of the cycle values it reads (the carried value at
        chunk start, v', ...): the serial kernel then holds only the recurrence. The new scan
        recomputes the chunk-only values it needs from the inputs (``_split`` then treats it as
        the parallel kernel it is). Stores of cycle values (checkpoints the program writes
        itself) stay in the serial kernel.
        """
        block = scan.regions[0].blocks[0]
        args = list(block.arguments)
        carried = set(args[1:])
        if not carried:
            return
        body = [op.operation for op in block.operations]
        terminator, body = body[-1], body[:-1]
        dep_ops, _ = _state_dependent(body, carried)
        needed, cycle = set(terminator.operands), set()
        for op in reversed(dep_ops):
            if any(r in needed for r in op.results):
                cycle.add(op)
                needed.update(op.operands)
        cycle_values = set(carried) | {r for op in cycle for r in op.results}
        # a store of a cycle value (or of its conversion) is a checkpoint: it stays
        for op in dep_ops:
            if op.name in CHUNK_STORES and op not in cycle:
                stored = op.operands[2]
                src = stored.owner.operation if not isinstance(stored, ir.BlockArgument) else None
                if stored in cycle_values:
                    cycle.add(op)
                elif src is not None and src.name == "kda.convert" and \
                        src.operands[0] in cycle_values and len(list(stored.uses)) == 1:
                    cycle.update((src, op))
        off = [op for op in dep_ops if op not in cycle]
        if not off:
            return
        cycle_values = set(carried) | {r for op in cycle for r in op.results}
        wanted = {v for off_op in off for v in off_op.operands if v in cycle_values}
        # a unary elementwise function of another cycle value (v' and -v') is recomputed after
        # the scan from that value's checkpoint rather than checkpointed itself
        recomputed = []
        for op in reversed([op for op in body if op in cycle]):
            if op.results and op.results[0] in wanted and _unary_of_cycle(op, cycle_values):
                wanted.discard(op.results[0])
                wanted.update(v for v in op.operands if v in cycle_values)
                recomputed.insert(0, op)
        checkpoints = [v for v in [*args[1:], *(r for op in body if op in cycle for r in op.results)]
                       if v in wanted]
        existing = {op.operands[2]: op.operands[0] for op in body
                    if op in cycle and op.name in CHUNK_STORES
                    and _element(op.operands[2].type) == _element(op.operands[0].type)}
        names = {v: _value_name(v) or "checkpoint" for v in checkpoints}
        ip = ir.InsertionPoint(scan)
        workspaces = {}
        for value in checkpoints:
            if value in existing:
                workspaces[value] = existing[value]
                continue
            name = _value_name(value) or f"{value.owner.operation.name[4:]}{len(workspaces)}"
            dyn = ir.ShapedType.get_dynamic_size()
            mem_t = ir.MemRefType.get([dyn, dyn] + _shape(value.type),
                                      ir.ShapedType(value.type).element_type)
            workspaces[value] = ir.Operation.create(
                "kda.workspace", results=[mem_t], attributes={
                    "name": ir.StringAttr.get(f"{name}_chunks"),
                    "layout": ir.StringAttr.get("chunk")},
                loc=ir.Location.name(f"{name}_chunks"), ip=ip).results[0]
        # the serial scan stores the checkpoints it does not store already
        before_yield = ir.InsertionPoint(terminator)
        for value in checkpoints:
            if value not in existing:
                ir.Operation.create("kda.store_chunk", results=[], operands=[
                    workspaces[value], args[0], value],
                    attributes={"name": ir.StringAttr.get(names[value])}, ip=before_yield)
        crossing = self._out_crossing(body, dep_ops, off, recomputed, terminator, ip,
                                      before_yield, args[0]) if self.out_crossing else {}
        # the chunk-parallel scan after it: checkpoints loaded, chunk values recomputed
        out = ir.Operation.create("kda.scan", results=[], operands=[],
                                  attributes={"reverse": scan.attributes["reverse"]},
                                  regions=1, loc=scan.location, ip=ir.InsertionPoint.after(scan))
        out_block = out.regions[0].blocks.append(ir.IndexType.get())
        out_ip = ir.InsertionPoint(out_block)
        mapping = {args[0]: out_block.arguments[0]}
        for value in checkpoints:
            mapping[value] = ir.Operation.create(
                "kda.load_chunk", results=[value.type],
                operands=[workspaces[value], out_block.arguments[0]],
                attributes={"name": ir.StringAttr.get(names[value])},
                loc=ir.Location.name(names[value]), ip=out_ip).results[0]
        for value, (ws, name) in crossing.items():
            mapping[value] = self._load_crossing(ws, out_block.arguments[0], value, name, out_ip)
        crossed = {v.owner.operation for v in crossing}
        off_set = set(off) | set(recomputed)
        for op in body:
            if op in crossed:
                continue
            if op in off_set or (op not in dep_ops and op.name not in CHUNK_STORES):
                _clone(op, mapping, out_ip)
        ir.Operation.create("gpu.yield", results=[], operands=[], ip=out_ip)
        dce(out)
        for op in reversed(off):
            op.erase()
        dce(scan)
        self._mark(out, f"{kernel_prefix}_out", parallel=True)

    def _out_crossing(self, body, dep_ops, off, recomputed, terminator, ws_ip, store_ip,
                      index) -> dict:
        """{chunk value: (workspace, name)} the off-cycle kernel loads instead of recomputing:
        the min cut between the chunk's inputs and what the off-cycle ops use (`_min_cut`).
        The serial scan stores them before its yield; `_split` then moves those stores, with
        everything they read, into the chunk kernel."""
        dep_set = set(dep_ops)
        indep = [op for op in body if op not in dep_set and op.name not in CHUNK_STORES]
        users = [op for op in body if op in set(off) | set(recomputed)]
        if not indep or not users:
            return {}
        _, crossing = self._min_cut(indep, users)
        out = {}
        for value in crossing:
            name = f"{_value_name(value) or value.owner.operation.name[4:]}_x{len(out)}"
            ws = self._crossing_workspace(value, name, ws_ip)
            self._store_crossing(ws, index, value, value, name, store_ip)
            out[value] = (ws, name)
        return out

    def _crossing_workspace(self, value, name: str, ip) -> ir.Value:
        """A per-chunk workspace ``<name>_ws`` for ``value`` in its storage type."""
        dyn = ir.ShapedType.get_dynamic_size()
        mem_t = ir.MemRefType.get([dyn, dyn] + _shape(value.type),
                                  _elt_type(self._storage(value)))
        return ir.Operation.create("kda.workspace", results=[mem_t], attributes={
            "name": ir.StringAttr.get(f"{name}_ws"), "layout": ir.StringAttr.get("chunk")},
            loc=ir.Location.name(f"{name}_ws"), ip=ip).results[0]

    def _store_crossing(self, ws, index, value, stored, name: str, ip) -> None:
        """Store ``stored`` (``value`` or its clone) into ``ws``, converted to its storage
        type."""
        if _element(value.type) != self._storage(value):
            stored = ir.Operation.create(
                "kda.convert", results=[ir.RankedTensorType.get(
                    _shape(value.type), _elt_type(self._storage(value)))],
                operands=[stored], ip=ip).results[0]
        ir.Operation.create("kda.store_chunk", results=[], operands=[ws, index, stored],
                            attributes={"name": ir.StringAttr.get(name)}, ip=ip)

    def _load_crossing(self, ws, index, value, name: str, ip) -> ir.Value:
        """Load ``value`` back from ``ws``, converted from its storage type."""
        loaded = ir.Operation.create("kda.load_chunk", results=[ir.RankedTensorType.get(
            _shape(value.type), _elt_type(self._storage(value)))],
            operands=[ws, index], attributes={"name": ir.StringAttr.get(name)},
            loc=ir.Location.name(name), ip=ip).results[0]
        if _element(value.type) != self._storage(value):
            loaded = ir.Operation.create("kda.convert", results=[value.type], operands=[loaded],
                                         ip=ip).results[0]
        return loaded

    def _split(self, scan, kernel_prefix: str) -> None:
        block = scan.regions[0].blocks[0]
        args = list(block.arguments)
        carried = set(args[1:])
        body = [op.operation for op in block.operations]
        terminator, body = body[-1], body[:-1]
        dep_ops, dependent = _state_dependent(body, carried)
        dep_set = set(dep_ops)
        indep_ops = [op for op in body if op not in dep_set]
        if not carried or not dep_ops or not any(o.name not in SOURCE_OPS for o in indep_ops):
            self._mark(scan, f"{kernel_prefix}_scan", parallel=not carried)
            return
        if self.fuse:
            remat, crossing = self._min_cut(indep_ops, dep_ops + [terminator])
        else:
            remat = [o for o in indep_ops if o.name in FREE_OPS]
            needed = self._needed(dep_ops + remat + [terminator], dependent,
                                  exclude={v for o in remat for v in o.results})
            crossing = [r for o in indep_ops for r in o.results if r in needed]
        if not crossing:   # everything is cheaper to recompute: one kernel
            self._mark(scan, f"{kernel_prefix}_scan", parallel=False)
            return

        chunk_ip = ir.InsertionPoint(scan)
        workspaces = {}
        _names: dict = {}
        for value in crossing:
            base = _value_name(value) or f"{value.owner.operation.name[4:]}{len(workspaces)}"
            # workspaces are found by name (kernels of other scans reuse a name as one buffer
            # used in turn); two values crossing from this scan must not share one
            name, i = base, 1
            while name in _names.values():
                name, i = f"{base}{i}", i + 1
            _names[value] = name
            workspaces[value] = self._crossing_workspace(value, name, chunk_ip)

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
            self._store_crossing(workspaces[value], par_block.arguments[0], value, mapping[value],
                                 _names[value], par_ip)
        ir.Operation.create("gpu.yield", results=[], operands=[], ip=par_ip)
        dce(par)
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
            mapping[value] = self._load_crossing(workspaces[value], st_block.arguments[0], value,
                                                 _names[value], st_ip)
        for op in body:
            if op in remat or op in dep_ops:
                _clone(op, mapping, st_ip)
        _clone(terminator, mapping, st_ip)
        dce(state)
        self._mark(state, f"{kernel_prefix}_state", parallel=False)
        for old, new in zip(scan.results, state.results):
            old.replace_all_uses_with(new)
        scan.erase()

    def _min_cut(self, indep_ops: list, state_users: list) -> tuple[list, list]:
        """Choose what the state kernel recomputes and what crosses through workspaces.

        A min cut on the data-flow graph of the independent ops (the rematerialisation
        formulation): each value costs what crossing it would move — 2 × its workspace bytes
        (written, then read), or its own bytes for a load (read again), 0 for constants — and
        the cut separates the chunk's inputs from the values the state ops use. Values on the
        cut cross (loads on the cut are simply re-issued); everything past it is recomputed.
        """
        values = [op.results[0] for op in indep_ops if op.results]
        index = {v: i for i, v in enumerate(values)}
        n = len(values)
        source, sink = 2 * n, 2 * n + 1
        big = 1 << 60
        graph = MaxFlow(2 * n + 2)
        for v, i in index.items():
            op = v.owner.operation
            graph.add_edge(2 * i, 2 * i + 1, self._crossing_cost(v))
            operands = [u for u in op.operands if u in index]
            if _banned_from_state(op) or (not operands and op.name in RELOAD_OPS):
                graph.add_edge(source, 2 * i, big)       # must be computed in the chunk kernel
            elif operands:
                # recomputed past the cut, in the serial kernel: pay its latency there
                graph.add_edge(source, 2 * i, serial_cost(op))
            for u in operands:
                graph.add_edge(2 * index[u] + 1, 2 * i, big)
        used_by_state = {u for op in state_users for u in op.operands if u in index}
        for v in used_by_state:
            graph.add_edge(2 * index[v] + 1, sink, big)
        reachable = graph.min_cut_source_side(source, sink)
        crossing, remat = [], []
        for op in indep_ops:
            if not op.results:
                continue
            i = index[op.results[0]]
            if 2 * i in reachable and 2 * i + 1 not in reachable:      # on the cut
                if op.name in FREE_OPS or op.name in RELOAD_OPS or _outside_only(op):
                    remat.append(op)                                   # re-issue it
                else:
                    crossing.append(op.results[0])
            elif 2 * i not in reachable:
                remat.append(op)                                       # past the cut
        return remat, crossing

    def _crossing_cost(self, value) -> int:
        name = value.owner.operation.name
        if name in FREE_OPS or _outside_only(value.owner.operation):
            return 0
        if name in RELOAD_OPS:
            return tile_bytes(value.type)
        numel = math.prod(_shape(value.type))
        return 2 * numel * _ELEMENT_BYTES[self._storage(value)]

    def _storage(self, value) -> str:
        """Element type a crossing value is stored in. ``auto``: bf16 when every use is a
        matrix-product operand (tensor cores round it to bf16 anyway), else fp32 (states, gate
        and exponent quantities, anything summed or fed to exp2 keeps full precision)."""
        if self.workspace_dtype != "auto":
            return _WORKSPACE_TYPES[self.workspace_dtype]
        users = [u.owner.operation if hasattr(u.owner, "operation") else u.owner
                 for u in value.uses]
        if users and all(u.name in MATMUL_OPS and _matmul_operand(u, value) for u in users):
            return "bf16"
        return "f32"

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


class MaxFlow:
    """Edmonds–Karp max flow on a small graph (a few hundred nodes per scan body)."""

    def __init__(self, n: int):
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def add_edge(self, u: int, v: int, capacity: int) -> None:
        for a, b, c in ((u, v, capacity), (v, u, 0)):
            self.adj[a].append(len(self.to))
            self.to.append(b)
            self.cap.append(c)

    def _augment(self, s: int, t: int) -> bool:
        parent = {s: None}
        queue = [s]
        for u in queue:
            for e in self.adj[u]:
                v = self.to[e]
                if self.cap[e] > 0 and v not in parent:
                    parent[v] = e
                    if v == t:
                        path, node = [], t
                        while parent[node] is not None:
                            path.append(parent[node])
                            node = self.to[parent[node] ^ 1]
                        push = min(self.cap[e2] for e2 in path)
                        for e2 in path:
                            self.cap[e2] -= push
                            self.cap[e2 ^ 1] += push
                        return True
                    queue.append(v)
        return False

    def min_cut_source_side(self, s: int, t: int) -> set:
        while self._augment(s, t):
            pass
        seen, queue = {s}, [s]
        for u in queue:
            for e in self.adj[u]:
                if self.cap[e] > 0 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    queue.append(self.to[e])
        return seen


def kernel_report(module: ir.Module) -> list[tuple[str, bool, float]]:
    """(kernel, parallel, HBM bytes per token and value head) for every kernel scan."""
    return [(ir.StringAttr(op.attributes["kda.kernel"]).value,
             bool(ir.BoolAttr(op.attributes["parallel"]).value),
             ir.FloatAttr(op.attributes["kda.hbm_bytes_per_token"]).value)
            for op in walk(module) if op.name == "kda.scan" and "kda.kernel" in op.attributes]
