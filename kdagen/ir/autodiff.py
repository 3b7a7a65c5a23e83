"""Reverse-mode differentiation of kda-dialect programs: ``kda_bwd = autodiff(kda_fwd)``.

:func:`autodiff` takes a module holding a forward program and returns a new module holding its
backward program, written with kda ops like any other program (it prints, parses and verifies).
Nothing in it is specific to KDA or GDN: every op has a VJP rule written with kda ops
(:data:`VJP_RULES`), so any gate or program variant built from kda ops gets its backward.

The backward program of a forward ``f(inputs) -> outputs``:

* **Arguments.** The forward's inputs; one cotangent input per forward output (``do`` for
  ``o``, ``dht`` for ``final_state``: the ``kda.grad_name`` argument attribute, else ``d`` +
  name); one gradient output per differentiable input that the forward reads (``dq``, ``dk``,
  ``dv``, ``dg_raw``, ``dbeta_raw``, ``dA_log``, ``ddt_bias``, ``dh0``).
* **Primal.** Function-level ops are re-emitted; each forward ``kda.scan`` becomes a *recompute
  scan* that stores its carried values at the start of every chunk into a per-chunk workspace
  (``S_chunks``) and drops the forward's output stores.
* **Adjoint.** Function-level ops are processed in reverse. A scan becomes a *reverse scan*
  carrying the adjoints of its carried values (``dS``). Its body reloads the chunk-start
  state from the workspace, recomputes the chunk forward, and runs the VJP rules in reverse
  order. Fan-out adjoints are summed (``kda.add``). A value the body captures from outside
  (a per-head parameter, ...) gets its per-chunk adjoint stored into a per-chunk workspace and
  summed per sequence after the scan (``kda.sum_chunks``): explicit, deterministic, and no
  differently-typed carried values (IRDL gives all operands of ``kda.scan`` one type).
* **Loads become stores.** The adjoint of a token load is a store of its adjoint to the
  gradient (rows past the sequence end are not stored). A GVA-grouped load (q, k with
  ``gva_ratio > 1``) stores per value head into an fp32 token workspace and a final
  ``kda.sum_head_groups`` reduces it into the [B, T, H, K] gradient (deterministic, no atomics).
  The adjoint of a per-head parameter load (``kda.load_head``) is stored per (sequence, head)
  into a workspace and reduced over sequences by a final ``kda.sum_seqs``; the reduction over
  tokens before it is the ``kda.reduce_sum`` adjoint of the gate's ``kda.broadcast`` plus the
  ``kda.sum_chunks`` over chunks. The adjoint of ``kda.load_state`` (h0) is stored to ``dh0``.

* **Residuals.** A forward may store chunk values into outputs marked ``kda.residual``
  (``save_residuals``: values its backward would otherwise recompute). They become inputs of
  the backward, and wherever the backward re-emits the op computing such a value (in the
  recompute scan and in the reverse scan's recompute) it loads the stored value instead; the
  producers left unused are dead code.

Limits (checked, with clear errors): each differentiable input is loaded once; no nested scans;
forward programs may not themselves read workspaces, nor write them except residuals.
"""
from __future__ import annotations

from kdagen._mlir import ir
from kdagen.ir.accessors import arg_specs, program_func
from kdagen.ir import dsl
from kdagen.ir.dialect import op_attrs, ops_with, py_attr, verify
from kdagen.ir.dsl import LN2, ProgramBuilder, Tile, create, value_name
from kdagen.ir.transforms import cse, dce

__all__ = ["autodiff", "VJP_RULES", "vjp_rule", "dce", "AutodiffError"]


class AutodiffError(ValueError):
    pass


VJP_RULES: dict = {}


def vjp_rule(*names):
    """Register a VJP rule: ``rule(ins, outs, douts, need) -> [operand adjoint or None]``.

    ``ins``/``outs`` are the recomputed primal operands/results as tiles, ``douts`` the result
    adjoints (None where zero), ``need[i]`` whether operand i needs an adjoint.
    """
    def deco(fn):
        for n in names:
            VJP_RULES[n] = fn
        return fn
    return deco


_STORES = ops_with(effect="write")
# loads of program inputs (kda.load_chunk reads workspaces, which forward programs do not)
_LOADS = ops_with(effect="read", kind="memory") - {"kda.load_chunk"}
_PURE_SOURCES = ops_with(kind="source") | ops_with(effect="alloc")


def _ops(block):
    return [op.operation for op in block.operations]


def _attr(op, name, default=None):
    return py_attr(op.attributes[name]) if name in op.attributes else default


def _is_float_tile(t):
    return isinstance(t, ir.RankedTensorType) and isinstance(t.element_type, ir.FloatType)


def _grad_name(spec) -> str:
    return spec.attrs.get("kda.grad_name") or ("d" + spec.name)


class _AD:
    def __init__(self, fwd, name):
        self.fwd = fwd
        self.name = name
        self.specs = arg_specs(fwd)
        self.fattrs = {k: py_attr(fwd.attributes[k]) for k in
                       (na.name if hasattr(na, "name") else na for na in fwd.attributes)
                       if k.startswith("kda.")}
        self.ratio = int(self.fattrs.get("kda.gva_ratio", 1))
        self.entry = fwd.regions[0].blocks[0]
        self.fargs = list(self.entry.arguments)
        self.arg_spec = {a: s for a, s in zip(self.fargs, self.specs)}
        self._check()
        self._activity()

    # ---------------------------------------------------------------- analysis
    def _residual_store(self, op) -> bool:
        """A store of a value the backward reads instead of recomputing (an output marked
        ``kda.residual``: the forward's save_residuals)."""
        spec = self.arg_spec.get(op.operands[0])
        return spec is not None and spec.role == "output" and bool(spec.attrs.get("kda.residual"))

    def _check(self):
        loads = {}
        self.residuals = {}       # forward value -> (its residual output, the chunk index)

        def visit(block, depth):
            for op in _ops(block):
                if op.name == "kda.scan":
                    if depth:
                        raise AutodiffError("autodiff: nested kda.scan is not supported")
                    visit(op.regions[0].blocks[0], depth + 1)
                if op.name == "kda.store_chunk" and self._residual_store(op):
                    self.residuals[op.operands[2]] = (op.operands[0], op.operands[1])
                    continue
                if op.name in ("kda.load_chunk", "kda.store_chunk", "kda.workspace"):
                    raise AutodiffError(f"autodiff: forward programs may not use {op.name}")
                if op.name in _LOADS:
                    src = op.operands[0]
                    loads[src] = loads.get(src, 0) + 1
                    if op.name in ("kda.load_head", "kda.load_state") and depth:
                        raise AutodiffError(f"autodiff: {op.name} inside a scan is not supported")
                if op.name in _STORES:
                    spec = self.arg_spec.get(op.operands[0])
                    if spec is None or spec.role != "output":
                        raise AutodiffError("autodiff: stores must target program outputs")
                    if op.name == "kda.store" and not depth:
                        raise AutodiffError("autodiff: kda.store outside a scan")
        visit(self.entry, 0)
        self.loaded = loads
        self.diff_inputs = []
        for a, s in zip(self.fargs, self.specs):
            if (s.role == "input" and s.layout in ("token", "head", "state")
                    and s.elt not in ("i1", "i32", "i64", "index") and a in loads):
                if loads[a] > 1:
                    raise AutodiffError(f"autodiff: input {s.name!r} is loaded {loads[a]} times; "
                                        "each differentiable input must be loaded once")
                self.diff_inputs.append(a)

    def _activity(self):
        active = set()
        diff = set(self.diff_inputs)

        def analyze(block):
            for op in _ops(block):
                if op.name == "kda.scan":
                    body = op.regions[0].blocks[0]
                    args = list(body.arguments)[1:]
                    for a, init in zip(args, op.operands):
                        if init in active:
                            active.add(a)
                    while True:
                        analyze(body)
                        term = _ops(body)[-1]
                        changed = False
                        for a, y in zip(args, term.operands):
                            if y in active and a not in active:
                                active.add(a)
                                changed = True
                        if not changed:
                            break
                    for a, r in zip(args, op.results):
                        if a in active:
                            active.add(r)
                elif op.name in _LOADS:
                    if op.operands[0] in diff:
                        active.add(op.results[0])
                elif op.name in _PURE_SOURCES:
                    continue
                elif any(v in active for v in op.operands):
                    for r in op.results:
                        if _is_float_tile(r.type):
                            active.add(r)
        analyze(self.entry)
        self.active = active

    # ---------------------------------------------------------------- building
    def build(self) -> ir.Module:
        attrs = {k[len("kda."):]: v for k, v in self.fattrs.items()}
        attrs["program"] = self.name
        attrs["derived_from"] = self.fattrs.get("kda.program", self.fwd.name.value)
        p = ProgramBuilder(self.name, attrs, context=self.fwd.context)
        self.p = p

        def raw(spec):
            return {k[len("kda."):]: v for k, v in spec.attrs.items() if k != "kda.name"}

        for a, s in zip(self.fargs, self.specs):
            if s.role == "input":
                p.declare(s.name, a.type, raw(s))
        for a, s in zip(self.fargs, self.specs):
            if s.role == "output" and s.attrs.get("kda.residual"):
                d = raw(s)          # the forward's residual output, read by the backward
                d.update(role="input")
                p.declare(s.name, a.type, d)
        for a, s in zip(self.fargs, self.specs):
            if s.role == "output" and not s.attrs.get("kda.residual"):
                d = raw(s)
                d.pop("grad_name", None)
                d.update(role="input", cotangent_of=s.name)
                p.declare(_grad_name(s), a.type, d)
        for a in self.diff_inputs:
            s = self.arg_spec[a]
            d = raw(s)
            d.pop("grad_name", None)
            d.pop("default", None)
            d.update(role="output", gradient_of=s.name)
            p.declare(_grad_name(s), a.type, d)

        self.deferred = []
        with p.body() as mems:
            self.pm = {}
            self.cot = {}
            self.grad = {}
            for a, s in zip(self.fargs, self.specs):
                if s.role == "input" or s.attrs.get("kda.residual"):
                    m = mems[s.name]
                    self.pm[a] = m.value if isinstance(m, dsl.Mem) else m
                else:
                    self.cot[a] = mems[_grad_name(s)]
            for a in self.diff_inputs:
                self.grad[a] = mems[_grad_name(self.arg_spec[a])]
            self.saved = {}
            ops = [op for op in _ops(self.entry) if op.name != "func.return"]
            for op in ops:
                self._primal(op, func_level=True)
            adj = {}
            for op in reversed(ops):
                self._adjoint(op, adj)
            for fn in self.deferred:
                fn()
        cse(p.func)
        dce(p.func)
        verify(p.module)
        return p.module

    # -- primal
    def _clone(self, op):
        if len(op.results) == 1 and op.results[0] in self.residuals:
            # the forward stored this value for us: load it instead of recomputing it
            mem, chunk = self.residuals[op.results[0]]
            name = self.arg_spec[mem].name
            self.pm[op.results[0]] = create(
                "load_chunk", [op.results[0].type], [self.pm[mem], self.pm[chunk]],
                {"name": ir.StringAttr.get(name)}, name=value_name(op.results[0]) or name).result
            return None
        new = ir.Operation.create(op.name, results=[r.type for r in op.results],
                                  operands=[self.pm[v] for v in op.operands],
                                  attributes={k: op.attributes[k] for k in
                                              (na.name if hasattr(na, "name") else na for na in op.attributes)},
                                  loc=op.location)
        for r, nr in zip(op.results, new.results):
            self.pm[r] = nr
        return new

    def _is_output_store(self, op):
        return op.name in _STORES

    def _primal(self, op, func_level=False):
        if self._is_output_store(op):
            return
        if op.name == "kda.scan":
            return self._recompute_scan(op)
        self._clone(op)

    def _recompute_scan(self, op):
        body = op.regions[0].blocks[0]
        bargs = list(body.arguments)
        wss = []
        for a in bargs[1:]:
            t = ir.RankedTensorType(a.type)
            nm = (value_name(a) or "carried") + "_chunks"
            mt = dsl.memref_type("chunk", list(t.shape), t.element_type)
            ws = create("workspace", [mt], [], {"name": ir.StringAttr.get(nm),
                                                "layout": ir.StringAttr.get("chunk")}, name=nm).result
            wss.append(ws)
        self.saved[op] = wss
        scan = dsl.Scan([Tile(self.pm[v]) for v in op.operands],
                        names=[value_name(a) for a in bargs[1:]], reverse=_attr(op, "reverse", False),
                        name=(value_name(op.results[0]) or "scan") + "_recompute" if len(op.results) else None)
        with scan as (c, *carried):
            self.pm[bargs[0]] = c
            for a, nv, ws in zip(bargs[1:], carried, wss):
                self.pm[a] = nv.value
                create("store_chunk", [], [ws, c, nv.value], {"name": ir.StringAttr.get(value_name(a) or "carried")})
            for inner in _ops(body):
                if inner.name == "gpu.yield":
                    scan.yield_(*[Tile(self.pm[v]) for v in inner.operands])
                else:
                    self._primal(inner)
        for r, nr in zip(op.results, scan.op.results):
            self.pm[r] = nr

    # -- adjoint helpers
    def _acc(self, adj, v, contrib):
        """adj[v] += contrib (a ``kda.add`` on fan-out), only for active values."""
        if contrib is None or v not in self.active:
            return
        contrib = contrib if isinstance(contrib, Tile) else Tile(contrib)
        if v in adj:
            s = adj[v] + contrib
            nm = value_name(v)
            adj[v] = s.named("d" + nm) if nm else s
        else:
            adj[v] = contrib

    def _zeros(self, t, name=None):
        t = ir.RankedTensorType(t)
        return dsl.constant(0.0, list(t.shape), t.element_type, name=name)

    def _vjp(self, op, adj):
        douts = [adj.get(r) for r in op.results]
        if all(d is None for d in douts):
            return
        need = [v in self.active for v in op.operands]
        if not any(need):
            return
        rule = VJP_RULES.get(op.name)
        if rule is None:
            raise AutodiffError(f"autodiff: no VJP rule for {op.name}")
        ins = [Tile(self.pm[v]) if _is_float_tile(v.type) or isinstance(v.type, ir.RankedTensorType) else self.pm[v]
               for v in op.operands]
        outs = [Tile(self.pm[r]) for r in op.results]
        douts = [d if d is None or isinstance(d, Tile) else Tile(d) for d in douts]
        contribs = list(rule(ins, outs, douts, need, _attrs=op_attrs(op)))
        # name fresh contributions after their primal ("dkd" for kd); a value returned for two
        # operands (e.g. by the add rule) or passed through (a result adjoint) keeps its name
        keep = {d.value for d in douts if d is not None}
        renamed = {}
        for i, (v, cb) in enumerate(zip(op.operands, contribs)):
            if cb is None or not need[i]:
                continue
            cv = cb.value
            if cv in renamed:
                contribs[i] = renamed[cv]
                continue
            nm = value_name(v)
            if (nm and cv not in keep and not isinstance(cv, ir.BlockArgument)
                    and value_name(cv) is None and not len(cv.owner.regions)):
                renamed[cv] = cb.named("d" + nm)
                contribs[i] = renamed[cv]
        for v, cb, nd in zip(op.operands, contribs, need):
            if nd and cb is not None:
                self._acc(adj, v, cb)

    def _adjoint(self, op, adj):
        n = op.name
        if n == "kda.store_state":
            mem = self.cot[op.operands[0]]
            self._acc(adj, op.operands[1], self.p.load_state(mem))
        elif n == "kda.scan":
            self._reverse_scan(op, adj)
        elif n == "kda.load_state":
            if op.operands[0] in self.grad:
                self._grad_state(op, adj.get(op.results[0]))
        elif n == "kda.load_head":
            if op.operands[0] in self.grad:
                self._grad_head(op, adj.get(op.results[0]))
        else:
            self._vjp(op, adj)

    def _grad_state(self, op, a):
        gm = self.grad[op.operands[0]]
        tile = a if a is not None else self._zeros(op.results[0].type)
        self.p.store_state(gm, tile, name=gm.name)

    def _grad_head(self, op, a):
        gm = self.grad[op.operands[0]]
        t = ir.RankedTensorType(op.results[0].type)
        tile = a if a is not None else self._zeros(t)
        nm = gm.name + "_per_seq"
        mt = dsl.memref_type("state", list(t.shape), t.element_type)
        ws = create("workspace", [mt], [], {"name": ir.StringAttr.get(nm),
                                            "layout": ir.StringAttr.get("state")}, name=nm).result
        self.p.store_state(dsl.Mem(ws, nm, "state", "workspace"), tile, name=nm)

        def final(ws=ws, gm=gm):
            create("sum_seqs", [], [ws, gm.value], {"name": ir.StringAttr.get(gm.name)})
        self.deferred.append(final)

    def _captured(self, body):
        inside = set(body.arguments)
        caps = []
        for op in _ops(body):
            for v in op.operands:
                if v not in inside and v in self.active and v not in caps:
                    caps.append(v)
            for r in op.results:
                inside.add(r)
        return caps

    def _reverse_scan(self, op, adj):
        body = op.regions[0].blocks[0]
        bargs = list(body.arguments)
        carried = bargs[1:]
        wss = self.saved[op]
        caps = self._captured(body)
        # GVA workspaces for grouped loads of differentiable inputs (created before the scan)
        self.gva_ws = {}
        for inner in _ops(body):
            if inner.name == "kda.load" and inner.operands[0] in self.grad and \
                    _attr(inner, "head_map") == "grouped" and self.ratio > 1:
                gm = self.grad[inner.operands[0]]
                t = ir.RankedTensorType(inner.results[0].type)
                nm = gm.name + "_per_value_head"
                mt = dsl.memref_type("token", list(t.shape[1:]), ir.F32Type.get())
                ws = create("workspace", [mt], [], {"name": ir.StringAttr.get(nm),
                                                    "layout": ir.StringAttr.get("token")}, name=nm).result
                self.gva_ws[inner.operands[0]] = ws

                def final(ws=ws, gm=gm):
                    create("sum_head_groups", [], [ws, gm.value], {"name": ir.StringAttr.get(gm.name)})
                self.deferred.append(final)
        # adjoints of values captured from outside the body (per-head parameters, ...): each
        # chunk stores its partial into a per-chunk workspace, summed per sequence after the
        # scan (kda.sum_chunks) -- explicit, deterministic, and no heterogeneous carried values
        cap_ws = []
        for v in caps:
            t = ir.RankedTensorType(v.type)
            nm = "d" + (value_name(v) or "captured") + "_chunks"
            mt = dsl.memref_type("chunk", list(t.shape), t.element_type)
            cap_ws.append(create("workspace", [mt], [], {"name": ir.StringAttr.get(nm),
                                                         "layout": ir.StringAttr.get("chunk")},
                                 name=nm).result)
        inits = []
        for init, r in zip(op.operands, op.results):
            a = adj.get(r)
            inits.append(a if a is not None else self._zeros(r.type, name="d" + (value_name(r) or "carried")))
        names = ["d" + (value_name(a) or "carried") for a in carried]
        scan_name = ("d" + (value_name(carried[0]) or "carried") + "0") if carried else None
        scan = dsl.Scan(inits, names=names, reverse=not _attr(op, "reverse", False), name=scan_name)
        with scan as (c, *dS):
            self.pm[bargs[0]] = c
            for a, ws in zip(carried, wss):
                t = ir.RankedTensorType(a.type)
                self.pm[a] = create("load_chunk", [t], [ws, c],
                                    {"name": ir.StringAttr.get(value_name(a) or "carried")},
                                    name=value_name(a)).result
            inner_ops = _ops(body)
            term = inner_ops[-1]
            for inner in inner_ops[:-1]:
                self._primal(inner)
            adjl = {}
            for y, d in zip(term.operands, dS):
                self._acc(adjl, y, d)
            for inner in reversed(inner_ops[:-1]):
                n = inner.name
                if n == "kda.store":
                    mem = self.cot[inner.operands[0]]
                    self._acc(adjl, inner.operands[2], self.p.load(mem, c))
                elif n == "kda.load":
                    if inner.operands[0] in self.grad:
                        self._grad_token(inner, adjl.get(inner.results[0]), c)
                else:
                    self._vjp(inner, adjl)
            for v, ws in zip(caps, cap_ws):
                d = adjl.get(v)
                d = d if d is not None else self._zeros(v.type)
                create("store_chunk", [], [ws, c, d.value],
                       {"name": ir.StringAttr.get("d" + (value_name(v) or "captured"))})
            outs = []
            for a in carried:
                d = adjl.get(a)
                outs.append(d if d is not None else self._zeros(a.type))
            scan.yield_(*outs)
        for a, r in zip(op.operands, scan.op.results):
            self._acc(adj, a, Tile(r))
        for v, ws in zip(caps, cap_ws):
            nm = "d" + (value_name(v) or "captured")
            t = ir.RankedTensorType(v.type)
            total = create("sum_chunks", [t], [ws], {"name": ir.StringAttr.get(nm)}, name=nm).result
            self._acc(adj, v, Tile(total))

    def _grad_token(self, load, a, c):
        src = load.operands[0]
        gm = self.grad[src]
        t = load.results[0].type
        if src in self.gva_ws:
            ws = self.gva_ws[src]
            if a is None:
                f = self._zeros(ir.RankedTensorType.get(list(ir.RankedTensorType(t).shape), ir.F32Type.get()))
            else:
                f = _strip_convert(a)
                f = dsl.convert(f, "fp32")
            nm = gm.name + "_per_value_head"
            create("store", [], [ws, c, f.value], {"name": ir.StringAttr.get(nm)})
        else:
            tile = a if a is not None else self._zeros(t)
            self.p.store(gm, c, tile, name=gm.name)


def _strip_convert(t: Tile) -> Tile:
    """The fp32 source of a ``kda.convert`` result (avoid rounding GVA partial sums)."""
    v = t.value
    if not isinstance(v, ir.BlockArgument):
        op = v.owner
        op = op.operation if hasattr(op, "operation") else op
        if op.name == "kda.convert" and str(ir.ShapedType(op.operands[0].type).element_type) == "f32":
            return Tile(op.operands[0])
    return t


# --------------------------------------------------------------------------------------
# the entry point
# --------------------------------------------------------------------------------------


def autodiff(module, name: str | None = None) -> ir.Module:
    """The backward program of the forward program in ``module`` (a new module, same context).

    ``name`` defaults to the forward's name with ``_fwd`` replaced by ``_bwd``.
    """
    fwd = program_func(module)
    fname = fwd.name.value
    name = name or (fname[:-4] + "_bwd" if fname.endswith("_fwd") else fname + "_bwd")
    with module.context, ir.Location.unknown():
        return _AD(fwd, name).build()


# --------------------------------------------------------------------------------------
# VJP rules (each written with kda ops)
# --------------------------------------------------------------------------------------


@vjp_rule("kda.add")
def _vjp_add(ins, outs, d, need, _attrs):
    return [d[0], d[0]]


@vjp_rule("kda.sub")
def _vjp_sub(ins, outs, d, need, _attrs):
    return [d[0], -d[0] if need[1] else None]


@vjp_rule("kda.mul")
def _vjp_mul(ins, outs, d, need, _attrs):
    a, b = ins
    return [d[0] * b if need[0] else None, d[0] * a if need[1] else None]


@vjp_rule("kda.div")
def _vjp_div(ins, outs, d, need, _attrs):
    a, b = ins
    return [d[0] / b if need[0] else None, -(d[0] * outs[0]) / b if need[1] else None]


@vjp_rule("kda.neg")
def _vjp_neg(ins, outs, d, need, _attrs):
    return [-d[0]]


@vjp_rule("kda.exp2")
def _vjp_exp2(ins, outs, d, need, _attrs):
    return [d[0] * outs[0] * LN2]          # d 2^x = 2^x ln 2


@vjp_rule("kda.log2")
def _vjp_log2(ins, outs, d, need, _attrs):
    return [d[0] / (ins[0] * LN2)]


@vjp_rule("kda.sigmoid")
def _vjp_sigmoid(ins, outs, d, need, _attrs):
    # y·σ(−x) rather than y·(1 − y): the subtraction would cancel for a saturated gate
    y = outs[0]
    return [d[0] * (y * dsl.sigmoid(-ins[0]))]


@vjp_rule("kda.softplus")
def _vjp_softplus(ins, outs, d, need, _attrs):
    return [d[0] * dsl.sigmoid(ins[0])]


@vjp_rule("kda.rsqrt")
def _vjp_rsqrt(ins, outs, d, need, _attrs):
    y = outs[0]
    return [d[0] * (y * y * y) * -0.5]


@vjp_rule("kda.convert")
def _vjp_convert(ins, outs, d, need, _attrs):
    return [dsl.convert(d[0], ins[0].dtype)]


@vjp_rule("kda.assume_range", "kda.convert_layout")
def _vjp_identity(ins, outs, d, need, _attrs):
    return [d[0]]


@vjp_rule("kda.clamp")
def _vjp_clamp(ins, outs, d, need, _attrs):
    # torch.clamp's rule: the identity inside [lo, hi] (boundaries included), zero outside
    return [dsl.where(dsl.in_range(ins[0], _attrs["lo"], _attrs["hi"]), d[0], 0.0)]


@vjp_rule("kda.select")
def _vjp_select(ins, outs, d, need, _attrs):
    c = ins[0]
    return [None, dsl.where(c, d[0], 0.0) if need[1] else None,
            dsl.where(c, 0.0, d[0]) if need[2] else None]


@vjp_rule("kda.broadcast")
def _vjp_broadcast(ins, outs, d, need, _attrs):
    return [dsl.reduce_sum(d[0], _attrs["dims"])]


@vjp_rule("kda.reduce_sum")
def _vjp_reduce_sum(ins, outs, d, need, _attrs):
    return [dsl.broadcast(d[0], ins[0].shape, _attrs["dims"])]


@vjp_rule("kda.cumsum")
def _vjp_cumsum(ins, outs, d, need, _attrs):
    return [dsl.cumsum(d[0], reverse=not _attrs.get("reverse", False))]   # prefix <-> suffix


@vjp_rule("kda.transpose")
def _vjp_transpose(ins, outs, d, need, _attrs):
    return [dsl.transpose(d[0])]


@vjp_rule("kda.extract_row")
def _vjp_extract_row(ins, outs, d, need, _attrs):
    return [dsl.embed_row(d[0], _attrs["index"], ins[0].shape[0])]


@vjp_rule("kda.embed_row")
def _vjp_embed_row(ins, outs, d, need, _attrs):
    return [dsl.extract_row(d[0], _attrs["index"])]


@vjp_rule("kda.tril")
def _vjp_tril(ins, outs, d, need, _attrs):
    return [dsl.tril(d[0], _attrs["diagonal"])]


@vjp_rule("kda.dot")
def _vjp_dot(ins, outs, d, need, _attrs):
    a, b = ins
    dc = d[0]
    ta, tb = bool(_attrs.get("transpose_lhs")), bool(_attrs.get("transpose_rhs"))
    da = db = None
    # C = op(A) op(B)
    if need[0]:
        if not ta:   # dA = dC op(B)^T
            da = dsl.dot(dc, b, transpose_b=not tb)
        else:        # dA = (dC op(B)^T)^T = op(B) dC^T
            da = dsl.dot(b, dc, transpose_a=tb, transpose_b=True)
    if need[1]:
        if not tb:   # dB = op(A)^T dC
            db = dsl.dot(a, dc, transpose_a=not ta)
        else:        # dB = (op(A)^T dC)^T = dC^T op(A)
            db = dsl.dot(dc, a, transpose_a=True, transpose_b=ta)
    return [da, db]


@vjp_rule("kda.tril_inv")
def _vjp_tril_inv(ins, outs, d, need, _attrs):
    # Y = (I + L)^-1  =>  dL = -strict_tril(Y^T dY Y^T)
    y = outs[0]
    return [-dsl.strict_tril(dsl.dot(dsl.dot(y, d[0], transpose_a=True), y, transpose_b=True))]


@vjp_rule("kda.tril_solve")
def _vjp_tril_solve(ins, outs, d, need, _attrs):
    # X = (I + L)^-1 B  =>  dB = (I + L)^-T dX,  dL = -strict_tril(dB X^T)
    L, _ = ins
    x = outs[0]
    db = dsl.dot(dsl.tril_inv(L), d[0], transpose_a=True)
    dl = -dsl.strict_tril(dsl.dot(db, x, transpose_b=True)) if need[0] else None
    return [dl, db if need[1] else None]
