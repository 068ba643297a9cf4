"""Cheap checks a sink's ``check()`` makes before the relay listens: no import of the tool (that
takes seconds: it happens in the sink's own process), no file created, nothing sent anywhere; and
the same directory probe again at ``open()``, where it may create and write."""
from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path

from sinks.base import SinkError


def need_package(module: str, sink: str, extra: str) -> None:
    """SinkError unless ``module`` can be found on the import path (found, not imported)."""
    if not package_found(module):
        raise SinkError(f"the {sink} sink needs {module}, which is not installed; {install_hint(extra)}")


def package_found(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (only its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a module set to None
        return False


def install_hint(extra: str) -> str:
    """The command that installs an extra of this package (it is not on PyPI: README)."""
    return f"pip install './[{extra}]' in the metrics-relay checkout"


def need_writable_dir(path: Path, what: str, fix: str, create: bool = False) -> Path:
    """SinkError unless ``path`` is a writable directory, the one probe of every sink's folders.

    At ``check()`` (``create`` False) nothing is made: the directory, or its nearest existing
    ancestor, must be one this process may write into. At ``open()`` (``create`` True) the directory
    is made and a file written in it and removed, which also catches what permission bits do not
    say (a read-only mount, a full disk, root squashed on NFS). ``what`` names it, ``fix`` says what
    to do. Returns the path, ``~`` expanded."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise SinkError(f"{what} {path} is not usable: it is not a directory; {fix}")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".relay-write-test-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SinkError(f"{what} {path} is not usable: {exc.strerror or exc}; {fix}") from None
        return path
    existing = path
    while not existing.exists():  # stops at the root, which exists
        existing = existing.parent
    if not existing.is_dir():
        raise SinkError(f"{what} {path} is not usable: {existing} is not a directory; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SinkError(f"{what} {path} is not usable: {existing} is not writable; {fix}")
    return path
