"""Helpers for the tests of the commands that watch a journal (relay tail, relay plot): journal
lines written as a relay writes them, a real ``relay`` command run to its end, and one read live."""
from __future__ import annotations

import os
import signal
import statistics
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
    """This environment without what changes how the viewers print (NO_COLOR, COLUMNS), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    env.update(extra)
    return env


def relay_cmd(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m relay ARGS`` run to its end; text output."""
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=timeout,
                          env=env or cli_env())


class LiveCommand:
    """A ``python -m relay ARGS`` left running, its stdout lines (and stderr) collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        # Ctrl-C as at a terminal: a test run started in the background (SIGINT ignored, and so
        # inherited ignored) must not make ``stop(SIGINT)`` a no-op.
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env or cli_env(),
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


def training_journal(path: Path, run: str, steps: int, *, t0: float, ranks: int = 2, straggler_every: int = 0,
                     mode: str = "wb") -> int:
    """A journal of a ``ranks``-rank job of ``steps`` logged steps, as a relay writes one: each rank's
    hello, train_begin, then per step each rank's own figures (stage rank), the Trainer's log (stage
    train) and the relay's cluster figures, a straggler named and cleared every ``straggler_every``
    steps, train_end. Written in pieces (a million lines need not fit in memory); the lines written."""
    seqs = dict.fromkeys([*range(ranks), RELAY_RANK], 0)
    written = 0

    def ev(rank: int, ts: float, kind: str, data: Any, **kw: Any) -> bytes:
        seqs[rank] += 1
        return encode_line(event(run, rank, seqs[rank] - 1, ts, kind, data, world_size=ranks, **kw))

    with open(path, mode) as fh:
        chunk = [ev(r, t0, "hello", {"pid": 1000 + r, "version": 1}) for r in range(ranks)]
        chunk.append(ev(0, t0, "lifecycle", {"event": "train_begin", "world_size": ranks, "max_steps": steps,
                                             "attempt": 0}, step=0))
        for step in range(1, steps + 1):
            ts = t0 + step * 0.5
            slow = 1 if straggler_every and step % straggler_every < 3 else None
            own = {r: 0.2 * (2.5 if r == slow else 1.0) for r in range(ranks)}
            for r in range(ranks):
                chunk.append(ev(r, ts, "metrics", {
                    "step_time": 0.5, "step_time_max": 0.5, "samples_per_second": 16.0, "steps": 1,
                    "rss_peak_mb": 812.5, "own_time": own[r], "outside_time": 0.01, "collective_wait": 0.5 - own[r],
                    "outside_wait": 0.001}, step=step, stage="rank"))
            chunk.append(ev(0, ts, "metrics", {"loss": 2.0 / (1 + step / 1000), "grad_norm": 0.9,
                                               "learning_rate": 1e-4 * (1 - step / (steps + 1)),
                                               "num_tokens": 2048.0 * step, "mean_token_accuracy": 0.5,
                                               "epoch": step / steps}, step=step, stage="train"))
            median = statistics.median(own.values())
            chunk.append(ev(RELAY_RANK, ts + 0.01, "metrics", {
                "step_time_min": 0.5, "step_time_median": 0.5, "step_time_max": 0.5, "step_time_spread": 1.0,
                "slowest_rank": 0, "ranks": ranks, "own_time_min": min(own.values()), "own_time_median": median,
                "own_time_max": max(own.values()), "own_time_spread": max(own.values()) / median,
                "own_slowest_rank": max(own, key=own.__getitem__)}, step=step, stage="cluster"))
            if straggler_every and step % straggler_every in (2, 5):
                said = ({"event": "straggler", "rank": 1, "by": "own_time", "cost_s": 0.3, "cost": 0.6, "window": 15}
                        if step % straggler_every == 2 else
                        {"event": "straggler_cleared", "rank": 1, "why": "recovered", "named_step": step - 3})
                chunk.append(ev(RELAY_RANK, ts + 0.02, "lifecycle", said, step=step, stage="cluster"))
            if len(chunk) >= 4096:
                fh.write(b"".join(chunk))
                written += len(chunk)
                chunk = []
        chunk.append(ev(0, t0 + steps * 0.5 + 1, "lifecycle", {"event": "train_end", "status": "completed",
                                                              "global_step": steps}, step=steps))
        fh.write(b"".join(chunk))
    return written + len(chunk)
