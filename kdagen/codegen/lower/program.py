"""A kda program read into plain Python objects (the input of the lowering).

The lowering never walks the MLIR objects of the kda module while it emits GPU code (that
happens in another MLIR context): :func:`read_program` copies the program function once into
:class:`Value` / :class:`Node` / :class:`Block` objects with shapes, element types and attributes
as Python data, and records per argument what the calling convention needs (name, role, layout,
heads, element type, trailing shape).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kdagen._mlir import ir
from kdagen.ir.accessors import program_func
from kdagen.ir.dialect import op_attrs, ops_with, py_attr

LAYOUT_OPS = ops_with(kind="layout")

__all__ = ["Value", "Node", "Block", "ArgInfo", "Program", "read_program", "walk"]

_ELT_NAMES = {"bf16": "bf16", "f16": "f16", "f32": "f32", "f64": "f64", "i1": "i1",
              "i32": "i32", "i64": "i64", "index": "index"}


@dataclass(eq=False)
class Value:
    id: int
    kind: str                 # "tile" | "memref" | "index" | "f32" | "other"
    shape: tuple              # tile: static shape; memref: shape with -1 for dynamic dims
    elt: str                  # element type name ("bf16", "f32", "i1", "i64", ...)
    name: str = ""
    owner: "Node | None" = None       # defining node (None: block or function argument)
    block: "Block | None" = None      # block the value is defined in
    uses: list = field(default_factory=list)   # [(Node, operand index)]
    arg: "ArgInfo | None" = None      # function argument info
    carried: tuple | None = None      # (scan node, i) for scan block args / results
    workspace: dict | None = None     # {"name", "layout", "heads"} for kda.workspace results

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self):
        return f"%{self.name or self.id}:{self.kind}{list(self.shape)}{self.elt}"


@dataclass(eq=False)
class Node:
    op: str                   # full op name ("kda.add", "gpu.yield", "func.return")
    operands: list
    results: list
    attrs: dict
    block: "Block"
    body: "Block | None" = None
    index: int = 0            # program order (pre-order over the whole function)

    @property
    def kind(self) -> str:
        return self.op[4:] if self.op.startswith("kda.") else self.op

    def __repr__(self):
        return f"<{self.op} #{self.index}>"


@dataclass(eq=False)
class Block:
    args: list
    nodes: list
    parent: "Node | None" = None      # the scan owning this block (None: function body)

    @property
    def depth(self) -> int:
        d, b = 0, self
        while b.parent is not None:
            d += 1
            b = b.parent.block
        return d


@dataclass
class ArgInfo:
    index: int
    name: str
    role: str                 # "input" | "output"
    layout: str               # "token" | "head" | "state" | "seqlens" | "scalar" | "chunk"
                              # | "pool" (a state pool) | "slots" (its per-sequence slots)
    heads: str | None         # token layouts: "qk" (H heads) or "v" (HV heads)
    elt: str
    tail: tuple               # trailing static dims after the leading (B, T, H) / (HV) / (N, HV)
    default: float | None = None


@dataclass
class Program:
    name: str
    attrs: dict               # function attributes kda.* without the prefix
    args: list                # ArgInfo per function argument
    arg_values: list          # Value per function argument
    body: Block
    nodes: list               # every node, program order

    @property
    def chunk_size(self) -> int:
        return int(self.attrs["chunk_size"])

    @property
    def gva_ratio(self) -> int:
        return int(self.attrs.get("gva_ratio", 1))

    @property
    def value_split(self) -> int:
        """CTAs per (sequence, value head), each owning V / value_split value columns (the
        decode programs' option; memory ops of value-indexed tiles carry value_parts)."""
        return int(self.attrs.get("value_split", 1))

    @property
    def varlen(self) -> bool:
        return bool(self.attrs.get("varlen", False)) or any(a.layout == "seqlens" for a in self.args)


_LEAD = {"token": 3, "head": 1, "state": 2, "chunk": 2, "seqlens": 1, "pool": 2, "slots": 1}


def _type_info(t) -> tuple[str, tuple, str]:
    if isinstance(t, ir.RankedTensorType):
        return "tile", tuple(t.shape), _ELT_NAMES.get(str(t.element_type), str(t.element_type))
    if isinstance(t, ir.MemRefType):
        shape = tuple(-1 if ir.ShapedType.is_dynamic_size(d) else d for d in t.shape)
        return "memref", shape, _ELT_NAMES.get(str(t.element_type), str(t.element_type))
    if isinstance(t, ir.IndexType):
        return "index", (), "index"
    if isinstance(t, ir.F32Type):
        return "f32", (), "f32"
    return "other", (), str(t)


#: ids of values the lowering makes itself (`new_node`), apart from read_program's
_NEW_VALUE_IDS = itertools.count(1 << 30)


def new_node(block: Block, op: str, operands: list, shape: tuple, elt: str = "f32",
             attrs: dict | None = None, at: int | None = None, index: int = 0,
             prefix: str = "v") -> Value:
    """A node the lowering adds to ``block`` (at position ``at``, else last): ``op`` of
    ``operands`` (their readers updated) with one tile result of ``shape``, named ``prefix``
    and its id; returns the result."""
    r = Value(next(_NEW_VALUE_IDS), "tile", tuple(shape), elt, block=block)
    r.name = f"{prefix}{r.id}"
    n = Node(op, list(operands), [r], dict(attrs or {}), block, index=index)
    r.owner = n
    for i, o in enumerate(n.operands):
        o.uses.append((n, i))
    block.nodes.insert(len(block.nodes) if at is None else at, n)
    return r


def read_program(module) -> Program:
    """Copy the program function of a kda module into Python objects."""
    fn = program_func(module)
    values: dict = {}
    counter = [0]
    all_nodes: list = []

    def mk(v, block, owner=None, name=""):
        kind, shape, elt = _type_info(v.type)
        val = Value(counter[0], kind, shape, elt, name or _ssa_name(v), owner, block)
        counter[0] += 1
        values[v] = val
        return val

    def read_block(mblock, parent) -> Block:
        blk = Block([], [], parent)
        for a in mblock.arguments:
            blk.args.append(values[a] if a in values else mk(a, blk))
        for op in mblock.operations:
            op = op.operation
            if op.name in LAYOUT_OPS:
                # kda-assign-layouts' conversions: this lowering keeps every tile in its own
                # buffers and loops, so a layout change is the value itself
                values[op.results[0]] = values[op.operands[0]]
                continue
            node = Node(op.name, [values[v] for v in op.operands], [], op_attrs(op), blk)
            node.index = len(all_nodes)
            all_nodes.append(node)
            for i, v in enumerate(node.operands):
                v.uses.append((node, i))
            for r in op.results:
                node.results.append(mk(r, blk, node))
            if op.regions and len(op.regions[0].blocks):
                node.body = read_block(op.regions[0].blocks[0], node)
            blk.nodes.append(node)
            if node.op == "kda.scan":
                for i, r in enumerate(node.results):
                    r.carried = (node, i)
                for i, a in enumerate(node.body.args[1:]):
                    a.carried = (node, i)
            if node.op == "kda.workspace":
                node.results[0].workspace = dict(name=node.attrs["name"], layout=node.attrs["layout"],
                                                 heads=node.attrs.get("heads"))
                node.results[0].name = node.attrs["name"]
        return blk

    with module.context:
        fattrs = {k[4:]: py_attr(fn.attributes[k]) for k in _attr_names(fn.attributes)
                  if k.startswith("kda.")}
        arg_attrs = fn.arg_attrs if "arg_attrs" in fn.attributes else None
        entry = fn.regions[0].blocks[0]
        body = Block([], [], None)
        args, arg_values = [], []
        for i, a in enumerate(entry.arguments):
            d = py_attr(arg_attrs[i]) if arg_attrs is not None else {}
            kind, shape, elt = _type_info(a.type)
            layout = d.get("kda.layout", "token" if kind == "memref" else "scalar")
            lead = _LEAD.get(layout, 0)
            info = ArgInfo(i, d.get("kda.name", f"arg{i}"), d.get("kda.role", "input"), layout,
                           d.get("kda.heads"), elt, tuple(shape[lead:]) if kind == "memref" else (),
                           d.get("kda.default"))
            val = mk(a, body, name=info.name)
            val.arg = info
            args.append(info)
            arg_values.append(val)
        body.args = arg_values
        inner = read_block(entry, None)
        body.nodes = inner.nodes
        for n in body.nodes:
            n.block = body
        for v in values.values():
            if v.block is inner:
                v.block = body
    name = fattrs.get("program", fn.name.value)
    return Program(str(name), fattrs, args, arg_values, body, all_nodes)


def _attr_names(attrs):
    return [na.name if hasattr(na, "name") else na for na in attrs]


def _ssa_name(v) -> str:
    try:
        text = v.get_name()
        return text.lstrip("%")
    except Exception:  # pragma: no cover - name printing is best effort
        return ""


def walk(block: Block):
    """Every node under ``block`` in program order (pre-order, into scan bodies)."""
    for n in block.nodes:
        yield n
        if n.body is not None:
            yield from walk(n.body)
