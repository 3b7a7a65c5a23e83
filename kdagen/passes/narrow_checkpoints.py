"""``kda-narrow-checkpoints``: store a serial kernel's per-chunk checkpoints in fp16 where
every product that reads them rounds its operands to a 10-bit significand anyway.

The recurrence slice (kda-partition) has each serial scan store the values its off-cycle
kernel needs, per chunk: the state at chunk start and v' in a forward. They are fp32, 1.5 KB
per token and value head at K = V = 128 written and read again, a fifth of the forward's HBM
bytes, and the forward runs at the bandwidth (docs/ARCHITECTURE.md, "where GDN's time goes").
A product at TF32 reads an operand to 10 significand bits; fp16 keeps exactly those bits
(its exponent range aside), so a checkpoint every reader of which only feeds such products
can be stored in fp16 and the products compute what they computed from fp32: in the CPU
simulator of the kernels o moves from 1.736e-3 to 1.737e-3 (gdn_fwd, "B1_T1000 weak";
floor 1.66e-3). A checkpoint a more precise product reads (bf16x3, tf32x3: the backward's dk
kernel reading the state and dS for the gate-parameter gradients) keeps fp32: there fp16 moved
gdn_bwd's dA_log from 6.0e-4 to 9.2e-4 ("B1_T200 correlated steep").

fp16's largest value is 65504, and nothing bounds the state and v' by a constant (they scale
with v). ``scale=column`` (the default) divides each value column by its 2-norm over the rows
before the conversion, so every stored entry is in [-1, 1], and stores the [V] norms per chunk
beside it in fp32; the reader multiplies them back (a column of the state or of v' feeds one
column of o, so each column keeps 10 bits relative to itself). ``scale=none`` stores the
values as they are: an entry past 65504 becomes infinity. On sm_90a the register scan sums
each value column with two quad shuffles (a value column is one accumulator row) and stores
the norms from the quad leaders; the register-tile reader multiplies each A element of the
product's W (its rows are W's columns) by its column's norm.

A checkpoint here is a ``kda.workspace`` of layout ``chunk`` and element f32 that serial
kernels (scans carrying a value) write and chunk-parallel kernels read, where every read feeds
only matrix operands of products whose ``kda.precision`` is ``tf32`` or ``bf16``; the
runtime allocates workspaces by name, so all workspaces of one name narrow together or not at
all. Writers convert to f16 before their store, readers widen after their load (exact). After
``kda-assign-precision`` (it reads the products' precision), before the per-kernel planning.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .._mlir import ir
from ..ir.accessors import program_func
from ..ir.precision import PRODUCT_OPS
from ..ir.transforms import walk
from .base import ModulePass, register_pass
from .partition import _WORKSPACE_TYPES, _attributes, _elt_type, _shape
from .share_chunk_values import _count_bytes

#: products whose operands are rounded to at most a 10-bit significand (fp16 keeps them)
NARROW_PRECISIONS = frozenset({"tf32", "bf16"})


def _owner(use):
    return use.owner.operation if hasattr(use.owner, "operation") else use.owner


def _feeds_narrow_products(value) -> bool:
    """Whether ``value`` is used only as a matrix operand (operand 0 or 1) of products at a
    precision of at most 10 significand bits."""
    uses = list(value.uses)
    if not uses:
        return False
    for use in uses:
        op = _owner(use)
        if op.name not in PRODUCT_OPS or use.operand_number > 1:
            return False
        if "kda.precision" not in op.attributes or \
                ir.StringAttr(op.attributes["kda.precision"]).value not in NARROW_PRECISIONS:
            return False
    return True


def _kernel_of(op):
    while op is not None and not (op.name == "kda.scan" and "kda.kernel" in op.attributes):
        op = op.parent
    return op


@register_pass
@dataclass
class NarrowCheckpointsPass(ModulePass):
    name = "kda-narrow-checkpoints"
    summary = "serial kernels' checkpoints in fp16 where only TF32 products read them"
    # "fp32": leave every checkpoint as it is (the default); "fp16": narrow. fp16 with the
    # column scale, on the H100 (one process; GPU check 574 ok): gdn fwd B1_T32k_H16 1.478 ->
    # 1.395 ms, B8_T4k_H32 3.656 -> 3.120; kda fwd 2.474 -> 2.427 and 5.402 -> 4.928; fwd+bwd
    # 0.3-2.5% faster (bench/results/h100_stop61_ab_f16s.log, h100_stop61_check_f16s_full.log).
    # The default until the GPU checks the final lowering (rsqrt.approx and four add chains in
    # the register scan's column sums, the K-split column exchange at K = 256) and the
    # portable and stand-in sets with it (bench/calls/stop61.sh cf2)
    dtype: str = field(default="fp32", metadata={"choices": ("fp32", "fp16")})
    # which checkpoints: "tf32" (those only products of at most TF32 precision read) or "all"
    # (every one: the accuracy study's knob, e.g. the backward's state read at bf16x3)
    scope: str = field(default="tf32", metadata={"choices": ("tf32", "all")})
    # "column": each value column scaled by its 2-norm over the rows before the conversion
    # (|x| <= 1: within fp16's range whatever the state's size), the norms stored beside it in
    # fp32 ([V] per chunk, <name>_norm) and multiplied back after the load; "none": unscaled
    # (an entry past 65504 stores as infinity; what stop 60 measured on the GPU)
    scale: str = field(default="column", metadata={"choices": ("column", "none")})

    def run(self, module: ir.Module) -> None:
        if self.dtype == "fp32":
            return
        with module.context, ir.Location.unknown():
            func = program_func(module)
            top = [op.operation for op in func.regions[0].blocks[0].operations]
            by_name: dict = {}
            for op in top:
                if op.name == "kda.workspace":
                    by_name.setdefault(ir.StringAttr(op.attributes["name"]).value, []).append(op)
            accesses = {}
            for op in walk(module):
                if op.name in ("kda.store_chunk", "kda.load_chunk"):
                    accesses.setdefault(op.operands[0], []).append(op)
            touched = set()
            for name, spaces in by_name.items():
                if all(self._eligible(ws, accesses.get(ws.results[0], []), self.scope)
                       for ws in spaces):
                    for ws in spaces:
                        touched.update(self._narrow(ws, accesses.get(ws.results[0], [])))
            for kernel in touched:
                _count_bytes(kernel)

    @staticmethod
    def _eligible(ws, accesses: list, scope: str) -> bool:
        mem_t = ir.MemRefType(ws.results[0].type)
        if str(mem_t.element_type) != "f32" or "layout" not in ws.attributes or \
                ir.StringAttr(ws.attributes["layout"]).value != "chunk":
            return False
        if len(accesses) != len(list(ws.results[0].uses)):  # read some other way (sum_chunks)
            return False
        stores = [a for a in accesses if a.name == "kda.store_chunk"]
        loads = [a for a in accesses if a.name == "kda.load_chunk"]
        if not stores or not loads:
            return False
        for s in stores:
            kernel = _kernel_of(s)
            if kernel is None or not kernel.operands:          # not a serial kernel
                return False
        for load in loads:
            kernel = _kernel_of(load)
            if kernel is None or kernel.operands:
                return False
            if scope == "tf32" and not _feeds_narrow_products(load.results[0]):
                return False
        return True

    def _narrow(self, ws, accesses: list) -> set:
        """Re-type workspace ``ws`` and its accesses to f16; the kernels touched."""
        f16 = _elt_type(_WORKSPACE_TYPES[self.dtype])
        mem_t = ir.MemRefType(ws.results[0].type)
        new = ir.Operation.create("kda.workspace", results=[
            ir.MemRefType.get(list(mem_t.shape), f16)], attributes=_attributes(ws),
            loc=ws.location, ip=ir.InsertionPoint(ws)).results[0]
        norms = None
        if self.scale == "column":
            shape = list(mem_t.shape)
            norms = ir.Operation.create("kda.workspace", results=[
                ir.MemRefType.get(shape[:2] + shape[-1:], ir.F32Type.get())], attributes={
                "name": ir.StringAttr.get(f"{_name(ws)}_norm"),
                "layout": ir.StringAttr.get("chunk")}, loc=ws.location,
                ip=ir.InsertionPoint(ws)).results[0]
        kernels = set()
        for a in accesses:
            kernels.add(_kernel_of(a))
            ip = ir.InsertionPoint(a)
            if a.name == "kda.store_chunk":
                value = a.operands[2]
                if norms is not None:
                    value, norm = _column_scaled(value, ip)
                    ir.Operation.create("kda.store_chunk", results=[], operands=[
                        norms, a.operands[1], norm], attributes={
                        "name": ir.StringAttr.get(_name(a) + "_norm")}, ip=ip)
                narrow = ir.Operation.create("kda.convert", results=[ir.RankedTensorType.get(
                    _shape(value.type), f16)], operands=[value], ip=ip)
                ir.Operation.create("kda.store_chunk", results=[], operands=[
                    new, a.operands[1], narrow.results[0]], attributes=_attributes(a),
                    loc=a.location, ip=ip)
            else:
                result = a.results[0]
                load = ir.Operation.create("kda.load_chunk", results=[ir.RankedTensorType.get(
                    _shape(result.type), f16)], operands=[new, a.operands[1]],
                    attributes=_attributes(a), loc=a.location, ip=ip)
                wide = ir.Operation.create("kda.convert", results=[result.type],
                                           operands=[load.results[0]], ip=ip).results[0]
                if norms is not None:
                    norm = ir.Operation.create("kda.load_chunk", results=[
                        ir.RankedTensorType.get(_shape(result.type)[-1:], ir.F32Type.get())],
                        operands=[norms, a.operands[1]], attributes={
                            "name": ir.StringAttr.get(_name(a) + "_norm")}, ip=ip).results[0]
                    wide = _op("kda.mul", result.type, [wide, _columns(norm, result.type, ip)],
                               ip)
                result.replace_all_uses_with(wide)
            a.erase()
        ws.erase()
        return kernels


#: added to a column's sum of squares: an all-zero column scales by 1e15, stays zero, and its
#: norm is 1e-15
_TINY = 1e-30


def _name(op) -> str:
    return ir.StringAttr(op.attributes["name"]).value


def _op(name: str, result_type, operands: list, ip, attributes=None) -> ir.Value:
    return ir.Operation.create(name, results=[result_type], operands=operands,
                               attributes=attributes or {}, ip=ip).results[0]


def _columns(vector, tile_type, ip) -> ir.Value:
    """[V] ``vector`` broadcast over the rows of ``tile_type`` [R, V]."""
    return _op("kda.broadcast", tile_type, [vector], ip,
               {"dims": ir.DenseI64ArrayAttr.get([0])})


def _column_scaled(x, ip) -> tuple:
    """(x with each column divided by its 2-norm over the rows, the [V] norms): every entry in
    [-1, 1], so fp16 holds it whatever the scale of x, to 10 significand bits relative to its
    column (entries below 2^-14 of their column's norm lose bits as fp16 subnormals: at most
    2^-25 of the norm)."""
    vec_t = ir.RankedTensorType.get(_shape(x.type)[-1:], ir.F32Type.get())
    squares = _op("kda.mul", x.type, [x, x], ip)
    sums = _op("kda.reduce_sum", vec_t, [squares], ip, {"dims": ir.DenseI64ArrayAttr.get([0])})
    tiny = _op("kda.constant", vec_t, [], ip,
               {"value": ir.FloatAttr.get(ir.F64Type.get(), _TINY)})
    padded = _op("kda.add", vec_t, [sums, tiny], ip)
    inverse = _op("kda.rsqrt", vec_t, [padded], ip)
    norms = _op("kda.mul", vec_t, [padded, inverse], ip)
    return _op("kda.mul", x.type, [x, _columns(inverse, x.type, ip)], ip), norms
