"""``kda-share-chunk-values``: a chunk-parallel kernel loads what an earlier one computed.

After ``kda-partition`` a program can compute one chunk quantity in several chunk-parallel
kernels. The backward is the case in point: its prologue kernel computes the inverse
(I + Akk)⁻¹, w and u for the forward recompute, and the two kernels after the scans (dq; dk,
dv, dg, dβ) compute the same decay products, inverse, w and u again from the inputs. In the
tile lowering a matrix product or a triangular inverse costs far more than streaming its fp32
result back (16–32 KB per chunk through the producer's TMA ring), so the earliest kernel that
computes such a value stores it into a per-chunk workspace of its own and the later kernels
load it.

Two ops compute the same value when they have the same name, attributes and result types and
their operands are the same values: the chunk index, a value defined outside the kernels, or
results of ops that compute the same value (value numbering across the kernel bodies). Two
reads match when they read the same memory with no write to it between the two kernels: the
program's inputs, and workspaces written before both (the backward's dq kernel and dk kernel
both read the forward recompute's state checkpoints, w and u; the reverse scan between them
writes only dS and dv'). The runtime allocates workspaces by name, so a write to any
workspace of that name counts; a kernel's reads of memory it writes itself never match.
With that, the dk kernel loads w S, do v'ᵀ, do Sᵀ and the dq decay product from the dq kernel:
on an H100 (B1_T8k_H16) kda's dk kernel 2301 -> 1868 us, its dq kernel 917 -> 968 us,
fwd+bwd 5.34 -> 4.97 ms; gdn 4.58 -> 4.39 ms (bench/results/h100_stop40_share_checkpoint_reads.md).

What is shared: results of matrix and solve ops (``kda.dot``, ``decay_dot``, ``decay_matmul``,
``tril_inv``, ``tril_solve``), the work that dominates a chunk kernel; the elementwise work
feeding them stays recomputed where something else still uses it. Sharing the gate's cumsum
too (a [C, K] fp32 value per chunk) was measured slower: KDA B1_T8k_H16 fwd+bwd 5.195 ->
5.528 ms on the H200, the kernels that load it slower than those that recomputed it (the
dq kernel 927 -> 1143 us) and the ones that store it too
(bench/results/h200_share_cumsum_ablation_B1_T8k_H16.log). A shared value is loaded
only where the kernel still needs it after the others are loaded (w replaces its own inverse
unless the kernel uses the inverse elsewhere). Workspaces keep the value's element type (fp32),
so a loaded value is the recomputed one.

In every chip's pipeline, after ``kda-partition``. Measured on the H200 (kda_bwd, K = V = 128,
B1_T8k_H16, same process as FLA; ``bench/results/h200_bench_kernels_affine_ints_share.log``):
the dq kernel 2.87 -> 1.92 ms, the dk/dv/dg kernel 5.33 -> 4.94 ms, the prologue 0.81 ->
0.96 ms (it stores the shared values), forward+backward 11.56 -> 10.38 ms; the GPU check of the
backward variants 152/152 within the bars
(``bench/results/h200_gpu_check_share_chunk_values_own_workspaces.log``).

A first version let the dk kernel load w and u from the prologue's workspaces ``w_ws`` /
``u_ws``; ``kda-partition`` names the reverse scan's copy of w ``w_ws`` too, and the runtime
allocates workspaces by name, so the dq kernel's transposed TF32 copy overwrote the w the dk
kernel read (dk errors 4e-2 to 0.4 on the H200). Shared values therefore go to workspaces of
their own, under names no other workspace of the program has.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._mlir import ir
from ..ir.accessors import program_func
from ..ir.dialect import ops_with
from ..ir.transforms import SIDE_EFFECT_OPS, attr_key, dce, defining_op, walk
from .base import ModulePass, register_pass
from .partition import _attributes, _shape, _value_name, hbm_bytes_per_token

SHARED_OPS = ops_with(kind=("matrix", "solve"))
PURE_OPS = ops_with(effect="pure")
READ_OPS = ops_with(effect="read")
WRITE_OPS = ops_with(effect=("write", "global"))


def _parallel_scans(func) -> list:
    return [op.operation for op in func.regions[0].blocks[0].operations
            if op.operation.name == "kda.scan" and "parallel" in op.operation.attributes
            and ir.BoolAttr(op.operation.attributes["parallel"]).value]


def _body(scan) -> list:
    return [op.operation for op in scan.regions[0].blocks[0].operations]


class _Numbering:
    """Value numbers of the values of kernel bodies: equal numbers, equal values.

    A read of memory is numbered with the memory's version: how many writes the program made to
    it before the kernel. Two kernels' reads of an input, or of a workspace nothing writes
    between them, are the same tile; a read of memory the kernel writes itself is never
    numbered."""

    def __init__(self):
        self.versions: dict = {}      # memory key -> writes made so far (in program order)

    def wrote(self, written: set) -> None:
        """Count the writes of a top-level op (`_written_memory` of it)."""
        for key in written:
            self.versions[key] = self.versions.get(key, 0) + 1

    def of_scan(self, scan, own_writes: set) -> dict:
        """The numbers of ``scan``'s values; ``own_writes``: `_written_memory` of ``scan``."""
        block = scan.regions[0].blocks[0]
        chunk = block.arguments[0]
        numbers: dict = {}

        def number(v):
            if v == chunk:
                return ("chunk",)
            if isinstance(v, ir.BlockArgument):
                return None if v.owner == block else ("outer", v)
            if defining_op(v).parent != scan:
                return ("outer", v)
            return numbers.get(v)

        for op in _body(scan):
            memory = tuple(_memory_key(v) for v in op.operands if _is_memref(v))
            if op.name in PURE_OPS:
                ok, versions = True, ()
            elif op.name in READ_OPS:
                ok = not any(key in own_writes for key in memory)
                versions = tuple(self.versions.get(key, 0) for key in memory)
            else:
                ok = False
            operands = tuple(number(v) for v in op.operands)
            if not ok or any(n is None for n in operands):
                continue
            head = (op.name, attr_key(op), tuple(str(r.type) for r in op.results), operands,
                    versions)
            for i, r in enumerate(op.results):
                numbers[r] = (head, i)
        return numbers


def _memory_key(v):
    """What a memref names at run time: the runtime allocates workspaces by name (two
    ``kda.workspace`` ops of one name are one buffer), any other memref is itself."""
    owner = defining_op(v)
    if owner is not None and owner.name == "kda.workspace":
        return ("workspace", ir.StringAttr(owner.attributes["name"]).value)
    return ("value", v)


def _written_memory(op) -> set:
    return {_memory_key(inner.operands[0]) for inner in walk(op) if inner.name in WRITE_OPS}


def _count_bytes(scan) -> None:
    """Re-count a kernel's ``kda.hbm_bytes_per_token`` after its loads or stores changed."""
    scan.attributes["kda.hbm_bytes_per_token"] = ir.FloatAttr.get(
        ir.F64Type.get(), hbm_bytes_per_token(scan))


def _is_memref(v) -> bool:
    return isinstance(v.type, ir.MemRefType)


def _still_needed(scan, candidates: set) -> list:
    """The candidates that the kernel's effects still reach once every candidate is a load
    (a candidate's own operands are no longer needed through it)."""
    defining = {r: op for op in _body(scan) for r in op.results}
    reached, seen = [], set()
    stack = [op for op in _body(scan) if op.name in SIDE_EFFECT_OPS]
    while stack:
        op = stack.pop()
        for v in op.operands:
            src = defining.get(v)
            if src is None or src in seen:
                continue
            seen.add(src)
            if src in candidates:
                reached.append(src)
            else:
                stack.append(src)
    order = {op: i for i, op in enumerate(_body(scan))}
    return sorted(reached, key=order.__getitem__)


@dataclass
class _FirstKernel:
    """The program's first chunk-parallel kernel, as :meth:`ShareChunkValuesPass._hoist`
    needs it: its scan, where it stands among the function's ops, the memory versions its
    reads saw, the memory it writes, and its values by value number."""
    scan: object
    position: int
    versions: dict
    writes: set
    values: dict                  # value number -> value of the kernel


@register_pass
@dataclass
class ShareChunkValuesPass(ModulePass):
    name = "kda-share-chunk-values"
    summary = "later chunk-parallel kernels load the matrix results an earlier one computed"
    # a matrix product a later chunk kernel computes from the chunk's inputs alone (no value
    # of a serial kernel, no memory written since the first chunk kernel) moves into the first
    # one, with the element-wise work feeding it that the first kernel lacks, and is loaded
    # where it was (the backward's query-key decay product and its product with do move from
    # the dq kernel into the prologue). Off: measured no gain on the H100 (kda B1_T8k_H16,
    # bench/results/h100_stop50_ab_candidates_b1t8k.log): the forward's prologue +87 us and
    # output kernel -92; the backward's prologue +206 us and dq kernel -9 (its 1362 fewer
    # instructions per thread do not show: it waits on shared memory and its loads instead)
    hoist_products: bool = False

    def run(self, module: ir.Module) -> None:
        with module.context, ir.Location.unknown():
            func = program_func(module)
            scans = _parallel_scans(func)
            if len(scans) < 2:
                return
            numbering = _Numbering()
            first: dict = {}            # value number -> (kernel, value) where first computed
            made: dict = {}             # value -> (workspace, tile name) made to share it
            workspaces = {ir.StringAttr(op.operation.attributes["name"]).value
                          for op in func.regions[0].blocks[0].operations
                          if op.operation.name == "kda.workspace"}
            tops = [op.operation for op in func.regions[0].blocks[0].operations]
            head: _FirstKernel | None = None
            hoisted: set = set()        # values hoist_products moved into the first kernel
            for position, top in enumerate(tops):
                written = _written_memory(top)
                if top in scans:
                    numbers = numbering.of_scan(top, written)
                    if head is None:
                        head = _FirstKernel(top, position, dict(numbering.versions), written,
                                            {n: v for v, n in numbers.items()})
                    elif self.hoist_products:
                        hoisted |= self._hoist(top, numbers, head, numbering.versions, tops,
                                               first)
                    self._share_into(top, numbers, first, workspaces, made, hoisted)
                numbering.wrote(written)
            if hoisted:
                dce(head.scan)                 # hoisted products no kernel ended up loading
                _count_bytes(head.scan)

    def _hoist(self, scan, numbers: dict, head: _FirstKernel, versions: dict, tops: list,
               first: dict) -> set:
        """Move the matrix products of ``scan`` that only the chunk's inputs feed into
        ``head``'s kernel (``hoist_products``), with the ops feeding them that ``head`` does
        not compute already; ``first`` then sends ``scan`` (and later kernels) to load them
        (the store made where a kernel loads one). Returns the hoisted values."""
        body = _body(scan)
        defining = {r: op for op in body for r in op.results}
        positions = {top: i for i, top in enumerate(tops)}

        def cone(op, seen: dict) -> bool:
            """Whether ``op`` can run in the head kernel: collect into ``seen`` (op -> True)
            the ops of ``scan`` it needs that the head kernel lacks."""
            if op in seen:
                return True
            if any(numbers.get(r) is None for r in op.results):
                return False                     # an effect, or a read of its own writes
            if all(numbers[r] in head.values for r in op.results):
                return True
            if op.name in READ_OPS:
                for v in op.operands:
                    if _is_memref(v):
                        key = _memory_key(v)
                        if key in head.writes or versions.get(key, 0) != head.versions.get(key, 0):
                            return False         # written since the head kernel read it
            for v in op.operands:
                src = defining.get(v)
                if src is not None:
                    if not cone(src, seen):
                        return False
                elif not isinstance(v, ir.BlockArgument):
                    owner = defining_op(v)
                    if owner.parent == scan or positions.get(owner, -1) >= head.position:
                        return False             # defined after the head kernel
            seen[op] = True
            return True

        order = {op: i for i, op in enumerate(body)}
        moved = set()
        for op in body:
            if op.name not in SHARED_OPS or numbers.get(op.results[0]) in first:
                continue
            if numbers.get(op.results[0]) in head.values:
                continue
            needed: dict = {}
            if not cone(op, needed):
                continue
            value = self._clone_into(head, sorted(needed, key=order.__getitem__), numbers,
                                     scan)
            first[numbers[op.results[0]]] = (head.scan, value)
            moved.add(value)
        return moved

    @staticmethod
    def _clone_into(head: _FirstKernel, ops: list, numbers: dict, scan):
        """Clone ``ops`` (program order) into the head kernel, each right after the last of
        the head kernel's ops it reads (so what it reads dies no later than before); returns
        the last op's result."""
        block = head.scan.regions[0].blocks[0]
        chunk, their_chunk = block.arguments[0], scan.regions[0].blocks[0].arguments[0]
        cloned = None
        for op in ops:
            operands = []
            for v in op.operands:
                n = numbers.get(v)
                operands.append(chunk if v == their_chunk else
                                head.values[n] if n is not None and n in head.values else v)
            head_ops = _body(head.scan)
            index = {o: i for i, o in enumerate(head_ops)}
            defs = [index[op_] for op_ in map(defining_op, operands) if op_ in index]
            at = head_ops[max(defs) + 1] if defs else head_ops[0]
            cloned = ir.Operation.create(op.name, results=[r.type for r in op.results],
                                         operands=operands, attributes=_attributes(op),
                                         loc=op.location, ip=ir.InsertionPoint(at))
            for old, fresh in zip(op.results, cloned.results):
                head.values[numbers[old]] = fresh
        return cloned.results[0]

    def _share_into(self, scan, numbers: dict, first: dict, workspaces: set, made: dict,
                    hoisted: set = frozenset()) -> None:
        """Replace what ``scan`` computes that an earlier kernel computed by a load of it."""
        candidates = {op for op in _body(scan) if op.name in SHARED_OPS
                      and numbers.get(op.results[0]) in first}
        changed = set()
        for op in _still_needed(scan, candidates):
            source_scan, value = first[numbers[op.results[0]]]
            ws, name = self._workspace_of(source_scan, value, workspaces, made,
                                          after=value if value in hoisted else None)
            loaded = ir.Operation.create(
                "kda.load_chunk", results=[value.type],
                operands=[ws, scan.regions[0].blocks[0].arguments[0]],
                attributes={"name": ir.StringAttr.get(name)},
                loc=op.location, ip=ir.InsertionPoint(op)).results[0]
            op.results[0].replace_all_uses_with(loaded)
            changed.update((scan, source_scan))
        for v, n in numbers.items():
            first.setdefault(n, (scan, v))
        if changed:
            dce(scan)
        for s in changed:
            _count_bytes(s)

    @staticmethod
    def _workspace_of(scan, value, names: set, made: dict, after=None):
        """(workspace, tile name) ``scan`` stores ``value`` to for sharing: a chunk workspace of the
        value's own type (fp32) and a store before the kernel's yield, made once per value.
        Never a workspace the kernel already stores: other kernels read those, and a register
        scan among them chooses how they are laid out (transposed, TF32-rounded)."""
        if value in made:
            return made[value]
        base = _value_name(value) or defining_op(value).name[4:]
        name, i = f"{base}_ws", 1
        while name in names:
            name, i = f"{base}{i}_ws", i + 1
        names.add(name)
        dyn = ir.ShapedType.get_dynamic_size()
        mem_t = ir.MemRefType.get([dyn, dyn] + _shape(value.type),
                                  ir.ShapedType(value.type).element_type)
        ws = ir.Operation.create("kda.workspace", results=[mem_t], attributes={
            "name": ir.StringAttr.get(name), "layout": ir.StringAttr.get("chunk")},
            loc=ir.Location.name(name), ip=ir.InsertionPoint(scan)).results[0]
        # before the yield; ``after``: right after that value (a hoisted product: its buffer
        # then dies there)
        ip = ir.InsertionPoint(_body(scan)[-1])
        if after is not None:
            ops = _body(scan)
            ip = ir.InsertionPoint(ops[ops.index(defining_op(after)) + 1])
        ir.Operation.create("kda.store_chunk", results=[], operands=[
            ws, scan.regions[0].blocks[0].arguments[0], value],
            attributes={"name": ir.StringAttr.get(name[:-3])}, ip=ip)
        made[value] = ws, name[:-3]
        return made[value]
