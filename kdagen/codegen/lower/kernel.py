"""kda program -> GPU kernels: one kernel per scan (grid = one CTA per (sequence, value head)),
plus one small kernel per global op. This module drives the emitters of tiles.py over the plan
of plan.py; it holds no kernel body of its own.

Calling convention (what the runtime relies on; also written into every bundle manifest):

Tile kernels (``kind = "tile"``): grid = ``(HV, N, 1)`` (blockIdx.x = value head hv,
blockIdx.y = sequence n), block = ``(nthreads, 1, 1)`` (128 by default), dynamic shared memory
as in the manifest. Parameters, in this order:

1. one ``ptr`` per program memref argument the kernel reads or writes, in the program's
   argument order (q, k, v, g_raw/g, beta_raw/beta, A_log, dt_bias, initial_state, cu_seqlens,
   do, dht, o, final_state, dq, ... as the program declares them); element type as in the
   program (bf16/f16/f32 storage, cu_seqlens int64);
2. one ``ptr`` per workspace the kernel uses (``kda.workspace``, by name, f32 unless the program
   says otherwise), in program order; layouts ``chunk`` ``[total_chunks, HV, *tail]`` with the
   chunks of sequence n at rows ``sum_{m<n} ceil(len_m / C)`` + c, ``token`` ``[B, T, HV, *tail]``,
   ``state`` ``[N, HV, *tail]``;
3. ``T`` (i32: tokens per sequence, or total tokens with varlen), ``N`` (i32: sequences; the
   batch size without varlen), ``HV`` (i32: value heads);
4. every f32 scalar argument of the program (``scale``), in argument order;
5. ``scratch`` (``ptr`` f32) when the kernel's storage is ``global``: ``N * HV *
   scratch_bytes_per_cta`` bytes, uninitialised, private to the launch.

Global kernels (``kind = "global"``, kda.sum_head_groups / kda.sum_seqs): block 256, grid and
parameters in the manifest (src, dst, T, N, HV).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kdagen._mlir import arith, ir, llvm, nvvm
from kdagen.codegen.common import smem as smem_mod
from kdagen.codegen.common.ints import IntVal, as_i32
from kdagen.codegen.common.kernel import GpuModuleBuilder, Param
from kdagen.codegen.common.sreg import block_idx, thread_idx
from kdagen.codegen.target import Target

from . import tiles as T_
from .plan import (EXPR_OPS, GLOBAL_OPS, MATRIX_OPS, KernelGroup, LoweringError, StoragePlan,
                   buffer_strides, group_kernels, plan_storage)
from .program import Program, Value, read_program, walk

__all__ = ["LoweredKernel", "lower_program", "LowerOptions"]

REDUCE_SLOTS_BYTES = 64       # cross-warp partial sums (one f32 per warp, up to 16 warps)


@dataclass
class LowerOptions:
    nthreads: int = 128
    split_scans: bool = True            # one kernel per scan (False: one per segment)
    storage: str = "auto"               # "auto" | "smem" | "global"
    smem_reserve: int = 1024            # bytes of the target's budget kept free
    global_block: int = 256


@dataclass
class LoweredKernel:
    name: str
    program: str
    kind: str                           # "tile" | "global"
    order: int                          # launch order within the program
    builder: GpuModuleBuilder
    params: list                        # [Param]
    launch: dict                        # grid rule, block, dynamic_shared_memory, storage...
    storage: str                        # "smem" | "global" | "none"
    scratch_bytes_per_cta: int = 0
    path: str = "portable-fma"
    info: dict = field(default_factory=dict)

    @property
    def module(self):
        return self.builder.module

    def param_dicts(self) -> list[dict]:
        return [dict(name=p.name, kind=p.kind, elem=p.elem) for p in self.params]


# ------------------------------------------------------------------------------------------
# memory operands
# ------------------------------------------------------------------------------------------


@dataclass
class MemRef:
    name: str
    ptr: ir.Value
    elt: str
    layout: str            # token | head | state | chunk | seqlens
    heads: str | None
    tail: tuple

    @property
    def inner(self) -> int:
        return T_.numel(self.tail)

    def flat(self, idx) -> object:
        """Row-major offset of a tail index (int-like)."""
        off = 0
        stride = 1
        for i, d in zip(reversed(list(idx)), reversed(self.tail)):
            off = off + i * stride if not (isinstance(i, int) and i == 0) else off
            stride *= d
        return off

    def gep(self, elem_index_i64: ir.Value) -> ir.Value:
        return llvm.getelementptr(smem_mod.global_ptr_type(), self.ptr, [elem_index_i64],
                                  [T_._DYN], T_.elem_type(self.elt), 0)

    def load_f32(self, elem_index_i64) -> ir.Value:
        v = llvm.load(T_.elem_type(self.elt), self.gep(elem_index_i64))
        if self.elt == "f32":
            return v
        return arith.extf(T_.f32t(), v)

    def store_f32(self, value: ir.Value, elem_index_i64) -> None:
        if self.elt != "f32":
            value = arith.truncf(T_.elem_type(self.elt), value)
        llvm.store(value, self.gep(elem_index_i64))


def _mem_info(v: Value, program: Program) -> tuple:
    if v.arg is not None:
        a = v.arg
        return a.name, a.elt, a.layout, a.heads, a.tail
    if v.workspace is not None:
        lead = {"token": 3, "state": 2, "chunk": 2}[v.workspace["layout"]]
        return (v.workspace["name"], v.elt, v.workspace["layout"], v.workspace.get("heads") or "v",
                tuple(v.shape[lead:]))
    raise LoweringError(f"memref {v} is neither an argument nor a workspace")


# ------------------------------------------------------------------------------------------
# per-CTA geometry
# ------------------------------------------------------------------------------------------


class Geometry:
    """CTA coordinates and the chunk geometry of its sequence."""

    def __init__(self, program: Program, p: dict, nthreads: int, need_chunk_off: bool):
        self.C = program.chunk_size
        self.ratio = program.gva_ratio
        self.tid = IntVal(thread_idx("x"))
        self.hv = IntVal(block_idx("x"))
        self.n = IntVal(block_idx("y"))
        self.T = IntVal(p["T"])
        self.N = IntVal(p["N"])
        self.HV = IntVal(p["HV"])
        self.H = self.HV // self.ratio if self.ratio > 1 else self.HV
        C = self.C
        if program.varlen:
            cu = p["cu_seqlens"]
            i64 = T_.i64t()

            def cu_at(i):
                return llvm.load(i64, llvm.getelementptr(smem_mod.global_ptr_type(), cu,
                                                         [T_.i64(i)], [T_._DYN], i64, 0))
            self.start = cu_at(self.n)
            end = cu_at(self.n + 1)
            self.seqlen = IntVal(arith.trunci(T_.i32t(), arith.subi(end, self.start)))
        else:
            self.start = arith.muli(T_.i64(self.n), T_.i64(self.T))
            self.seqlen = self.T
        self.nchunks = (self.seqlen + (C - 1)) // C
        self.chunk_off = None
        if need_chunk_off:
            if program.varlen:
                cu = p["cu_seqlens"]
                i64 = T_.i64t()

                def step(m, acc):
                    a = llvm.load(i64, llvm.getelementptr(smem_mod.global_ptr_type(), cu,
                                                          [T_.i64(m)], [T_._DYN], i64, 0))
                    b = llvm.load(i64, llvm.getelementptr(smem_mod.global_ptr_type(), cu,
                                                          [T_.i64(m + 1)], [T_._DYN], i64, 0))
                    ln = IntVal(arith.trunci(T_.i32t(), arith.subi(b, a)))
                    return [as_i32(IntVal(acc) + (ln + (C - 1)) // C)]
                (off,) = T_.for_range(0, self.n, 1, step, [T_.ci32(0)])
                self.chunk_off = IntVal(off)
            else:
                self.chunk_off = self.n * ((self.T + (C - 1)) // C)


# ------------------------------------------------------------------------------------------
# tile kernels
# ------------------------------------------------------------------------------------------


class TileKernelEmitter:
    def __init__(self, program: Program, group: KernelGroup, plan: StoragePlan, storage: str,
                 opts: LowerOptions):
        self.program = program
        self.group = group
        self.plan = plan
        self.storage = storage
        self.opts = opts
        self.env: dict = {}

    # -- parameters ----------------------------------------------------------------------
    def memrefs(self) -> tuple[list, list]:
        used = []
        for n in self.group.nodes:
            for m in [n, *(walk(n.body) if n.body is not None else [])]:
                for o in m.operands:
                    if o.kind == "memref" and o not in used:
                        used.append(o)
        args = [v for v in self.program.arg_values if v.kind == "memref"
                and (v in used or (v.arg.layout == "seqlens"))]
        workspaces = [v for v in used if v.workspace is not None]
        return args, workspaces

    def params(self) -> list[Param]:
        args, wss = self.memrefs()
        ps = [Param(v.arg.name, "ptr", v.arg.elt) for v in args]
        ps += [Param(v.workspace["name"], "ptr", v.elt) for v in wss]
        ps += [Param("T", "i32"), Param("N", "i32"), Param("HV", "i32")]
        ps += [Param(a.name, "f32") for a in self.program.args if a.layout == "scalar"]
        if self.storage == "global":
            ps.append(Param("scratch", "ptr", "f32"))
        return ps

    # -- emission ------------------------------------------------------------------------
    def emit(self, builder: GpuModuleBuilder, name: str) -> None:
        nt = self.opts.nthreads
        with builder.kernel(name, self.params(), (nt, 1, 1)) as p:
            need_off = any(m.op in ("kda.load_chunk", "kda.store_chunk", "kda.sum_chunks")
                           for n in self.group.nodes
                           for m in [n, *(walk(n.body) if n.body is not None else [])])
            geo = Geometry(self.program, p, nt, need_off)
            self.geo = geo
            self.th = T_.Threads(geo.tid, nt)
            if self.storage == "smem":
                smem_mod.declare_dynamic_smem(builder)
                base = llvm.mlir_addressof(smem_mod.shared_ptr_type(), smem_mod.DYNAMIC_SMEM_SYMBOL)
                self.scratch = T_.Scratch(base, "smem")
            else:
                per_cta = self.scratch_elems
                cta = arith.addi(arith.muli(T_.i64(geo.n), T_.i64(geo.HV)), T_.i64(geo.hv))
                off = arith.muli(cta, arith.constant(T_.i64t(), per_cta))
                base = llvm.getelementptr(smem_mod.global_ptr_type(), p["scratch"], [off],
                                          [T_._DYN], T_.f32t(), 0)
                self.scratch = T_.Scratch(base, "global")
            self.red = T_.ReduceScratch(T_.BufRef(self.scratch, 0, (16,), (1,)))
            args, wss = self.memrefs()
            for v in args + wss:
                nm, elt, layout, heads, tail = _mem_info(v, self.program)
                self.env[v] = MemRef(nm, p[nm], elt, layout, heads, tail)
            for a, v in zip(self.program.args, self.program.arg_values):
                if a.layout == "scalar":
                    self.env[v] = p[a.name]
            for n in self.group.nodes:
                self.node(n)

    @property
    def scratch_elems(self) -> int:
        return (REDUCE_SLOTS_BYTES + self.plan.total_bytes) // 4

    def bufref(self, v: Value) -> T_.BufRef:
        b = self.plan.buffers[v]
        return T_.BufRef(self.scratch, (REDUCE_SLOTS_BYTES + b.offset) // 4, tuple(v.shape),
                         buffer_strides(tuple(v.shape)))

    def barrier(self):
        nvvm.barrier()

    def node(self, n) -> None:
        op = n.op
        if op == "kda.scan":
            return self.scan(n)
        if op == "kda.workspace":
            return  # the memref is a kernel parameter (bound in emit)
        if op in ("gpu.yield", "func.return"):
            raise LoweringError(f"unexpected {op}")
        if op in ("kda.store", "kda.store_state", "kda.store_chunk"):
            self.store(n)
            self.barrier()
            return
        if op in MATRIX_OPS:
            out = self.bufref(n.results[0])
            self.matrix(n, out)
            self.env[n.results[0]] = out
            self.barrier()
            return
        ref = self.expr(n)
        r = n.results[0]
        if self.plan.mode(r) == "buffer":
            out = self.bufref(r)
            T_.materialize(self.th, ref, out)
            self.barrier()
            ref = out
        self.env[r] = ref

    # -- scans ---------------------------------------------------------------------------
    def scan(self, n) -> None:
        geo = self.geo
        carried = [self.bufref(r) for r in n.results]
        for i, init in enumerate(n.operands):
            src = self.env[init]
            if not carried[i].same_storage(src):
                T_.materialize(self.th, src, carried[i])
        self.barrier()
        body = n.body
        reverse = bool(n.attrs.get("reverse", False))
        y = body.nodes[-1]

        def step(s, *_):
            c = (geo.nchunks - 1) - s if reverse else s
            self.env[body.args[0]] = c
            for a, ref in zip(body.args[1:], carried):
                self.env[a] = ref
            for m in body.nodes[:-1]:
                self.node(m)
            copied = False
            for i, v in enumerate(y.operands):
                if self.plan.yield_copy.get((n, i)) == "skip":
                    continue
                src = self.env[v]
                if carried[i].same_storage(src):
                    continue
                T_.materialize(self.th, src, carried[i])
                copied = True
            if copied:
                self.barrier()
            return []

        T_.for_range(0, geo.nchunks, 1, step)
        for r, ref in zip(n.results, carried):
            self.env[r] = ref

    # -- expressions ---------------------------------------------------------------------
    def expr(self, n) -> T_.Ref:
        k = n.kind
        ops = [self.env.get(o) for o in n.operands]
        r = n.results[0]
        shape = tuple(r.shape)
        a = n.attrs
        if k == "constant":
            return T_.ConstRef(float(a["value"]), shape)
        if k == "scalar":
            return T_.ScalarRef(ops[0], shape)
        if k in ("add", "sub", "mul", "div"):
            return T_.binary(k, ops[0], ops[1])
        if k in ("neg", "exp2", "log2", "sigmoid", "softplus", "rsqrt"):
            return T_.unary(k, ops[0], a)
        if k == "assume_range":
            return ops[0]
        if k == "convert":
            return T_.convert(ops[0], n.operands[0].elt, r.elt)
        if k == "select":
            return T_.select(*ops)
        if k == "broadcast":
            return T_.broadcast(ops[0], a["dims"], shape)
        if k == "transpose":
            return T_.transpose(ops[0])
        if k == "extract_row":
            return T_.extract_row(ops[0], int(a["index"]))
        if k == "embed_row":
            return T_.embed_row(ops[0], int(a["index"]), shape)
        if k == "tril":
            return T_.tril(ops[0], int(a["diagonal"]))
        if k == "valid_rows":
            c = ops[0]
            geo = self.geo
            C = geo.C
            return T_.FnRef(shape, lambda idx: T_.sel(
                T_.icmp("lt", c * C + idx[0], geo.seqlen), T_.cf(1.0), T_.cf(0.0)))
        if k == "load":
            return self.load_token(n, ops[0], ops[1])
        if k == "load_head":
            mem = ops[0]
            geo = self.geo
            return T_.FnRef(shape, lambda idx: mem.load_f32(self._off(T_.i64(geo.hv), mem, idx)))
        if k == "load_state":
            mem = ops[0]
            return T_.FnRef(shape, lambda idx: mem.load_f32(self._off(self._state_row(), mem, idx)))
        if k == "load_chunk":
            mem, c = ops
            return T_.FnRef(shape, lambda idx: mem.load_f32(self._off(self._chunk_row(c), mem, idx)))
        raise LoweringError(f"{n.op}: no expression lowering")

    def _state_row(self):
        geo = self.geo
        return arith.addi(arith.muli(T_.i64(geo.n), T_.i64(geo.HV)), T_.i64(geo.hv))

    def _chunk_row(self, c):
        geo = self.geo
        slot = T_.i64(geo.chunk_off + c)
        return arith.addi(arith.muli(slot, T_.i64(geo.HV)), T_.i64(geo.hv))

    def _off(self, row_i64, mem: MemRef, idx) -> ir.Value:
        """row * inner + flat(idx) in i64."""
        base = arith.muli(row_i64, arith.constant(T_.i64t(), mem.inner))
        fl = mem.flat(idx)
        if isinstance(fl, int) and fl == 0:
            return base
        return arith.addi(base, T_.i64(fl))

    def _token_row(self, mem: MemRef, pos, head):
        """(start + pos) * heads + head, i64; heads = H for q/k-head tensors, else HV."""
        geo = self.geo
        t = arith.addi(geo.start, T_.i64(pos))
        heads = geo.H if mem.heads == "qk" else geo.HV
        return arith.addi(arith.muli(t, T_.i64(heads)), T_.i64(head))

    def load_token(self, n, mem: MemRef, c) -> T_.Ref:
        geo = self.geo
        C = geo.C
        grouped = n.attrs.get("head_map") == "grouped" and mem.heads == "qk"
        shape = tuple(n.results[0].shape)

        def read(idx):
            pos = c * C + idx[0]
            valid = T_.icmp("lt", pos, geo.seqlen)
            safe = IntVal(arith.select(valid, as_i32(pos), as_i32(c * C)))
            head = geo.hv // self.program.gva_ratio if grouped and self.program.gva_ratio > 1 else geo.hv
            x = mem.load_f32(self._off(self._token_row(mem, safe, head), mem, idx[1:]))
            return T_.sel(valid, x, T_.cf(0.0))

        return T_.FnRef(shape, read)

    # -- stores --------------------------------------------------------------------------
    def store(self, n) -> None:
        geo = self.geo
        k = n.kind
        mem = self.env[n.operands[0]]
        if k == "store":
            c = self.env[n.operands[1]]
            src = self.env[n.operands[2]]
            C = geo.C

            def write(idx):
                pos = c * C + idx[0]
                ok = T_.icmp("lt", pos, geo.seqlen)
                T_.if_then(ok, lambda: mem.store_f32(
                    src.read(idx), self._off(self._token_row(mem, pos, geo.hv), mem, idx[1:])))
            T_.foreach(self.th, src.shape, write)
        elif k == "store_state":
            src = self.env[n.operands[1]]
            T_.foreach(self.th, src.shape, lambda idx: mem.store_f32(
                src.read(idx), self._off(self._state_row(), mem, idx)))
        elif k == "store_chunk":
            c = self.env[n.operands[1]]
            src = self.env[n.operands[2]]
            T_.foreach(self.th, src.shape, lambda idx: mem.store_f32(
                src.read(idx), self._off(self._chunk_row(c), mem, idx)))

    # -- matrix ops ----------------------------------------------------------------------
    def matrix(self, n, out: T_.BufRef) -> None:
        k = n.kind
        ops = [self.env.get(o) for o in n.operands]
        a = n.attrs
        th = self.th
        if k == "dot":
            lhs, rhs = ops
            if a.get("transpose_lhs"):
                lhs = T_.transpose(lhs)
            if a.get("transpose_rhs"):
                rhs = T_.transpose(rhs)
            T_.emit_dot(th, out, lhs, rhs)
        elif k == "decay_dot":
            T_.emit_decay_dot(th, out, *ops, int(a["diagonal"]), a.get("clamp_min"))
        elif k == "decay_matmul":
            T_.emit_decay_matmul(th, out, *ops, int(a["diagonal"]), bool(a.get("transpose")),
                                 a.get("clamp_min"))
        elif k == "cumsum":
            T_.emit_cumsum(th, out, ops[0], bool(a.get("reverse")))
        elif k == "reduce_sum":
            T_.emit_reduce_sum(th, out, ops[0], a["dims"], self.red)
        elif k == "tril_inv":
            T_.emit_tril_inv(th, out, ops[0])
        elif k == "tril_solve":
            T_.emit_tril_solve(th, out, ops[0], ops[1])
        elif k == "sum_chunks":
            mem = ops[0]
            geo = self.geo

            def one(idx):
                def step(c, acc):
                    return [arith.addf(acc, mem.load_f32(self._off(self._chunk_row(c), mem, idx)))]
                (acc,) = T_.for_range(0, geo.nchunks, 1, step, [T_.cf(0.0)])
                out.write(idx, acc)
            T_.foreach(th, out.shape, one)
        else:
            raise LoweringError(f"{n.op}: no matrix lowering")


# ------------------------------------------------------------------------------------------
# global kernels
# ------------------------------------------------------------------------------------------


def _emit_global(builder: GpuModuleBuilder, program: Program, n, name: str, block: int):
    src_v, dst_v = n.operands
    s_name, s_elt, s_layout, s_heads, s_tail = _mem_info(src_v, program)
    d_name, d_elt, d_layout, d_heads, d_tail = _mem_info(dst_v, program)
    params = [Param(s_name, "ptr", s_elt), Param(d_name, "ptr", d_elt),
              Param("T", "i32"), Param("N", "i32"), Param("HV", "i32")]
    inner = T_.numel(d_tail)
    ratio = program.gva_ratio
    varlen = program.varlen
    with builder.kernel(name, params, (block, 1, 1)) as p:
        src = MemRef(s_name, p[s_name], s_elt, s_layout, s_heads, s_tail)
        dst = MemRef(d_name, p[d_name], d_elt, d_layout, d_heads, d_tail)
        tid = IntVal(thread_idx("x"))
        e = IntVal(block_idx("x")) * block + tid
        HV = IntVal(p["HV"])
        N = IntVal(p["N"])
        Tt = IntVal(p["T"])
        if n.op == "kda.sum_head_groups":
            H = HV // ratio if ratio > 1 else HV
            tokens = Tt if varlen else IntVal(arith.muli(as_i32(N), as_i32(Tt)))
            total = arith.muli(T_.i64(tokens), arith.muli(T_.i64(H), arith.constant(T_.i64t(), inner)))
            e64 = T_.i64(e)
            ok = arith.cmpi(arith.CmpIPredicate.slt, e64, total)

            def body():
                inner64 = arith.constant(T_.i64t(), inner)
                d = arith.remsi(e64, inner64)
                th = arith.divsi(e64, inner64)          # token * H + h
                Hh = T_.i64(H)
                h = arith.remsi(th, Hh)
                t = arith.divsi(th, Hh)
                acc = T_.cf(0.0)
                for gidx in range(ratio):
                    hv = arith.addi(arith.muli(h, arith.constant(T_.i64t(), ratio)),
                                    arith.constant(T_.i64t(), gidx))
                    row = arith.addi(arith.muli(t, T_.i64(HV)), hv)
                    acc = arith.addf(acc, src.load_f32(arith.addi(arith.muli(row, inner64), d)))
                dst.store_f32(acc, e64)
            T_.if_then(ok, body)
        elif n.op == "kda.sum_seqs":
            total = HV * inner
            ok = e.lt(total)

            def body():
                def step(m, acc):
                    idx = arith.addi(arith.muli(T_.i64(m), T_.i64(total)), T_.i64(e))
                    return [arith.addf(acc, src.load_f32(idx))]
                (acc,) = T_.for_range(0, N, 1, step, [T_.cf(0.0)])
                dst.store_f32(acc, T_.i64(e))
            T_.if_then(ok, body)
        else:  # pragma: no cover
            raise LoweringError(n.op)
    if n.op == "kda.sum_head_groups":
        size = f"tokens * H * {inner}"
    else:
        size = f"HV * {inner}"
    return params, {"grid": [f"ceil_div({size}, {block})", "1", "1"], "block": [block, 1, 1],
                    "dynamic_shared_memory": 0}


# ------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------


def lower_program(module, target: Target, *, name: str | None = None,
                  options: LowerOptions | None = None) -> list[LoweredKernel]:
    """Lower a kda program (after kda-stable-reassociate; any scan structure) to GPU kernels
    for ``target``; returns them in launch order."""
    opts = options or LowerOptions()
    program = read_program(module)
    prefix = name or program.name
    groups = group_kernels(program, opts.split_scans)
    out: list[LoweredKernel] = []
    for g in groups:
        kname = f"{prefix}__k{g.index}_{g.label}"
        builder = GpuModuleBuilder(f"{kname}_module")
        if g.kind == "global":
            with builder.context, builder.location:
                params, launch = _emit_global(builder, program, g.nodes[0], kname, opts.global_block)
            launch.update(kind="global", order=g.index, storage="none", scratch_bytes_per_cta=0)
            out.append(LoweredKernel(kname, program.name, "global", g.index, builder, params,
                                     launch, "none", 0, "portable"))
            continue
        plan = plan_storage(program, g)
        need = REDUCE_SLOTS_BYTES + plan.total_bytes
        budget = target.smem_per_block - opts.smem_reserve
        storage = opts.storage
        if storage == "auto":
            storage = "smem" if need <= budget else "global"
        if storage == "smem" and need > budget:
            raise LoweringError(f"{kname}: {need} bytes of tile storage exceed the "
                                f"{target.chip} shared-memory budget {budget}")
        em = TileKernelEmitter(program, g, plan, storage, opts)
        with builder.context, builder.location:
            params = em.params()
            em.emit(builder, kname)
        dyn = need if storage == "smem" else 0
        launch = {"grid": ["HV", "N", "1"], "block": [opts.nthreads, 1, 1],
                  "dynamic_shared_memory": dyn, "kind": "tile", "order": g.index,
                  "storage": storage, "scratch_bytes_per_cta": need if storage == "global" else 0,
                  "tile_bytes": need}
        info = {"buffers": len({id(b) for b in plan.buffers.values()}),
                "modes": _mode_counts(plan), "scans": len(g.scans)}
        out.append(LoweredKernel(kname, program.name, "tile", g.index, builder, params, launch,
                                 storage, need if storage == "global" else 0, "portable-fma", info))
    return out


def _mode_counts(plan: StoragePlan) -> dict:
    out: dict = {}
    for m in plan.modes.values():
        out[m] = out.get(m, 0) + 1
    return out
