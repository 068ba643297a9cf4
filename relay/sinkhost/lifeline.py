"""A sink's process lives only as long as the relay that started it, and alone on its journal.

The relay's side, ``spawn``: every sink process of the relay is started from one thread that lives
as long as the relay, through this module's launcher, and inherits the read end of a pipe whose
write end only the relay holds and never writes. (Linux sends the parent-death signal when the
*thread* that started a child ends: started from a sink's opener thread, which ends once the sink is
open, or from its feeding thread, which ends at shutdown before the child has drained, the child
would be killed with that thread.)

The child's side: on Linux it asks the kernel, between fork and exec, to SIGKILL it the moment the
relay is gone, however the relay died (``prctl(PR_SET_PDEATHSIG)``; the signal outlives the exec).
Then the launcher (``python -m relay.sinkhost.lifeline RELAY_PID FD NAME MODULE ARGS...``), before
anything slow (importing a tracker took seconds under load), asks again where that failed, ends the
process if the relay died before it was asked (its pid is no longer the parent's), and on any
system starts a thread that blocks reading the pipe, which reads end-of-file once the kernel has
closed the dead relay's end, and ends the process; then it runs MODULE as ``__main__``. Nothing is
drained then: the journal holds every event the sink had not written, and the next relay's sink
catches it up (relay/sinkhost/catch_up.py); a store survives that kill as it survives any, its
one-time set-up included (sinks/store_setup.py).

``hold_sink_lock``: a relay started again at once can start a sink's process before the dead
relay's is gone; the new one waits for the old one's lock (and says so in the log), so two sink
processes never write the same store for one journal together.
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import queue
import runpy
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: The exit status of a sink process whose relay is gone (EX_TEMPFAIL: the next relay's sink takes
#: over). Nobody reads it but the process that adopts it; it tells it apart in a process listing.
RELAY_GONE = 75


class _Spawner:
    """The one thread that starts this relay's sink processes, and the pipe they watch."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked copy of the relay has no such thread: it makes its own
        self.read_end, self.write_end = os.pipe()  # both close-on-exec; the child gets the read end only
        self.preexec = _preexec()
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="sink-spawner", daemon=True).start()

    def _serve(self) -> None:
        while True:
            start, result, done = self._requests.get()
            try:
                result.append(start())
            except BaseException as exc:  # handed to the caller, raised there: this thread must live on
                result.append(exc)
            done.set()

    def run(self, start: Callable[[], Any]) -> Any:
        result: list[Any] = []
        done = threading.Event()
        self._requests.put((start, result, done))
        done.wait()
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _preexec() -> Callable[[], None] | None:
    """Linux: what the child runs between fork and exec, so that it is tied from its first moment
    (the launcher's own request comes only once the interpreter has started: under load that took
    over a second, in which a dead relay's child lived on). One system call through a function found
    beforehand: nothing there may take a lock another thread of the relay could hold."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def ask_kernel() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # if it fails, the launcher asks again and says so
    return ask_kernel


def spawn(name: str, module: str, args: list[str], **popen: Any) -> subprocess.Popen:
    """``python -m MODULE ARGS...`` as ``subprocess.Popen(..., **popen)`` would start it, through the
    launcher, from the relay's long-lived spawner thread: tied to this process from its first moment.
    ``name`` says what it is in the one line it writes if it outlives the relay."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():
            _spawner = _Spawner()
    spawner = _spawner
    fd = spawner.read_end
    command = [sys.executable, "-m", __name__, str(os.getpid()), str(fd), name, module, *args]
    return spawner.run(lambda: subprocess.Popen(command, pass_fds=(fd,), preexec_fn=spawner.preexec, **popen))


def tie_to_relay(relay_pid: int, fd: int, name: str) -> None:
    """End this process as soon as the relay ``relay_pid`` that started it is gone (see the module's docstring)."""
    die_with_parent(name)
    if os.getppid() != relay_pid:  # it died before the kernel was asked: nobody would tell us
        _gone(name)
    watch_lifeline(fd, name)


def die_with_parent(name: str) -> bool:
    """Linux: have the kernel SIGKILL this process when the thread that started it ends."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("%s: no parent-death signal (prctl: %s); the pipe from the relay is watched instead",
                    name, os.strerror(ctypes.get_errno()))
        return False
    return True


def watch_lifeline(fd: int, name: str) -> None:
    """A thread that ends this process once the relay's end of the pipe ``fd`` is closed."""
    os.set_inheritable(fd, False)  # the sink's own helpers (wandb-core) need not hold it
    threading.Thread(target=_watch, args=(fd, name), name="relay-lifeline", daemon=True).start()


def _watch(fd: int, name: str) -> None:
    """Block until the relay's end of the pipe is closed (the relay never writes to it), then exit."""
    while os.read(fd, 1):
        pass
    _gone(name)


def _gone(name: str) -> None:
    try:
        os.write(2, f"{name} (pid {os.getpid()}): the relay that started it is gone; stopping now "
                    "(what it had not written is in the journal: the next relay's sink catches it up)\n".encode())
    except OSError:  # the log went with the relay
        pass
    os._exit(RELAY_GONE)


def hold_sink_lock(path: Path, name: str) -> int:
    """Take ``path`` (flock) for this process's lifetime, waiting for the sink process of an earlier
    relay on the same journal to stop first; returns the descriptor to keep open."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        log.warning("sink %s: waiting for the sink process of an earlier relay (pid %s) to stop before opening "
                    "(it holds %s)", name, holder, path)
        started = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        log.info("sink %s: the earlier sink process stopped after %.1f s; opening", name, time.monotonic() - started)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _launch(argv: list[str]) -> None:
    """``RELAY_PID FD NAME MODULE ARGS...``: tie this process to the relay, then run MODULE as ``__main__``."""
    relay_pid, fd, name, module, *args = argv
    tie_to_relay(int(relay_pid), int(fd), name)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    from relay.sinkhost.lifeline import _launch as launch  # the module's one copy, which the child imports too

    launch(sys.argv[1:])
