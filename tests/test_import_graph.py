"""The layering of the package, read from its source: every module's imports (``ast``, module
level and function level alike, relative imports resolved) checked against the house rules
(docs/ARCHITECTURE.md §2), and no import cycle between modules.

Dynamic imports (``importlib.import_module``) are not followed; the one in ``kdagen/__init__``
loads ``kdagen.api`` lazily (the API sits above everything).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kdagen"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of the package that ``name`` denotes (a module, or a name inside one)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in ("kdagen", "tools", "tests"):
                resolved = _resolve(target)
                out.add(resolved if resolved is not None else target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


EMITTERS = ("kdagen.codegen.common", "kdagen.codegen.sm90", "kdagen.codegen.sm100")
LOWERING = ("kdagen.codegen.lower", "kdagen.codegen.to_ptx", "kdagen.codegen.ptxas")
COMPILER = ("kdagen.codegen", "kdagen.passes", "kdagen.interpreter", "kdagen.ir", "kdagen._mlir",
            "kdagen.compiler_hooks", "kdagen.driver", "kdagen.emit", "kdagen.check", "kdagen.cli")

# What the runtime may import of the package besides itself: each is a leaf with no compiler
# behind it. kdagen.target: the chip table (which chip a device is); kdagen.version: the
# source hash of cache keys and manifests.
RUNTIME_MAY_IMPORT = ("kdagen.runtime", "kdagen.target", "kdagen.version")

# (importer prefixes, forbidden prefixes, why)
NEVER = [
    (("kdagen.runtime",), COMPILER,
     "the runtime runs bundles where no compiler is installed; the compiler registers into it"),
    (("kdagen.passes",), ("kdagen.codegen", "kdagen.interpreter"),
     "passes are chip-agnostic (the target rides on the module) and rewrite IR, not run it"),
    (("kdagen.ir",), ("kdagen.passes", "kdagen.interpreter", "kdagen.codegen"),
     "the IR layer knows no pass, interpreter or lowering"),
    (EMITTERS, LOWERING,
     "instruction emitters know no tile program"),
    (LOWERING, ("kdagen.interpreter",),
     "lowering reads IR, not the interpreter"),
    (("kdagen",), ("tools", "tests"),
     "the product package does not import the developer tools or the tests"),
]


@pytest.mark.parametrize("importers,forbidden,why", NEVER, ids=[n[0][0] for n in NEVER])
def test_layering_rule(importers, forbidden, why):
    broken = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if _under(m, importers)
                    for t in targets if _under(t, forbidden))
    assert not broken, f"{why}:\n  " + "\n  ".join(broken)


def test_runtime_imports_only_the_runtime_and_leaves():
    broken = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if _under(m, ("kdagen.runtime",))
                    for t in targets if not _under(t, RUNTIME_MAY_IMPORT))
    assert not broken, "\n".join(broken)


def test_target_is_a_leaf():
    assert GRAPH["kdagen.target"] == set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or one that imports
    itself."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_the_checker_sees_what_it_checks():
    """The graph is read as intended: function-level and relative imports count, and a cycle
    or a broken rule would be found."""
    assert "kdagen.runtime.launch" in GRAPH["kdagen.runtime.bundle_executor"]   # in a function
    assert "kdagen.codegen.lower.backend" in GRAPH["kdagen.codegen.lower.kernel"] or \
        "kdagen.codegen.lower.emitter" in GRAPH["kdagen.codegen.lower.kernel"]  # relative
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]
