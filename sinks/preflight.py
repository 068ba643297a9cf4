"""Cheap checks a sink's ``check()`` makes before the relay listens: no import of the tool (that
takes seconds: it happens in the sink's own process), no file created, nothing sent anywhere."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from sinks.base import SinkError


def need_package(module: str, sink: str, extra: str) -> None:
    """SinkError unless ``module`` can be found on the import path (found, not imported)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a module set to None
        found = False
    if not found:
        raise SinkError(f"the {sink} sink needs {module}, which is not installed; "
                        f"pip install './[{extra}]' in the metrics-relay checkout")


def need_writable_dir(path: Path, what: str, fix: str) -> None:
    """SinkError unless ``path`` is a writable directory or could be made one (its nearest existing
    ancestor is a directory this process may write into). ``what`` names it, ``fix`` says what to do."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise SinkError(f"{what} {path} is not usable: it is not a directory; {fix}")
    existing = path
    while not existing.exists():  # stops at the root, which exists
        existing = existing.parent
    if not existing.is_dir():
        raise SinkError(f"{what} {path} is not usable: {existing} is not a directory; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SinkError(f"{what} {path} is not usable: {existing} is not writable; {fix}")
