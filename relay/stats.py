"""The relay's counters: what came in, what was written, and every way an event did not make it.

Logged periodically and at shutdown, and written atomically to a JSON file next to the journal
so scripts and tests can read them without parsing logs.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("relay.stats")


class Counters:
    """Plain attributes and counters, touched only by the ingest thread (sink workers own theirs)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.frames = 0
        self.events = 0
        self.written = 0
        self.derived = 0  # events the relay made itself (relay/cluster.py), journaled with the others
        self.duplicates = 0
        self.acks_sent = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        self.deadletter_overflow = 0
        self.journal_errors = 0
        self.reused_run_ids = 0
        self.runs_evicted = 0  # forgotten to stay within --max-runs
        self.memory_resets = 0  # every connection dropped to stay within --max-memory
        self.bad_drop_reports = 0  # client loss reports naming seqs they cannot have dropped
        self.client_dropped: dict[tuple[str, int], int] = {}
        self._client_dropped_forgotten = 0  # of runs whose state was forgotten

    def forget_client_drops(self, key: tuple[str, int]) -> None:
        """Keep a forgotten rank's drop count in the total without keeping the rank."""
        self._client_dropped_forgotten += self.client_dropped.pop(key, 0)

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
            "client_dropped": sum(self.client_dropped.values()) + self._client_dropped_forgotten,
            "ranks": ranks,
            "sinks": sinks,
        }


def write_stats(path: Path, snapshot: dict[str, Any]) -> None:
    """Replace the stats file atomically so a reader never sees a partial document. A full or
    read-only disk must not stop the relay: the failure is logged and the counters live on."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(snapshot, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write stats file %s: %s", path, exc.strerror)
        tmp.unlink(missing_ok=True)


def log_stats(snapshot: dict[str, Any], final: bool = False) -> None:
    sinks = ", ".join(f"{name}: {s['written']} written, {s['errors']} errors, {s['dropped']} dropped"
                      + (f", {s['dead_lettered']} dead-lettered" if s.get("dead_lettered") else "")
                      for name, s in snapshot["sinks"].items())
    log.info("%s: %d events in %d frames, %d written, %d duplicates, %d rejected %s, "
             "%d dropped by clients, %d ranks; sinks: %s",
             "final" if final else "stats", snapshot["events"], snapshot["frames"], snapshot["written"],
             snapshot["duplicates"], snapshot["rejected_total"], snapshot["rejected"] or "",
             snapshot["client_dropped"], snapshot["ranks"], sinks or "none")
