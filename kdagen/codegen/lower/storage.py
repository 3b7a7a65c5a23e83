"""Storage planning for one kernel of a kda program (after plan.py cut the program into
kernels): :func:`plan_storage` gives every tile value a *mode*:

- ``const`` / ``param``: a constant or a kernel scalar, read where used;
- ``view``: a re-indexing of another value (broadcast, transpose, extract_row,
  assume_range, a widening convert) — no storage;
- ``lazy``: an elementwise/index-wise expression (arith, gate math, select, tril, loads
  from global memory...) evaluated inside the loop of its single consumer — no storage;
- ``buffer``: materialised into a per-CTA fp32 buffer (results of matrix ops, cumsum,
  reductions, and expressions that are read more than once, read by a matrix op, read
  across a scan boundary, ...);
- ``carried``: the buffer of a scan's carried value (block argument and result alias it).

Buffers get byte offsets in one per-CTA scratch region by first-fit over live intervals
(positions = program order; a value read inside a loop it was not defined in stays live
until that loop ends). All tile storage is fp32 (i1 masks as 0.0/1.0; a convert to
bf16/fp16 rounds and stays fp32), so buffer bytes = 4 * numel.
"""
from __future__ import annotations

from dataclasses import dataclass

from kdagen.ir.dialect import ops_with

from .plan import (EXPR_OPS, LOAD_OPS, MATRIX_OPS, MULTI_READ, NOOP_OPS, STORE_OPS, VIEW_OPS,
                   KernelGroup, LoweringError)
from .program import Block, Node, Program, Value, walk

__all__ = ["StoragePlan", "plan_storage", "remat_candidates", "expr_ops", "expression_reads",
           "buffer_strides", "buffer_elems", "GLOBAL_ALIGN"]


#: byte alignment of buffers in the global scratch (whole 128-byte lines; the per-CTA
#: scratch size is a multiple of it too)
GLOBAL_ALIGN = 128
#: byte alignment of buffers in shared memory: 16, so the rows of a tile whose pitch is a
#: multiple of 4 elements take 16-byte vector accesses (a buffer packed after a scalar one
#: started 4 bytes off, and its element loops fell back to 4-byte accesses 16 bytes apart
#: across a warp: 4-way bank conflicts, the top excess wavefronts of the dk kernel on the H100)
SMEM_ALIGN = 16


@dataclass(eq=False)
class Buffer:
    value: Value                  # the value owning it (carried: the scan's i-th result)
    nbytes: int
    start: int = 0
    end: int = 0
    offset: int = -1              # byte offset in its pool
    space: str = "smem"           # pool: "smem" (shared memory) or "global" (scratch)
    density: float = 0.0          # estimated element reads per element per kernel run
    row_pad: int = 1              # elements padding each row in shared memory
    mma_read: bool = False        # a matrix product gathers fragments from it or stores them


@dataclass
class StoragePlan:
    modes: dict                   # Value -> mode
    buffers: dict                 # Value -> Buffer (materialised / carried values)
    carried: dict                 # (scan node, i) -> Buffer
    total_bytes: int              # bytes of all buffers packed in one pool (first fit)
    positions: dict               # Node -> position
    written_memrefs: set          # memref Values stored to inside the kernel
    yield_copy: dict              # (scan, i) -> "skip" | "copy"
    smem_bytes: int = 0           # after pack(): bytes of each pool
    global_bytes: int = 0
    single_read: frozenset = frozenset()   # plan_storage's argument

    def mode(self, v: Value) -> str:
        return self.modes.get(v, "none")

    def global_reads(self) -> float:
        """Bytes read from the global scratch per kernel run, estimated: each buffer there
        times its reads per element (:attr:`Buffer.density`)."""
        return sum(b.nbytes * b.density for b in self.unique_buffers() if b.space == "global")

    def unique_buffers(self) -> list:
        return list({id(b): b for b in self.buffers.values()}.values())

    def pack(self, storage: str, smem_capacity: int | None = None, align: int = 16) -> None:
        """Assign every buffer a pool and an offset. ``storage``: "smem" / "global" (one pool),
        "hybrid": the buffers read most per byte go to shared memory as long as
        ``smem_capacity`` allows (first fit over live intervals), the rest to the global
        scratch."""
        bufs = self.unique_buffers()
        if storage in ("smem", "global"):
            for b in bufs:
                b.space = storage
            total = _first_fit(bufs, align, GLOBAL_ALIGN if storage == "global" else SMEM_ALIGN)
            self.smem_bytes, self.global_bytes = (total, 0) if storage == "smem" else (0, total)
            return
        if storage != "hybrid":
            raise ValueError(f"storage must be smem, global or hybrid, not {storage!r}")
        placed = {"smem": [], "global": []}
        size = {"smem": 0, "global": 0}
        for b in sorted(bufs, key=lambda b: (-b.density, b.start, -b.nbytes)):
            for space in ("smem", "global"):
                cap = smem_capacity if space == "smem" else None
                off = _fit(b, placed[space], cap, GLOBAL_ALIGN if space == "global" else SMEM_ALIGN)
                if off is not None:
                    b.space, b.offset = space, off
                    placed[space].append(b)
                    size[space] = max(size[space], off + b.nbytes)
                    break
        self.smem_bytes, self.global_bytes = size["smem"], size["global"]


def _sums_a_product(v: Value, modes: dict) -> bool:
    """Whether ``v`` is a sum (add or sub) whose terms read a matrix product's result through
    element-wise expressions: materialised at once (``eager_sums``), the partial sum can take
    a term's buffer in place and the product dies there, instead of every term of a sum tree
    living until the tree's root is evaluated."""
    n = v.owner
    if n is None or n.op not in ("kda.add", "kda.sub"):
        return False
    return any(_reads_product(o, modes, SUM_TERM_DEPTH) for o in n.operands
               if o.kind == "tile")


#: element-wise ops between a sum and the product a term reads that :func:`_sums_a_product`
#: looks through (the backward's gate-gradient terms are scale(mul(operand, product)))
SUM_TERM_DEPTH = 4


def _reads_product(v: Value, modes: dict, depth: int) -> bool:
    n = v.owner
    if n is None:
        return False
    if n.op in MATRIX_OPS:
        return True
    if depth == 0 or modes.get(v) not in ("lazy", "view"):
        return False
    return any(_reads_product(o, modes, depth - 1) for o in n.operands if o.kind == "tile")


def _is_widening_convert(n: Node) -> bool:
    src, dst = n.operands[0].elt, n.results[0].elt
    return dst == "f32" and src in ("bf16", "f16", "f32")


#: ops whose lowering gathers operand fragments (8 rows x 4 columns per warp) from buffers and
#: stores its result's fragments (the same pattern)
FRAGMENT_READERS = frozenset({"kda.dot", "kda.decay_dot", "kda.decay_matmul", "kda.tril_inv"})


#: ops whose element at an index reads their operands at that same index only
IDENTITY_INDEX_OPS = ops_with(kind="elementwise") | {"kda.assume_range", "kda.pipeline_wait"}


def same_index_reads(v: Value, buffers: dict) -> set:
    """The buffers that materialising ``v`` reads only at the element it writes: reached from
    v through element-wise ops and identity views alone, and not also through an op that reads
    elsewhere (a broadcast, a transpose, ...)."""
    same, other = set(), set()
    stack = [o for o in v.owner.operands if o.kind == "tile"]
    seen = set()
    while stack:
        o = stack.pop()
        if o in seen:
            continue
        seen.add(o)
        if o in buffers:
            same.add(o)
        elif o.owner is not None and o.owner.op in IDENTITY_INDEX_OPS:
            stack.extend(x for x in o.owner.operands if x.kind == "tile")
        else:
            other |= expression_reads([o], buffers)[0]
    return {x for x in same - other if tuple(x.shape) == tuple(v.shape)}


def _share_in_place(knodes: list, buffers: dict, positions: dict) -> int:
    """Let an element-wise result share the buffer of an operand it reads last, at the same
    index: every thread reads its elements of that operand before it writes the same
    elements of the result (`tiles.foreach_batched`), so the two need one buffer, not two.
    The emitter's hazard check still puts a barrier before the write where an earlier op
    read the buffer since the last one. Returns how many results share."""
    shared = 0
    for n in knodes:
        if n.op not in EXPR_OPS or not n.results or n.results[0] not in buffers:
            continue
        r = n.results[0]
        own = buffers[r]
        if own.value is not r:
            continue
        pos = positions[n]
        fits = [x for x in same_index_reads(r, buffers)
                if buffers[x].end == pos and buffers[x].start < pos
                and buffers[x].value.carried is None and x.carried is None]
        if not fits:
            continue
        b = buffers[min(fits, key=lambda x: positions.get(x.owner, -1))]
        b.end = max(b.end, own.end)
        b.density += own.density
        b.mma_read |= own.mma_read
        for v, other in list(buffers.items()):
            if other is own:
                buffers[v] = b
        shared += 1
    return shared


#: ops that walk their operand down its columns (a thread per column segment, one element per
#: row), so its reads cannot be vector accesses
SCAN_READ = frozenset({"kda.cumsum"})


def _buffers_read(v: Value, modes: dict) -> int:
    """Distinct materialised values (products, reductions) that evaluating lazy ``v`` reads."""
    seen, found, stack = set(), set(), [v]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        m = modes.get(x)
        if x is not v and m == "buffer":
            found.add(x)
            continue
        if m in ("lazy", "view") or x is v:
            if x.owner is not None:
                stack.extend(o for o in x.owner.operands if o.kind == "tile")
    return len(found)


def plan_storage(program: Program, group: KernelGroup, align: int = 16,
                 ring_loads: frozenset = frozenset(), single_read: frozenset = frozenset(),
                 keep_lazy: frozenset = frozenset(), row_pad: int = 1,
                 pad_all: bool = False, in_place: bool = False, eager_sums: bool = False,
                 scan_operand_reads: int = 0) -> StoragePlan:
    """``ring_loads``: load nodes whose tiles a native path streams into a shared-memory ring
    (mode ``ring``: cheap to read, no buffer, valid for the chunk step that loaded them).
    ``single_read``: (node, operand index) pairs of matrix ops that read each element of that
    operand about once (a native path's wgmma products stage each operand into shared memory
    once): such an operand needs no buffer of its own. ``keep_lazy``: values to re-evaluate at
    each consumer instead of materialising (:func:`remat_candidates`: values whose buffers
    landed in the global scratch and are cheap to recompute); cross-block uses, reads of a
    workspace written in the kernel and yield hazards still get a buffer. ``in_place``: an
    element-wise result may take the buffer of an operand it reads last, at the same index
    (:func:`_share_in_place`)."""
    nodes = group.nodes
    # every node of the kernel (function level + scan bodies), program order
    knodes: list[Node] = []
    for n in nodes:
        knodes.append(n)
        if n.body is not None:
            knodes.extend(walk(n.body))
    in_kernel = set(knodes)
    written = set()
    for n in knodes:
        if n.op in STORE_OPS:
            written.add(n.operands[0])

    def consumers(v):
        return [(u, i) for (u, i) in v.uses if u in in_kernel and u.op not in NOOP_OPS]

    modes: dict = {}
    # pass 1: modes, in program order (a view's mode depends on its operand's)
    cheap: dict = {}
    for n in knodes:
        if n.op == "kda.scan":
            for a in n.body.args[1:]:
                modes[a] = "carried"
                cheap[a] = True
            for r in n.results:
                modes[r] = "carried"
                cheap[r] = True
            continue
        for r in n.results:
            if r.kind != "tile":
                continue
            if n in ring_loads:
                modes[r], cheap[r] = "ring", True
            elif n.op == "kda.constant":
                modes[r], cheap[r] = "const", True
            elif n.op in ("kda.scalar", "kda.slot_valid"):
                # one value per CTA (a scalar argument, the sequence's slot check): a register
                modes[r], cheap[r] = "param", True
            elif n.op in MATRIX_OPS:
                modes[r], cheap[r] = "buffer", True
            elif n.op in VIEW_OPS or (n.op == "kda.convert" and _is_widening_convert(n)):
                # pipeline_wait / assume_range / widening converts are identities
                modes[r] = "view"
                cheap[r] = cheap.get(n.operands[0], False)
            elif n.op in EXPR_OPS:
                modes[r], cheap[r] = "lazy", False
            else:
                raise LoweringError(f"{n.op}: unexpected tile result")
    # pass 2: materialise expressions that must be
    def reads_written(v: Value) -> bool:
        """Whether evaluating v where it is used loads a workspace this kernel writes."""
        if modes.get(v) not in ("lazy", "view") or v.owner is None:
            return False
        if v.owner.op in LOAD_OPS and v.owner.operands[0] in written:
            return True
        return any(reads_written(o) for o in v.owner.operands if o.kind == "tile")

    def needs_buffer(v: Value) -> bool:
        cons = consumers(v)
        users = {u for u, _ in cons}
        if not users:
            return False
        if eager_sums and _sums_a_product(v, modes):
            return True
        if len(users) > 1:
            if v not in keep_lazy:
                return True
            if any(u.block is not v.block or u.op in ("gpu.yield", "kda.scan") for u in users):
                return True
            return reads_written(v)
        (u,) = users
        if u.block is not v.block:
            return True
        if (scan_operand_reads and u.op in SCAN_READ and v not in keep_lazy
                and _buffers_read(v, modes) > scan_operand_reads):
            # materialised by one vector-wide element loop, so the scan reads one buffer
            # (LowerOptions.scan_operand_reads)
            return True
        if u.op in MULTI_READ and not all((u, i) in single_read for uu, i in cons if uu is u):
            if v not in keep_lazy or reads_written(v):
                return True
        if v.owner is not None and v.owner.op in LOAD_OPS and v.owner.operands[0] in written:
            return True
        if u.op == "gpu.yield":
            scan = u.block.parent
            return _yield_hazard(v, u.operands.index(v), scan, modes)
        if u.op == "kda.scan":
            return False
        return False

    # iterate to a fixed point: materialising v makes it cheap, which can make views cheap
    for _ in range(8):
        changed = False
        for n in knodes:
            for r in n.results:
                if r.kind != "tile":
                    continue
                m = modes.get(r)
                if m == "lazy" and needs_buffer(r):
                    modes[r] = "buffer"
                    changed = True
                elif (m == "view" and n.op != "kda.broadcast" and not _cheap(r, modes)
                      and needs_buffer(r)):
                    modes[r] = "buffer"
                    changed = True
        if not changed:
            break

    positions: dict = {}
    loop_end: dict = {}
    counter = [0]

    def number(block_nodes: list):
        for n in block_nodes:
            positions[n] = counter[0]
            counter[0] += 1
            if n.body is not None:
                number(n.body.nodes)
                loop_end[n] = counter[0]
                counter[0] += 1

    number(nodes)

    buffers: dict = {}
    carried: dict = {}
    for n in knodes:
        if n.op == "kda.scan":
            for i, r in enumerate(n.results):
                b = Buffer(r, _nbytes(r, align), positions[n], loop_end[n])
                carried[(n, i)] = b
                buffers[r] = b
                buffers[n.body.args[1 + i]] = b
            continue
        for r in n.results:
            if modes.get(r) == "buffer":
                buffers[r] = Buffer(r, _nbytes(r, align), positions[n], positions[n])

    def use_position(u: Node, v_block: Block) -> int:
        """Position until which a value defined in v_block must live for a use at node u."""
        pos = positions.get(u)
        if u.op == "gpu.yield":
            pos = loop_end[u.block.parent]
        b = u.block
        while b is not v_block and b.parent is not None:
            pos = max(pos, loop_end[b.parent])
            b = b.parent.block
        return pos

    for n in knodes:
        if n.op in NOOP_OPS:
            continue
        operands = list(n.operands)
        weight = 64.0 ** n.block.depth          # body ops run once per chunk
        for i, o in enumerate(operands):
            if o.kind != "tile":
                continue
            for b in {buffers[v] for v in expression_reads([o], buffers)[0]}:
                owner_block = b.value.block if b.value.carried is None else b.value.carried[0].block
                b.end = max(b.end, use_position(n, owner_block))
                b.density += weight * (1.0 if (n, i) in single_read else _read_factor(n, i))
                b.mma_read |= n.op in FRAGMENT_READERS
        if n.op in FRAGMENT_READERS and n.results and n.results[0] in buffers:
            buffers[n.results[0]].mma_read = True      # and stores its fragments there
        if n.op in ("kda.tril_inv", "kda.tril_solve") and n.results[0] in buffers:
            buffers[n.results[0]].density += weight * n.results[0].shape[0] / 2
    # scan results are views of the carried buffers: extend those by the results' uses
    yield_copy = {}
    for n in knodes:
        if n.op == "kda.scan":
            y = n.body.nodes[-1]
            for i, v in enumerate(y.operands):
                yield_copy[(n, i)] = "skip" if v is n.body.args[1 + i] else "copy"

    if in_place:
        _share_in_place(knodes, buffers, positions)
    # the padding that keeps fragment gathers conflict-free costs shared memory (and, padded
    # everywhere, it made the backward's dk kernel spill 8 bytes at its 96 registers): only the
    # buffers a product gathers from or stores to take it, unless ``pad_all``
    unique = list({id(b): b for b in buffers.values()}.values())
    for b in unique:
        b.row_pad = row_pad if b.mma_read or pad_all else 1
        b.nbytes = _nbytes(b.value, align, b.row_pad)
    total = _first_fit(unique, align)
    return StoragePlan(modes, buffers, carried, total, positions, written, yield_copy,
                       single_read=single_read)


def expression_reads(values, buffers) -> tuple[set, set]:
    """What evaluating ``values`` where they are used reads: the values among ``buffers`` that
    it reaches through element-wise expressions and views (lazy values are evaluated in their
    consumer), and the memrefs their loads read."""
    found, memrefs, seen = set(), set(), set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in buffers:
            found.add(v)
        elif v.kind == "memref":
            memrefs.add(v)
        elif v.kind == "tile" and v.owner is not None:
            stack.extend(v.owner.operands)
    return found, memrefs


# ops counted by :func:`expr_ops` (the rest count 1): multi-instruction special functions
_OP_WEIGHT = {"kda.exp2": 2, "kda.log2": 2, "kda.rsqrt": 2, "kda.div": 3, "kda.sigmoid": 4,
              "kda.softplus": 6}


def expr_ops(v: Value, modes: dict, own: bool = True) -> int:
    """Instructions (roughly) to evaluate v at one index from what is stored: views are free,
    buffers/ring/constants are leaves, a global load counts 1. ``own=False``: v itself is
    evaluated as its expression even if it has a buffer now."""
    m = modes.get(v)
    if own and m in ("const", "param", "buffer", "carried", "ring"):
        return 0
    n = v.owner
    if n is None or v.kind != "tile":
        return 0
    cost = 0 if (n.op in VIEW_OPS or (n.op == "kda.convert" and _is_widening_convert(n))) \
        else _OP_WEIGHT.get(n.op, 1)
    return cost + sum(expr_ops(o, modes) for o in n.operands if o.kind == "tile")


def remat_candidates(plan: StoragePlan, max_ops: int) -> frozenset:
    """Values whose buffers the last pack put in the global scratch and that are cheaper to
    re-evaluate at each consumer than to write and read back through L2: expressions of at
    most ``max_ops`` instructions (:func:`expr_ops`) from what stays stored, read element-wise
    by consumers in their own block (a consumer that reads each element many times — a
    contraction off the tensor-core staging, a broadcast — only re-reads loads and views)."""
    if max_ops <= 0:
        return frozenset()
    out = set()
    for v, b in plan.buffers.items():
        if b.space != "global" or plan.modes.get(v) != "buffer" or v.owner is None:
            continue
        n = v.owner
        if n.op in MATRIX_OPS or n.op in STORE_OPS:
            continue
        cost = expr_ops(v, plan.modes, own=False)
        if cost > max_ops:
            continue
        cons = [(u, i) for u, i in v.uses if u.op not in NOOP_OPS]
        if not cons or any(u.block is not v.block or u.op in ("gpu.yield", "kda.scan")
                           for u, _ in cons):
            continue
        if cost > 1 and any(u.op in MULTI_READ and (u, i) not in plan.single_read
                            for u, i in cons):
            continue
        out.add(v)
    return frozenset(out)


def _read_factor(n: Node, i: int) -> float:
    """How many times a matrix op reads each element of operand i (1 for element-wise use)."""
    op = n.op
    out = n.results[0].shape if n.results else ()
    if op == "kda.dot":
        return float(out[1] if i == 0 else out[0])
    if op == "kda.decay_dot":
        return float(out[1] if i in (0, 2) else out[0])
    if op == "kda.decay_matmul":
        return float(out[1] if i == 0 else out[0])
    if op in ("kda.tril_inv",):
        return n.operands[0].shape[0] / 2
    if op == "kda.tril_solve":
        return float(n.operands[1].numel // n.operands[1].shape[0]) if i == 0 else 1.0
    return 1.0


def _cheap(v: Value, modes: dict) -> bool:
    m = modes.get(v)
    if m in ("const", "param", "buffer", "carried", "ring"):
        return True
    if m == "view":
        return _cheap(v.owner.operands[0], modes)
    return False


def _yield_hazard(v: Value, i: int, scan: Node, modes: dict) -> bool:
    """Whether evaluating v in place into carried buffer i of ``scan`` could read an element
    of a carried buffer that this or another yield copy has already overwritten."""
    dest = scan.body.args[1 + i]
    carried_args = set(scan.body.args[1:])

    def visit(x: Value, identity: bool) -> bool:
        if x in carried_args:
            return not (x is dest and identity)
        if x.owner is None or x.kind != "tile":
            return False
        m = modes.get(x)
        if m in ("buffer", "const", "param", "ring"):
            return False
        op = x.owner.op
        if op in VIEW_OPS and op not in ("kda.assume_range", "kda.pipeline_wait"):
            return any(visit(o, False) for o in x.owner.operands if o.kind == "tile")
        if op in ("kda.embed_row",):
            return any(visit(o, False) for o in x.owner.operands if o.kind == "tile")
        return any(visit(o, identity) for o in x.owner.operands if o.kind == "tile")

    return visit(v, True)


def buffer_strides(shape: tuple, space: str = "smem", row_pad: int = 1) -> tuple:
    """Element strides of a buffer of ``shape``: row-major; in shared memory the rows of 2-D+
    tiles are padded by ``row_pad`` elements (default one: an odd pitch, so column-wise reads
    by a warp hit 32 different banks; four puts an mma fragment's 8 rows x 4 columns on 32
    different banks), in the global scratch they are not (a warp's 32 consecutive floats of a
    row then fill 4 whole 32-byte sectors instead of straddling 5)."""
    if not shape:
        return ()
    strides = [1]
    acc = shape[-1] + (row_pad if len(shape) >= 2 and space == "smem" else 0)
    for d in reversed(shape[:-1]):
        strides.insert(0, acc)
        acc *= d
    return tuple(strides)


def buffer_elems(shape: tuple, row_pad: int = 1) -> int:
    if not shape:
        return 1
    return shape[0] * buffer_strides(shape, "smem", row_pad)[0]


def _nbytes(v: Value, align: int, row_pad: int = 1) -> int:
    n = 4 * buffer_elems(v.shape, row_pad)
    return -(-n // align) * align


def _fit(b, placed: list, capacity: int | None, offset_align: int = 1):
    """First-fit offset (a multiple of ``offset_align``) for b among the placed buffers that
    are live at the same time, or None when it would end past ``capacity``."""
    live = sorted((p for p in placed if not (p.end < b.start or p.start > b.end)),
                  key=lambda p: p.offset)
    off = 0
    for p in live:
        if off + b.nbytes <= p.offset:
            break
        off = -(-max(off, p.offset + p.nbytes) // offset_align) * offset_align
    if capacity is not None and off + b.nbytes > capacity:
        return None
    return off


def _first_fit(bufs: list, align: int, offset_align: int = 1) -> int:
    bufs = sorted(bufs, key=lambda b: (b.start, -b.nbytes))
    placed: list = []
    total = 0
    for b in bufs:
        b.offset = _fit(b, placed, None, offset_align)
        placed.append(b)
        total = max(total, b.offset + b.nbytes)
    return total
