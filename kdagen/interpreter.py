"""A CPU interpreter for kda-dialect modules: the semantic oracle of every pass test.

``run(module, inputs, dtype=torch.float64)`` executes the program function of a module (before
or after any pass) with torch and returns its outputs by name (``o``, ``final_state``, ``dq``,
...). Semantics are those documented in :mod:`kdagen.ir.dialect`:

* every tile value is held as a torch tensor ``[N, HV, *tile_shape]``: the implicit
  (sequence, value head) iteration is vectorised over all sequences and heads at once;
* ``kda.scan`` loops over ``max(chunks per sequence)`` steps; at each step every sequence is at
  its own chunk index (a ``[N]`` tensor; reverse scans count down from each sequence's last
  chunk); sequences that have run out of chunks keep their carried values and store nothing;
* loads read rows past a sequence end as 0; stores skip them; outputs and workspaces start
  poisoned with NaN, so anything left unwritten shows — except a state pool output (layout
  ``pool``), which starts as the tensor given under its name among the inputs and keeps the
  rows no sequence's slot writes.

``dtype`` is the compute type of every float tile: ``torch.float32`` really computes in
float32 (inputs are cast on entry). With ``round_storage=True``, inputs are first rounded to
the storage type their argument declares (bf16/fp16/fp32, as the launcher converts them) and
``kda.convert`` to bf16/fp16 rounds to that type (otherwise conversions are exact in the
compute type).

Adding an op is one decorated function::

    @op_impl("kda.my_op")
    def _my_op(ex, node, x):          # operand values in, result value(s) out
        return x * node.attrs["alpha"]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from kdagen.ir.accessors import arg_specs, program_func, type_info
from kdagen.ir.dialect import op_attrs, py_attr

__all__ = ["run", "op_impl", "OP_IMPLS", "InterpreterError"]

OP_IMPLS: dict[str, Callable] = {}


class InterpreterError(RuntimeError):
    pass


def op_impl(*names):
    """Register the implementation of one or more ops: ``fn(ex, node, *operands) -> result``."""
    def deco(fn):
        for n in names:
            OP_IMPLS[n] = fn
        return fn
    return deco


# --------------------------------------------------------------------------------------
# compiled form of the IR (so the chunk loop does not go through the bindings)
# --------------------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    operands: list
    results: list
    attrs: dict
    result_types: list
    blocks: list  # per region: CBlock
    text: str = ""


@dataclass
class CBlock:
    args: list
    nodes: list
    arg_types: list = field(default_factory=list)


class _Ids:
    def __init__(self):
        self.ids = {}

    def __call__(self, v):
        i = self.ids.get(v)
        if i is None:
            i = self.ids[v] = len(self.ids)
        return i


def _compile_block(block, ids) -> CBlock:
    nodes = []
    for op in block.operations:
        op = op.operation
        blocks = [_compile_block(r.blocks[0], ids) for r in op.regions if len(r.blocks)]
        nodes.append(Node(op.name, [ids(v) for v in op.operands], [ids(v) for v in op.results],
                          op_attrs(op), [type_info(r.type) for r in op.results], blocks,
                          text=op.name))
    return CBlock([ids(a) for a in block.arguments], nodes, [type_info(a.type) for a in block.arguments])


_LEAD = {"token": 3, "head": 1, "state": 2, "chunk": 2, "pool": 2}
_STORAGE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


# --------------------------------------------------------------------------------------
# the executor
# --------------------------------------------------------------------------------------


class Executor:
    def __init__(self, fn, inputs: dict, dtype, round_storage: bool):
        self.fn = fn
        self.dtype = dtype
        self.round_storage = round_storage
        self.check_ranges = False
        fattrs = {k: py_attr(fn.attributes[k]) for k in _names(fn.attributes) if k.startswith("kda.")}
        self.fattrs = fattrs
        if "kda.chunk_size" not in fattrs:
            raise InterpreterError("program function has no kda.chunk_size attribute")
        self.C = int(fattrs["kda.chunk_size"])
        self.specs = arg_specs(fn)
        self.v_part = 0               # the value part running (programs with value_split)
        self._bind(inputs)

    # -- arguments and the (sequence, head) grid
    def _bind(self, inputs):
        inputs = {k: v for k, v in inputs.items() if v is not None}
        names = {s.name for s in self.specs}
        unknown = set(inputs) - names
        if unknown:
            raise InterpreterError(f"unknown inputs {sorted(unknown)}; the program takes "
                                   f"{[s.name for s in self.specs if s.role == 'input']}")
        self.args = {}
        tok = None
        for s in self.specs:
            if s.role != "input":
                continue
            if s.name not in inputs:
                if s.layout == "scalar" and "kda.default" in s.attrs:
                    self.args[s.name] = float(s.attrs["kda.default"])
                    continue
                raise InterpreterError(f"missing input {s.name!r}")
            x = inputs[s.name]
            if s.layout == "scalar":
                self.args[s.name] = float(x)
                continue
            if not isinstance(x, torch.Tensor):
                raise InterpreterError(f"input {s.name!r} must be a torch.Tensor")
            x = x.detach().cpu()
            if s.layout in ("seqlens", "slots"):
                self.args[s.name] = x.to(torch.int64)
                continue
            if x.dim() != len(s.shape) or any(d >= 0 and d != x.shape[i] for i, d in enumerate(s.shape)):
                raise InterpreterError(f"input {s.name!r}: shape {list(x.shape)} does not match "
                                       f"the program's {_fmt_shape(s.shape)}")
            if x.is_floating_point():
                if self.round_storage and s.elt in _STORAGE:   # as the launcher converts inputs
                    x = x.to(_STORAGE[s.elt])
                self.args[s.name] = x.to(self.dtype).clone()
            else:
                self.args[s.name] = x.clone()
            if s.layout == "token" and s.heads == "v" and tok is None:
                tok = self.args[s.name]
        if tok is None:
            raise InterpreterError("no token-layout input with value heads (heads = 'v') to define the grid")
        self.B, self.T, self.HV = (int(d) for d in tok.shape[:3])
        ratio = int(self.fattrs.get("kda.gva_ratio", 1))
        self.ratio = ratio
        if self.HV % ratio:
            raise InterpreterError(f"HV = {self.HV} is not a multiple of gva_ratio {ratio}")
        self.H = self.HV // ratio
        for s in self.specs:
            if s.role == "input" and s.layout == "token":
                want = self.H if s.heads == "qk" else self.HV
                x = self.args[s.name]
                if tuple(x.shape[:3]) != (self.B, self.T, want):
                    raise InterpreterError(f"input {s.name!r}: leading dims {list(x.shape[:3])}, "
                                           f"expected {[self.B, self.T, want]}")
        seqlens = [s for s in self.specs if s.layout == "seqlens"]
        if seqlens:
            cu = self.args[seqlens[0].name]
            if self.B != 1:
                raise InterpreterError(f"varlen (cu_seqlens) needs B == 1, got B = {self.B}")
            if int(cu[0]) != 0 or int(cu[-1]) != self.T or bool((cu[1:] < cu[:-1]).any()):
                raise InterpreterError(f"cu_seqlens must rise from 0 to T = {self.T}, got {cu.tolist()}")
            self.N = len(cu) - 1
            self.batch = torch.zeros(self.N, dtype=torch.long)
            self.start = cu[:-1].clone()
            self.length = cu[1:] - cu[:-1]
        else:
            self.N = self.B
            self.batch = torch.arange(self.B)
            self.start = torch.zeros(self.B, dtype=torch.long)
            self.length = torch.full((self.B,), self.T, dtype=torch.long)
        self.nchunks = (self.length + self.C - 1) // self.C
        self.chunk_off = torch.cumsum(self.nchunks, 0) - self.nchunks
        self.total_chunks = int(self.nchunks.sum())
        for s in self.specs:
            if s.role == "input" and s.layout == "state":
                x = self.args[s.name]
                if tuple(x.shape[:2]) != (self.N, self.HV):
                    raise InterpreterError(f"input {s.name!r}: leading dims {list(x.shape[:2])}, expected [N, HV] = {[self.N, self.HV]}")
            if s.role == "input" and s.layout == "head":
                x = self.args[s.name]
                if x.shape[0] != self.HV:
                    raise InterpreterError(f"input {s.name!r}: leading dim {x.shape[0]}, expected HV = {self.HV}")
            if s.role == "input" and s.layout == "slots":
                x = self.args[s.name]
                if tuple(x.shape) != (self.N,):
                    raise InterpreterError(f"input {s.name!r}: shape {list(x.shape)}, expected "
                                           f"[N] = [{self.N}] (a slot per sequence)")
        for s in self.specs:
            if s.role == "output" and s.layout == "pool":
                self.args[s.name] = self._bind_pool_output(s, inputs.get(s.name))
            elif s.role == "output":
                self.args[s.name] = self.alloc(s.layout, s.shape[_LEAD[s.layout]:], s.elt, s.heads)
        for s in self.specs:
            if s.layout == "pool" and self.args[s.name].shape[1] != self.HV:
                raise InterpreterError(f"{s.name!r}: a state pool [slots, HV = {self.HV}, ...], "
                                       f"got {list(self.args[s.name].shape)}")

    def _bind_pool_output(self, s, dest):
        """A pool output starts as the caller's tensor (given among the inputs by its name):
        the program writes the rows of its sequences' slots and leaves the others."""
        if not isinstance(dest, torch.Tensor):
            raise InterpreterError(f"output {s.name!r} is a state pool: pass the pool it "
                                   f"writes into among the inputs (as {s.name!r})")
        if dest.dim() != len(s.shape) or tuple(dest.shape[2:]) != tuple(s.shape[2:]):
            raise InterpreterError(f"output {s.name!r}: shape {list(dest.shape)} does not "
                                   f"match the program's {_fmt_shape(s.shape)}")
        return dest.detach().cpu().to(self.dtype).clone()

    def torch_dtype(self, elt):
        if elt in ("i1",):
            return torch.bool
        if elt.startswith("i") or elt == "index":
            return torch.int64
        return self.dtype

    def alloc(self, layout, tail, elt, heads=None):
        tail = tuple(int(d) for d in tail)
        if layout == "token":
            lead = (self.B, self.T, self.H if heads == "qk" else self.HV)
        elif layout == "state":
            lead = (self.N, self.HV)
        elif layout == "chunk":
            lead = (self.total_chunks, self.HV)
        elif layout == "head":
            lead = (self.HV,)
        else:
            raise InterpreterError(f"cannot allocate layout {layout!r}")
        dt = self.torch_dtype(elt)
        x = torch.empty(lead + tail, dtype=dt)
        if dt.is_floating_point:
            x.fill_(float("nan"))
        return x

    # -- chunk geometry
    def rows(self, c):
        """(valid [N, C] bool, t [N, C] long clamped token index) of chunk indices c [N]."""
        pos = c[:, None] * self.C + torch.arange(self.C)[None, :]
        valid = (c[:, None] >= 0) & (pos >= 0) & (pos < self.length[:, None])
        t = (self.start[:, None] + pos).clamp(0, max(self.T - 1, 0))
        return valid, t

    def chunk_slot(self, c):
        active = (c >= 0) & (c < self.nchunks)
        idx = (self.chunk_off + c).clamp(0, max(self.total_chunks - 1, 0))
        return active, idx

    def full(self, shape, value, elt="f32"):
        return torch.full((self.N, self.HV, *shape), float(value), dtype=self.torch_dtype(elt))

    # -- execution
    def run_block(self, block: CBlock, env: dict):
        for node in block.nodes:
            if node.name in ("gpu.yield", "func.return"):
                return [env[i] for i in node.operands]
            if node.name == "kda.scan":
                outs = self.run_scan(node, env)
            else:
                impl = OP_IMPLS.get(node.name)
                if impl is None:
                    raise InterpreterError(f"no interpreter implementation for {node.name}; "
                                           f"register one with @kdagen.interpreter.op_impl({node.name!r})")
                try:
                    outs = impl(self, node, *[env[i] for i in node.operands])
                except InterpreterError:
                    raise
                except Exception as err:
                    raise InterpreterError(f"{node.name}: {type(err).__name__}: {err}") from err
            if node.results:
                if not isinstance(outs, (list, tuple)):
                    outs = [outs]
                for r, val in zip(node.results, outs):
                    env[r] = val
        return []

    def run_scan(self, node, env):
        body = node.blocks[0]
        carried = [env[i] for i in node.operands]
        reverse = bool(node.attrs.get("reverse", False))
        steps = int(self.nchunks.max()) if self.N else 0
        saved_active = getattr(self, "active", None)
        for s in range(steps):
            c = (self.nchunks - 1 - s) if reverse else torch.full((self.N,), s, dtype=torch.long)
            active = (c >= 0) & (c < self.nchunks)
            self.active = active
            env[body.args[0]] = c
            for a, val in zip(body.args[1:], carried):
                env[a] = val
            new = self.run_block(body, env)
            carried = [torch.where(active.view(-1, *([1] * (n.dim() - 1))), n, o)
                       for n, o in zip(new, carried)]
        self.active = saved_active
        return carried


def _names(attrs):
    return [na.name if hasattr(na, "name") else na for na in attrs]


def _fmt_shape(shape):
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def run(module, inputs: dict, dtype: torch.dtype = torch.float64, *, round_storage: bool = False,
        return_workspaces: bool = False, check_ranges: bool = False) -> dict:
    """Execute the program of ``module`` on CPU; returns ``{output name: tensor}``.

    ``inputs`` maps argument names (``q``, ``k``, ``v``, ``g_raw``/``g``, ``beta_raw``/``beta``,
    ``A_log``, ``dt_bias``, ``initial_state``, ``cu_seqlens``, ``scale``, ``do``, ``dht``, ...)
    to tensors (``scale`` to a float; it defaults to the program's ``K ** -0.5``).

    ``check_ranges=True`` checks every ``kda.assume_range`` (e.g. a gate's declared output
    range) against the values that reach it; ``return_workspaces=True`` also returns the
    workspace buffers as ``"workspace:NAME"``.
    """
    if dtype not in (torch.float64, torch.float32):
        raise ValueError("dtype must be torch.float64 or torch.float32")
    fn = program_func(module)
    ex = Executor(fn, inputs, dtype, round_storage)
    ex.check_ranges = check_ranges
    ids = _Ids()
    with module.context:
        entry = fn.regions[0].blocks[0]
        block = _compile_block(entry, ids)
    env = {}
    for s, a in zip(ex.specs, block.args):
        if s.name in ex.args:
            env[a] = ex.args[s.name]
    ex.workspaces = {}
    ex.active = None
    # a program split over the value columns runs once per part (its ops never mix columns;
    # value_parts loads and stores address the part's columns: _part)
    for part in range(int(ex.fattrs.get("kda.value_split", 1))):
        ex.v_part = part
        ex.run_block(block, dict(env))
    out = {s.name: ex.args[s.name] for s in ex.specs if s.role == "output"}
    if return_workspaces:
        out.update({f"workspace:{k}": v for k, v in ex.workspaces.items()})
    return out


# --------------------------------------------------------------------------------------
# op implementations
# --------------------------------------------------------------------------------------


def _elt(node, i=0):
    return node.result_types[i][1]


def _shape(node, i=0):
    return node.result_types[i][0]


def _part(ex, node, mem):
    """The memref as memory op ``node`` addresses it: all of it, or with ``value_parts`` P a
    view of the running part's V / P columns of its value dim (the last, or ``value_axis``);
    stores write through it."""
    parts = int(node.attrs.get("value_parts", 1))
    if parts == 1:
        return mem
    axis = int(node.attrs.get("value_axis", -1))
    size = mem.shape[axis] // parts
    return mem.narrow(mem.dim() + axis, ex.v_part * size, size)


@op_impl("kda.load")
def _load(ex, node, mem, c):
    mem = _part(ex, node, mem)
    valid, t = ex.rows(c)
    b = ex.batch[:, None].expand_as(t)
    x = mem[b, t]                                     # [N, C, Hm, *D]
    hm = x.shape[2]
    if node.attrs.get("head_map") == "grouped":
        if ex.HV % hm:
            raise InterpreterError(f"load {node.attrs.get('name')}: {hm} heads do not divide HV = {ex.HV}")
        x = x[:, :, torch.arange(ex.HV) // (ex.HV // hm)]
    elif hm != ex.HV:
        raise InterpreterError(f"load {node.attrs.get('name')}: direct head map needs {ex.HV} heads, memref has {hm}")
    x = x.movedim(2, 1)                               # [N, HV, C, *D]
    mask = valid[:, None, :].reshape(ex.N, 1, ex.C, *([1] * (x.dim() - 3)))
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype))


@op_impl("kda.store")
def _store(ex, node, mem, c, tile):
    valid, t = ex.rows(c)
    if mem.shape[2] != ex.HV:
        raise InterpreterError(f"store {node.attrs.get('name')}: memref has {mem.shape[2]} heads, stores write HV = {ex.HV}")
    n_i, r_i = valid.nonzero(as_tuple=True)
    src = tile.movedim(1, 2)                          # [N, C, HV, *D]
    _part(ex, node, mem)[ex.batch[n_i], t[n_i, r_i]] = src[n_i, r_i].to(mem.dtype)
    return []


@op_impl("kda.valid_rows")
def _valid_rows(ex, node, c):
    valid, _ = ex.rows(c)
    return valid[:, None, :].expand(ex.N, ex.HV, ex.C)


@op_impl("kda.load_head")
def _load_head(ex, node, mem):
    return mem.unsqueeze(0).expand(ex.N, *mem.shape)


@op_impl("kda.load_state")
def _load_state(ex, node, mem, slots=None):
    mem = _part(ex, node, mem)
    if slots is None:
        return mem.clone()
    live = slots >= 0                                  # a skipped sequence reads nothing: 0
    rows = mem[slots.clamp(min=0)]
    return torch.where(live.view(-1, *([1] * (rows.dim() - 1))), rows,
                       torch.zeros((), dtype=rows.dtype))


@op_impl("kda.store_state")
def _store_state(ex, node, mem, tile, slots=None):
    mem = _part(ex, node, mem)
    if slots is None:
        mem[...] = tile.to(mem.dtype)
        return []
    live = slots >= 0
    if int(torch.unique(slots[live]).numel()) != int(live.sum()):
        raise InterpreterError(f"store_state {node.attrs.get('name')}: two sequences write one "
                               f"slot ({slots.tolist()})")
    mem[slots[live]] = tile[live].to(mem.dtype)
    return []


@op_impl("kda.slot_valid")
def _slot_valid(ex, node, slots):
    return (slots >= 0).view(ex.N, 1).expand(ex.N, ex.HV)


@op_impl("kda.load_chunk")
def _load_chunk(ex, node, mem, c):
    active, idx = ex.chunk_slot(c)
    x = mem[idx]
    return torch.where(active.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros((), dtype=x.dtype))


@op_impl("kda.store_chunk")
def _store_chunk(ex, node, mem, c, tile):
    active, idx = ex.chunk_slot(c)
    _part(ex, node, mem)[idx[active]] = tile[active].to(mem.dtype)
    return []


@op_impl("kda.workspace")
def _workspace(ex, node):
    shape, elt = node.result_types[0]
    layout = node.attrs["layout"]
    tail = shape[_LEAD[layout]:]
    buf = ex.alloc(layout, tail, elt, node.attrs.get("heads"))
    ex.workspaces[node.attrs["name"]] = buf
    return buf


@op_impl("kda.sum_chunks")
def _sum_chunks(ex, node, mem):
    seq_of_slot = torch.repeat_interleave(torch.arange(ex.N), ex.nchunks)
    out = torch.zeros((ex.N, *mem.shape[1:]), dtype=mem.dtype)
    return out.index_add_(0, seq_of_slot, mem)


@op_impl("kda.sum_head_groups")
def _sum_head_groups(ex, node, src, dst):
    B, T, HV = src.shape[:3]
    H = dst.shape[2]
    dst[...] = src.reshape(B, T, H, HV // H, *src.shape[3:]).sum(3).to(dst.dtype)
    return []


@op_impl("kda.sum_seqs")
def _sum_seqs(ex, node, src, dst):
    dst[...] = src.sum(0).to(dst.dtype)
    return []


@op_impl("kda.scalar")
def _scalar(ex, node, x):
    return ex.full((), x)


@op_impl("kda.constant")
def _constant(ex, node):
    shape, elt = node.result_types[0]
    return torch.full((1, 1, *shape), float(node.attrs["value"]),
                      dtype=ex.torch_dtype(elt)).expand(ex.N, ex.HV, *shape)


@op_impl("kda.convert")
def _convert(ex, node, x):
    elt = _elt(node)
    if elt == "i1":
        return x != 0
    if ex.round_storage and elt in ("bf16", "f16"):
        return x.to(torch.bfloat16 if elt == "bf16" else torch.float16).to(ex.dtype)
    return x.to(ex.torch_dtype(elt))


_BINARY = {"kda.add": torch.add, "kda.sub": torch.sub, "kda.mul": torch.mul, "kda.div": torch.div}
for _n, _f in _BINARY.items():
    op_impl(_n)(lambda ex, node, a, b, _f=_f: _f(a, b))


def _softplus(x):
    # exact log(1 + e^x) (no linearisation threshold)
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype))


_UNARY = {"kda.neg": torch.neg, "kda.log2": torch.log2,
          "kda.sigmoid": torch.sigmoid, "kda.softplus": _softplus, "kda.rsqrt": torch.rsqrt}
for _n, _f in _UNARY.items():
    op_impl(_n)(lambda ex, node, x, _f=_f: _f(x))


@op_impl("kda.assume_range")
def _assume_range(ex, node, x):
    if ex.check_ranges:
        lo, hi = float(node.attrs["lo"]), float(node.attrs["hi"])
        fin = x[torch.isfinite(x)]
        if fin.numel() and (fin.min() < lo or fin.max() > hi):
            raise InterpreterError(f"kda.assume_range: values in [{fin.min().item():.6g}, "
                                   f"{fin.max().item():.6g}] leave the declared range [{lo}, {hi}]")
    return x


@op_impl("kda.convert_layout")
def _convert_layout(ex, node, x):
    return x                  # a layout, not a value


@op_impl("kda.clamp")
def _clamp(ex, node, x):
    lo, hi = float(node.attrs["lo"]), float(node.attrs["hi"])
    if ex.check_ranges:
        fin = x[torch.isfinite(x)]
        if fin.numel() and (fin.min() < lo or fin.max() > hi):
            raise InterpreterError(f"kda.clamp: values in [{fin.min().item():.6g}, "
                                   f"{fin.max().item():.6g}] leave the declared range [{lo}, {hi}]")
    return torch.clamp(x, lo, hi)             # NaN stays NaN


@op_impl("kda.in_range")
def _in_range(ex, node, x):
    lo, hi = float(node.attrs["lo"]), float(node.attrs["hi"])
    return (x >= lo) & (x <= hi)              # false for NaN


@op_impl("kda.select")
def _select(ex, node, cond, a, b):
    return torch.where(cond, a, b)


@op_impl("kda.broadcast")
def _broadcast(ex, node, x):
    shape = _shape(node)
    for d in node.attrs["dims"]:
        x = x.unsqueeze(2 + d)
    return x.expand(ex.N, ex.HV, *shape)


@op_impl("kda.reduce_sum")
def _reduce_sum(ex, node, x):
    dims = [2 + d for d in node.attrs["dims"]]
    return x.sum(dim=dims) if dims else x


@op_impl("kda.cumsum")
def _cumsum(ex, node, x):
    if node.attrs.get("reverse"):
        return torch.flip(torch.cumsum(torch.flip(x, [2]), 2), [2])
    return torch.cumsum(x, 2)


@op_impl("kda.transpose")
def _transpose(ex, node, x):
    return x.transpose(-1, -2)


@op_impl("kda.extract_row")
def _extract_row(ex, node, x):
    return x[:, :, int(node.attrs["index"])]


@op_impl("kda.embed_row")
def _embed_row(ex, node, x):
    shape = _shape(node)
    out = torch.zeros((ex.N, ex.HV, *shape), dtype=x.dtype)
    out[:, :, int(node.attrs["index"])] = x
    return out


@op_impl("kda.dot")
def _dot(ex, node, a, b):
    if node.attrs.get("transpose_lhs"):
        a = a.transpose(-1, -2)
    if node.attrs.get("transpose_rhs"):
        b = b.transpose(-1, -2)
    return torch.matmul(a, b)


@op_impl("kda.tril")
def _tril(ex, node, x):
    return torch.tril(x, int(node.attrs["diagonal"]))


def _unit_lower(x):
    n = x.shape[-1]
    return torch.tril(x, -1) + torch.eye(n, dtype=x.dtype)


@op_impl("kda.tril_inv")
def _tril_inv(ex, node, x):
    L = _unit_lower(x)
    eye = torch.eye(x.shape[-1], dtype=x.dtype).expand_as(L)
    return torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True)


@op_impl("kda.tril_solve")
def _tril_solve(ex, node, x, b):
    return torch.linalg.solve_triangular(_unit_lower(x), b, upper=False, unitriangular=True)


# --------------------------------------------------------------------------------------
# bounded-exponent ops (introduced by kda-stable-reassociate; semantics in kdagen.ir.dialect)
# --------------------------------------------------------------------------------------


def _clamped_exp2(x, node):
    """2^x with the argument clamped at the op's ``clamp_min`` / ``clamp_max`` (when set)."""
    low, high = node.attrs.get("clamp_min"), node.attrs.get("clamp_max")
    if low is not None or high is not None:
        x = torch.clamp(x, min=None if low is None else float(low),
                        max=None if high is None else float(high))
    return torch.exp2(x)


@op_impl("kda.exp2")
def _exp2(ex, node, x):
    return _clamped_exp2(x, node)


def _decay_factors(node, g_row, g_col):
    """E[..., i, j, d] = 2^(g_row[i, d] - g_col[j, d]) where j <= i + diagonal, else 0."""
    arg = g_row.unsqueeze(-2) - g_col.unsqueeze(-3)
    rows, cols = arg.shape[-3], arg.shape[-2]
    mask = torch.ones(rows, cols, dtype=torch.bool).tril(int(node.attrs["diagonal"]))
    arg = arg.masked_fill(~mask[..., None], 0.0)          # masked entries: harmless 2^0, zeroed below
    return _clamped_exp2(arg, node) * mask[..., None].to(arg.dtype)


@op_impl("kda.decay_dot")
def _decay_dot(ex, node, a, b, g_a, g_b):
    S = int(node.attrs.get("subblock", 1))
    diagonal = int(node.attrs["diagonal"])
    if S <= 1:
        return torch.einsum("...id,...jd,...ijd->...ij", a, b, _decay_factors(node, g_a, g_b))
    # Factor through r = gamma_lhs at the first row of each S-row block: for the columns j that
    # survive the mask (j <= i + diagonal < block end), both 2^(g_a[i] - r) and 2^(r - g_b[j])
    # have exponents the pass proved bounded, and each block is one plain matmul.
    # exact_diagonal: only the columns left of the row block are factored (there
    # g_a[i] <= r <= g_b[j], both exponents <= 0); the diagonal block takes relative exponents.
    exact_diagonal = bool(node.attrs.get("exact_diagonal", False))
    rows, cols = a.shape[-2], b.shape[-2]
    out = torch.zeros(*a.shape[:-1], cols, dtype=a.dtype)
    for start in range(0, rows, S):
        end = min(start + S, rows)
        ncols = max(0, min(cols, (start if exact_diagonal else end + diagonal)))
        if exact_diagonal:
            dcols = slice(start, max(start, min(cols, end + diagonal)))
            arg = g_a[..., start:end, None, :] - g_b[..., None, dcols, :]
            mask = torch.ones(end - start, arg.shape[-2], dtype=torch.bool).tril(diagonal)
            e = _clamped_exp2(arg.masked_fill(~mask[..., None], 0.0), node) * mask[..., None]
            out[..., start:end, dcols] = torch.einsum(
                "...id,...jd,...ijd->...ij", a[..., start:end, :], b[..., dcols, :], e)
        if ncols == 0:
            continue
        r = g_a[..., start:start + 1, :]
        left = a[..., start:end, :] * _clamped_exp2(g_a[..., start:end, :] - r, node)
        right = b[..., :ncols, :] * _clamped_exp2(r - g_b[..., :ncols, :], node)
        out[..., start:end, :ncols] = left @ right.transpose(-1, -2)
    return torch.tril(out, diagonal)


@op_impl("kda.decay_matmul")
def _decay_matmul(ex, node, w, x, g_row, g_col):
    factors = _decay_factors(node, g_row, g_col)
    if node.attrs.get("transpose"):
        return torch.einsum("...ij,...id,...ijd->...jd", w, x, factors)
    return torch.einsum("...ij,...jd,...ijd->...id", w, x, factors)


# --------------------------------------------------------------------------------------
# pipeline structure (introduced by kda-warp-specialize): synchronisation only, no values
# --------------------------------------------------------------------------------------


@op_impl("kda.pipeline_wait")
def _pipeline_wait(ex, node, x):
    return x


@op_impl("kda.pipeline_release")
def _pipeline_release(ex, node, x):
    return []
