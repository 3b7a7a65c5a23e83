"""Memory-aware order of a chunk-parallel kernel's chunk step (the scan body).

The IR comes out of autodiff and the passes in an order that computes a step's matrix
products first and consumes them much later (the backward's dk kernel held 12 [64, 128] fp32
tiles at once, 336 KB of them in the global scratch). Any topological order of the body is
the same computation, so before the storage plan packs the tile buffers the body is
re-ordered by a greedy list schedule that, among the nodes whose operands are ready, runs

1. nodes that materialise nothing (views, lazy expressions, markers): they cost no storage
   and are evaluated inside their consumers anyway;
2. then the node that frees the most buffer bytes net of what it allocates (a store or an
   element-wise consumer reading the last use of a product), ties in program order.

It keeps what the order must keep: operands before users, loads and stores of one memref in
their order where either is a store, a pipeline release after every other user of the
released value, the terminator last. Each node still computes the same values from the same
operands in the same arithmetic, so results are bitwise those of the program order.
"""
from __future__ import annotations

from .plan import LOAD_OPS, NOOP_OPS, STORE_OPS
from .program import Block, Node, Value
from .storage import expression_reads

__all__ = ["schedule_for_memory", "list_schedule"]


def schedule_for_memory(body: Block, buffers: dict) -> bool:
    """Re-order ``body.nodes`` in place (see the module doc). ``buffers``: the values that
    the storage plan materialises (``StoragePlan.buffers``). Returns whether the order
    changed."""
    nodes = [n for n in body.nodes if n.op != "gpu.yield"]
    tail = [n for n in body.nodes if n.op == "gpu.yield"]
    if any(n.body is not None for n in nodes):
        return False                    # nested regions: keep the program order
    reads = {n: _buffers_read(n, buffers) for n in nodes}
    materialises = {n: n.op in STORE_OPS or any(r in buffers for r in n.results) for n in nodes}
    readers_left: dict = {}
    for n in nodes:
        if materialises[n]:
            for v in reads[n]:
                readers_left[v] = readers_left.get(v, 0) + 1
    position = {n: i for i, n in enumerate(nodes)}

    def priority(n: Node):
        if not materialises[n]:
            return (1, 0, -position[n])
        freed = sum(_nbytes(v) for v in reads[n] if readers_left[v] == 1)
        allocated = sum(_nbytes(r) for r in n.results if r in buffers)
        return (0, freed - allocated, -position[n])

    def taken(n: Node):
        if materialises[n]:
            for v in reads[n]:
                readers_left[v] -= 1

    order = list_schedule(nodes, lambda ready: max(ready, key=priority), taken)
    changed = order != nodes
    body.nodes[:] = order + tail
    return changed


def list_schedule(nodes: list, choose, taken=None) -> list:
    """A list schedule of ``nodes`` (one block's, no terminator) under `_dependencies`: each
    step runs ``choose(ready)`` of the nodes whose predecessors have all run, then calls
    ``taken(node)``. Returns the order."""
    preds = _dependencies(nodes)
    users = {n: [] for n in nodes}
    for n, ps in preds.items():
        for p in ps:
            users[p].append(n)
    waiting = {n: len(preds[n]) for n in nodes}
    ready = [n for n in nodes if waiting[n] == 0]
    order = []
    while ready:
        n = choose(ready)
        ready.remove(n)
        order.append(n)
        if taken is not None:
            taken(n)
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(order) != len(nodes):        # pragma: no cover - a cycle would be a bug
        raise AssertionError("list_schedule: the dependencies have a cycle")
    return order


def _dependencies(nodes: list) -> dict:
    """{node: nodes of the block that must run before it}."""
    inside = set(nodes)
    preds = {n: set() for n in nodes}
    accesses: dict = {}
    for n in nodes:
        for o in n.operands:
            if o.owner in inside:
                preds[n].add(o.owner)
        if n.op in STORE_OPS or n.op in LOAD_OPS:
            ref = n.operands[0]
            for m in accesses.get(ref, ()):
                if n.op in STORE_OPS or m.op in STORE_OPS:
                    preds[n].add(m)
            accesses.setdefault(ref, []).append(n)
    for n in nodes:
        if n.op == "kda.pipeline_release":
            preds[n] |= {u for u, _ in n.operands[0].uses if u in inside and u is not n}
    return preds


def _buffers_read(n: Node, buffers: dict) -> set:
    """The buffered values that evaluating n reads (through lazy expressions and views)."""
    if n.op in NOOP_OPS:
        return set()
    return expression_reads(n.operands, buffers)[0]


def _nbytes(v: Value) -> int:
    return 4 * v.numel
