"""A tracker store's one-time set-up (MLflow's tables in a SQLite file, an Aim repository) made so
that a kill at any moment leaves the store either as it was or set up, never half made.

The tools' own set-up is not: MLflow's schema migrations on SQLite commit part of their DDL as
they go, so a process killed in the middle leaves tables that the next attempt fails to create again
(``table webhooks already exists``) and MLflow's own client cannot open the file any more; and two
processes migrating one file at once break it the same way. So a store is set up by one process
at a time (``setup_lock``, a lock the kernel frees when its holder dies), in a temporary sibling
that is renamed into place only once complete (``build_into_place``): a kill leaves only a
temporary, which the next set-up removes.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def _beside(target: Path, suffix: str) -> Path:
    """A hidden file next to ``target``: ``.NAME<suffix>``."""
    name = target.name if target.name.startswith(".") else f".{target.name}"
    return target.with_name(name + suffix)


@contextlib.contextmanager
def setup_lock(target: Path, what: str) -> Iterator[None]:
    """Hold the set-up lock of ``target`` (waiting, with a line in the log, while another process
    sets it up); the kernel frees it when its holder dies, however it dies."""
    fd = os.open(_beside(target, ".relay-setup.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s %s is being set up by another process; waiting for it", what, target)
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log.info("%s %s: waited %.1f s for the other process's set-up", what, target,
                     time.monotonic() - started)
        yield
    finally:
        os.close(fd)


def build_into_place(target: Path, build: Callable[[Path], Path]) -> None:
    """Under ``setup_lock``: ``build(tmp)`` makes the store at (or inside) ``tmp``, a fresh
    temporary sibling of ``target``, and returns the path it made, which is then renamed to
    ``target`` (replacing a file, or taking the name of a directory that does not exist).
    Temporaries that killed set-ups left are removed first; on any error this one is removed too."""
    # SQLite's -journal too
    for stale in target.parent.glob(_beside(target, ".relay-setup-*.tmp*").name):
        log.info("removing %s, left by a set-up that did not finish", stale)
        _remove(stale)
    tmp = _beside(target, f".relay-setup-{os.getpid()}.tmp")
    try:
        os.replace(build(tmp), target)
    finally:
        _remove(tmp)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the new name survives a power cut too
    finally:
        os.close(dir_fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=_gone_meanwhile)
    else:
        path.unlink(missing_ok=True)


def _gone_meanwhile(function: Callable[..., object], path: str, exc_info: tuple) -> None:
    """A file that vanished while the folder was being removed is fine (a killed set-up's own
    helper, SQLite rolling a journal back); anything else is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
