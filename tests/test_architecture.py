"""The layout's rules, checked on the source: imports run trainer -> relay -> sinks with no cycle
between modules (lazy imports inside functions included), each room of relay/ imports only the rooms
its ``__init__`` names (ROOMS, drawn in docs/architecture.md), no module is over 400 lines, and
no object is reached through to its parts or has its state assigned by another."""
from __future__ import annotations

import ast
import fnmatch
import re
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
    "relay.ship": {"relay.journal", "sinks", "sinks.events"},
    "relay.sinkhost": {"relay.wire", "relay.journal", "relay.ship", "sinks", "sinks.events"},
    "relay.daemon": {"relay.wire", "relay.journal", "relay.sinkhost", "sinks", "sinks.events"},
    "relay.forward": {"relay.wire", "relay.client", "relay.journal", "relay.ship", "sinks",
                      "sinks.events"},
    "relay.fleet": {"relay.wire", "relay.journal", "relay.sinkhost", "relay.ship", "sinks",
                    "sinks.events"},
    "relay.metrics": {"relay.wire", "relay.daemon", "relay.fleet", "sinks.events"},
    "relay.cli": {"relay.wire", "relay.client", "relay.journal", "relay.sinkhost", "relay.daemon", "relay.forward",
                  "relay.fleet", "relay.metrics", "relay.ship", "sinks", "sinks.events"},
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


# -- each object keeps its parts: no reaching through, no assigning into -------------------------

#: The product code both checks below read (the rooms, the sinks, the trainer).
OBJECT_DIRS = ("relay", "sinks", "trainer")

Function = ast.FunctionDef | ast.AsyncFunctionDef
#: (function, or None for a module's own statements; its class, or None; the nodes it holds itself)
Scope = tuple[Function | None, ast.ClassDef | None, list[ast.AST]]


def _own_methods(cls: ast.ClassDef) -> list[str]:
    """A class's methods but for dunders, properties and static methods: what makes it an object
    with behaviour rather than a record of data."""
    return [node.name for node in cls.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith("__")
            and not any(getattr(d, "id", None) in ("property", "staticmethod")
                        for d in node.decorator_list)]


def _targets(node: ast.Assign | ast.AnnAssign | ast.AugAssign) -> list[ast.expr]:
    """What an assignment assigns, a tuple's elements each."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _keeps_state(cls: ast.ClassDef) -> bool:
    """Whether a method of the class's own (not its constructor) assigns its attributes: an object
    that keeps its state itself, rather than a record with a few helpers that only read it."""
    methods = [m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
               and m.name not in ("__init__", "__post_init__")]
    return any(isinstance(target, ast.Attribute) and _is_self(target.value)
               for method in methods for node in ast.walk(method)
               if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for target in _targets(node))


def _classes(trees: dict[Path, ast.Module]) -> list[ast.ClassDef]:
    return [node for tree in trees.values() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)]


def _value_class(cls: ast.ClassDef) -> bool:
    """A NamedTuple or a frozen dataclass: a value, whose fields are what it is, not parts."""
    return any(ast.unparse(base).endswith("NamedTuple") for base in cls.bases) or any(
        isinstance(d, ast.Call) and any(k.arg == "frozen" and getattr(k.value, "value", False)
                                        for k in d.keywords)
        for d in cls.decorator_list)


def _self_targets(cls: ast.ClassDef) -> list[tuple[str, ast.expr | None, ast.expr | None]]:
    """What a class gives values to: (name, annotation, value) for ``self.name = ...`` and
    ``self.name: T = ...`` in its methods and ``name: T = ...`` in its body."""
    found: list[tuple[str, ast.expr | None, ast.expr | None]] = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.append((node.target.id, node.annotation, node.value))
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            found += [(target.attr, getattr(node, "annotation", None), node.value)
                      for target in _targets(node)
                      if isinstance(target, ast.Attribute) and _is_self(target.value)]
    return found


def _object_class(node: ast.expr | None, objects: set[str], annotation: bool = False) -> str | None:
    """The class of ``objects`` an annotation (``C``, ``C | None``, ``"C"``, ``C[T]``) or a value
    (``C(...)``, ``field(default_factory=C)``) names, if any."""
    if annotation and isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _object_class(ast.parse(node.value, mode="eval").body, objects)
    if isinstance(node, ast.BinOp):
        named = [n for n in (node.left, node.right)
                 if not (isinstance(n, ast.Constant) and n.value is None)]
        return _object_class(named[0], objects) if len(named) == 1 else None
    if isinstance(node, ast.Subscript):
        return _object_class(node.value, objects)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "field":
            return next((_object_class(k.value, objects) for k in node.keywords
                         if k.arg == "default_factory"), None)
        return _object_class(node.func, objects)
    return node.id if isinstance(node, ast.Name) and node.id in objects else None


def objects_of(trees: dict[Path, ast.Module]) -> tuple[set[str], set[str]]:
    """Our classes with behaviour (methods of their own; not values), and of those the ones that
    keep their state themselves (``_keeps_state``)."""
    objects = {cls.name for cls in _classes(trees) if _own_methods(cls) and not _value_class(cls)}
    keepers = {cls.name for cls in _classes(trees) if cls.name in objects and _keeps_state(cls)}
    return objects, keepers


def object_model(trees: dict[Path, ast.Module]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """From the source alone, by name where no declaration says the class: ``parts``, each
    attribute name our objects with behaviour hold one of our objects with behaviour in
    (``self.name = C(...)``, ``name: C``), with those classes; and ``state``, each attribute name
    our objects that keep their state set, with those classes. A name a record or a value of ours
    also holds is neither (read as theirs: a record's fields are its interface)."""
    objects, keepers = objects_of(trees)
    parts: dict[str, set[str]] = {}
    state: dict[str, set[str]] = {}
    fields: set[str] = set()  # what records and values hold
    settable: set[str] = set()  # what classes that do not keep their state hold
    for cls in _classes(trees):
        for name, annotation, value in _self_targets(cls):
            if cls.name not in keepers:
                settable.add(name)
            if cls.name not in objects:
                fields.add(name)
                continue
            held = (_object_class(annotation, objects, annotation=True)
                    or _object_class(value, objects))
            if held is not None:
                parts.setdefault(name, set()).add(held)
            if cls.name in keepers:
                state.setdefault(name, set()).add(cls.name)
    return ({name: classes for name, classes in parts.items() if name not in fields},
            {name: classes for name, classes in state.items() if name not in settable})


def _static_names(tree: ast.Module) -> set[str]:
    """Names a module binds by import or class statement: a chain from one of them is a path to
    where something is defined (``os.path.join``, ``Kind.FOO.value``), not a walk through
    objects."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
    return names


def reaches_through(trees: dict[Path, ast.Module]) -> list[str]:
    """Each chain ``x.a.b`` (``self.a.b.c``) that steps on another object's part: see the test."""
    parts, _ = object_model(trees)
    found = []
    for path, tree in trees.items():
        static = _static_names(tree)
        inner = {id(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in inner:
                continue
            steps: list[str] = []
            root: ast.expr = node
            while isinstance(root, ast.Attribute):
                steps.insert(0, root.attr)
                root = root.value
            if not isinstance(root, ast.Name) or root.id in static:
                continue
            first = 2 if _is_self(root) else 1  # self.a is its own part: self.a.b is fine
            for k in range(first, len(steps)):
                part = steps[k - 1]
                if part in parts and not steps[k].startswith("__"):
                    chain = ".".join([root.id, *steps[:k + 1]])
                    held = "/".join(sorted(parts[part]))
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {chain} "
                                 f"(through {part}: {held})")
                    break
    return sorted(set(found))


def _built(stmt: ast.stmt) -> str | None:
    """The name ``stmt`` binds to a new object (``x = C(...)``), if it does."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id[:1].isupper():
        return stmt.targets[0].id
    return None


def _setting_up(body: list[ast.stmt]) -> set[int]:
    """The ``x.attr = ...`` (``x.a, x.b = ...``) statements of ``body`` (and of its nested blocks)
    that set up ``x`` right after the same block built it (``x = C(...)``), before any other
    statement: filling in a new object, not changing one someone holds."""
    exempt: set[int] = set()
    building: str | None = None
    for stmt in body:
        targets = _targets(stmt) if isinstance(stmt, ast.Assign) else []
        if building is not None and targets and all(
                isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                and t.value.id == building for t in targets):
            exempt.add(id(stmt))
            continue
        building = _built(stmt)
        for handler in getattr(stmt, "handlers", []):
            exempt |= _setting_up(handler.body)
        exempt |= _setting_up([s for name in ("body", "orelse", "finalbody")
                               for s in getattr(stmt, name, []) if isinstance(s, ast.stmt)])
    return exempt


def _declared(function: Function | None, owner: ast.ClassDef | None,
              known: set[str]) -> dict[str, str]:
    """What a function's names and its class's ``self.`` attributes are declared or built as,
    where the source says it with one of the ``known`` classes: ``x: C``, ``x = C(...)``,
    ``self.a = C(...)`` (as ``"x"`` and ``"self.a"``)."""
    found: dict[str, str] = {}
    if owner is not None:
        for name, annotation, value in _self_targets(owner):
            cls = _object_class(annotation, known, annotation=True) or _object_class(value, known)
            if cls is not None:
                found[f"self.{name}"] = cls
    if function is None:
        return found
    for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]:
        if (cls := _object_class(arg.annotation, known, annotation=True)) is not None:
            found[arg.arg] = cls
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) \
                and (cls := _object_class(node.value, known)) is not None:
            found[node.targets[0].id] = cls
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and (cls := _object_class(node.annotation, known, annotation=True)) is not None:
            found[node.target.id] = cls
    return found


def _scopes(tree: ast.Module) -> list[Scope]:
    """Each function of a module with its class (None outside one) and the nodes it holds itself
    (not those of functions inside it); the module's own statements as a scope of its own."""
    scopes: list[Scope] = []

    def visit(node: ast.AST, owner: ast.ClassDef | None, into: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mine: list[ast.AST] = []
                scopes.append((child, owner, mine))
                visit(child, owner, mine)
            elif isinstance(child, ast.ClassDef):
                visit(child, child, into)
            else:
                into.append(child)
                visit(child, owner, into)

    top: list[ast.AST] = []
    scopes.append((None, None, top))
    visit(tree, None, top)
    return scopes


def assigns_into(trees: dict[Path, ast.Module]) -> list[str]:
    """Each assignment to an attribute of another object that keeps its state: see the test."""
    _, state = object_model(trees)
    every = {cls.name for cls in _classes(trees)}
    _, keepers = objects_of(trees)
    found = []
    for path, tree in trees.items():
        exempt = _setting_up(tree.body)
        for function, owner, nodes in _scopes(tree):
            declared = _declared(function, owner, every)
            for node in nodes:
                if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) \
                        or id(node) in exempt:
                    continue
                for target in _targets(node):
                    if not isinstance(target, ast.Attribute) or _is_self(target.value):
                        continue
                    cls = declared.get(ast.unparse(target.value))
                    if cls in keepers or cls is None and target.attr in state:
                        said = cls or "/".join(sorted(state[target.attr]))
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                                     f"{ast.unparse(target)} ({said})")
    return sorted(set(found))


#: Findings kept for now, each with why: (module, the part reached through) for the first check,
#: (module, the class assigned into) for the second. Each entry is a debt; the goal is none.
REACH_ALLOWED: dict[tuple[str, str], str] = {}
ASSIGN_ALLOWED: dict[tuple[str, str], str] = {
    ("relay/daemon/*.py", "Counters"):
        "the relay's tally: each part of the relay (ingest, loop, commit, refusals, shutdown) is "
        "given it to add its own counts; += is a counter's whole interface",
}


def _allowed(finding: str, allowed: dict[tuple[str, str], str]) -> bool:
    """Whether ``allowed`` names the finding's module and a part or class it names."""
    path, said = finding.split(":", 1)[0], set(re.findall(r"\w+", finding.rsplit("(", 1)[1]))
    return any(fnmatch.fnmatch(path, pattern) and name in said for pattern, name in allowed)


def _product_trees() -> dict[Path, ast.Module]:
    return {path: parse_python(path.read_text())
            for folder in OBJECT_DIRS for path in sorted((ROOT / folder).rglob("*.py"))}


def test_no_object_is_reached_through() -> None:
    """Callers ask an object for what they need; they do not walk through it to its parts
    (``self.ingest.commit_step.reading``, ``writer.worker.dropped``): its owner could not change
    how it keeps them. The rule, on the source of relay/, sinks/ and trainer/: in a chain of
    attributes from a name, no attribute is taken of another object's part. A part is what one of
    our objects with behaviour (a class with methods of its own, not a NamedTuple or frozen
    dataclass) holds one of our objects with behaviour in: ``self.worker = BatchWorker(...)``,
    ``worker: BatchWorker``. ``self.part.method()`` and ``self.part.value`` are one step into one's
    own part: fine; ``x.part.method()`` and ``self.a.part.method()`` are not. Fine as well: a
    chain from an imported name or a class (``os.path.join``, an enum member: where a thing is
    defined), dunders, and a field of a record (a class without methods of its own) or of a value:
    a name such a class also holds is read as its field (names stand for what they hold: no types
    are inferred). Exceptions: REACH_ALLOWED, each with its reason."""
    found = [f for f in reaches_through(_product_trees()) if not _allowed(f, REACH_ALLOWED)]
    assert not found, "reaching through another object (ask it instead):\n" + "\n".join(found)


def test_no_module_assigns_into_another_object() -> None:
    """An object that keeps its own state is the only one to assign it: an outside assignment goes
    around the methods that keep it consistent (``writer.bad_lines = decoder.bad_lines``,
    ``self.worker.dropped -= resolved``). The rule, on the source of relay/, sinks/ and trainer/:
    no ``x.attr = v`` (nor ``+=``, nor a tuple's element) where ``x`` is not ``self``/``cls`` and
    is one of our objects that keep their state (a method other than its constructor assigns its
    attributes). ``x``'s class is the one the function declares or builds it as (``x: C``,
    ``x = C(...)``, ``self.x = C(...)`` in its class); else one that sets ``attr``, where no class
    that does not keep its state (a record, a value) has an ``attr`` too. Fine as well: an object
    set up right after its function built it (``x = C(); x.attr = v``, before any other statement
    uses it), a library's object (no class of ours has ``attr``), a record's fields. Exceptions:
    ASSIGN_ALLOWED, each with its reason."""
    found = [f for f in assigns_into(_product_trees()) if not _allowed(f, ASSIGN_ALLOWED)]
    assert not found, "assigning into another object (give it a method):\n" + "\n".join(found)


PLANTED_OBJECTS = """
import os


class Worker:
    def __init__(self):
        self.dropped = 0

    def submit(self, n):
        self.dropped += n


class Record:
    def __init__(self):
        self.count = 0


class Writer:
    def __init__(self):
        self.worker = Worker()
        self.bad_lines = 0

    def count(self, lines):
        self.bad_lines += lines

    def close(self):
        self.worker.submit(1)                  # passes: a method of its own part
        self.worker.dropped -= 1               # assigned: into its part's state


def main():
    writer = Writer()
    writer.bad_lines, writer.worker = 0, None  # passes: set up right after it was built
    writer.close()
    writer.bad_lines = 3                       # assigned: into an object that keeps its state
    record = Record()
    record.count += 1                          # passes: a record's field
    print(writer.worker.dropped)               # reached: through the writer's part
    return os.path.join("a", "b")             # passes: a module path
"""


def test_the_object_checks_find_planted_examples() -> None:
    """The two checks above name each wrong line of a planted module, and nothing else in it."""
    trees = {ROOT / "relay" / "planted.py": parse_python(PLANTED_OBJECTS)}
    assert [f.split(": ", 1)[1] for f in reaches_through(trees)] == [
        "writer.worker.dropped (through worker: Worker)"]
    assert [f.split(": ", 1)[1] for f in assigns_into(trees)] == [
        "self.worker.dropped (Worker)", "writer.bad_lines (Writer)"]


#: Where every catch-all must re-raise, or count and report (issue 42 item 5): all product code.
EXCEPT_ROOTS = ("relay", "sinks", "trainer")
EXCEPT_SKIPPED: tuple[str, ...] = ()
#: Handlers marked ``# broad: <why>`` that neither re-raise nor count and report: few, by design.
MAX_MARKED_BROAD = 2
LOG_NAMES = {"log", "logger", "logging"}
REPORT_LEVELS = {"warning", "error", "exception", "critical"}
COUNT_PREFIXES = ("count", "record", "note", "failed", "reject")


def _broad(handler: ast.ExceptHandler) -> bool:
    """A bare ``except:`` or one whose classes name Exception or BaseException."""
    kinds = handler.type
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return kinds is None or any(isinstance(n, ast.Name) and n.id in {"Exception", "BaseException"}
                                for n in names)


def _own_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """Every node of ``body``, nested functions and lambdas left out (they run later, if at all)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        found.append(node)
        todo += [child for child in ast.iter_child_nodes(node)
                 if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]
    return found


def _name(node: ast.expr) -> str | None:
    """``x``'s name or ``a.x``'s last attribute."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _called(node: ast.AST) -> str | None:
    """The name of the function or method a call calls."""
    return _name(node.func) if isinstance(node, ast.Call) else None


def _reports(node: ast.AST) -> bool:
    """A logging call at warning level or above: ``log.error(...)``, ``self.log.exception(...)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    return _name(node.func.value) in LOG_NAMES and node.func.attr in REPORT_LEVELS


def _counts(node: ast.AST) -> bool:
    """``+=``, or a call of something named count*, record*, note*, failed* or reject*."""
    name = _called(node)
    return (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add)) or (
        name is not None and name.lstrip("_").startswith(COUNT_PREFIXES))


def _does(body: list[ast.stmt], helpers: dict[str, tuple[bool, bool]]) -> tuple[bool, bool]:
    """Whether ``body`` reports and whether it counts, itself or through a helper of its module."""
    nodes = _own_nodes(body)
    lent = [helpers.get(name or "", (False, False)) for name in map(_called, nodes)]
    return (any(map(_reports, nodes)) or any(r for r, _ in lent),
            any(map(_counts, nodes)) or any(c for _, c in lent))


def catch_alls(trees: dict[Path, ast.Module],
               sources: dict[Path, list[str]]) -> tuple[list[str], list[str]]:
    """The broad handlers that break the rule, and those marked ``# broad:``, as path:line: text."""
    wrong, marked = [], []
    for path, tree in trees.items():
        helpers: dict[str, tuple[bool, bool]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                reports, counts = _does(node.body, {})
                before = helpers.get(node.name, (False, False))  # methods of one name: either
                helpers[node.name] = (before[0] or reports, before[1] or counts)
        for handler in ast.walk(tree):
            if not (isinstance(handler, ast.ExceptHandler) and _broad(handler)):
                continue
            line = sources[path][handler.lineno - 1]
            where = f"{path.relative_to(ROOT)}:{handler.lineno}: {line.strip()}"
            if isinstance(handler.body[-1], ast.Raise) or all(_does(handler.body, helpers)):
                continue
            (marked if re.search(r"#.*\bbroad: \S", line) else wrong).append(where)
    return wrong, marked


def _covered_sources() -> dict[Path, list[str]]:
    paths = [path for root in EXCEPT_ROOTS for path in sorted((ROOT / root).rglob("*.py"))
             if not str(path.relative_to(ROOT)).startswith(EXCEPT_SKIPPED)]
    return {path: path.read_text().splitlines() for path in paths}


def test_every_catch_all_re_raises_or_is_counted_and_reported() -> None:
    """A catch-all that swallows an error hides a bug for good; one that counts and reports it
    shows it in the stats and the log. The rule, on EXCEPT_ROOTS (less EXCEPT_SKIPPED): every
    ``except:``, ``except Exception`` or ``except BaseException`` (alone or in a tuple) either
    - re-raises: its last statement is a ``raise`` (the same exception, or another from it); or
    - reports and counts. Reports: a call ``X.warning/error/exception/critical(...)`` where X
      is ``log``, ``logger`` or ``logging``, or an attribute so named (``self.log``). Counts:
      an augmented assignment ``+=``, or a call of a function or method whose name, leading
      underscores aside, starts with ``count``, ``record``, ``note``, ``failed`` or ``reject``
      (the relay's refusals are counted by reason: relay/daemon/refusals.py). A call of a
      function or method defined in the same module (found by name, one level deep) does what
      its own body does: ``self._failed(exc)`` whose body counts and logs does both. Nested
      functions and lambdas in the handler are not its body; or
    - carries ``# broad: <why>`` on its ``except`` line: the few that must stay broad and
      neither raise nor say it here (at most MAX_MARKED_BROAD).
    Anything else narrows to what can really be raised there (OSError, ValueError, ...)."""
    sources = _covered_sources()
    wrong, marked = catch_alls({p: parse_python("\n".join(s)) for p, s in sources.items()}, sources)
    assert not wrong, "catch-alls that neither re-raise nor count and report:\n" + "\n".join(wrong)
    assert len(marked) <= MAX_MARKED_BROAD, "too many marked broad:\n" + "\n".join(marked)


PLANTED_EXCEPTS = """
import logging

log = logging.getLogger(__name__)


class Thing:
    def _failed(self, exc):
        self.errors += 1
        log.error("failed: %s", exc)

    def run(self, step):
        try:
            step()
        except Exception as exc:               # passes: a helper of this module counts and logs
            self._failed(exc)
        try:
            step()
        except BaseException:                  # passes: cleanup, then raised again
            self.close()
            raise
        try:
            step()
        except Exception:                      # wrong: swallowed
            pass
        try:
            step()
        except (OSError, Exception) as exc:    # wrong: logged, not counted
            log.exception("step: %s", exc)
        try:
            step()
        except:                                # wrong: counted, said only at debug level
            self.errors += 1
            log.debug("step failed")
        try:
            step()
        except Exception:  # broad: planted
            self.close()
        try:
            step()
        except OSError:                        # passes: narrowed
            pass
"""


def test_the_catch_all_check_finds_planted_examples() -> None:
    """The check names each wrong handler of a planted module, and the marked one apart."""
    path = ROOT / "relay" / "planted.py"
    wrong, marked = catch_alls({path: parse_python(PLANTED_EXCEPTS)},
                               {path: PLANTED_EXCEPTS.splitlines()})
    assert [w.split(": ", 1)[0] for w in wrong] == ["relay/planted.py:24", "relay/planted.py:28",
                                                     "relay/planted.py:32"]
    assert [m.split(": ", 1)[0] for m in marked] == ["relay/planted.py:37"]
