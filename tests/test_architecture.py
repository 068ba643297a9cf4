"""The layout's rules, checked on the source: imports run trainer -> relay -> sinks with no cycle
between modules (lazy imports inside functions included), and no module grows past about 350 lines
without saying why in its docstring."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("trainer", "relay", "sinks")
MAX_LINES = 350


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, at the top or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from relay import schema`` imports relay.schema (and relay/__init__ first, which
            # is part of every module's import, so it is not an edge of its own).
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                     for alias in node.names]
        out.update(name for name in names if name in known and name not in PACKAGES)
    return out


def test_packages_import_one_way_and_modules_form_no_cycle() -> None:
    found = modules()
    graph = {name: imports(path, set(found)) - {name} for name, path in found.items()}
    order = {package: rank for rank, package in enumerate(PACKAGES)}
    backwards = [(a, b) for a, targets in graph.items() for b in targets
                 if order[b.split(".")[0]] < order[a.split(".")[0]]]
    assert not backwards, f"imports against trainer -> relay -> sinks: {backwards}"
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError(f"import cycle: {' -> '.join(path[path.index(name):] + [name])}")
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_long_modules_say_why() -> None:
    long = {}
    for name, path in modules().items():
        lines = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and f"over {MAX_LINES} lines" not in doc:
            long[name] = lines
    assert not long, f"modules over {MAX_LINES} lines without a reason in their docstring: {long}"
