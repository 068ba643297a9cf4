"""Relays started warm for bench/crash.py: a process that imported the relay once forks each relay
the crash run starts, so a start costs the relay's own set-up (binding, recovering its journal),
not a fresh interpreter's imports (0.15 CPU-s, most of a killed relay's life). Each relay is what
``python -m relay ARGV`` runs (``relay.cli.main``), in a process group of its own, in the checkout,
its output appended to a log file. The forker reaps its relays: their CPU is its children's, and
becomes its parent's when the forker ends (``close``).

The forker reads one JSON request a line on stdin (``{"argv": [...], "log": PATH}``) and writes
one JSON line for each: ``{"pid": PID}`` when a relay is forked, ``{"exit": PID, "status": CODE}``
when one ends (minus the signal that killed it, as ``subprocess`` says). At the end of its stdin it
SIGKILLs the relays still running, reaps them and exits.

    python -m bench.relay_forker
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench.common import ROOT


def _relay(argv: list[str], log: str) -> None:
    """The forked relay: ``python -m relay argv``'s work, to its exit status (never returns)."""
    from relay.cli.main import main

    os.setpgid(0, 0)  # the forker sets it too: whichever runs first
    os.chdir(ROOT)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for target, fd in ((0, null), (1, out), (2, out)):
        os.dup2(fd, target)
    os.close(null)
    os.close(out)
    code = 0
    try:
        main(args=argv, prog_name="relay")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # noqa: BLE001 - as the interpreter shows an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    """Fork a relay for each request; say when each ends; at the end of stdin, end them all."""
    import relay.cli.main  # noqa: F401 - the imports every relay would pay again

    def say(**message: object) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    running: set[int] = set()
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.02 if running else None)
        if readable:
            line = sys.stdin.readline()
            if not line:
                break
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _relay(request["argv"], request["log"])
            # its group before its pid is said, as a shell does: a kill_group() the moment the pid
            # is known found no group while the child was not yet run (a crash round at load 8 hung)
            with contextlib.suppress(ProcessLookupError):  # it ended already
                os.setpgid(pid, pid)
            running.add(pid)
            say(pid=pid)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            say(exit=pid, status=code)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    for pid in running:
        os.waitpid(pid, 0)


class RelayForker:
    """The crash run's side: the forker process, and each relay's exit status as it reports them."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.relay_forker"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.status: dict[int, int] = {}
        self.pending = b""  # what was read of the forker's output past the last whole line

    def start(self, argv: list[str], log: Path) -> ForkedRelay:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            message = self._read(None)
            if "pid" in message:
                self.status.pop(message["pid"], None)  # an earlier relay's, if the pid is reused
                return ForkedRelay(self, message["pid"])

    def _read(self, timeout: float | None) -> dict:
        """The forker's next message (``{}`` if none came within ``timeout``); exits recorded."""
        assert self.proc.stdout is not None
        while b"\n" not in self.pending:
            readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not readable:
                return {}
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError(f"the relay forker ended (exit {self.proc.wait(30)})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        message = json.loads(line)
        if "exit" in message:
            self.status[message["exit"]] = message["status"]
        return message

    def pump(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status, waiting up to ``timeout`` for it (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.status:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._read(left)
        return self.status[pid]

    def close(self) -> None:
        """The relays still running killed, the forker ended and reaped: their CPU is now counted
        as this process's children's."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


class ForkedRelay:
    """One forked relay, held as the ``subprocess.Popen`` of ``python -m relay``."""

    def __init__(self, forker: RelayForker, pid: int) -> None:
        self.forker, self.pid = forker, pid

    @property
    def returncode(self) -> int | None:
        return self.forker.status.get(self.pid)

    def poll(self) -> int | None:
        return self.forker.pump(self.pid, 0)

    def wait(self, timeout: float | None = None) -> int:
        status = self.forker.pump(self.pid, timeout)
        if status is None:
            raise subprocess.TimeoutExpired("relay", timeout or 0)
        return status

    def terminate(self) -> None:
        os.kill(self.pid, signal.SIGTERM)


if __name__ == "__main__":
    serve()
