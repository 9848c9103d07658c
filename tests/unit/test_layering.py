"""Layering: the packages follow the request path (protocols -> ingress -> engine -> backends) and
no lumenrt module imports itself back through others.

- The import graph of every ``lumenrt`` module, read from the sources (imports inside functions
  count; those under ``if TYPE_CHECKING:`` do not), has no cycle.
- ``lumenrt.protocols`` imports nothing from lumenrt outside itself; ``lumenrt.client`` imports
  only itself and ``lumenrt.protocols``; the engine, the backends and the native core import
  nothing from the front ends, the clients or the tools above them.
- The clients and the codecs also load only those packages when imported in a fresh interpreter
  (what this test process has already imported does not count).
"""

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import lumenrt

SOURCE_ROOT = Path(str(lumenrt.__file__)).parent  # src/lumenrt


# ---- the import graph, from the sources ------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    """Every lumenrt module with a Python source, by name."""
    return {_module_name(p): p for p in sorted(SOURCE_ROOT.rglob("*.py"))}


def _module_names() -> set[str]:
    """The modules imports can name: the sources, and compiled modules by their stubs (``_core``)."""
    return set(_sources()) | {_module_name(p) for p in SOURCE_ROOT.rglob("*.pyi")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterable[str]:
    """Every module name an import statement in ``tree`` names (at any depth, relative imports
    resolved), and for ``from X import y`` also ``X.y`` (which is a module when y is one); the
    bodies of ``if TYPE_CHECKING:`` are skipped."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """lumenrt module -> the lumenrt modules it imports (a name that is not a module counts as the
    module it is taken from: ``from lumenrt.native import clean_stale`` -> ``lumenrt.native``)."""
    known = _module_names()
    graph: dict[str, set[str]] = {}
    for module, path in _sources().items():
        targets: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]  # Tarjan's algorithm, without recursion
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return [_cycle_in(graph, set(c), c[0]) for c in components]


def _cycle_in(graph: Mapping[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself inside one strongly connected component."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [*reversed(chain), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")  # pragma: no cover - a component always has one


def _in(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports_outside(packages: tuple[str, ...], allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of ``packages`` that import lumenrt modules outside ``allowed``, and what."""
    return {
        module: sorted(t for t in targets if t != "lumenrt" and not _in(t, allowed))
        for module, targets in import_graph().items()
        if _in(module, packages) and any(t != "lumenrt" and not _in(t, allowed) for t in targets)
    }


def test_cycle_finder_names_the_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_reads_function_level_imports_and_skips_type_checking_blocks() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from lumenrt.engine import engine\n"
        "else:\n    import lumenrt.backends.base\n"
        "def f():\n    from lumenrt.protocols import raw\n"
        "from . import tcp\n"
    )
    names = set(_imported_names(tree, "lumenrt.protocols.dtypes", is_package=False))
    assert {"lumenrt.backends.base", "lumenrt.protocols.raw", "lumenrt.protocols.tcp"} <= names
    assert not any(n.startswith("lumenrt.engine") for n in names)


def test_graph_covers_every_package() -> None:
    graph = import_graph()
    for package in ("protocols", "ingress", "engine", "backends", "native", "client"):
        assert f"lumenrt.{package}" in graph
    assert "lumenrt.protocols.raw" in graph["lumenrt.protocols.tcp"]
    assert "lumenrt.native._core" in graph["lumenrt.native.shm"]  # a compiled module, by its stub


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert cycles == [], "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


BELOW_INGRESS = ("lumenrt.engine", "lumenrt.backends", "lumenrt.native")


@pytest.mark.parametrize(
    ("packages", "allowed"),
    [
        (("lumenrt.protocols",), ("lumenrt.protocols",)),
        (("lumenrt.client",), ("lumenrt.client", "lumenrt.protocols")),
        (
            BELOW_INGRESS,
            (*BELOW_INGRESS, "lumenrt.protocols", "lumenrt.models", "lumenrt.extras", "lumenrt.placement"),
        ),
        (("lumenrt.placement",), ("lumenrt.placement",)),  # reads the machine, plans; the engine uses it
    ],
    ids=["protocols", "client", "engine-backends-native", "placement"],
)
def test_sources_import_only_lower_layers(packages: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    assert _imports_outside(packages, allowed) == {}


# ---- what an import really loads ---------------------------------------------------------------------


def _loaded_lumenrt_modules(*modules: str) -> set[str]:
    """Import ``modules`` in a fresh interpreter; return the ``lumenrt`` modules it then holds."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'lumenrt' or m.startswith('lumenrt.'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert set(modules) <= loaded  # the imports really happened
    return loaded


def _under(loaded: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if _in(m, packages))


def test_client_loads_no_ingress_engine_or_bench() -> None:
    loaded = _loaded_lumenrt_modules("lumenrt.client")
    assert {"lumenrt.protocols.tcp", "lumenrt.protocols.raw"} <= loaded
    assert _under(loaded, ("lumenrt.ingress", "lumenrt.engine", "lumenrt.native", "lumenrt.bench")) == []


def test_protocols_load_no_ingress_engine_or_client() -> None:
    codecs = [m for m in _sources() if m.startswith("lumenrt.protocols.") and not m.endswith("_pb2")]
    loaded = _loaded_lumenrt_modules(*codecs)
    assert _under(loaded, ("lumenrt.ingress", "lumenrt.engine", "lumenrt.native", "lumenrt.client")) == []
