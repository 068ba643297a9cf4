"""The pytest side of warm ranks (tests/warm_launch.py): a job started as ``torchrun ARGS`` would
start it, by a serving process that imported torch, transformers, trl and peft once per pytest
process, and a handle on it that does what a ``subprocess.Popen`` does (``pid``, ``poll``, ``wait``,
``send_signal``, ``kill``, ``stdout``). The scenario tests run their jobs here; the tests of the
command line itself (``torchrun ... -m trainer``'s usage errors, the seed's command, the demo) keep
real torchrun (docs/development.md, "Warm ranks", says which is which).

CPU: a job's, its ranks' included, is counted in the test that ran it (``budget.charge``, from what
the serving process's ``wait4`` says), the serving process's imports in the first test that asked
for it; when it ends, what was charged is taken back, since its whole CPU is then reaped."""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import budget
from warm_launch import PIDS_ENV

SERVER = Path(__file__).resolve().parent / "warm_launch.py"
READY_WAIT = 600  # a wait, not a limit: the imports take 10 CPU-s, minutes at load 30


class WarmJob:
    """A job the serving process forked: torchrun's agent, whose ranks are its forks."""

    def __init__(self, launcher: WarmLauncher, pid: int, stdout: IO[str] | None, pids: Path) -> None:
        self.launcher, self.pid, self.stdout, self.pids = launcher, pid, stdout, pids
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.launcher.pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"warm job {self.pid}", timeout or 0)
            self.launcher.pump(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float) -> tuple[str, None]:
        """The rest of ``stdout`` (a pipe) and the exit, within ``timeout`` s (``Popen.communicate``)."""
        assert self.stdout is not None
        deadline = time.monotonic() + timeout
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(self.stdout.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise subprocess.TimeoutExpired(f"warm job {self.pid}", timeout)
        self.wait(max(deadline - time.monotonic(), 0.001))
        return "".join(rest), None

    def rank_pids(self) -> dict[int, int]:
        """Each rank's pid, as the rank wrote it at its start (a fork's environment is not in /proc)."""
        return {int(path.stem[4:]): int(path.read_text()) for path in self.pids.glob("rank*.pid")
                if path.read_text()}


class WarmLauncher:
    """The serving process of one pytest process, and the jobs it started."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env, self.cwd = env, cwd
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                     env=env, cwd=cwd, stdin=subprocess.DEVNULL)
        theirs.close()
        self.jobs: dict[int, WarmJob] = {}
        self.charged = 0.0
        ready = self._receive(READY_WAIT)
        if ready is None or "ready" not in ready:
            raise RuntimeError(f"the warm launcher did not start: {ready} (exit {self.proc.poll()})")
        self._charge(ready["ready"])

    def _charge(self, seconds: float) -> None:
        budget.charge(seconds)
        self.charged += seconds

    def _receive(self, timeout: float | None) -> dict | None:
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            return None
        message = self.sock.recv(1 << 16)
        if not message:
            raise RuntimeError(f"the warm launcher ended (exit {self.proc.wait(30)})")
        return json.loads(message)

    def pump(self, timeout: float | None) -> None:
        """Take the serving process's messages until none is waiting (the first within ``timeout``)."""
        message = self._receive(timeout)
        while message is not None:
            self._take(message)
            message = self._receive(0)

    def _take(self, message: dict) -> int | None:
        """A job's end (its status set, its CPU charged, its pid files gone); a job's start: its pid."""
        if "exit" in message:
            self._charge(message["cpu"])
            job = self.jobs.pop(message["exit"])
            job.returncode = message["status"]
            shutil.rmtree(job.pids, ignore_errors=True)
        return message.get("pid")

    def start(self, argv: list[str], env: dict[str, str], *, stdout: int | IO | None = None,
              stderr: int | IO | None = None) -> WarmJob:
        """``torchrun argv`` with ``env``; ``stdout``/``stderr``: a file, ``subprocess.PIPE`` (stdout
        only: read ``job.stdout``), ``subprocess.STDOUT`` (stderr only) or None (this process's)."""
        ours = None
        if stdout == subprocess.PIPE:
            ours, out_fd = os.pipe()
        else:
            out_fd = os.dup(stdout.fileno() if stdout is not None and not isinstance(stdout, int) else 1)
        err_fd = os.dup(out_fd if stderr == subprocess.STDOUT else
                        stderr.fileno() if stderr is not None and not isinstance(stderr, int) else 2)
        in_fd = os.open(os.devnull, os.O_RDONLY)
        pids = Path(tempfile.mkdtemp(prefix="warm-ranks-"))
        request = {"argv": argv, "env": {**env, PIDS_ENV: str(pids)}, "cwd": str(self.cwd)}
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], [in_fd, out_fd, err_fd])
        finally:
            for fd in (in_fd, out_fd, err_fd):
                os.close(fd)
        pid = None
        while pid is None:
            message = self._receive(READY_WAIT)
            if message is None:
                raise RuntimeError("the warm launcher did not start the job")
            pid = self._take(message)
        job = WarmJob(self, pid, os.fdopen(ours, "r") if ours is not None else None, pids)
        self.jobs[job.pid] = job
        return job

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(torchrun argv, capture_output=True, text=True, timeout=timeout)``."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            job = self.start(argv, env, stdout=out, stderr=err)
            try:
                job.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
                raise
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(["torchrun", *argv], job.returncode, out.read(), err.read())

    def close(self) -> None:
        """Every job still running killed, the serving process ended and reaped: its CPU is counted
        as a reaped child's now, so what was charged is taken back."""
        for pid in list(self.jobs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.sock.close()
        self.proc.wait(60)
        budget.charge(-self.charged)

