"""The relay's counters: what came in, what was written, and every way an event did not make it
(docs/relay.md, "Counters"). Rates and "ranks connected" are figures over time: ``Rate`` keeps the
samples for the first, ``run_view`` reads the second off each rank's last activity.
"""
from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from relay.daemon.status import format_line
from sinks.events import RELAY_RANK
from sinks.files import write_atomic

log = logging.getLogger("relay.daemon.counters")

RUNS_LISTED = 100  # runs the snapshot details (the most recently active); ``runs`` counts them all
MAX_FORGOTTEN = 4096  # forgotten ranks whose client-reported drops are kept by rank


class Counters:
    """Plain attributes and counters only the ingest thread touches (sink workers own theirs)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.frames = 0
        self.events = 0
        self.written = 0
        #: events the relay made itself (relay/daemon/cross_rank.py), journaled with the others
        self.derived = 0
        self.duplicates = 0
        self.acks_sent = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        self.deadletter_overflow = 0
        self.journal_errors = 0
        self.reused_run_ids = 0
        self.runs_evicted = 0  # forgotten to stay within --max-runs
        self.memory_resets = 0  # every connection dropped to stay within --max-memory
        self.bad_drop_reports = 0  # client loss reports naming seqs they cannot have dropped
        #: streams whose owning connection went away (relay/daemon/owners.py)
        self.owners_released = 0
        #: status requests answered (relay/daemon/status.py); never counted as frames or rejects
        self.status_answered = 0
        self.status_unanswered = 0  # beyond the answer budget, or undeliverable
        self.client_dropped: dict[tuple[str, int], int] = {}
        #: of ranks whose run was forgotten, the last MAX_FORGOTTEN by rank (a run met again takes
        #: its figure back instead of counting it twice), the rest summed
        self._forgotten: dict[tuple[str, int], int] = {}
        self._client_dropped_forgotten = 0

    def forget_client_drops(self, key: tuple[str, int]) -> None:
        """Keep a forgotten rank's drop count in the total without keeping the rank."""
        dropped = self.client_dropped.pop(key, 0)
        if dropped:
            self._forgotten[key] = dropped
            if len(self._forgotten) > MAX_FORGOTTEN:
                self._client_dropped_forgotten += self._forgotten.pop(next(iter(self._forgotten)))

    def client_reported(self, key: tuple[str, int], dropped: int) -> bool:
        """A rank's client said it dropped ``dropped`` events in all (a live ``stats`` event, or
        the journal's last word on a rank met again); True if that is more than was known."""
        known = max(self.client_dropped.get(key, 0), self._forgotten.pop(key, 0))
        if max(known, dropped) > 0:
            self.client_dropped[key] = max(known, dropped)
        return dropped > known

    def snapshot(self, sinks: dict[str, dict[str, int]], ranks: int) -> dict[str, Any]:
        return {
            "uptime_s": round(time.time() - self.started, 3),
            "frames": self.frames,
            "events": self.events,
            "written": self.written,
            "derived": self.derived,
            "duplicates": self.duplicates,
            "acks_sent": self.acks_sent,
            "rejected": dict(self.rejected),
            "rejected_total": sum(self.rejected.values()),
            "deadletter_overflow": self.deadletter_overflow,
            "journal_errors": self.journal_errors,
            "reused_run_ids": self.reused_run_ids,
            "runs_evicted": self.runs_evicted,
            "memory_resets": self.memory_resets,
            "bad_drop_reports": self.bad_drop_reports,
            "owners_released": self.owners_released,
            "status_answered": self.status_answered,
            "status_unanswered": self.status_unanswered,
            "client_dropped": (sum(self.client_dropped.values()) + sum(self._forgotten.values())
                               + self._client_dropped_forgotten),
            "ranks": ranks,
            "sinks": sinks,
        }


def run_view(runs: Iterable[str], run_ranks: Mapping[str, list[int]],
             active: Mapping[tuple[str, int], float], world: Mapping[str, int],
             ended: Mapping[str, str], now: float,
             window: float) -> dict[str, dict[str, Any]]:
    """Per run (in the order given: most recently active first), up to RUNS_LISTED: its ranks that
    sent something within ``window`` seconds, those it has state for, its world size (None until
    known), the seconds since its last event and its state: how it ended, else "running" (the status
    line calls one silent for long "stale", relay/daemon/status.py)."""
    view: dict[str, dict[str, Any]] = {}
    for run in runs:
        if len(view) >= RUNS_LISTED:
            break
        seen = [active.get((run, rank)) for rank in run_ranks.get(run, ()) if rank != RELAY_RANK]
        last = max((t for t in seen if t is not None), default=None)
        view[run] = {"connected": sum(1 for t in seen if t is not None and now - t <= window),
                     "ranks": len(seen), "world_size": world.get(run),
                     "idle_s": None if last is None else round(now - last, 1),
                     "state": ended.get(run, "running")}
    return view


def write_stats(path: Path, snapshot: dict[str, Any]) -> None:
    """Replace the stats file atomically so a reader never sees a partial document. A full or
    read-only disk must not stop the relay: the failure is logged and the counters live on."""
    try:
        write_atomic(path, json.dumps(snapshot, indent=1, sort_keys=True))
    except OSError as exc:
        log.warning("cannot write stats file %s: %s", path, exc.strerror)


def log_stats(snapshot: dict[str, Any], final: bool = False) -> None:
    """One INFO line: the status line with every counter's detail."""
    log.info("%s: %s", "final" if final else "stats", format_line(snapshot, detail=True))
