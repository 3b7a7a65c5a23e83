"""Kernel partitioning for the lowering of a kda program, and how the lowering treats each op
(sets derived from the dialect's effects and kinds).

Decided on the Python form of the program (program.py), before any code is emitted; the
storage of each kernel's tiles is planned next (storage.py).

**Kernels** (:func:`group_kernels`). A program's function body is cut at its *global* ops
   (``kda.sum_head_groups``, ``kda.sum_seqs``: they need every (sequence, head) to be done, so
   each becomes a small kernel of its own). Between them, the per-(sequence n, value head hv)
   work becomes one kernel per ``kda.scan`` (grid = one CTA per (n, hv)). Function-level ops
   are placed with the scan whose results they use (SSA); pure function-level ops with no such
   dependence (``load_head``, ``scalar``, ``load_state``...) are recomputed in every kernel that
   needs them; side-effecting ops that depend on no scan go with the latest scan before them.
   Scans are merged into one kernel only where a tile value flows from one scan to another
   (kernels exchange data through memory only). Memory dependences (a scan writing a workspace
   that a later scan reads) need no merging: kernels run in program order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kdagen.ir.dialect import ops_with

from .program import Node, Program, walk

__all__ = ["KernelGroup", "group_kernels", "GLOBAL_OPS", "MATRIX_OPS", "EXPR_OPS", "VIEW_OPS",
           "LoweringError"]


class LoweringError(ValueError):
    """A program the lowering cannot handle (the message says what and why)."""


# How the lowering materialises each op, from the dialect's effects and kinds
# (kdagen.ir.dialect.OPS):
GLOBAL_OPS = ops_with(effect="global")
# ops producing a buffer from operands read many times / in another thread mapping
MATRIX_OPS = ops_with(kind=("matrix", "solve", "reduction")) - GLOBAL_OPS
# views: a result element is one operand element at a remapped index (the declared range and
# the pipeline's wait are identities)
VIEW_OPS = ((ops_with(kind="shape") - {"kda.embed_row"}) | {"kda.assume_range"}
            | (ops_with(kind="pipeline") & {"kda.pipeline_wait"}) | ops_with(kind="layout"))
# pure element-wise / index-wise expressions (result element = f(operands at the same index,
# the index, kernel scalars, global memory))
EXPR_OPS = (ops_with(kind=("elementwise", "shape")) | ops_with(effect="read", kind="memory")
            | {"kda.valid_rows"}) - VIEW_OPS
# synchronisation markers of kda-warp-specialize: with a barrier after every op the lowering is
# already synchronised, so they emit nothing (pipeline_wait is an identity view)
NOOP_OPS = ops_with(kind="pipeline") - VIEW_OPS
STORE_OPS = ops_with(effect="write")
LOAD_OPS = ops_with(effect="read")
CHUNK_LOADS = ops_with(effect="read", kind="memory", operand="chunk")   # load, load_chunk
PURE_OPS = EXPR_OPS | VIEW_OPS | MATRIX_OPS | NOOP_OPS | ops_with(kind="source") \
    | ops_with(effect="alloc")
# consumers that read each element of an operand more than once (or at other indices while
# writing): their operands must be cheap to read (buffer, view of a buffer, constant)
MULTI_READ = ops_with(kind=("matrix", "solve")) | {"kda.broadcast", "kda.embed_row"}
SUPPORTED = (GLOBAL_OPS | PURE_OPS | STORE_OPS | {"kda.scan", "gpu.yield", "func.return"})


# ------------------------------------------------------------------------------------------
# 1. kernels
# ------------------------------------------------------------------------------------------


@dataclass
class KernelGroup:
    kind: str                      # "tile" (grid = (HV, N)) or "global"
    nodes: list                    # function-level nodes of the kernel, program order
    scans: list = field(default_factory=list)
    index: int = 0

    @property
    def label(self) -> str:
        if self.kind == "global":
            n = self.nodes[0]
            return f"{n.kind}_{n.attrs.get('name', '')}"
        return "scan" + "_".join(str(i) for i in self.scan_ids) if self.scans else "tile"

    scan_ids: list = field(default_factory=list)
    parallel: bool = False         # one CTA per chunk (grid z): a single scan without
                                   # carried values and no function-level side effects


def _captured(scan: Node) -> list:
    """Values used inside a scan body but defined outside it."""
    inside = set()
    for n in walk(scan.body):
        for r in n.results:
            inside.add(r)
    for a in scan.body.args:
        inside.add(a)
    out = []
    for n in walk(scan.body):
        for o in n.operands:
            if o not in inside and o.kind in ("tile",):
                out.append(o)
    return out


def group_kernels(program: Program, split_scans: bool = True) -> list[KernelGroup]:
    """Cut the program into kernels (see the module doc)."""
    for n in program.nodes:
        if n.op not in SUPPORTED:
            raise LoweringError(f"{n.op}: no lowering for this op (supported: "
                                f"{', '.join(sorted(o[4:] for o in SUPPORTED if o.startswith('kda.')))})")
    groups: list[KernelGroup] = []
    segment: list[Node] = []

    def flush():
        if segment:
            groups.extend(_split_segment(list(segment), split_scans))
            segment.clear()

    for n in program.body.nodes:
        if n.op in GLOBAL_OPS:
            flush()
            groups.append(KernelGroup("global", [n]))
        elif n.op == "func.return":
            continue
        else:
            segment.append(n)
    flush()
    # drop tile kernels that do nothing observable (only pure ops, no stores)
    out = []
    for g in groups:
        if g.kind == "tile" and not g.scans and not any(
                n.op in STORE_OPS for n in g.nodes):
            continue
        g.index = len(out)
        if (g.kind == "tile" and len(g.scans) == 1 and not g.scans[0].operands
                and all(n.op in PURE_OPS for n in g.nodes if n.op != "kda.scan")):
            g.parallel = True
        out.append(g)
    return out


def _split_segment(nodes: list[Node], split_scans: bool) -> list[KernelGroup]:
    scans = [n for n in nodes if n.op == "kda.scan"]
    if not scans:
        return [KernelGroup("tile", nodes)]
    sid = {s: i for i, s in enumerate(scans)}
    # SSA anchors: the scans whose tile results (transitively, through function-level ops)
    # a function-level node uses
    anchor: dict = {}
    for n in nodes:
        a = set()
        ins = list(n.operands) + (_captured(n) if n.op == "kda.scan" else [])
        for o in ins:
            if o.owner is not None and o.owner in anchor:
                a |= anchor[o.owner]
        if n.op == "kda.scan":
            a = a | {sid[n]}
        anchor[n] = a
    # union scans that must share a kernel: contiguous ranges
    parent = list(range(len(scans)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union_range(ids):
        if not ids:
            return
        lo, hi = min(ids), max(ids)
        for i in range(lo, hi + 1):
            parent[find(i)] = find(lo)

    if not split_scans:
        union_range(range(len(scans)))
    for n in nodes:
        if len(anchor[n]) > 1:
            union_range(anchor[n])
    # ranges may have grown: make the partition into contiguous classes
    changed = True
    while changed:
        changed = False
        for i in range(len(scans) - 1):
            ri = [j for j in range(len(scans)) if find(j) == find(i)]
            lo, hi = min(ri), max(ri)
            for j in range(lo, hi + 1):
                if find(j) != find(lo):
                    parent[find(j)] = find(lo)
                    changed = True
    classes: list[list[int]] = []
    for i in range(len(scans)):
        if not classes or find(i) != find(classes[-1][0]):
            classes.append([i])
        else:
            classes[-1].append(i)
    kid = {i: k for k, cl in enumerate(classes) for i in cl}

    # placement
    placed: list[list[Node]] = [[] for _ in classes]
    last_scan_kernel = 0
    home: dict = {}
    for n in nodes:
        if n.op == "kda.scan":
            k = kid[sid[n]]
            home[n] = k
            last_scan_kernel = k
            placed[k].append(n)
        elif anchor[n]:
            k = kid[next(iter(anchor[n]))]
            home[n] = k
            if n.op not in PURE_OPS:
                placed[k].append(n)
        elif n.op not in PURE_OPS:
            k = last_scan_kernel
            if _chunk_parallel([scans[i] for i in classes[k]]):
                # a per-sequence node (e.g. a sum over chunks) must not serialise a
                # chunk-parallel kernel: it gets a per-sequence kernel of its own after it
                if len(placed) == len(classes):
                    placed.append([])
                k = len(classes)
            home[n] = k
            placed[k].append(n)
    # pure nodes: into every kernel that (transitively) needs them
    needed: list[set] = [set(p) for p in placed]
    for k in range(len(placed)):
        stack = list(needed[k])
        while stack:
            n = stack.pop()
            ins = list(n.operands) + (_captured(n) if n.op == "kda.scan" else [])
            for o in ins:
                d = o.owner
                if d is not None and d.block.parent is None and d not in needed[k]:
                    if d in home and home[d] != k and d.op not in PURE_OPS:
                        raise LoweringError(f"{d.op} is needed by kernels {home[d]} and {k}")
                    needed[k].add(d)
                    stack.append(d)
    out = []
    for k, cl in enumerate(classes):
        ns = [n for n in nodes if n in needed[k]]
        g = KernelGroup("tile", ns, [scans[i] for i in cl])
        g.scan_ids = list(cl)
        out.append(g)
    if len(placed) > len(classes):
        g = KernelGroup("tile", [n for n in nodes if n in needed[len(classes)]], [])
        g.scan_ids = []
        out.append(g)
    return out


def _chunk_parallel(scans: list) -> bool:
    """A kernel of one scan with no carried values (one CTA per chunk when nothing else in it
    is per sequence)."""
    return len(scans) == 1 and not scans[0].operands
