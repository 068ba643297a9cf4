"""The relay's last steps after SIGTERM (docs/relay.md, "Sinks at shutdown"): journal what ingest
still holds, then wait within ``--shutdown-timeout`` for every sink's process to apply what it was
handed. A sink's process never outlives its relay (relay/sinkhost/lifeline.py), so this wait is the
last chance a sink has to be complete; one stopped before it is named with what it lacks
(relay/sinkhost/behind.py)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.daemon.counters import Counters, log_stats, write_stats
from relay.daemon.ingest import Ingest
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import NAME as JOURNAL, Journal
from relay.sinkhost import behind
from relay.sinkhost.fan_out import FanOut
from relay.sinkhost.spec import SinkSpec

log = logging.getLogger("relay")


class Shutdown:
    """What ``Relay._shutdown`` does between the loop's end and closing the socket."""

    def __init__(self, ingest: Ingest, journal: Journal, deadletters: DeadLetters,
                 counters: Counters, fan_out: FanOut, specs: list[SinkSpec], timeout: float,
                 snapshot: Callable[..., dict[str, Any]], stats_path: Path) -> None:
        self.ingest, self.journal, self.fan_out, self.specs = ingest, journal, fan_out, specs
        self.deadletters, self.counters = deadletters, counters
        self.timeout, self.snapshot, self.stats_path = timeout, snapshot, stats_path
        #: seconds into the wait for the sinks when a progress line is due
        self._line_due = behind.PROGRESS_EVERY

    def run(self, stats_window: float) -> None:
        """Journal, drain, close the journal; the final stats written and logged."""
        ingest = self.ingest
        ingest.close_runs(time.monotonic())
        log.info("shutting down: flushing %d events", ingest.pending)
        deadline = time.monotonic() + self.timeout
        ingest.commit(time.monotonic(), retry_now=True)
        while ingest.pending and time.monotonic() < deadline:
            time.sleep(0.1)  # each retry when the journal's backoff says
            ingest.commit(time.monotonic())
        if ingest.pending:
            log.error("shutting down with %d events the journal could not take; their clients "
                      "still hold them and will resend to the next relay", ingest.pending)
        self.fan_out.close(deadline, lambda waited: self._progress(stats_window, waited))
        try:
            self.journal.close()
        except OSError as exc:
            self.counters.journal_errors += 1
            log.error("journal close failed: %s", exc)
        self.deadletters.close()
        snap = self.snapshot(stats_window, final=True)
        snap.update(self._lacking(snap["sinks"]))
        if snap["behind"]:
            log.error("%s", behind.report(snap["behind"], snap["replay"], snap["sinks"]))
        log_stats(snap, final=True)
        write_stats(self.stats_path, snap)

    def _progress(self, stats_window: float, waited: float) -> None:
        """Every second or so while the sinks drain: the stats file; each PROGRESS_EVERY s, a log
        line."""
        snap = self.snapshot(stats_window)
        line = behind.progress_line(_others(snap["sinks"]), waited, self.timeout)
        snap.update(stopping=True, progress=line, **self._lacking(snap["sinks"]))
        write_stats(self.stats_path, snap)
        if waited >= self._line_due:
            self._line_due = waited + behind.PROGRESS_EVERY
            log.info("%s", line)

    def _lacking(self, sinks: dict[str, Any]) -> dict[str, Any]:
        """``behind``: the sinks not complete and the events each lacks; ``replay``: the command
        that completes them from the journal."""
        lacks = behind.behind(_others(sinks))
        replay = behind.replay_command(self.journal.path, self.specs, list(lacks))
        return {"behind": lacks, "replay": replay}


def _others(sinks: dict[str, Any]) -> dict[str, Any]:
    """The sinks but the journal (complete by construction: its clients were acknowledged)."""
    return {name: stats for name, stats in sinks.items() if name != JOURNAL}
