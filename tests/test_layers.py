"""The code's own import graph: every package of `testbed/` imports only packages below it, no
package imports one that imports it back, and `agents/` (what runs on a lab host) imports
nothing from `testbed/`. Read from the source with `ast`, every import counted (module level
and inside functions) but those under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LAYERS = {
    "core": 0,  # errors, paths, reading files into models, statistics, fan-out, commands' result
    "topo": 1,  # link profile, schedules and traces, topology, host classes, hardware catalogue
    "config": 2,  # the playbook
    "metrics": 3,  # typed records, one stats object per condition, cost, capacity
    "hosts": 3,  # commands on hosts through Fabric, inventories through ansible-core
    "models": 3,  # the tiny pair's build
    "labs": 4,  # the lab kinds
    "links": 5,  # impairing the links, probing them, calibrating them
    "results": 5,  # the run folder, its tables
    "report": 6,  # figures, summary, dashboard, compare
    "balance": 6,  # BALANCE on the controller: simulator, exact solver, benchmarks
    "runner": 7,  # the condition pipeline
    "twin": 7.5,  # the twin of SLED and the centralized server (simulates a playbook)
    "bench": 8,  # benchmarks
    "commands": 9,  # the CLI's commands
    "cli": 10,  # the CLI
}
"""The ground floor (`core`, `topo`, `config`) at the bottom; a package may import only
packages of a lower layer."""


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, but those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def package_of(path: Path) -> str:
    """`testbed/<package>/...` -> package; a module of `testbed/` itself is its own."""
    parts = path.relative_to(REPO / "testbed").with_suffix("").parts
    return parts[0]


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> where, for imports across packages."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted((REPO / "testbed").rglob("*.py")):
        if path.name == "__init__.py" and path.parent == REPO / "testbed":
            continue
        pkg = package_of(path)
        for line, module in imports(path):
            parts = module.split(".")
            if parts[0] == "testbed" and len(parts) > 1 and parts[1] != pkg:
                edges[(pkg, parts[1])].append(f"{path.relative_to(REPO)}:{line} {module}")
    return edges


def test_every_package_has_a_layer():
    top = REPO / "testbed" / "__init__.py"
    packages = {package_of(p) for p in (REPO / "testbed").rglob("*.py") if p != top}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_no_package_imports_one_at_or_above_its_layer():
    upward = [
        where
        for (a, b), places in package_edges().items()
        if LAYERS.get(b, 99) >= LAYERS.get(a, 99)
        for where in places
    ]
    assert upward == []


def test_no_package_imports_one_that_imports_it_back():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in package_edges():
        graph[a].add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo += graph[node]
        return False

    pairs = [(a, b) for a, targets in list(graph.items()) for b in targets]
    cycles = sorted({tuple(sorted((a, b))) for a, b in pairs if reaches(b, a)})
    assert cycles == []


def test_agents_import_nothing_of_the_controller():
    found = [
        f"{path.relative_to(REPO)}:{line} {module}"
        for path in sorted((REPO / "agents").rglob("*.py"))
        for line, module in imports(path)
        if module == "testbed" or module.startswith("testbed.")
    ]
    assert found == []


def test_the_graph_is_read_from_the_source(tmp_path, monkeypatch):
    """An import written upward, and one inside a function back down, are both edges."""
    fake = tmp_path / "testbed"
    (fake / "core").mkdir(parents=True)
    (fake / "runner").mkdir()
    (fake / "core" / "bad.py").write_text("from testbed.runner.run import execute\n")
    (fake / "runner" / "run.py").write_text("def f():\n    from testbed.core import bad\n")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    edges = package_edges()
    assert ("core", "runner") in edges and ("runner", "core") in edges
