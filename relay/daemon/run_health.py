"""Each run's health as the Prometheus endpoint shows it (relay/metrics/; the series in
docs/monitoring.md).

Ingest (relay/daemon/ingest.py) hands ``observe`` the events it already looks at for the cross-rank
derivation (``stage="rank"`` metrics and ``lifecycle`` events) and ``take_frame`` each new frame's
events (read from its end: the last step, and with ``loss`` on rank 0's latest loss, are all it
keeps); each costs a few dict writes, and nothing here builds a metric. The
endpoint's thread reads ``runs`` at scrape time (``view``): every structure it reads is replaced or
copied whole in one C call (a dict copy, ``tuple`` of a deque), so the ingest thread never waits for
a scrape and a scrape never sees half an update. No socket, no clock: the caller gives the time
(monotonic); ``expire`` drops runs that ended ``keep_ended`` seconds ago, ``forget`` one the relay
forgot.
"""
from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence
from itertools import pairwise
from math import isfinite
from typing import Any, NamedTuple

#: Logged steps whose arrival times a run keeps: its pace (steps/s) and its median interval between
#: logged steps (what the stall rule scales with) are taken over these.
PACE_STEPS = 64


class _Run:
    __slots__ = ("world_size", "last_step", "last_step_at", "pace", "step_time", "own_time",
                 "rank_step", "attempt", "loss", "ended_at", "status", "ranked")

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.last_step = -1
        self.last_step_at: float | None = None
        self.pace: collections.deque[tuple[float, int]] = collections.deque(maxlen=PACE_STEPS)
        self.step_time: dict[int, float] = {}  # rank -> its last reported step time (s)
        self.own_time: dict[int, float] = {}  # rank -> its last reported own work (s)
        self.rank_step: dict[int, int] = {}  # rank -> the last step it reported
        self.attempt: int | None = None
        self.loss: float | None = None
        self.ended_at: float | None = None
        self.status: str | None = None
        # it sends per-rank windows (stage "rank"): its steps come from them alone
        self.ranked = False


class RunView(NamedTuple):
    """One run as a scrape sees it; times are monotonic, as given to ``observe``."""

    world_size: int
    last_step: int | None
    last_step_at: float | None
    steps_per_s: float | None
    interval_median_s: float | None
    step_time: dict[int, float]
    own_time: dict[int, float]
    rank_step: dict[int, int]
    attempt: int | None
    loss: float | None
    ended_at: float | None
    status: str | None


_NUMBERS = (int, float)


def _figure(value: Any) -> float | None:
    if type(value) in _NUMBERS and isfinite(value):
        return float(value)
    return None


class RunHealth:
    """The runs' health, fed by the ingest thread, read by the endpoint's."""

    def __init__(self, keep_ended: float = 300.0, loss: bool = False) -> None:
        self.keep_ended = keep_ended
        self.loss = loss
        self.runs: dict[str, _Run] = {}

    def _run(self, event: dict[str, Any]) -> _Run:
        run = self.runs.get(event["run"])
        if run is None:
            run = self.runs[event["run"]] = _Run(event["world_size"])
        run.world_size = event["world_size"]
        return run

    def observe(self, event: dict[str, Any], now: float) -> None:
        """A new event of the kinds named above, arrived at ``now``. A rank's report is inlined: it
        is the one kind every rank sends at every logged step."""
        kind = event["type"]
        if kind == "lifecycle":
            self._lifecycle(event, event["data"], now)
            return
        if kind != "metrics" or event["stage"] != "rank":
            return
        run = self.runs.get(event["run"])
        if run is None:
            run = self.runs[event["run"]] = _Run(event["world_size"])
        rank, step, data = event["rank"], event["step"], event["data"]
        if rank >= run.world_size:
            return
        run.ranked = True
        took, own = data.get("step_time"), data.get("own_time")
        if type(took) in _NUMBERS and isfinite(took):
            run.step_time[rank] = took
        if type(own) in _NUMBERS and isfinite(own):
            run.own_time[rank] = own
        if type(step) is int:
            run.rank_step[rank] = step
            _stepped(run, step, now)

    def take_frame(self, events: Sequence[dict[str, Any]], rank: int, now: float) -> None:
        """New events of one frame of ``rank``, oldest first: their steps, and with ``loss`` rank
        0's last."""
        self.take_steps(events, now)
        if self.loss and rank == 0:
            self.take_loss(events)

    def take_steps(self, events: Sequence[dict[str, Any]], now: float) -> None:
        """New events of one frame, oldest first: the step of the last metrics event among them, for
        a run that sends no per-rank windows (a custom loop's ``Publisher``, the accelerate
        tracker), so it has a last step, a pace and a stall series too. A run that sends them keeps
        its steps from them."""
        for event in reversed(events):
            if (event["type"] == "metrics" and type(event["step"]) is int
                    and event["stage"] != "rank"):
                run = self._run(event)
                if not run.ranked:
                    _stepped(run, event["step"], now)
                return

    def take_loss(self, events: Sequence[dict[str, Any]]) -> None:
        """Rank 0's new events of one frame, oldest first: the last training loss among them."""
        for event in reversed(events):
            if event["stage"] == "train" and event["type"] == "metrics":
                loss = _figure(event["data"].get("loss"))
                if loss is not None:
                    self._run(event).loss = loss
                    return

    def _lifecycle(self, event: dict[str, Any], data: dict[str, Any], now: float) -> None:
        what = data.get("event")
        if what == "train_begin":
            run = self._run(event)
            attempt = data.get("attempt")
            run.attempt = attempt if type(attempt) is int else run.attempt
            run.ended_at = run.status = None  # a run id reused by a restart begins again
        elif what == "train_end":
            run = self._run(event)
            if run.ended_at is None:
                run.ended_at = now
                status = data.get("status")
                run.status = status if isinstance(status, str) else "completed"

    def expire(self, now: float) -> None:
        """Drop the runs that ended ``keep_ended`` seconds ago or more."""
        gone = [name for name, run in self.runs.items()
                if run.ended_at is not None and now - run.ended_at >= self.keep_ended]
        for name in gone:
            del self.runs[name]

    def forget(self, run: str) -> None:
        self.runs.pop(run, None)

    def view(self, limit: int) -> dict[str, RunView]:
        """Up to ``limit`` runs, the most recent steps first; safe from another thread (above)."""
        runs = list(self.runs.items())  # one C call: the ingest thread may add a run meanwhile
        runs.sort(key=lambda item: -(item[1].last_step_at or 0.0))
        return {name: _view(run) for name, run in runs[:limit]}


def _stepped(run: _Run, step: int, now: float) -> None:
    """A step reported at ``now``: the run's last step and pace move on if it is a new one."""
    if step > run.last_step:
        run.last_step, run.last_step_at = step, now
        run.pace.append((now, step))


def _view(run: _Run) -> RunView:
    pace = tuple(run.pace)
    steps_per_s = interval = None
    if len(pace) >= 2:
        (t0, s0), (t1, s1) = pace[0], pace[-1]
        steps_per_s = (s1 - s0) / (t1 - t0) if t1 > t0 else None
        interval = statistics.median(b[0] - a[0] for a, b in pairwise(pace))
    last = run.last_step
    return RunView(run.world_size, last if last >= 0 else None, run.last_step_at, steps_per_s,
                   interval, run.step_time.copy(), run.own_time.copy(), run.rank_step.copy(),
                   run.attempt, run.loss, run.ended_at, run.status)
