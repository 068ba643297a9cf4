"""Sinks are found through the ``metrics_relay.sinks`` entry-point group, so a third-party
package adds one with a line in its own pyproject and no change here; for a quick experiment,
``package.module:Class`` names a class on the import path without any entry point."""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.util
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from sinks.base import CatchesUp, Sink, SinkError
from sinks.preflight import install_hint, package_found

GROUP = "metrics_relay.sinks"
#: This package's own tracker sinks (registered as entry points too, pyproject.toml), found without
#: reading every installed distribution's metadata: that read takes 0.1-0.2 s, which the relay
#: would spend before it listens.
BUILTIN = {"aim": "sinks.aim:AimSink", "mlflow": "sinks.mlflow:MlflowSink",
           "tensorboard": "sinks.tensorboard:TensorBoardSink", "wandb": "sinks.wandb:WandbSink",
           "clearml": "sinks.clearml:ClearmlSink"}
#: The package each built-in sink needs beyond the relay's own; each is also the name of the extra
#: that installs it (pyproject.toml).
NEEDS = {"aim": "aim", "mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb",
         "clearml": "clearml", "nats": "nats"}
#: Catch-up's members before ``CatchesUp`` (``holes`` took no argument): a plugin that has them is
#: refused in one line that says what to write instead, never run half right.
RETIRED = ("catches_up", "holes", "caught_up")


@functools.lru_cache(maxsize=1)
def available() -> dict[str, EntryPoint]:
    """Registered sink names, without importing them. Read once per process: each read scans every
    installed distribution's metadata (about 0.1 s), and the relay asks for each sink, more than
    once, before it listens. (Do not change the dict: it is shared.)"""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def summaries() -> list[tuple[str, str]]:
    """Each installed sink's name and one line about it (its class docstring's first sentence), for
    ``relay serve --help``; a built-in sink whose package is missing says so, with the command that
    installs it. Read from the source with ``ast``, never imported: help stays fast and a broken
    plugin cannot break it."""
    return [(name, _first_sentence(ep.value) + _missing(name))
            for name, ep in sorted(available().items())]


def _missing(name: str) -> str:
    module = NEEDS.get(name)
    if module is None or package_found(module):
        return ""
    return f" [not installed: {install_hint(module)}]"


def _first_sentence(target: str) -> str:
    module, _, attr = target.partition(":")
    try:
        origin = _source(module)
    except (ImportError, ValueError, OSError) as exc:
        return f"(cannot be read: {type(exc).__name__})"
    if not origin.endswith(".py"):
        return "(no description)"
    try:
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as exc:
        return f"(cannot be read: {type(exc).__name__})"
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == attr.split(".")[-1]:
            doc = " ".join((ast.get_docstring(node) or "").split()).replace("``", "")
            first = doc.split(". ")[0].rstrip(".")
            return first + "." if first else "(no description)"
    return "(no description)"


def _source(module: str) -> str:
    """The file that defines ``module``, found as the import system finds it (an editable install's
    finder is not on sys.path) but without running a package's ``__init__``, as ``find_spec`` of a
    dotted name would: a plugin's package could raise anything there, or take long."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: found, nothing imported
    for depth in range(1, len(parts) + 1):
        if spec is None or spec.submodule_search_locations is None:
            return ""
        name = ".".join([top, *parts[:depth]])
        spec = importlib.machinery.PathFinder.find_spec(name, spec.submodule_search_locations)
    return (spec and spec.origin) or ""


def known(name: str) -> bool:
    """Whether ``name`` is an installed sink's name (a built-in one without reading every entry
    point)."""
    return name in BUILTIN or name in available()


def load(name: str, kinds: tuple[type, ...] = (Sink,)) -> type:
    """The class registered as ``name``, or the class a ``package.module:Class`` name points to, a
    subclass of one of ``kinds`` (the relay also takes its shippers: relay/ship/base.py); SinkError
    with a one-line message otherwise (naming the known sinks for an unknown name)."""
    if ":" in name:
        return _import(name, kinds)
    if name in BUILTIN:
        return _import(BUILTIN[name], kinds)
    eps = available()
    if name not in eps:
        raise SinkError(f"unknown sink {name!r}; installed sinks: "
                        f"{', '.join(sorted(eps)) or 'none'}")
    try:
        cls = eps[name].load()
    except Exception as exc:  # a broken plugin is reported, never fatal for the other sinks
        raise SinkError(f"sink {name!r} ({eps[name].value}) failed to import: "
                        f"{type(exc).__name__}: {exc}") from None
    return _checked(cls, f"sink {name!r} ({eps[name].value})", kinds)


def _import(spec: str, kinds: tuple[type, ...]) -> type:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SinkError(f"sink {spec!r}: give package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise SinkError(f"sink {spec!r}: no module named {exc.name!r}; check the name and "
                        "PYTHONPATH") from None
    except Exception as exc:  # the module itself raised while importing
        raise SinkError(f"sink {spec!r} failed to import: {type(exc).__name__}: {exc}") from None
    cls: object = module
    for part in attr.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise SinkError(f"sink {spec!r}: module {module_name} has no {attr!r}")
    return _checked(cls, f"sink {spec!r}", kinds)


def _checked(cls: object, what: str, kinds: tuple[type, ...]) -> type:
    if not (isinstance(cls, type) and issubclass(cls, kinds)):
        first, *more = (f"{kind.__module__}.{kind.__name__}" for kind in kinds)
        nor = "".join(f" (nor a {name})" for name in more)
        raise SinkError(f"{what} is not a {first} subclass{nor}")
    retired = [m for m in RETIRED
               if hasattr(cls, m) and not (m == "holes" and issubclass(cls, CatchesUp))]
    if retired:
        raise SinkError(f"{what} is written for the old catch-up contract ({', '.join(retired)}): "
                        "derive from sinks.base.CatchesUp and write holes(filled) instead "
                        "(docs/plugins.md)")
    return cls

