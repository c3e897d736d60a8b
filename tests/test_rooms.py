"""The rooms of ``coeffd`` and the direction of their imports (CONTRIBUTING.md, "Rooms").

Every module under ``coeffd/`` is parsed with :mod:`ast`; every import of another room
counts, wherever it stands (inside functions, under ``TYPE_CHECKING``): a room may import
only rooms of a lower rank, so the arrows point down and never sideways. Module-level
imports (those that run when the module is imported) must also form no cycle between
modules. The checks are plain functions, tested here on small synthetic packages too, so
that a bad edge is known to fail the test.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "coeffd"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: Rank of each room: a module may import modules of its own room and of rooms ranked
#: strictly lower. ``records`` (the shared record types) and ``base`` (listener and
#: logging plumbing) import nothing else of coeffd; the package's own ``__init__`` and
#: ``__main__`` (room ``coeffd``) are the top.
RANKS: dict[str, int] = {
    "records": 0,
    "base": 0,
    "joiner": 1,  # events → observations: imports records only
    "learners": 1,
    "receivers": 1,
    "simfleet": 2,  # simfleet computes its truth with the learners' physics features
    "daemon": 3,
    PACKAGE: 4,
}


@dataclass(frozen=True)
class Edge:
    """One import of a coeffd module by another."""

    source: str  # importing module, e.g. coeffd.receivers.grpc.server
    target: str  # imported module (the deepest one that exists)
    line: int
    #: Runs when ``source`` is imported: at module level (or in a class body), not under
    #: ``if TYPE_CHECKING:``. Only these can make an import cycle.
    runtime: bool


def room(module: str) -> str:
    """The room of a module: its top-level subpackage, or the package itself.

    >>> room("coeffd.receivers.otlp.decode"), room("coeffd.__main__"), room("coeffd")
    ('receivers', 'coeffd', 'coeffd')
    """
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else parts[0]


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (a package directory) by dotted name."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time."""

    def walk(
        nodes: Iterable[ast.AST], runtime: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node, runtime
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for sub in ast.walk(node):  # deferred until called
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        yield sub, False
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, False)
                yield from walk(node.orelse, runtime)
            else:  # try/except, with, if, class bodies...: run at import time
                yield from walk(ast.iter_child_nodes(node), runtime)

    yield from walk(tree.body, True)


def edges(root: Path) -> list[Edge]:
    """Every import between modules of the package at ``root``."""
    modules = module_names(root)
    package = root.name
    out: list[Edge] = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, runtime in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolved against the importing package
                    anchor = name.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from pkg import sub`` imports the submodule when there is one
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                if target != package and not target.startswith(package + "."):
                    continue
                while target not in modules and "." in target:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target != name:
                    out.append(Edge(name, target, node.lineno, runtime))
    return out


def room_violations(all_edges: Iterable[Edge]) -> list[str]:
    """One line per import that points up or sideways between rooms."""
    bad = []
    for e in all_edges:
        src, dst = room(e.source), room(e.target)
        if src != dst and RANKS[dst] >= RANKS[src]:
            way = "sideways" if RANKS[dst] == RANKS[src] else "up"
            bad.append(
                f"{e.source} (line {e.line}) imports {e.target}: {src} -> {dst} points {way}"
            )
    return sorted(set(bad))


def import_cycles(all_edges: Iterable[Edge]) -> list[list[str]]:
    """The import cycles among runtime edges, one per strongly connected component,
    each as a closed path ``[a, b, ..., a]``."""
    graph: dict[str, set[str]] = {}
    for e in all_edges:
        if e.runtime:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    # Tarjan's strongly connected components, iteratively (no recursion limit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1:
                    components.append(comp)
    return [_cycle_in(sorted(c), graph) for c in components]


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


# ----------------------------------------------------------------- the real package


def test_every_module_is_in_a_room() -> None:
    names = module_names(ROOT)
    assert len(names) > 50  # the parse found the package
    outside = [n for n in names if n != PACKAGE and room(n) == PACKAGE]
    assert outside == ["coeffd.__main__"], "a new top-level subpackage needs a rank in RANKS"


def test_imports_point_down_only() -> None:
    bad = room_violations(edges(ROOT))
    assert not bad, "imports against the rooms' order (CONTRIBUTING.md):\n" + "\n".join(bad)


def test_every_room_is_imported_from_above() -> None:
    """A room nobody above imports is dead weight or a misfiled stage."""
    imported = {room(e.target) for e in edges(ROOT) if room(e.source) != room(e.target)}
    unused = sorted(r for r in RANKS if r != PACKAGE and r not in imported)
    assert not unused, f"rooms no other room imports: {unused}"


def test_no_import_cycle() -> None:
    cycles = import_cycles(edges(ROOT))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# ------------------------------------------------- the checks on synthetic packages


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / PACKAGE
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return root


def test_bad_edges_are_named(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            # up, hidden under TYPE_CHECKING
            "receivers/grpc.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from coeffd.daemon.app import App
            """,
            # sideways, inside a function, relative
            "learners/rls.py": """
                def f():
                    from ..receivers import grpc
            """,
            # the bottom room imports another room
            "records/events.py": "import coeffd.base.http\n",
            # the package's top imported from below
            "simfleet/run.py": "from coeffd import __version__\n",
            # all fine: down, within a room, the allowed simfleet -> learners
            "daemon/app.py": "from coeffd.receivers.grpc import x\nfrom coeffd import records\n",
            "simfleet/truth.py": "from coeffd.learners.rls import f\nfrom . import run\n",
            "daemon/app2.py": "from coeffd.daemon import app\n",
            "base/http.py": "import json\n",
        },
    )
    assert room_violations(edges(root)) == [
        "coeffd.learners.rls (line 3) imports coeffd.receivers.grpc: "
        "learners -> receivers points sideways",
        "coeffd.receivers.grpc (line 4) imports coeffd.daemon.app: receivers -> daemon points up",
        "coeffd.records.events (line 1) imports coeffd.base.http: records -> base points sideways",
        "coeffd.simfleet.run (line 1) imports coeffd: simfleet -> coeffd points up",
    ]


def test_cycles_are_found_and_deferred_imports_are_not_cycles(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "daemon/a.py": "from coeffd.daemon.b import x\n",
            "daemon/b.py": "import coeffd.daemon.c\n",
            "daemon/c.py": "try:\n    from coeffd.daemon import a\nexcept ImportError:\n    pass\n",
            # deferred (in a function) or type-only back edges make no cycle
            "daemon/d.py": "from coeffd.daemon import e\n",
            "daemon/e.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from coeffd.daemon import d
                def f():
                    from coeffd.daemon import d
            """,
            # a module importing a name of its own package's __init__ is no cycle with
            # itself; a package importing its submodules is fine
            "receivers/__init__.py": "from coeffd.receivers.otlp import decode\n",
            "receivers/otlp/decode.py": "from coeffd.receivers.otlp import limits\n",
            "receivers/otlp/limits.py": "X = 1\n",
        },
    )
    all_edges = edges(root)
    assert import_cycles(all_edges) == [
        ["coeffd.daemon.a", "coeffd.daemon.b", "coeffd.daemon.c", "coeffd.daemon.a"]
    ]
    assert Edge("coeffd.daemon.e", "coeffd.daemon.d", 4, False) in all_edges
    assert room_violations(all_edges) == []


@pytest.mark.parametrize("bad", ["daemon", "simfleet"])
def test_receivers_may_not_import_upper_rooms(tmp_path: Path, bad: str) -> None:
    root = _package(
        tmp_path, {"receivers/x.py": f"from coeffd.{bad} import y\n", f"{bad}/y.py": ""}
    )
    assert room_violations(edges(root)) == [
        f"coeffd.receivers.x (line 1) imports coeffd.{bad}.y: receivers -> {bad} points up"
    ]
