"""Small cleanups on kda IR used by the program builder and the autodiff: CSE and DCE."""
from __future__ import annotations

from kdagen._mlir import ir

from .dialect import ops_with

__all__ = ["attr_key", "cse", "dce", "defining_op", "walk", "PURE_TILE_OPS", "SIDE_EFFECT_OPS"]

# ops that compute a tile from their operands and attributes only (no memory access)
PURE_TILE_OPS = ops_with(effect="pure")

# ops kept whether or not their results are used
SIDE_EFFECT_OPS = ops_with(effect=("write", "global", "sync")) | {"func.return", "gpu.yield"}


def _ops(block):
    return [op.operation for op in block.operations]


def defining_op(value):
    """The op that defines ``value`` (as an ``ir.Operation``), None for a block argument."""
    if isinstance(value, ir.BlockArgument):
        return None
    owner = value.owner
    return owner.operation if hasattr(owner, "operation") else owner


def walk(root) -> list:
    """Every op nested in ``root`` (a module or op), pre-order, as a list (safe to rewrite
    while iterating over it)."""
    root = root.operation if hasattr(root, "operation") else root
    out = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in _ops(block):
                    out.append(inner)
                    visit(inner)

    visit(root)
    return out


def attr_key(op) -> tuple:
    """An op's attributes as a sorted, hashable tuple of (name, printed value)."""
    names = [na.name if hasattr(na, "name") else na for na in op.attributes]
    return tuple(sorted((n, str(op.attributes[n])) for n in names))


def cse(root) -> int:
    """Merge identical pure tile ops (same name, operands, attributes, result types); an op in a
    region may reuse an equal op of an enclosing block. Returns the number of ops erased."""
    root = root.operation if hasattr(root, "operation") else root
    erased = 0

    def block_cse(block, scope):
        nonlocal erased
        local = dict(scope)
        for op in _ops(block):
            for region in op.regions:
                for b in region.blocks:
                    block_cse(b, local)
            if op.name not in PURE_TILE_OPS or len(op.regions):
                continue
            key = (op.name, tuple(op.operands), attr_key(op), tuple(str(r.type) for r in op.results))
            hit = local.get(key)
            if hit is None:
                local[key] = list(op.results)
                continue
            for old, new in zip(op.results, hit):
                old.replace_all_uses_with(new)
            op.erase()
            erased += 1

    for region in root.regions:
        for b in region.blocks:
            block_cse(b, {})
    return erased


def _has_effects(op) -> bool:
    if op.name in SIDE_EFFECT_OPS:
        return True
    if not op.name.startswith("kda."):
        return True  # unknown dialects: keep
    for r in op.regions:
        for b in r.blocks:
            if any(_has_effects(o) for o in _ops(b)):
                return True
    return False


def dce(root) -> int:
    """Erase side-effect-free ops whose results are unused (recursively); returns the count."""
    root = root.operation if hasattr(root, "operation") else root
    erased = 0

    def block_dce(block):
        nonlocal erased
        changed = True
        while changed:
            changed = False
            for op in reversed(_ops(block)):
                for r in op.regions:
                    for b in r.blocks:
                        block_dce(b)
                if _has_effects(op):
                    continue
                if all(next(iter(res.uses), None) is None for res in op.results):
                    op.erase()
                    erased += 1
                    changed = True

    for r in root.regions:
        for b in r.blocks:
            block_dce(b)
    return erased
