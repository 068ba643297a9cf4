"""Cheap checks a sink's ``check()`` makes before the relay listens: no import of the tool (that
takes seconds: it happens in the sink's own process), no file created, nothing sent anywhere; and
the same directory probe again at ``open()``, where it may create and write, and the tool's
imports there; and, for a sink that reaches into a tool's private API, one line when the installed
tool is outside the versions the sink was tested with."""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from sinks.base import SinkError

log = logging.getLogger(__name__)


def need_package(module: str, sink: str, extra: str, tested: tuple[str, str] | None = None) -> None:
    """SinkError unless ``module`` can be found on the import path (found, not imported). A sink
    that uses the tool's private API passes ``tested`` (the releases it was tested with, what it
    uses: see ``untested``), and the one line is logged as a warning when another release is
    installed."""
    if not package_found(module):
        raise SinkError(f"the {sink} sink needs {module}, which is not installed; "
                        f"{install_hint(extra)}")
    line = untested(*tested) if tested is not None else None
    if line is not None:
        log.warning("%s sink: %s", sink, line)


@contextlib.contextmanager
def tool_import(sink: str, tool: str) -> Iterator[None]:
    """Around the tool's imports at ``open()``: an ImportError becomes a SinkError that says how to
    install the extra named as the sink (the relay logs it and opens the sink again later)."""
    try:
        yield
    except ImportError as exc:
        raise SinkError(f"the {sink} sink needs {tool}, which is not importable ({exc}): "
                        f"{install_hint(sink)}") from None


def package_found(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (only its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a module set to None
        return False


def untested(requirement: str, uses: str) -> str | None:
    """The one line saying the installed tool is outside ``requirement`` (``"aim>=3.29,<3.30"``: the
    versions a sink was tested with, as Lightning's RequirementCache states an integration's), or
    None: inside, or not installed (need_package says that). ``uses`` names the private API the sink
    relies on, which a release may change without notice. Reads the package's metadata only."""
    from packaging.requirements import Requirement  # (a few ms, only for the sinks that ask)

    wanted = Requirement(requirement)
    try:
        installed = importlib.metadata.version(wanted.name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if wanted.specifier.contains(installed, prereleases=True):
        return None
    return (f"{wanted.name} {installed} is installed, but this sink was tested with {requirement} "
            f"and uses its private API ({uses}), which may have changed: if the sink fails or "
            f"writes wrong, pip install '{requirement}'")


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
