"""The layout's rules, checked on the source: imports run trainer -> relay -> sinks with no cycle
between modules (lazy imports inside functions included), each room of relay/ imports only the rooms
its ``__init__`` names (ROOMS, drawn in docs/architecture.md), and no module is over 400 lines."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT, parse_python

PACKAGES = ("trainer", "relay", "sinks")
MAX_LINES = 400

#: Which rooms each room may import (besides itself). ``relay`` alone is relay/__init__ and
#: __main__ (the lazy public names and the ``relay`` program); sinks.events is the event model.
ROOMS: dict[str, set[str]] = {
    "sinks.events": set(),
    "sinks": {"sinks.events"},
    "relay.wire": {"sinks.events"},
    "relay.client": {"relay.wire", "sinks.events"},
    "relay.journal": {"relay.wire", "sinks.events"},
    "relay.sinkhost": {"relay.wire", "relay.journal", "sinks", "sinks.events"},
    "relay.daemon": {"relay.wire", "relay.journal", "relay.sinkhost", "sinks", "sinks.events"},
    "relay.forward": {"relay.wire", "relay.client", "relay.journal", "sinks", "sinks.events"},
    "relay.fleet": {"relay.wire", "relay.journal", "relay.sinkhost", "sinks", "sinks.events"},
    "relay.metrics": {"relay.wire", "relay.daemon", "relay.fleet", "sinks.events"},
    "relay.cli": {"relay.wire", "relay.client", "relay.journal", "relay.sinkhost", "relay.daemon", "relay.forward",
                  "relay.fleet", "relay.metrics", "sinks", "sinks.events"},
    "relay": {"relay.client", "relay.wire", "relay.cli"},
    "trainer": {"relay", "relay.client", "relay.wire", "sinks.events"},
}
#: Modules still over MAX_LINES while the house is rebuilt (issue 19); each entry is a debt.
LONG_FOR_NOW: set[str] = set()


def room(module: str) -> str:
    """The room a module lives in: relay's subpackages, sinks.events apart from the other sinks, else its package."""
    parts = module.split(".")
    if parts[0] == "relay":
        return ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOM_NAMES) else "relay"
    return "sinks.events" if module == "sinks.events" else parts[0]


ROOM_NAMES = {name.split(".")[1] for name in ROOMS if name.startswith("relay.")}


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
    for node in ast.walk(parse_python(path.read_text())):
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


def test_rooms_import_only_what_they_may() -> None:
    found = modules()
    assert {room(name) for name in found} <= ROOMS.keys(), "a module outside every room: add the room to ROOMS"
    wrong = sorted((a, b) for a, path in found.items() for b in imports(path, set(found))
                   if room(b) != room(a) and room(b) not in ROOMS[room(a)])
    assert not wrong, f"imports a room may not make (tests/test_architecture.py ROOMS): {wrong}"


def test_every_room_says_what_it_may_import() -> None:
    for name in ROOM_NAMES:
        doc = ast.get_docstring(parse_python((ROOT / "relay" / name / "__init__.py").read_text())) or ""
        assert "import" in doc, f"relay/{name}/__init__.py: say in one line what the room is and what it may import"


def test_no_module_is_over_400_lines() -> None:
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES and name not in LONG_FOR_NOW}
    assert not long, f"modules over {MAX_LINES} lines: split them by job: {long}"


def defined(path: Path) -> tuple[set[str], set[str]]:
    """The names a module defines itself at its top level (assignments, functions, classes): what
    others may import from it; and the names it imports from the project, which it must not pass on."""
    names: set[str] = set()
    tree = parse_python(path.read_text())
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "finalbody", []) + [
                stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] in PACKAGES for alias in node.names}
    return names, imported - names


def test_every_name_is_imported_from_its_home() -> None:
    """No module passes on a name it imported from the project (relay/wire/schema.py once re-exported
    the event model): ``from m import n`` and ``m.n`` only where m defines n, in the project, its
    tests and benchmarks. The packages themselves (``relay``, ``trainer``) are exempt: their lazy
    public names are the API."""
    found = modules()
    homes = {name: defined(path) for name, path in found.items()}
    wrong = []
    for path in sorted(p for d in (*PACKAGES, "tests", "bench") for p in (ROOT / d).rglob("*.py")):
        tree = parse_python(path.read_text())
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in found and not node.level:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in found:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif node.module not in PACKAGES and alias.name in homes[node.module][1]:
                        wrong.append(f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                aliases.update({alias.asname: alias.name for alias in node.names if alias.asname and alias.name in found})
        wrong += [f"{path.relative_to(ROOT)}: {node.value.id}.{node.attr} ({aliases[node.value.id]} only imports it)"
                  for node in ast.walk(tree) if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases and node.attr in homes[aliases[node.value.id]][1]]
    assert not wrong, f"names imported from a module that only passes them on: {sorted(set(wrong))}"


def _functions(tree: ast.AST) -> set[str]:
    """The names of the functions and methods ``tree`` defines (properties are values, not callbacks)."""
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not any(getattr(d, "id", None) == "property" for d in node.decorator_list)}


def _methods(tree: ast.AST) -> set[str]:
    """The names of the methods ``tree``'s classes define, but for properties."""
    return set().union(set(), *(_functions(node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)))


def _data(tree: ast.AST) -> set[str]:
    """The attribute names ``tree`` gives values (``self.name = ...``, a class's ``name: type``)."""
    names = {target.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(target, ast.Attribute)}
    return names | {node.target.id for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) for node in cls.body
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


#: A library's classes whose methods the project wraps: not objects of its own given callbacks late.
#: accelerate calls its trackers on the main process only (trainer/accelerate_tracker.py).
WRAPPED_LIBRARY_CLASSES = {"Accelerator"}


def callbacks_wired(trees: dict[Path, ast.AST]) -> list[str]:
    """Where a module of ``trees`` assigns a function (a lambda, a function or method of these modules,
    a bound method) to an attribute of another object than ``self``/``cls`` (or a class of
    WRAPPED_LIBRARY_CLASSES)."""
    # (a name some object holds as a value, ``run.name``, is not taken for the method of another class)
    methods = set().union(*map(_methods, trees.values())) - set().union(*map(_data, trees.values()))
    wired = []
    for path, tree in trees.items():
        functions = _functions(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            value = node.value
            if not (isinstance(value, ast.Lambda) or isinstance(value, ast.Name) and value.id in functions
                    or isinstance(value, ast.Attribute) and value.attr in methods):
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Attribute) and not (
                        isinstance(target.value, ast.Name)
                        and target.value.id in ("self", "cls", *WRAPPED_LIBRARY_CLASSES)):
                    wired.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}")
    return wired


def test_no_module_assigns_another_objects_callbacks_after_construction() -> None:
    """Dependencies go in through constructors: an object whose callbacks another assigns once it is
    built does without them until then (the relay's acks were dropped without a word before its
    socket was bound). So no module of the project or its benchmarks assigns a function (a lambda,
    a function or method of the project, a bound method) to an attribute of another object:
    ``ingest.batch.send = self._send_acks`` fails, ``self.send = send`` in a constructor passes."""
    trees = {path: parse_python(path.read_text()) for path in modules().values()}
    trees.update({path: parse_python(path.read_text()) for path in sorted((ROOT / "bench").rglob("*.py"))})
    wired = callbacks_wired(trees)
    assert not wired, "callbacks assigned after construction (pass them to the constructor):\n" + "\n".join(wired)


PLANTED = """
class Relay:
    def __init__(self, ingest, sink):
        self.send = ingest.send               # passes: its own attribute
        ingest.commit_step.send = self._send_acks   # wired: a bound method onto another object
        sink.on_error = lambda exc: None       # wired: a lambda
        sink.name = self.label                 # passes: a value, not a callback
        self.label = "relay"

    def _send_acks(self, acks):
        return acks

    def bind(self, loop):
        loop.on_ready = helper                 # wired: a function of this module, outside any constructor


def helper():
    return None
"""


def test_the_callback_check_finds_a_planted_example() -> None:
    """The check above names each wiring of a planted module, and nothing else in it."""
    path = ROOT / "relay" / "planted.py"
    wired = callbacks_wired({path: parse_python(PLANTED)})
    assert [line.split(": ", 1)[1] for line in wired] == [
        "ingest.commit_step.send = self._send_acks", "sink.on_error = lambda exc: None", "loop.on_ready = helper"]
