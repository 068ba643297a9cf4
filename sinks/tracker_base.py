"""The sink-author API: a base class for sinks that feed an experiment tracker (Aim, MLflow, ...).

An author writes four methods in the tracker's own terms; this class does, once for every tracker,
the Trainer naming, the rank policy, numbers, the idempotent ``(rank, seq)`` spans, late params,
attempts and the holes catch-up fills (docs/plugins.md, "The sink-author API: four methods" and
"What every tracker sink shows"). It never reads the journal: the relay feeds it what it missed
(relay/sinkhost/catch_up.py).
"""
from __future__ import annotations

import abc
import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sinks.base import CatchesUp, Sink, SinkContext
from sinks.events import NONFINITE_JSON, RELAY_RANK, Event
from sinks.files import write_atomic
from sinks.naming import CLUSTER_NAMES, RANK_NAMES, SYSTEM, display_names, trainer_groups
from sinks.spans import SeqSpans
from sinks.tracker_run import RunState

log = logging.getLogger(__name__)

#: Stages whose metrics the Trainer already reduced across ranks: taken from rank 0 only.
TRAINER_STAGES = frozenset({"train", "eval", "test"})
INT64 = range(-(1 << 63), 1 << 63)  # ``in`` a range is O(1)
Spans = dict[int, list[list[int]]]
#: The state file's key for appends_to's sizes (a run id starts with a letter or a digit).
APPENDED = "#appended"


class TrackerSink(Sink, CatchesUp):
    """Subclass this, set ``name``, write the four abstract methods (plus ``options``, ``open`` and
    ``close`` as for any Sink). Its state is made in ``__init__``: an ``__init__`` of your own calls
    ``super().__init__()`` first. ``super().open(context)`` only keeps ``self.context`` for the
    subclass to read; this class reads nothing of it, so an ``open`` without it still writes."""

    def __init__(self) -> None:
        self.context = SinkContext()
        self._runs: dict[str, RunState] = {}
        self._warned: set[str] = set()
        self.counters: Counter[str] = Counter()
        self._state_file: dict[str, Spans] | None = None
        self._sizes: dict[str, int] = {}  # appends_to's files, as far as the saved spans cover them
        self._unwritten = False  # save_applied kept spans the state file does not hold yet
        self._holes: set[str] = set()  # runs with a hole the relay has not caught up yet

    @abc.abstractmethod
    def start_run(self, run: str, params: dict[str, Any]) -> None:
        """The first event of ``run`` this process meets (also after a restart: resume, do not
        duplicate). ``params``: what is known of it so far (``world_size``)."""

    @abc.abstractmethod
    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        """Numbers at a step. ``rank`` is None for the Trainer's own (reduced) series; ``ts`` is
        when the rank published them, so a late write can keep the live time axis."""

    @abc.abstractmethod
    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        """Run metadata, merged key by key into the group ``name`` (dotted for nesting:
        ``relay.ranks``); values are JSON-like, non-finite floats as "NaN"/"Infinity" strings."""

    @abc.abstractmethod
    def finish_run(self, run: str, status: str) -> None:
        """Rank 0 ended training: ``completed``, ``failed`` or what the trainer said."""

    def supersede(self, run: str, step: int) -> None:
        """A later attempt of ``run`` (a job resumed from a checkpoint) starts again after ``step``:
        what earlier attempts logged at later steps is superseded by what this one logs. A tracker
        that can drop or replace those points does so here; one that cannot says in its docs what
        users see."""

    def state_path(self) -> Path | None:
        """A file beside the sink's output for the applied spans (default: kept in memory only)."""
        return None

    def appends_to(self) -> list[Path]:
        """Files this sink only appends to (a CSV): cut back to the size saved with the spans when
        a batch fails and when a process starts, so no row is written twice (docs/plugins.md)."""
        return []

    def open(self, context: SinkContext) -> None:
        self.context = context

    def write(self, events: Sequence[Event]) -> None:
        """Apply a batch; on any error fall back to the spans last saved and re-raise (the relay
        retries the batch, and what was applied already is skipped or rewritten identically)."""
        touched: dict[str, RunState] = {}
        try:
            for event in events:
                state = touched.get(event["run"]) or self._run(event)
                touched[state.run] = state
                self._apply(state, event)
            self._save(touched.values())
        except Exception:
            self._rollback(touched.values())
            raise

    def holes(self, filled: Sequence[str]) -> list[str]:
        """Runs where a rank's seqs skip some this sink has not applied: shown by a batch, or by the
        spans saved by an earlier process (a client's dropped events leave such a hole for good)."""
        self._holes.difference_update(filled)
        return list(self._holes)

    def catch_up_due(self, run: str) -> bool:
        """Whether ``run`` has a hole the relay has yet to fill from the journal (so not finished
        yet)."""
        return run in self._holes

    def run_settled(self, run: str) -> bool:
        """Whether ``run`` has said all it will: rank 0's ``train_end`` and every rank's closing
        ``stats`` (a client's last event; rank 0's after its train_end) are applied. A sink that
        closes a run's handle waits for this, so the late events of a finished job (the clients'
        last counters) do not reopen it; a rank that never says goodbye leaves the run to the
        sink's idle or shutdown close."""
        state = self._runs.get(run)
        return state is not None and state.end_seq is not None and state.stats_ranks.issuperset(
            range(state.world_size))

    def forget_run(self, run: str) -> None:
        """Drop what this class keeps of ``run`` (a sink that hands the run over to another
        process); its next event starts it again, spans loaded afresh (and a hole they hold named
        again)."""
        self._runs.pop(run, None)
        self._holes.discard(run)

    def load_applied(self, run: str) -> Spans:
        """The spans saved for ``run`` (override with ``save_applied`` to keep them in the
        tracker)."""
        return self._states().get(run, {})

    def save_applied(self, run: str, spans: Spans) -> None:
        """Keep ``spans``; the state file is written once the batch's runs are all kept."""
        self._states()[run] = spans
        self._unwritten = True

    def _states(self) -> dict[str, Spans]:
        if self._state_file is None:
            path = self.state_path()
            raw = json.loads(path.read_text()) if path is not None and path.exists() else {}
            sizes = raw.pop(APPENDED, {})
            self._state_file = {run: {int(r): s for r, s in spans.items()}
                                for run, spans in raw.items()}
            # What an earlier process wrote past its last save is cut; a file it never saved a size
            # for is kept as it is (it may be another tool's).
            self._sizes = {str(f): sizes.get(str(f), _size(f)) for f in self.appends_to()}
            self._cut()
        return self._state_file

    def _write_states(self) -> None:
        self._unwritten = False
        path = self.state_path()
        if path is None:
            return
        sizes = {str(f): _size(f) for f in self.appends_to()}
        states: dict[str, Any] = {**self._states(), APPENDED: sizes} if sizes else self._states()
        write_atomic(path, json.dumps(states))
        self._sizes = sizes

    def _cut(self) -> None:
        for name, size in self._sizes.items():
            path = Path(name)
            if _size(path) > size:
                log.info("%s: cut back to the %d bytes the applied spans cover", path, size)
                with path.open("r+b") as fh:
                    fh.truncate(size)

    def _run(self, event: Event) -> RunState:
        run = event["run"]
        state = self._runs.get(run)
        if state is None:
            self.start_run(run, {"world_size": event["world_size"]})
            saved = self.load_applied(run)
            state = self._runs[run] = RunState(run, saved, event["world_size"])
            if any(spans.holes for spans in state.applied.values()):  # left by an earlier process
                self._holes.add(run)
        return state

    def _apply(self, state: RunState, event: Event) -> None:
        rank, seq = event["rank"], event["seq"]
        spans = state.applied.get(rank)
        if spans is None:
            spans = state.applied[rank] = SeqSpans()
        if seq in spans:
            self.counters["duplicates"] += 1
            return
        kind = event["type"]
        run = state.run
        if kind == "metrics":
            self._metrics(run, event)
        elif kind == "params":
            self._params(state, event["stage"] or "params", event["data"], event["ts"])
        elif kind == "hello":
            info = {"host": event["host"], "local_rank": event["local_rank"], **event["data"]}
            self._params(state, "relay.ranks", {str(rank): info}, event["ts"])
            self._params(state, "relay", {"world_size": event["world_size"]}, event["ts"])
        elif kind == "lifecycle":
            self._lifecycle(state, event)
        elif kind == "stats":
            self._client_stats(state, event)
        if spans.add(seq):
            self._holes.add(run)
        state.dirty = True
        self.counters["events"] += 1
        if kind == "metrics" and event["step"] is None:
            # the tracker numbers these itself: applying one twice would add a point
            self._save([state])

    def _metrics(self, run: str, event: Event) -> None:
        stage, rank, data = event["stage"], event["rank"], event["data"]
        if stage in TRAINER_STAGES:
            if rank != 0:  # already reduced across ranks: every rank would repeat rank 0
                self.counters["nonzero_rank_trainer_metrics"] += 1
                return
            groups = trainer_groups(stage, data)
            # HF's Trainer adds it to every log, eval's too; its callbacks log it
            if event["epoch"] is not None:
                groups.setdefault((), ({}, {}))[1]["epoch"] = event["epoch"]
            series_rank = None
        elif stage == "rank":
            groups = {(): ({SYSTEM: "rank", "rank": rank},
                           display_names(data, RANK_NAMES, "rank_"))}
            series_rank = rank
        elif stage == "cluster" and rank == RELAY_RANK:
            # across ranks already: one run-level series each
            figures = display_names(data, CLUSTER_NAMES, "cluster_")
            groups, series_rank = {(): ({SYSTEM: "cluster"}, figures)}, None
        else:
            groups, series_rank = {(): ({"subset": stage or "custom", "rank": rank}, data)}, rank
        for context, values in groups.values():
            numbers = self._numbers(values)
            if numbers:
                self.log_metrics(run, series_rank, event["step"], event["epoch"], context, numbers,
                                 event["ts"])
                self.counters["values"] += len(numbers)

    def _numbers(self, values: dict[str, Any]) -> dict[str, float | int]:
        """What a tracker can plot; "NaN"/"Infinity" strings from a journal become floats again."""
        out: dict[str, float | int] = {}
        for name, value in values.items():
            kind = type(value)
            if kind is float or (kind is int and value in INT64):
                out[name] = value
            elif kind is int:
                out[name] = float(value)
            elif kind is str and value in NONFINITE_JSON:
                out[name] = NONFINITE_JSON[value]
            else:
                self.counters["skipped_values"] += 1
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning("%s sink: metric %r has a %s value, not a number; not tracked",
                                self.name, name, kind.__name__)
        return out

    def _params(self, state: RunState, name: str, data: dict[str, Any], ts: float) -> None:
        fresh = {}
        for key, value in data.items():
            if state.param_ts.get((name, key), -math.inf) > ts:
                continue  # a newer value is already there (this one came late, from the journal)
            state.param_ts[(name, key)] = ts
            fresh[key] = value
        if fresh:
            self.log_params(state.run, name, fresh)

    def _client_stats(self, state: RunState, event: Event) -> None:
        """A rank's closing ``stats`` is what ``run_settled`` waits for (rank 0's: after its
        train_end)."""
        rank, data = event["rank"], event["data"]
        if rank != 0 or (state.end_seq is not None and event["seq"] > state.end_seq):
            state.stats_ranks.add(rank)
        self._params(state, "relay.client", {f"rank{rank}": data}, event["ts"])
        dropped = self._numbers({"relay_dropped": data["dropped"]}) if "dropped" in data else {}
        if dropped and dropped["relay_dropped"] != 0:
            self.log_metrics(state.run, rank, event["seq"], None, {SYSTEM: "rank", "rank": rank},
                             dropped, event["ts"])

    def _lifecycle(self, state: RunState, event: Event) -> None:
        data = event["data"]
        what = data.get("event")
        record = {**data, "step": event["step"], "ts": event["ts"]}
        if what == "checkpoint":  # keyed by step, so a late catch-up cannot reorder them
            self._params(state, "relay.checkpoints", {str(event["step"]): record}, event["ts"])
        elif event["rank"] == RELAY_RANK and isinstance(what, str) and what:
            # many per run: one key each
            step = event["step"] if event["step"] is not None else data.get("last_step")
            at = f"step{step}" if step is not None else f"seq{event['seq']}"
            key = f"rank{data.get('rank')}_" + at
            self._params(state, f"relay.cluster.{what}", {key: record}, event["ts"])
        elif isinstance(what, str) and what:
            self._params(state, "relay.lifecycle", {what: record}, event["ts"])
        if what == "train_begin" and event["rank"] == 0 and type(data.get("attempt")) is int:
            self._params(state, "relay.attempts", {str(data["attempt"]): record}, event["ts"])
            if data["attempt"] > 0 and type(data.get("resumed_from")) is int:
                # what came before is the tool's, as saved, before it starts over
                self._save([state])
                self.supersede(state.run, data["resumed_from"])
                self.counters["attempts_resumed"] += 1
        if what == "train_end" and event["rank"] == 0:
            state.end_seq = event["seq"]
            status = data.get("status")
            self.finish_run(state.run,
                            status if isinstance(status, str) and status else "completed")

    def _save(self, states: Any) -> None:
        before = {}
        for state in states:
            if state.dirty:
                spans = {rank: [list(span) for span in s.spans]
                         for rank, s in state.applied.items()}
                self.save_applied(state.run, spans)
                before[state.run] = state.saved
                state.saved, state.dirty = spans, False
        if self._unwritten:
            try:
                self._write_states()
            except Exception:
                for state in states:
                    state.saved = before.get(state.run, state.saved)
                raise

    def _rollback(self, states: Any) -> None:
        """After a failure, trust only what was saved: the retry re-applies the rest."""
        for state in states:
            state.applied = {rank: SeqSpans(spans) for rank, spans in state.saved.items()}
            state.dirty = False
        self._cut()


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def exact_ints(obj: Any) -> Any:
    """A params value with every int beyond int64 as its decimal string: trackers store ints as
    int64 (or turn big ones into floats), and a string keeps the value exactly."""
    kind = type(obj)
    if kind is int:
        return obj if obj in INT64 else str(obj)
    if kind is dict:
        return {k: exact_ints(v) for k, v in obj.items()}
    if kind is list:
        return [exact_ints(v) for v in obj]
    return obj
