"""``kda-assign-layouts``: give every tile value a layout, and make the changes explicit.

A register-tile lowering keeps a tile where its producer leaves it — the accumulator fragments
of a matrix product, the shared-memory box a TMA load fills — and runs element-wise code on it
there. This pass decides, for every tile value of every kernel, which layout it lives in, and
inserts a ``kda.convert_layout`` wherever a consumer needs another one, so that no layout change
is hidden in the lowering and the cost of the ones a kernel needs can be counted.

Layouts (:data:`LAYOUTS`; the MMA atom they refer to is the module's, ``kda.mma_atom`` on the
function: the target's ``mma_atom``, ``wgmma`` on sm_90a, ``mma_sync`` elsewhere):

- ``acc``: the accumulator fragments of the atom, rows of the fragment = rows of the value (a
  matrix product's result);
- ``acc_t``: accumulator fragments holding the value's transpose (a product computed as
  ``Cᵀ = Bᵀ·Aᵀ``; the carried state of a register-resident scan, Sᵀ with V as the M dimension);
- ``row`` / ``col``: a vector laid out like the rows / the columns of a fragment (a row sum of
  an accumulator; the operand of a broadcast back into one);
- ``opb``: register B-operand fragments (``mma_sync``; ``wgmma`` reads B from shared memory);
- ``smem`` / ``smem_t``: a tile in shared memory as stored / stored transposed (a TMA box; a
  product's shared operand, whose contraction dimension must be contiguous for TF32);
- ``blocked``: each thread a run of consecutive elements (loads without TMA, element-wise
  chains that meet no product);
- ``replicated``: a rank-0 tile every thread holds;
- ``any``: a constant or a broadcast scalar, made in whatever layout its consumer runs in.

How layouts are chosen:

- **Anchors.** Matrix products give accumulators; an accumulator is reused as the A operand of
  the next product in place (no conversion), B comes from shared memory (``wgmma``) or registers
  (``mma_sync``). TMA loads (loads with a ring slot) land in shared memory.
- **Orientation.** Each ``kda.dot`` is computed as ``C = A·B`` (result ``acc``) or as
  ``Cᵀ = Bᵀ·Aᵀ`` (result ``acc_t``), whichever needs fewer bytes of conversions for the layouts
  its operands are in: a product whose right operand is an accumulator takes it as A of the
  transposed product (the register scan's ``(L·X)ᵀ = Xᵀ·Lᵀ``).
- **Propagation.** Element-wise ops run in their operands' layout; where operands disagree the
  pass picks the layout whose conversions move the fewest bytes (:func:`conversion_bytes`),
  registers first. Reductions of an accumulator give ``row``/``col``, broadcasts of those give
  accumulators back; a transpose of a shared tile is a view (``smem`` <-> ``smem_t``).
- **Choices by cost.** Each kernel is tried (a dry run of its body each) with a serial scan's
  carried value as ``acc`` and as ``acc_t``, and with element-wise chains read from shared
  memory into the fragments a product downstream takes in place (``fragment_hint``) or into
  ``blocked``; it keeps the cheapest. A workspace that every kernel reading it would
  convert to ``smem_t`` is stored transposed by its writer instead (``kda.tile_layout`` on the
  ``kda.workspace``; its loads then land as ``smem_t``), which costs the writer nothing: its
  store stages the tile through shared memory either way. Stores take any layout.

Each op with tile results gets ``kda.tile_layout`` (a scan: ``kda.carried_layouts``), and each
kernel (a ``kda.scan`` marked ``kda.kernel``) ``kda.layout_cost``: the conversions in its body and
the bytes they move through shared memory for every chunk (``conversions``,
``conversion_bytes``), those of its carried initial values, once per CTA (``init_*``), and the
most bytes of tiles live at once in registers and in shared memory (`peak_live`). Values are unchanged: ``kda.convert_layout`` is
an identity for the interpreter and for today's tile lowering, which keeps every tile in its own
buffers and drops the conversions (it emits the kernels of the pipeline without this pass).

In every chip's pipeline, last (after ``kda-warp-specialize``: a load with a ring slot is a TMA
load). The pass reads the chip only through the target's ``mma_atom``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .._mlir import ir
from ..ir.accessors import module_target
from ..ir.dialect import ops_with, py_attr
from .base import ModulePass, PassError, register_pass
from .partition import tile_bytes

__all__ = ["AssignLayoutsPass", "LAYOUTS", "ATOMS", "conversion_bytes"]

LAYOUTS = ("acc", "acc_t", "row", "col", "opb", "smem", "smem_t", "blocked", "replicated", "any")
ATOMS = ("wgmma", "mma_sync")
REGISTER = ("acc", "acc_t", "row", "col", "opb", "blocked")
SHARED = ("smem", "smem_t")
ACCUMULATORS = ("acc", "acc_t")
# where candidates cost the same: registers first, accumulators first
PREFERENCE = ("acc", "acc_t", "row", "col", "opb", "blocked", "smem", "smem_t")

MATMUL = ops_with(kind="matrix")
SOLVE = ops_with(kind="solve")
SOURCES = ops_with(kind="source")
# ops a register hint looks through (the value keeps its layout across them)
ELEMENTWISE_CHAIN = ops_with(kind="elementwise") | {"kda.pipeline_wait"}
LOADS = ops_with(effect="read", kind="memory")
STORES = ops_with(effect="write")
LAYOUT_ATTR = "kda.tile_layout"
CARRIED_ATTR = "kda.carried_layouts"
COST_ATTR = "kda.layout_cost"
ATOM_ATTR = "kda.mma_atom"
# precisions whose shared operands need the contraction dimension contiguous (TF32 wgmma,
# and the split forms staged as TF32/bf16 pieces the same way); plain bf16 reads either
K_MAJOR_PRECISIONS = ("tf32", "tf32x3", "bf16x3", "fma", "")


def conversion_bytes(src: str, dst: str, nbytes: int) -> int:
    """Bytes a change of layout moves through shared memory for a tile of ``nbytes``: none for
    no change or a free value, the tile once where one side is shared memory (a read, or a
    write), twice for registers to registers and for a shared tile rewritten transposed."""
    if src == dst or "any" in (src, dst) or "replicated" in (src, dst):
        return 0
    if src in SHARED and dst in SHARED:
        return 2 * nbytes
    if src in SHARED or dst in SHARED:
        return nbytes
    return 2 * nbytes


def _is_tile(v) -> bool:
    return isinstance(v.type, ir.RankedTensorType)


def _rank(v) -> int:
    return ir.RankedTensorType(v.type).rank


def _attr(op, name, default=None):
    return py_attr(op.attributes[name]) if name in op.attributes else default


def _i64(n: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), n)


@dataclass
class _Cost:
    conversions: int = 0          # in a scan's body: every chunk
    bytes: int = 0
    init_conversions: int = 0     # of a scan's carried initial values: once per CTA
    init_bytes: int = 0


@register_pass
@dataclass
class AssignLayoutsPass(ModulePass):
    name = "kda-assign-layouts"
    summary = "give every tile value a layout (kda.tile_layout); kda.convert_layout where they meet"
    # the MMA atom the layouts follow: "target" reads the module's target (kda-bind-target)
    atom: str = field(default="target", metadata={"choices": ("target", *ATOMS)})

    def run(self, module: ir.Module) -> None:
        atom = self.atom
        if atom == "target":
            target = module_target(module)
            if target is None:
                raise PassError("kda-assign-layouts: the module has no target (run kda-bind-target "
                                "first) and no atom option; pass atom=wgmma or atom=mma_sync")
            atom = target.mma_atom
        with module.context, ir.Location.unknown():
            for op in module.body.operations:
                op = op.operation
                if op.name == "func.func":
                    # a dry run finds the workspaces every reader wants transposed; then the
                    # real run, with those stored transposed
                    dry = _Layouts(atom, {}, dry=True)
                    dry.run(op)
                    _Layouts(atom, dry.transposed_workspaces(), dry=False).run(op)


class _Layouts:
    """One walk over a function: layouts of its values (dry: decisions and costs only, the IR
    untouched)."""

    def __init__(self, atom: str, workspaces: dict, dry: bool):
        self.atom = atom
        self.workspaces = workspaces          # workspace memref Value -> layout its loads land in
        self.dry = dry
        self.layout: dict = {}                # tile Value -> layout
        self.converted: dict = {}             # (Value, layout, block owner) -> converted Value
        self.origin: dict = {}                # loaded tile Value -> its workspace memref
        self.requests: dict = defaultdict(list)   # workspace -> layouts its loads were asked in
        self.cost = _Cost()
        self.carried: dict = {}               # a scan body's chunk argument -> carried layouts
        self.hints = False                    # element-wise reads from shared memory: fragment_hint

    def fork(self) -> "_Layouts":
        sub = _Layouts(self.atom, self.workspaces, dry=True)
        sub.layout = dict(self.layout)
        sub.origin = self.origin
        return sub

    def transposed_workspaces(self) -> dict:
        return {ws: "smem_t" for ws, asked in self.requests.items()
                if "smem_t" in asked and all(a in ("smem_t", "either") for a in asked)}

    # -- driver --------------------------------------------------------------------------
    def run(self, func) -> None:
        if not self.dry:
            func.attributes[ATOM_ATTR] = ir.StringAttr.get(self.atom)
        for a in func.regions[0].blocks[0].arguments:
            if _is_tile(a):
                self.layout[a] = "replicated" if _rank(a) == 0 else "blocked"
        self.block(func.regions[0].blocks[0])

    def block(self, block) -> None:
        for op in list(block.operations):
            self.op(op.operation)

    def op(self, op) -> None:
        name = op.name
        if name == "kda.scan":
            self.scan(op)
        elif name == "kda.convert_layout":          # the pass run twice: keep what is there
            self.layout[op.results[0]] = _attr(op, "to")
        elif name == "kda.dot":
            self.set(op, self.dot(op))
        elif name in MATMUL:
            self.set(op, "acc")         # decay products read their operands element by element
        elif name in SOLVE:
            self.require(op, 0, ACCUMULATORS)
            if name == "kda.tril_solve":
                self.require(op, 1, self.b_role(op, transposed=False))
            self.set(op, "acc")
        elif name == "kda.reduce_sum":
            self.set(op, self.reduced(op))
        elif name == "kda.cumsum":
            x = self.of(op.operands[0])
            self.set(op, self.require(op, 0, ("blocked",)) if x in SHARED else x)
        elif name == "kda.broadcast":
            self.set(op, self.broadcast(op))
        elif name == "kda.extract_row":
            self.set(op, {"acc": "col", "acc_t": "row"}.get(self.of(op.operands[0]), "blocked"))
        elif name == "kda.embed_row":
            self.set(op, "blocked")
        elif name == "kda.transpose":
            x = self.of(op.operands[0])
            if x not in SHARED:
                x = self.require(op, 0, ("smem",))
            self.set(op, "smem_t" if x == "smem" else "smem")
        elif name == "kda.pipeline_wait":
            x = op.operands[0]
            if x in self.origin:
                self.origin[op.results[0]] = self.origin[x]
            self.set(op, self.of(x))
        elif name in LOADS:
            self.set(op, self.loaded(op))
        elif name in STORES:
            pass                        # a store stages its tile from whatever layout it is in
        elif name in SOURCES:
            self.set(op, "any")
        elif name == "kda.workspace":
            if not self.dry and op.results[0] in self.workspaces:
                op.attributes[LAYOUT_ATTR] = ir.StringAttr.get(self.workspaces[op.results[0]])
        elif name == "gpu.yield":
            parent = op.parent
            if parent.name == "kda.scan":
                chunk = parent.regions[0].blocks[0].arguments[0]
                for i, want in enumerate(self.carried.get(chunk, ())):
                    self.require(op, i, (want,))
        elif op.results and all(_is_tile(r) for r in op.results):
            self.set(op, self.elementwise(op))          # element-wise, select, convert, ...

    # -- rules -----------------------------------------------------------------------------
    def scan(self, op) -> None:
        body = op.regions[0].blocks[0]
        carried_args = list(body.arguments)[1:]
        serial = not bool(_attr(op, "parallel", False))
        kernel = "kda.kernel" in op.attributes
        # try the carried values in each accumulator orientation, and element-wise chains read
        # from shared memory into the fragments of a product downstream or not; keep the
        # cheapest (dry runs of the body)
        carried = ("acc", "acc_t") if serial and any(_rank(a) >= 2 for a in carried_args) \
            else ("acc",)
        options = [(c, h) for c in carried for h in (False, True)]
        costs = []
        for c, h in options:
            sub = self.fork()
            sub.hints = h
            sub.run_scan(op, c)
            costs.append((sub.cost.bytes, sub.cost.init_bytes))
        choice, hints = options[costs.index(min(costs))]
        outer, self.cost = self.cost, _Cost()
        outer_hints, self.hints = self.hints, hints
        self.run_scan(op, choice)
        self.hints = outer_hints
        if kernel and not self.dry:
            c = self.cost
            fields = {"conversions": c.conversions, "conversion_bytes": c.bytes,
                      "init_conversions": c.init_conversions, "init_bytes": c.init_bytes}
            fields.update(self.peak_live(op))
            op.attributes[COST_ATTR] = ir.DictAttr.get({k: _i64(v) for k, v in fields.items()})
        for f in ("conversions", "bytes", "init_conversions", "init_bytes"):
            setattr(outer, f, getattr(outer, f) + getattr(self.cost, f))
        self.cost = outer

    def run_scan(self, op, matrix_layout: str) -> None:
        body = op.regions[0].blocks[0]
        carried = []
        for i, a in enumerate(list(body.arguments)[1:]):
            want = matrix_layout if _rank(a) >= 2 else (
                "replicated" if _rank(a) == 0 else "blocked")
            carried.append(want)
            self.layout[a] = want
            self.layout[op.results[i]] = want
            self.require(op, i, (want,), init=True)
        self.carried[body.arguments[0]] = carried
        if not self.dry:
            op.attributes[CARRIED_ATTR] = ir.ArrayAttr.get([ir.StringAttr.get(c) for c in carried])
        self.block(body)

    def peak_live(self, scan) -> dict:
        """The most bytes of tiles live at once in the kernel's body, in registers
        (``register_bytes``; per consumer thread as 4-byte registers, ``registers_per_thread``,
        where kda-warp-specialize planned the consumers) and in shared memory
        (``shared_bytes``; TMA boxes included): what a register-tile lowering must hold."""
        body = scan.regions[0].blocks[0]
        ops = [o.operation for o in body.operations]
        position = {o: i for i, o in enumerate(ops)}
        end = len(ops)
        intervals = []
        values = [(a, -1) for a in list(body.arguments)[1:]]       # carried: the whole step
        values += [(r, position[o]) for o in ops for r in o.results]
        for v, start in values:
            if not _is_tile(v) or self.layout.get(v) in (None, "any", "replicated"):
                continue
            last = start
            for use in v.uses:
                user = use.owner
                user = user.operation if hasattr(user, "operation") else user
                while user is not None and user not in position:
                    user = user.parent if user.name != "func.func" else None
                if user is not None:
                    last = max(last, position[user])
            if start < 0:
                last = end
            intervals.append((start, last, self.layout[v] in SHARED, tile_bytes(v.type)))
        peak = {False: 0, True: 0}
        for p in range(-1, end + 1):
            for shared in (False, True):
                live = sum(b for s0, s1, sh, b in intervals if sh == shared and s0 <= p <= s1)
                peak[shared] = max(peak[shared], live)
        out = {"register_bytes": peak[False], "shared_bytes": peak[True]}
        pipeline = _attr(scan, "kda.pipeline")
        if isinstance(pipeline, dict) and pipeline.get("consumer_warpgroups"):
            threads = 128 * int(pipeline["consumer_warpgroups"])
            out["registers_per_thread"] = -(-peak[False] // (4 * threads))
        return out

    def a_role(self, transposed: bool) -> tuple:
        """Layouts a product takes an operand in as its A (``transposed``: the operand's
        transpose is A): an accumulator of it in place, or a shared tile with the contraction
        dimension contiguous."""
        return ("acc", "smem") if not transposed else ("acc_t", "smem_t")

    def b_role(self, op, transposed: bool) -> tuple:
        """Layouts a product takes an operand in as its B: registers (mma_sync) or a shared tile
        (wgmma) with the contraction dimension contiguous where the precision needs it."""
        if self.atom == "mma_sync":
            return ("opb",)
        k_major = str(_attr(op, "kda.precision", "") or "") in K_MAJOR_PRECISIONS
        if transposed:                 # B = tᵀ, t [N, K]: K contiguous as stored
            return ("smem",) if k_major else ("smem", "smem_t")
        return ("smem_t",) if k_major else ("smem_t", "smem")

    def price(self, v, dst: str) -> int:
        """`conversion_bytes` of ``v`` into ``dst``; a tile a TMA load brought from a
        workspace is free to land transposed (its writer stores it so, in the real run)."""
        have = self.of(v)
        if (have, dst) == ("smem", "smem_t") and v in self.origin and self.dry:
            return 0
        return conversion_bytes(have, dst, tile_bytes(v.type))

    def consumer_hint(self, result) -> str | None:
        """The accumulator layout the first element-wise consumer of ``result`` already has
        on another operand (where two orientations cost the same, the one that matches it)."""
        for use in result.uses:
            user = use.owner
            user = user.operation if hasattr(user, "operation") else user
            for other in user.operands:
                if other != result and _is_tile(other) and self.layout.get(other) in ACCUMULATORS:
                    return self.layout[other]
        return None

    def fragment_hint(self, value, depth: int = 3) -> str | None:
        """The accumulator layout in which a ``kda.dot`` reached from ``value`` through at most
        ``depth`` element-wise ops would take it as its register A operand (lhs: ``acc``, or
        ``acc_t`` when the product reads it transposed; rhs: as the A of the transposed
        product)."""
        for use in value.uses:
            user = use.owner
            user = user.operation if hasattr(user, "operation") else user
            if user.name == "kda.dot":
                transposed = bool(_attr(user, "transpose_lhs" if use.operand_number == 0
                                        else "transpose_rhs", False))
                if use.operand_number == 0:
                    return "acc_t" if transposed else "acc"
                return "acc" if transposed else "acc_t"
            if depth > 1 and user.name in ELEMENTWISE_CHAIN and user.results:
                hint = self.fragment_hint(user.results[0], depth - 1)
                if hint:
                    return hint
        return None

    def dot(self, op) -> str:
        tl, tr = bool(_attr(op, "transpose_lhs", False)), bool(_attr(op, "transpose_rhs", False))
        lhs, rhs = op.operands[0], op.operands[1]
        # C = op(lhs)·op(rhs), or Cᵀ = op(rhs)ᵀ·op(lhs)ᵀ
        plans = {"acc": ((0, self.a_role(tl)), (1, self.b_role(op, tr))),
                 "acc_t": ((1, self.a_role(not tr)), (0, self.b_role(op, not tl)))}

        def price(plan):
            return sum(min(self.price((lhs, rhs)[i], c) for c in accepted)
                       for i, accepted in plan)

        hint = self.consumer_hint(op.results[0]) or "acc"
        result = min(plans, key=lambda r: (price(plans[r]), r != hint))
        for i, accepted in plans[result]:
            self.require(op, i, accepted)
        return result

    def reduced(self, op) -> str:
        x = self.of(op.operands[0])
        if _rank(op.results[0]) == 0:
            return "replicated"
        dims = tuple(_attr(op, "dims", ()))
        if x in ACCUMULATORS:
            rows = "row" if x == "acc" else "col"        # the value's rows in the fragment
            cols = "col" if x == "acc" else "row"
            return {(1,): rows, (0,): cols}.get(dims, "blocked")
        return x if x in ("row", "col") else "blocked"

    def broadcast(self, op) -> str:
        if _rank(op.results[0]) == 0:
            return "replicated"
        x = self.of(op.operands[0])
        dims = tuple(_attr(op, "dims", ()))
        if x in ("replicated", "any"):
            return "any"
        if _rank(op.results[0]) == 2 and _rank(op.operands[0]) == 1:
            # a vector along the value's rows (broadcast over dim 1) or its columns (dim 0)
            along_rows = dims == (1,)
            if x == "row":
                return "acc" if along_rows else "acc_t"
            if x == "col":
                return "acc_t" if along_rows else "acc"
        # any other vector: from shared memory, each thread reads the elements its consumer's
        # layout needs
        if x not in SHARED:
            self.require(op, 0, ("smem",))
        return "any"

    def loaded(self, op) -> str:
        if "kda.slot" not in op.attributes:
            return "blocked"
        src = op.operands[0]
        if op.name == "kda.load_chunk":
            self.origin[op.results[0]] = src
            return self.workspaces.get(src, "smem")
        return "smem"

    def elementwise(self, op) -> str:
        tiles = [v for v in op.operands if _is_tile(v)]
        if op.results and _rank(op.results[0]) == 0:
            return "replicated"
        if not tiles:                        # made from memory or indices alone
            return "blocked"
        have = [self.of(v) for v in tiles]
        candidates = [c for c in PREFERENCE if c in have and c in REGISTER]
        if not candidates and any(h in SHARED for h in have):
            # read from shared memory: into the fragments a product downstream takes in place,
            # if there is one (the same read as into a blocked layout, and no conversion later)
            candidates = [(self.hints and self.fragment_hint(op.results[0])) or "blocked"]
        if not candidates:
            return "any"                     # only free operands: free too
        best = min(candidates, key=lambda c: (sum(self.price(v, c) for v in tiles),
                                              PREFERENCE.index(c)))
        for i, v in enumerate(op.operands):
            if _is_tile(v):
                self.require(op, i, (best,))
        return best

    # -- bookkeeping ---------------------------------------------------------------------
    def of(self, v) -> str:
        if v not in self.layout:
            # defined where the pass did not look (a value of an op it skipped)
            self.layout[v] = "replicated" if _is_tile(v) and _rank(v) == 0 else "blocked"
        return self.layout[v]

    def set(self, op, layout: str) -> None:
        if op.results and _is_tile(op.results[0]) and _rank(op.results[0]) == 0:
            layout = "replicated"
        for r in op.results:
            if _is_tile(r):
                self.layout[r] = layout
        if op.results and not self.dry:
            op.attributes[LAYOUT_ATTR] = ir.StringAttr.get(layout)

    def note_request(self, v, accepted: tuple) -> None:
        """Record how a use needs a tile loaded from a workspace: in shared memory as stored,
        transposed, or either (uses that read it into registers do not care)."""
        if v not in self.origin or any(c in REGISTER for c in accepted):
            return
        shared = tuple(c for c in accepted if c in SHARED)
        self.requests[self.origin[v]].append(shared[0] if len(shared) == 1 else "either")

    def require(self, op, index: int, accepted: tuple, init: bool = False) -> str:
        """Operand ``index`` of ``op`` in one of the ``accepted`` layouts: a conversion before
        ``op`` (shared by later uses in the same block) where it is in none of them. Returns
        the layout the operand is in after."""
        v = op.operands[index]
        have = self.of(v)
        if have in accepted or have in ("any", "replicated"):
            self.note_request(v, accepted)
            return have
        want = min(accepted, key=lambda c: (self.price(v, c), accepted.index(c)))
        self.note_request(v, accepted)
        key = (v, want, op.parent)
        conv = self.converted.get(key)
        if conv is None:
            if init:
                self.cost.init_conversions += 1
                self.cost.init_bytes += self.price(v, want)
            else:
                self.cost.conversions += 1
                self.cost.bytes += self.price(v, want)
            if self.dry:
                self.converted[key] = v
                return want
            with ir.InsertionPoint(op):
                new = ir.Operation.create("kda.convert_layout", results=[v.type], operands=[v],
                                          attributes={"to": ir.StringAttr.get(want),
                                                      LAYOUT_ATTR: ir.StringAttr.get(want)})
            conv = self.converted[key] = new.results[0]
            self.layout[conv] = want
        if not self.dry:
            op.operands[index] = conv
        return want
