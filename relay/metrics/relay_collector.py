"""What ``relay serve --metrics-bind`` shows: each run's health and the relay's own, built at scrape
time from the relay's state, never on the ingest path (docs/monitoring.md, "How it is read, and
what it costs ingest").

The runs' figures are read live (relay/daemon/run_health.py, relay/daemon/cross_rank.py's
``standing``: both safe to read from this thread); the relay's counters and its sinks' figures are
the ingest thread's own, so it hands over a snapshot once a second (``take``, hooked on
``Relay.each_second``). A scrape's work is bounded by ``max_runs`` runs and RANK_SERIES ranks in
all, the most recent runs first while RANK_SERIES lasts.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.metrics_core import Metric

from relay.daemon.cross_rank import Cluster
from relay.daemon.run_health import RunHealth, RunView
from relay.metrics.table import Families

#: Ranks with per-rank series in one scrape, all runs together (a rendering's cost grows with them).
RANK_SERIES = 2048


class RelayCollector:
    """A prometheus_client collector over one relay's state."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], health: RunHealth | None,
                 cluster: Cluster | None, *, max_memory_mib: int, max_runs: int, max_ranks: int,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._snapshot = snapshot
        self._taken: dict[str, Any] | None = None
        self.health = health
        self.cluster = cluster
        self.max_memory = max_memory_mib * 2**20
        self.max_runs = max_runs
        self.max_ranks = max_ranks
        self._clock = clock
        self._wall_clock = wall_clock

    def take(self) -> None:
        """On the ingest thread, once a second: the counters and sinks a scrape will show."""
        self._taken = self._snapshot()

    def collect(self) -> Iterable[Metric]:
        out = Families()
        snap = self._taken
        if snap is not None:
            relay_figures(out, snap, self.max_memory)
        if self.health is not None:
            now, wall = self._clock(), self._wall_clock()
            budget = RANK_SERIES
            for run, view in self.health.view(self.max_runs).items():
                per_rank = view.world_size <= min(self.max_ranks, budget)
                budget -= view.world_size if per_rank else 0
                self._run(out, run, view, now, wall, per_rank)
        return out.all()

    def _run(self, out: Families, run: str, view: RunView, now: float, wall: float,
             per_rank: bool) -> None:
        out.add("relay_run_world_size", view.world_size, run)
        out.add("relay_run_last_step", view.last_step, run)
        if view.last_step_at is not None:
            out.add("relay_run_last_step_timestamp_seconds", wall - (now - view.last_step_at), run)
            out.add("relay_run_seconds_since_last_step", now - view.last_step_at, run)
        out.add("relay_run_step_interval_median_seconds", view.interval_median_s, run)
        out.add("relay_run_steps_per_second", view.steps_per_s, run)
        out.add("relay_run_step_duration_seconds", max(view.step_time.values(), default=None), run)
        out.add("relay_run_attempt", view.attempt, run)
        out.add("relay_run_ended", 0 if view.ended_at is None else 1, run)
        out.add("relay_run_loss", view.loss, run)
        standing = self.cluster.standing(run) if self.cluster is not None else None
        if standing is not None:
            out.add("relay_run_stragglers", len(standing.stragglers), run)
            out.add("relay_run_ranks_lost", len(standing.lost), run)
            for rank in standing.stragglers[:self.max_ranks]:
                out.add("relay_run_straggler_rank", 1, run, rank)
            for rank in standing.lost[:self.max_ranks]:
                out.add("relay_run_lost_rank", 1, run, rank)
            named = set(standing.stragglers[:self.max_ranks])
            for rank, cost in standing.costs:
                if per_rank or rank in named:
                    out.add("relay_run_rank_cost_ratio", cost, run, rank)
        for name, figures in (("step", view.step_time), ("own", view.own_time)):
            if figures:
                values = list(figures.values())
                stats = (("min", min(values)), ("median", statistics.median(values)),
                         ("max", max(values)))
                for stat, value in stats:
                    out.add(f"relay_run_rank_{name}_duration_seconds", value, run, stat)
                if per_rank:
                    for rank, value in sorted(figures.items()):
                        out.add(f"relay_rank_{name}_duration_seconds", value, run, rank)
        if per_rank:
            for rank, step in sorted(view.rank_step.items()):
                out.add("relay_rank_last_step", step, run, rank)


#: The stats' sink keys and the counter each becomes (``relay_sink_<name>``).
SINK_COUNTERS = {"written": "written_events_total", "errors": "errors_total",
                 "dropped": "dropped_events_total",
                 "dead_lettered": "dead_lettered_events_total",
                 "deadletter_overflow": "deadletter_overflow_total", "restarts": "restarts_total",
                 "caught_up": "caught_up_events_total", "catch_up_passes": "catch_up_passes_total",
                 "incomplete_flushes": "incomplete_flushes_total",
                 "incomplete_closes": "incomplete_closes_total"}


def relay_figures(out: Families, snap: dict[str, Any], max_memory: int) -> None:
    """The relay's own counters and each sink's figures, from a status snapshot
    (relay/daemon/status.py)."""
    for name, key in (("relay_frames_received_total", "frames"),
                      ("relay_events_received_total", "events"),
                      ("relay_events_journaled_total", "written"),
                      ("relay_events_derived_total", "derived"),
                      ("relay_events_duplicate_total", "duplicates"),
                      ("relay_client_dropped_events_total", "client_dropped"),
                      ("relay_journal_write_failures_total", "journal_errors"),
                      ("relay_deadletter_overflow_total", "deadletter_overflow"),
                      ("relay_memory_resets_total", "memory_resets"),
                      ("relay_runs", "runs"), ("relay_ranks", "ranks")):
        out.add(name, snap.get(key))
    for reason, count in sorted(snap.get("rejected", {}).items()):
        out.add("relay_frames_refused_total", count, reason)
    out.add("relay_memory_limit_bytes", max_memory)
    for sink, figures in snap.get("sinks", {}).items():
        out.add("relay_sink_queued_events", figures.get("queued"), sink)
        out.add("relay_sink_lag_seconds", figures.get("lag_s"), sink)
        for key, name in SINK_COUNTERS.items():
            out.add(f"relay_sink_{name}", figures.get(key), sink)
        if "open" in figures:
            out.add("relay_sink_open", int(bool(figures["open"])), sink)
