"""``kda-warp-specialize``: producer/consumer warp roles and the ring-buffer pipeline per kernel.

For every kernel scan (``kda.kernel``), this pass decides, as annotated IR that codegen lowers:

* **roles** — bulk loads of chunk tiles (``kda.load`` of token tensors, ``kda.load_chunk`` of
  workspaces) belong to one *producer* warpgroup, which issues them as TMA copies into a ring of
  shared-memory buffers ``depth`` chunks deep; every other op belongs to the *consumer*
  warpgroups (``kda.role``). Per-head and per-sequence loads stay with the consumers (once per
  CTA, not per chunk);
* **synchronisation** — each consumer use of a loaded tile goes through
  ``kda.pipeline_wait`` (the slot's 'full' barrier), and after its last use
  ``kda.pipeline_release`` (the slot's 'empty' barrier), so the producer can run ``depth``
  chunks ahead;
* **resources** — ring depth is the option's, reduced until the ring of whole-chunk stages fits
  the shared-memory budget (the module's target's, ``kda.target``, unless given as an option); when not even one chunk's
  tiles fit (the backward's state kernels), the ring becomes one of equal tile-sized slots
  filled in consumer order (``mode = "tile"``); register split per role (``setmaxnreg``).

The ops added are identities for the interpreter, so semantics are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .._mlir import ir
from ..ir.accessors import module_target
from ..ir.transforms import walk
from .base import ModulePass, PassError, register_pass
from .partition import CHUNK_LOADS, tile_bytes

# the loads of a chunk's tiles (load, load_chunk): what the producer streams per chunk
PRODUCER_OPS = CHUNK_LOADS


def _i64(v: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))


@register_pass
@dataclass
class WarpSpecializePass(ModulePass):
    name = "kda-warp-specialize"
    summary = "assign producer/consumer warp roles and insert the ring-buffer pipeline"
    depth: int = 2                       # chunks the producer may run ahead
    # None: the module's target's (kda.target), else the generic values of GENERIC
    consumer_warpgroups: int | None = None
    smem_budget: int | None = None       # bytes of shared memory per CTA
    reserved_smem: int | None = None     # for the consumers' own tiles (state, matrices)
    producer_registers: int = 40
    consumer_registers: int = 232

    #: the budgets of a module without a target (a pass test's module)
    GENERIC = {"consumer_warpgroups": 2, "smem_budget": 227 * 1024, "reserved_smem": 64 * 1024}

    def run(self, module: ir.Module) -> None:
        resolved = self.for_target(module)
        if resolved.depth < 1 or resolved.consumer_warpgroups < 1:
            raise PassError("kda-warp-specialize: depth and consumer_warpgroups must be >= 1")
        with module.context, ir.Location.unknown():
            for scan in _kernel_scans(module):
                resolved._specialize(scan)

    def for_target(self, module) -> "WarpSpecializePass":
        """This pass with every unset budget taken from the module's target."""
        target = module_target(module)
        budgets = dict(self.GENERIC) if target is None else {
            "consumer_warpgroups": target.consumer_warpgroups,
            "smem_budget": target.smem_per_block, "reserved_smem": target.reserved_smem}
        return replace(self, **{k: v for k, v in budgets.items() if getattr(self, k) is None})

    def _specialize(self, scan) -> None:
        block = scan.regions[0].blocks[0]
        ops = [op.operation for op in block.operations]
        loads = [op for op in ops if op.name in PRODUCER_OPS]
        sizes = [tile_bytes(op.results[0].type) for op in loads]
        stage_bytes, available = sum(sizes), self.smem_budget - self.reserved_smem
        kernel = ir.StringAttr(scan.attributes["kda.kernel"]).value
        depth = self.depth
        while depth > 1 and depth * stage_bytes > available:
            depth -= 1
        if stage_bytes <= available:
            # whole-chunk stages: slot i of stage s holds load i of chunk c ≡ s (mod depth)
            mode, slots, slot_bytes = "chunk", len(loads), stage_bytes
        else:
            # a chunk's tiles do not fit at once: a ring of equal slots, each as large as the
            # largest tile, filled in consumer order
            slot_bytes = max(sizes, default=0)
            slots = min(self.depth * len(loads), available // max(slot_bytes, 1))
            if slots < 1:
                raise PassError(
                    f"kda-warp-specialize: kernel {kernel} has a {slot_bytes}-byte tile but only "
                    f"{available} of the {self.smem_budget}-byte budget are left after "
                    f"{self.reserved_smem} reserved: not even one ring slot fits; lower "
                    "reserved_smem or use a smaller chunk")
            mode, depth, stage_bytes = "tile", 0, slot_bytes
        for index, load in enumerate(loads):
            slot = index if mode == "chunk" else index % slots
            load.attributes["kda.role"] = ir.StringAttr.get("producer")
            load.attributes["kda.slot"] = _i64(slot)
            self._guard_uses(load, slot, ops)
        for op in ops:
            if op.name.startswith("kda.") and "kda.role" not in op.attributes:
                op.attributes["kda.role"] = ir.StringAttr.get("consumer")
        scan.attributes["kda.pipeline"] = ir.DictAttr.get({
            "mode": ir.StringAttr.get(mode),
            "depth": _i64(depth),
            "slots": _i64(slots),
            "stage_bytes": _i64(stage_bytes),
            "ring_bytes": _i64(max(depth, 1) * stage_bytes if mode == "chunk" else slots * slot_bytes),
            "producer_warpgroups": _i64(1),
            "consumer_warpgroups": _i64(self.consumer_warpgroups),
            "producer_registers": _i64(self.producer_registers),
            "consumer_registers": _i64(self.consumer_registers),
        })

    @staticmethod
    def _guard_uses(load, slot: int, ops: list) -> None:
        value = load.results[0]
        users = [u.owner for u in value.uses]
        if not users:
            return
        def position(u):
            # By identity, not a dict: an operation's hash changes when its operands are
            # rewritten below, so a dict lookup would miss and the release land too early.
            u = u.operation if hasattr(u, "operation") else u
            return next((i for i, op in enumerate(ops) if op == u), 0)

        first = min(users, key=position)
        first = first.operation if hasattr(first, "operation") else first
        wait = ir.Operation.create("kda.pipeline_wait", results=[value.type], operands=[value],
                                   attributes={"slot": _i64(slot),
                                               "kda.role": ir.StringAttr.get("consumer")},
                                   loc=load.location, ip=ir.InsertionPoint(first))
        for user in users:
            user = user.operation if hasattr(user, "operation") else user
            if user != wait:
                for i, operand in enumerate(user.operands):
                    if operand == value:
                        user.operands[i] = wait.results[0]
        last = max((u.owner for u in wait.results[0].uses), key=position)
        last = last.operation if hasattr(last, "operation") else last
        if last.name == "gpu.yield":
            raise PassError("kda-warp-specialize: a loaded tile is carried across chunks")
        ir.Operation.create("kda.pipeline_release", results=[], operands=[wait.results[0]],
                            attributes={"slot": _i64(slot),
                                        "kda.role": ir.StringAttr.get("consumer")},
                            ip=ir.InsertionPoint.after(last))


def _kernel_scans(module: ir.Module) -> list:
    out = [op for op in walk(module) if op.name == "kda.scan" and "kda.kernel" in op.attributes]
    if not out:
        raise PassError("kda-warp-specialize: no kernel scans; run kda-partition first")
    return out
