"""Import layering of airflow_gpu/ (issue 28), read from the source with `ast`, nothing imported:

- core/ (the placement and queueing decisions) imports nothing outside core/ but the standard
  library, numpy and airflow_gpu.constants, lazily or not (constants.py is the project's vocabulary,
  names only: it imports nothing but the standard library, checked below);
- ui/, sim/, operators/ and triggers/ import nothing from airflow_gpu.scheduler or
  airflow_gpu.devtools, lazily or not;
- no import cycles among airflow_gpu modules: module-level imports (those run when the module is
  imported: top level, and in if/try/class bodies there, but not under `if TYPE_CHECKING:`); the
  lazy ones (inside functions) counted separately, with the module-level ones, in a second test.

An edge is `importer -> imported module`: `from a.b import c` is a.b.c when that is a module of the
package, else a.b. Parent packages that Python initialises on the way are not edges.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "airflow_gpu"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
# besides the standard library: numpy, and the names every layer shares (a leaf: see the test)
CORE_MAY_IMPORT = {"numpy", f"{PACKAGE}.constants"}
LEAVES = ("ui", "sim", "operators", "triggers")
NOT_FROM_LEAVES = ("scheduler", "devtools")


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    lazy: bool  # inside a function: runs when called, not when the module is imported
    type_only: bool  # under `if TYPE_CHECKING:`: never runs

    def __str__(self) -> str:
        how = " (lazy)" if self.lazy else " (type-only)" if self.type_only else ""
        return f"{self.importer} -> {self.imported}{how} [line {self.line}]"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> list[Edge]:
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []

    def add(target: str, node: ast.AST, lazy: bool, type_only: bool) -> None:
        edges.append(Edge(module, target, node.lineno, lazy, type_only))

    def visit(node: ast.AST, lazy: bool, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, lazy, type_only)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importer's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in MODULES else source, node, lazy, type_only)
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                visit(child, lazy, True)
            else:
                visit(child, lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), type_only)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return edges


EDGES = list(dict.fromkeys(e for module, path in MODULES.items() for e in _imports(module, path)))  # one per line


def _top(name: str) -> str:
    return name.split(".")[0]


def _in(name: str, package: str) -> bool:
    full = f"{PACKAGE}.{package}"
    return name == full or name.startswith(full + ".")


def _cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.imported in MODULES:
            graph.setdefault(e.importer, set()).add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def _cycle_edges(edges: list[Edge]) -> list[str]:
    """Every edge inside a cycle, for the failure message."""
    members = {m: i for i, c in enumerate(_cycles(edges)) for m in c}
    return [str(e) for e in edges if e.importer in members and members.get(e.imported) == members[e.importer]]


# --- what the rules see ----------------------------------------------------------------------------


def test_the_walk_sees_the_package():
    assert f"{PACKAGE}.core.queue" in MODULES and f"{PACKAGE}.checkpoint.storage.base" in MODULES
    core = [e for e in EDGES if e.importer == f"{PACKAGE}.core.policies"]
    assert any(e.imported == f"{PACKAGE}.core.framework" for e in core)
    lazy = [e for e in EDGES if e.importer == f"{PACKAGE}.cli.demo" and e.imported == f"{PACKAGE}.demo"]
    assert lazy and all(e.lazy for e in lazy)


def test_the_cycle_finder_finds_a_cycle():
    fake = [Edge(f"{PACKAGE}.core.queue", f"{PACKAGE}.core.model", 1, False, False),
            Edge(f"{PACKAGE}.core.model", f"{PACKAGE}.core.queue", 1, False, False)]
    assert _cycles(fake) == [[f"{PACKAGE}.core.model", f"{PACKAGE}.core.queue"]]


# --- the rules ---------------------------------------------------------------------------------------


def _stdlib(name: str) -> bool:
    return _top(name) in sys.stdlib_module_names


def test_core_imports_only_core_the_standard_library_and_numpy():
    bad = [str(e) for e in EDGES if _in(e.importer, "core") and not (
        _in(e.imported, "core") or _stdlib(e.imported) or e.imported in CORE_MAY_IMPORT
        or _top(e.imported) in CORE_MAY_IMPORT)]
    assert not bad, "core/ reaches outside core/:\n" + "\n".join(bad)


def test_what_core_may_import_from_the_package_is_a_leaf():
    for name in CORE_MAY_IMPORT & set(MODULES):
        bad = [str(e) for e in EDGES if e.importer == name and not _stdlib(e.imported)]
        assert not bad, f"{name} must import nothing but the standard library (core/ imports it):\n" + "\n".join(bad)


def _leaf_violations() -> list[str]:
    return [str(e) for e in EDGES
            if any(_in(e.importer, leaf) for leaf in LEAVES) and any(_in(e.imported, p) for p in NOT_FROM_LEAVES)]


def test_leaves_import_nothing_from_the_scheduler_or_devtools():
    bad = _leaf_violations()
    assert not bad, "ui/, sim/, operators/, triggers/ import the scheduler or devtools:\n" + "\n".join(bad)


def test_no_import_cycle_at_module_level():
    edges = [e for e in EDGES if not e.lazy and not e.type_only]
    cycles = _cycles(edges)
    assert not cycles, "import cycles (module level):\n" + "\n".join(_cycle_edges(edges))


def test_no_import_cycle_counting_lazy_imports():
    edges = [e for e in EDGES if not e.type_only]
    # checkpoint/backends.py <-> s3.py and cli/demo.py <-> demo.py were such, each lazy on one side
    cycles = _cycles(edges)
    assert not cycles, "import cycles (with lazy imports):\n" + "\n".join(_cycle_edges(edges))
