"""A sink's process lives only as long as the relay that started it, and alone on its journal
(docs/relay.md, "What holds, however the relay dies").

    python -m relay.sinkhost.lifeline RELAY_PID FD NAME MODULE ARGS...

The supervisor starts the sink in its own process group and SIGKILLs the group when the relay
dies, told by ``PR_SET_PDEATHSIG`` (Linux) and by end-of-file on a pipe only the relay holds. Linux
sends the signal when the relay's *thread* that started it ends, so a SIGTERM is acted on only once
the relay is no longer the parent (which also leaves a service manager's stray SIGTERM to the
relay's drain). The sink asks for SIGKILL when its supervisor dies. Nothing is drained: the journal
holds what the sink had not written.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 0.2  # how often the supervisor looks whether its sink exited (the pipe wakes it at once)


# Run in the relay's process.

_pipe: tuple[int, int, int] | None = None  # (this process's pid, read end, write end)
_pipe_lock = threading.Lock()


def spawn(name: str, module: str, args: list[str], **popen: Any) -> subprocess.Popen:
    """``python -m MODULE ARGS...`` under its supervisor, started as ``subprocess.Popen(...,
    **popen)`` would start it; the Popen is the supervisor's, whose exit status is the sink's.
    ``name`` says what it is in the one line it writes if the relay dies."""
    global _pipe
    with _pipe_lock:
        if _pipe is None or _pipe[0] != os.getpid():  # a forked copy of the relay makes its own
            # both ends close-on-exec; a supervisor gets the read end only
            _pipe = (os.getpid(), *os.pipe())
    fd = _pipe[1]
    command = [sys.executable, "-m", __name__, str(os.getpid()), str(fd), name, module, *args]
    return subprocess.Popen(command, pass_fds=(fd,), start_new_session=True,
                            preexec_fn=ask_kernel(signal.SIGTERM), **popen)


def kill(proc: subprocess.Popen) -> None:
    """Kill a sink's process, its supervisor and whatever its tool started (one process group)."""
    with contextlib.suppress(ProcessLookupError):  # all gone already
        os.killpg(proc.pid, signal.SIGKILL)


def ask_kernel(sig: int) -> Callable[[], None] | None:
    """Linux: what a child runs between fork and exec to be sent ``sig`` when the thread that
    started it ends (the signal outlives the exec). One system call through a function found
    beforehand: nothing there may take a lock another thread of the parent could hold."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def ask() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)  # if it fails, the pipe still tells
    return ask


# Run in the supervisor's process.

def supervise(relay_pid: int, fd: int, name: str, command: list[str]) -> None:
    """Run ``command`` (the sink) in this process group until it exits, then exit as it did; kill
    the group the moment the relay ``relay_pid`` is gone (the kernel's SIGTERM, or end-of-file on
    ``fd``)."""
    # the kernel's SIGTERM; a stray one (the relay lives) is the relay's to act on
    def relay_gone(*_: Any) -> None:
        if os.getppid() != relay_pid:
            _end_group(name)

    # started by hand, not by spawn(): the group to kill is ours alone
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    # Ctrl-C reaches the relay's group: the relay decides
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, relay_gone)
    if os.getppid() != relay_pid:  # it died before the kernel was asked: nobody would tell us
        _end_group(name)
    # fds 0-2: the relay's pipes
    sink = subprocess.Popen(command, preexec_fn=ask_kernel(signal.SIGKILL))
    devnull = os.open(os.devnull, os.O_RDWR)
    # the relay's pipes are the sink's alone: it sees their ends close with the sink
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    while True:
        if select.select([fd], [], [], POLL_S)[0] and not os.read(fd, 1):
            _end_group(name)
        pid, status = os.waitpid(sink.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:  # killed by a signal: so is this process, and the relay sees the same
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code)


def _end_group(name: str) -> None:
    with contextlib.suppress(OSError):  # the log went with the relay
        os.write(2, f"{name} (supervisor pid {os.getpid()}): the relay that started it is gone; "
                    "stopping its processes now (what it had not written is in the journal: the "
                    "next relay's sink catches it up)\n".encode())
    os.killpg(0, signal.SIGKILL)


def hold_sink_lock(path: Path, name: str) -> int:
    """Take ``path`` (flock) for this process's lifetime, waiting for the sink process of an earlier
    relay on the same journal to stop first; returns the descriptor to keep open."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        log.warning("sink %s: waiting for the sink process of an earlier relay (pid %s) to stop "
                    "before opening (it holds %s)", name, holder, path)
        started = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        log.info("sink %s: the earlier sink process stopped after %.1f s; opening", name,
                 time.monotonic() - started)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


if __name__ == "__main__":  # python -m relay.sinkhost.lifeline RELAY_PID FD NAME MODULE ARGS...
    relay, lifeline, label, module, *rest = sys.argv[1:]
    supervise(int(relay), int(lifeline), label, [sys.executable, "-m", module, *rest])
