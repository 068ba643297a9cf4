"""Helpers for the tests of the commands that watch a journal (relay tail, relay plot): journal
lines written as a relay writes them, a real ``relay`` command run to its end, and one read live."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from relay.wire.lines import encode_line
from sinks.events import RELAY_RANK

__all__ = ["RELAY_RANK", "LiveCommand", "event", "relay_cmd", "write_journal"]


def event(run: str, rank: int, seq: int, ts: float, kind: str, data: Any, *, step: int | None = None,
          stage: str | None = None, world_size: int = 2) -> dict[str, Any]:
    """A whole event envelope, in the journal's field order."""
    return {"v": 1, "run": run, "rank": rank, "local_rank": rank if rank != RELAY_RANK else 0,
            "world_size": world_size, "host": "node-a", "seq": seq, "ts": ts, "type": kind, "step": step,
            "epoch": None, "stage": stage, "data": data}


def write_journal(path: Path, events: list[dict[str, Any]]) -> bytes:
    """Write ``events`` as the relay would (encode_line); the bytes written."""
    blob = b"".join(encode_line(e) for e in events)
    path.write_bytes(blob)
    return blob


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(extra)
    return env


def relay_cmd(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m relay ARGS`` run to its end; text output."""
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=timeout,
                          env=env or cli_env())


class LiveCommand:
    """A ``python -m relay ARGS`` left running, its stdout lines (and stderr) collected as they come."""

    def __init__(self, *args: str) -> None:
        # Ctrl-C as at a terminal: a test run started in the background (SIGINT ignored, and so
        # inherited ignored) must not make ``stop(SIGINT)`` a no-op.
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=cli_env(),
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[bytes] = []
        self.errors: list[bytes] = []
        self._readers = [threading.Thread(target=self._read, args=(pipe, into), daemon=True)
                         for pipe, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.errors))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: Any, into: list[bytes]) -> None:
        for line in pipe:
            into.append(line)

    def text(self) -> str:
        return b"".join(self.lines).decode()

    def stderr(self) -> str:
        return b"".join(self.errors).decode()

    def stop(self, sig: int, timeout: float = 30) -> tuple[int, str]:
        """Send ``sig``; the exit status and everything it wrote on stderr."""
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        return code, self.stderr()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
