"""The Aim sink: one Aim run per training run, whatever the number of ranks (docs/aim.md).

Aim is slow to open a run (seconds) and to ingest (thousands of values per second), so the relay
runs this sink off the ingest path, and the sink is built so it can always be rebuilt from the
JSONL journal:

* **Idempotent.** Every applied event is remembered as its ``(rank, seq)`` inside the Aim run
  (compact ``[start, end)`` spans, stored beside the run's own metadata), so a retried batch, a
  restarted relay or a second ``relay replay`` skips what is already there. Points also carry
  the event's own timestamp, so a late write looks exactly like a live one.
* **Self-healing.** A gap in a rank's sequence means events did not reach this sink (its queue
  overflowed during an Aim outage, or they are still on their way); at the next flush the sink
  reads the journal from where it last looked and applies whatever it is missing.
* **Failure-safe.** On any Aim error the applied spans fall back to what Aim last stored and the
  error goes to the relay, which retries the batch with backoff; points already written are
  written again with the same step, value and time, so nothing is doubled. Local run handles
  are kept (Aim's RocksDB resumes by itself once the disk is writable again); with a remote
  server the client and its handles are replaced, since a restarted server forgets them.

Aim is imported only when the sink opens, so the relay works without the ``[aim]`` extra.
"""
from __future__ import annotations

import bisect
import json
import logging
import math
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import click
import orjson

from relay.schema import NONFINITE_JSON, from_json_metrics, json_safe
from sinks.base import Sink, SinkContext, SinkError

log = logging.getLogger(__name__)

#: The run-id export file the seed's users already script against.
EXPORT_NAME = "aim_tracker.json"
#: Run params holding the relay's identity of the run (queryable in Aim: ``run.relay.run_id``).
PARAMS_KEY = "relay"
#: Key in the run's own metadata (not a param) for the applied (rank, seq) spans.
STATE_KEY = "metrics_relay_applied"
#: Stages whose metrics the Trainer already reduced across ranks: taken from rank 0 only.
TRAINER_STAGES = frozenset({"train", "eval", "test"})
INT64 = range(-(1 << 63), 1 << 63)  # what Aim can store as an int (``in`` a range is O(1))
_SUBSET_PREFIXES = ("train_", "eval_", "test_")
#: Seconds the relay's shutdown waits for an ``aim://`` server to take the last writes.
REMOTE_CLOSE_TIMEOUT = 10.0
#: Seconds without events after which a run's Aim handle is closed (a job that died without
#: train_end must not stay "active" in Aim, nor hold files and threads, on a long-lived relay).
IDLE_CLOSE_S = 600.0


class SeqSpans:
    """The seqs applied for one rank, as sorted disjoint ``[start, end)`` spans.

    In order, without loss, this stays a single span, so membership and insertion are O(1);
    holes (events that have not reached the sink yet) cost one span each.
    """

    __slots__ = ("spans",)

    def __init__(self, spans: list[list[int]] | None = None) -> None:
        self.spans: list[list[int]] = [[int(a), int(b)] for a, b in spans or []]

    def __contains__(self, seq: int) -> bool:
        spans = self.spans
        if spans and spans[-1][0] <= seq < spans[-1][1]:
            return True
        i = bisect.bisect_right(spans, [seq, math.inf]) - 1
        return i >= 0 and spans[i][0] <= seq < spans[i][1]

    def add(self, seq: int) -> bool:
        """Record ``seq`` (not already present); True when this opens a new hole below it."""
        spans = self.spans
        if spans and spans[-1][1] == seq:
            spans[-1][1] = seq + 1
            return False
        if not spans or seq > spans[-1][1]:
            spans.append([seq, seq + 1])
            return seq > 0
        i = bisect.bisect_right(spans, [seq, math.inf])
        if i > 0 and spans[i - 1][1] == seq:
            spans[i - 1][1] = seq + 1
            if i < len(spans) and spans[i][0] == seq + 1:
                spans[i - 1][1] = spans.pop(i)[1]
        elif i < len(spans) and spans[i][0] == seq + 1:
            spans[i][0] = seq
        else:
            spans.insert(i, [seq, seq + 1])
        return False

    @property
    def holes(self) -> bool:
        """Whether some seq below the highest applied one is missing."""
        return len(self.spans) > 1 or (bool(self.spans) and self.spans[0][0] > 0)


@dataclass
class _RunState:
    """What the sink knows about one training run; survives its Aim handle being closed."""

    run_id: str
    handle: Any = None  # aim.Run while open
    applied: dict[int, SeqSpans] = field(default_factory=dict)
    saved: dict[int, list[list[int]]] = field(default_factory=dict)  # spans as last stored in Aim
    loaded: bool = False  # applied spans read from the Aim run
    dirty: bool = False  # applied spans changed since saved
    unclosable: bool = False  # close failed: keep the (still writable) handle, never close again
    take_over: bool = False  # its remote handle was abandoned: take the run's lock over on reopen
    experiment: str | None = None
    output_dir: str | None = None
    export_due: bool = False
    ended: bool = False  # rank 0 said train_end: close after every batch that touches the run
    needs_sweep: bool = False
    last_event: float = 0.0  # time.monotonic() of its last applied event
    param_ts: dict[tuple[str, str], float] = field(default_factory=dict)  # newest value's event time


def _import_aim() -> Any:
    """Import Aim, or say how to get it: the sink is optional and so is the ``[aim]`` extra."""
    try:
        import aim  # noqa: F401 - imported for its side effect of failing early
        from aim.sdk.repo import Repo
    except ImportError as exc:
        raise SinkError(f"the aim sink needs Aim, which is not importable ({exc}): "
                        "pip install 'metrics-relay[aim]'") from None
    return Repo


class AimSink(Sink):
    """Write relay events into an Aim repository, local (a path) or remote (``aim://host:port``)."""

    name = "aim"

    @classmethod
    def options(cls) -> list[click.Option]:
        """``--repo`` and ``--experiment``: the names users of the seed's ``--aim_repo`` know."""
        return [
            click.Option(["--repo"], metavar="PATH|aim://HOST:PORT", default=None,
                         help="Aim repository: a local directory (created if missing) or a remote "
                              "tracking server started with `aim server`."),
            click.Option(["--experiment"], metavar="NAME", default=None,
                         help="Aim experiment for runs that do not name one themselves."),
        ]

    def __init__(self, repo: str | None = None, experiment: str | None = None) -> None:
        if not repo:
            raise SinkError("--sink aim needs --repo PATH (a local Aim repository, created if missing) "
                            "or --repo aim://HOST:PORT (an `aim server`)")
        self.repo_spec = repo
        self.default_experiment = experiment
        self.remote = repo.startswith("aim://")
        self.counters: Counter[str] = Counter()
        self._repo: Any = None
        self._journal: Path | None = None
        self._runs: dict[str, _RunState] = {}
        self._hash_of: dict[str, str] = {}  # run id -> Aim run hash, from runs we scanned or made
        self._scanned: set[str] = set()  # Aim run hashes whose run id we read
        self._swept: dict[tuple[Path, str], int] = {}  # (journal file, run id) -> bytes swept
        self._warned: set[str] = set()
        self.idle_close_s = IDLE_CLOSE_S

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self, context: SinkContext) -> None:
        """Open (or create) the repository; SinkError when it cannot be used at all."""
        repo_cls = _import_aim()
        # One INFO line per opened run from Aim's status reporter is noise in the relay's log.
        logging.getLogger("aim.sdk.reporter").setLevel(logging.WARNING)
        self._journal = context.journal
        if self.remote:
            self._open_remote(repo_cls)
        else:
            self._open_local(repo_cls)

    def _open_local(self, repo_cls: Any) -> None:
        root = Path(self.repo_spec).expanduser()
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".relay-write-test-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
            self._repo = repo_cls.from_path(str(root), init=True)
        except OSError as exc:
            raise SinkError(f"Aim repository {root} is not usable: {exc.strerror or exc}: "
                            "pass a writable --repo directory") from None
        except Exception as exc:  # Aim reports a broken repo in many ways; all are a config error
            raise SinkError(f"Aim repository {root} cannot be opened ({type(exc).__name__}: {exc}): "
                            "check it with `aim up --repo`, or pass another --repo") from None
        log.info("aim sink writing to %s", self._repo.path)

    def _open_remote(self, repo_cls: Any) -> None:
        address = self.repo_spec[len("aim://"):]
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise SinkError(f"--repo {self.repo_spec!r} is not aim://HOST:PORT")
        try:
            self._repo = repo_cls.from_path(self.repo_spec)
        except Exception as exc:  # server down: training must not wait, the journal catches up later
            self.counters["open_errors"] += 1
            log.warning("aim server %s not reachable yet (%s: %s); retrying with every batch, "
                        "the journal keeps everything meanwhile", self.repo_spec, type(exc).__name__, exc)
        else:
            log.info("aim sink writing to %s", self.repo_spec)

    def close(self) -> None:
        """Persist progress and close every open Aim run (errors are counted, never fatal).

        Aim's remote client waits without limit for an unreachable server before a run closes,
        so with ``aim://`` the closing gets ``REMOTE_CLOSE_TIMEOUT`` seconds, then is given up.
        """
        if not self.remote:
            self._close_runs()
        else:
            closer = threading.Thread(target=self._close_runs, name="aim-sink-close", daemon=True)
            closer.start()
            closer.join(REMOTE_CLOSE_TIMEOUT)
            if closer.is_alive():
                self.counters["close_timeouts"] += 1
                log.error("aim server %s unreachable: runs not closed after %.0f s; everything is in the "
                          "journal, rebuild them with `relay replay JOURNAL --sink aim --repo %s` once it is back",
                          self.repo_spec, REMOTE_CLOSE_TIMEOUT, self.repo_spec)
        log.info("aim sink closed: %s", dict(sorted(self.counters.items())))

    def _close_runs(self) -> None:
        for state in list(self._runs.values()):
            if state.handle is not None and not state.unclosable:
                try:
                    self._persist(state)
                except Exception as exc:  # the journal still holds it: a replay restores it
                    self.counters["persist_errors"] += 1
                    log.error("aim sink: could not save progress of run %s: %s: %s",
                              state.run_id, type(exc).__name__, exc)
                self._close_handle(state)

    # -- writing --------------------------------------------------------------------------------

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        """Apply a batch; on any Aim error roll back to what Aim stored and re-raise (retried)."""
        touched: dict[str, _RunState] = {}
        try:
            self._ensure_repo()
            for event in events:
                state = touched.get(event["run"]) or self._state(event["run"])
                touched[state.run_id] = state
                self._apply(state, event)
            self._finish(touched.values())
        except Exception:
            self._rollback(touched.values())
            raise
        self._close_idle()

    def flush(self) -> None:
        """Catch up from the journal for runs where some rank showed a gap, then persist."""
        due = [s for s in self._runs.values() if s.needs_sweep]
        if not due or self._journal is None:
            return
        touched: dict[str, _RunState] = {}
        try:
            for waiting in due:
                path = self._journal_file(waiting.run_id)
                if path is None:
                    waiting.needs_sweep = False
                    continue
                state = touched[waiting.run_id] = self._state(waiting.run_id)
                for event in self._journal_events(path, state.run_id):
                    self._apply(state, event, swept=True)
                state.needs_sweep = False
            self._finish(touched.values())
        except Exception:
            self._rollback(touched.values())
            raise

    def _ensure_repo(self) -> None:
        if self._repo is None:  # a remote server that was down at open
            self._repo = _import_aim()(self.repo_spec)  # not from_path: that pools the old client
            log.info("aim sink connected to %s", self.repo_spec)

    def _finish(self, states: Iterable[_RunState]) -> None:
        for state in states:
            self._persist(state)
            if state.export_due:
                self._export(state)
            if state.ended:
                self._close_handle(state)

    def _close_idle(self) -> None:
        """Close the runs that went quiet; a late event reopens them."""
        quiet_since = time.monotonic() - self.idle_close_s
        for state in self._runs.values():
            if state.handle is not None and state.last_event < quiet_since:
                log.info("aim run of run %s idle for %.0f s: closing it", state.run_id, self.idle_close_s)
                self._persist(state)
                self._close_handle(state)

    def _rollback(self, states: Iterable[_RunState]) -> None:
        """After a failure, trust only what Aim stored: the retry re-applies the rest."""
        for state in states:
            state.applied = {rank: SeqSpans(spans) for rank, spans in state.saved.items()}
            state.dirty = False
        if self.remote:
            # A restarted server no longer knows this client or its run handles, and Aim's client
            # only reconnects its write queue: start over with a new client and take the runs over.
            self._repo = None
            for state in self._runs.values():
                if state.handle is not None:
                    state.handle, state.take_over = None, True

    # -- runs -----------------------------------------------------------------------------------

    def _state(self, run_id: str) -> _RunState:
        state = self._runs.get(run_id)
        if state is None:
            state = self._runs[run_id] = _RunState(run_id)
        if state.handle is None:
            self._open_run(state)
        return state

    def _open_run(self, state: _RunState) -> None:
        """Resume the Aim run of this run id, or create it; load what it already holds."""
        from aim import Run

        quiet = {"system_tracking_interval": None, "log_system_params": False, "capture_terminal_logs": False}
        run_hash = self._find(state.run_id)
        if run_hash is None:
            run = Run(repo=self._repo, experiment=state.experiment or self.default_experiment, **quiet)
            run[PARAMS_KEY] = {"run_id": state.run_id}
            run.name = state.run_id
            self._hash_of[state.run_id] = run.hash
            self._scanned.add(run.hash)
            state.export_due = True
            self.counters["runs_created"] += 1
            log.info("aim run %s created for run %s", run.hash, state.run_id)
        else:
            self._forget_listing()  # Aim refuses to resume a run missing from its listing
            run = Run(run_hash, repo=self._repo, force_resume=state.take_over, **quiet)
            state.take_over = False
            if state.experiment:
                run.experiment = state.experiment
            self.counters["runs_opened"] += 1
            log.info("aim run %s resumed for run %s", run_hash, state.run_id)
        state.handle = run
        if not state.loaded:
            saved = run.meta_run_tree.get(STATE_KEY, None)
            spans = orjson.loads(saved) if saved else {}
            state.saved = {int(rank): s for rank, s in spans.items()}
            state.applied = {rank: SeqSpans(s) for rank, s in state.saved.items()}
            state.loaded = True
            state.dirty = False

    def _find(self, run_id: str) -> str | None:
        """The Aim run already holding ``run_id``: each repo run is read once per relay lifetime.

        ``list_all_runs`` (unlike ``iter_runs``) also sees runs not indexed yet, such as ones a
        crashed relay left open.
        """
        found = self._hash_of.get(run_id)
        if found is not None:
            return found
        self._forget_listing()
        for run_hash in sorted(set(self._repo.list_all_runs()) - self._scanned):
            self._scanned.add(run_hash)
            try:
                owner = self._run_id_of(run_hash)
            except Exception as exc:  # a corrupt or half-deleted run is not ours to fix; counted
                self.counters["unreadable_runs"] += 1
                log.warning("aim run %s unreadable while looking for run %s: %s: %s",
                            run_hash, run_id, type(exc).__name__, exc)
                continue
            if isinstance(owner, str):
                self._hash_of.setdefault(owner, run_hash)
        return self._hash_of.get(run_id)

    def _forget_listing(self) -> None:
        """Aim caches a repo's run listing for 0.5 s, which hides a run made a moment ago (by
        this sink or another process); the listing is one directory read, so read it afresh."""
        type(self._repo)._all_run_hashes.cache_clear()

    def _run_id_of(self, run_hash: str) -> Any:
        """Read the run's own metadata, as Aim's indexer does: a read-only ``Run`` reads the
        repo index, which does not hold runs that were never closed or indexed."""
        tree = self._repo.request_tree("meta", run_hash, read_only=True, skip_read_optimization=True)
        return tree.subtree(("meta", "chunks", run_hash, "attrs", PARAMS_KEY)).get("run_id")

    def _index(self, run_hash: str) -> None:
        """Index a closed run as ``aim up`` would, so ``Repo.iter_runs`` and read-only ``Run``
        objects see it at once; if the index is busy (``aim up`` indexing), it does it later."""
        from aim.sdk.index_manager import RepoIndexManager

        try:
            RepoIndexManager.get_index_manager(self._repo).index(run_hash)
        except Exception as exc:  # counted; aim up / aim server index the run themselves
            self.counters["index_errors"] += 1
            log.warning("aim run %s not indexed yet (%s: %s); `aim up` indexes it", run_hash,
                        type(exc).__name__, exc)

    def _close_handle(self, state: _RunState) -> None:
        """Close and index the run. Aim cannot retry a failed close, but the handle stays
        writable, so it is kept (the run then shows as active until ``aim runs close``)."""
        run = state.handle
        if run is None or state.unclosable:
            return
        try:
            run.close()
        except Exception as exc:  # counted; later events of the run still go through this handle
            state.unclosable = True
            self.counters["close_errors"] += 1
            log.warning("aim run %s of run %s could not be closed (%s: %s); it stays marked active "
                        "until `aim runs close --force %s`", run.hash, state.run_id, type(exc).__name__, exc,
                        run.hash)
            return
        state.handle = None
        self.counters["runs_closed"] += 1
        if not self.remote:
            self._index(run.hash)

    def _persist(self, state: _RunState) -> None:
        if state.dirty and state.handle is not None:
            spans = {rank: [list(span) for span in s.spans] for rank, s in state.applied.items()}
            state.handle.meta_run_tree[STATE_KEY] = orjson.dumps(spans, option=orjson.OPT_NON_STR_KEYS).decode()
            state.saved = spans
            state.dirty = False

    # -- events ---------------------------------------------------------------------------------

    def _apply(self, state: _RunState, event: dict[str, Any], swept: bool = False) -> None:
        rank, seq = event["rank"], event["seq"]
        spans = state.applied.get(rank)
        if spans is None:
            spans = state.applied[rank] = SeqSpans()
        if seq in spans:
            self.counters["duplicates"] += 1
            return
        kind = event["type"]
        run = state.handle
        auto_step = False
        if kind == "metrics":
            auto_step = self._metrics(run, event)
        elif kind == "params":
            self._params(state, event)
        elif kind == "hello":
            info = {"host": event["host"], "local_rank": event["local_rank"], **event["data"]}
            run.set((PARAMS_KEY, "ranks", str(rank)), _storable(info), strict=False)
            run.set((PARAMS_KEY, "world_size"), event["world_size"], strict=False)
        elif kind == "lifecycle":
            self._lifecycle(state, event)
        elif kind == "stats":
            self._stats(run, event)
        if spans.add(seq) and not swept:
            state.needs_sweep = True
        state.dirty = True
        state.last_event = time.monotonic()
        self.counters["swept_events" if swept else "events"] += 1
        if auto_step:  # Aim numbers these itself, so applying one twice would add a point
            self._persist(state)

    def _metrics(self, run: Any, event: dict[str, Any]) -> bool:
        """Track an event's numbers, grouped by Aim context; True if Aim chose the step."""
        stage, rank = event["stage"], event["rank"]
        if stage in TRAINER_STAGES:
            if rank != 0:  # already reduced across ranks: every rank would repeat rank 0
                self.counters["nonzero_rank_trainer_metrics"] += 1
                return False
            groups = _trainer_groups(stage, event["data"])
            if stage == "train" and event["epoch"] is not None:
                groups.setdefault((), ({}, {}))[1]["epoch"] = event["epoch"]  # as Aim's callback does
        elif stage == "rank":
            groups = {(): ({"rank": rank}, dict(event["data"]))}
        else:
            context = {"subset": stage or "custom", "rank": rank}
            groups = {(): (context, dict(event["data"]))}
        tracker = run._tracker  # its _track takes the event's own time: replay looks like live
        step, epoch, ts = event["step"], event["epoch"], event["ts"]
        for context, values in groups.values():
            numbers = self._numbers(values)
            if numbers:
                tracker._track(numbers, ts, None, step, epoch, context=context)
                self.counters["values"] += len(numbers)
        return step is None

    def _numbers(self, values: dict[str, Any]) -> dict[str, float | int]:
        """Keep what Aim can plot; "NaN"/"Infinity" strings from a journal become floats again."""
        out: dict[str, float | int] = {}
        for name, value in values.items():
            kind = type(value)
            if kind is float or (kind is int and value in INT64):
                out[name] = value
            elif kind is int:
                out[name] = float(value)  # Aim keeps ints as int64
            elif kind is str and value in NONFINITE_JSON:
                out[name] = NONFINITE_JSON[value]
            else:
                self.counters["skipped_values"] += 1
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning("aim sink: metric %r has a %s value, not a number; not tracked", name,
                                kind.__name__)
        return out

    def _params(self, state: _RunState, event: dict[str, Any]) -> None:
        name, data, ts = event["stage"] or "params", _storable(event["data"]), event["ts"]
        run = state.handle
        for key, value in data.items():
            if state.param_ts.get((name, key), -math.inf) > ts:
                continue  # a newer value is already there (this one came late, from the journal)
            state.param_ts[(name, key)] = ts
            run.set((name, key), value, strict=False)
        if name in ("run", "hparams"):
            experiment = data.get("experiment")
            if isinstance(experiment, str) and experiment and experiment != state.experiment:
                state.experiment = experiment
                run.experiment = experiment
                state.export_due = True
            output_dir = data.get("output_dir")
            if isinstance(output_dir, str) and output_dir and output_dir != state.output_dir:
                state.output_dir = output_dir
                state.export_due = True

    def _lifecycle(self, state: _RunState, event: dict[str, Any]) -> None:
        data = _storable(event["data"])
        what = data.get("event")
        record = {**data, "step": event["step"], "ts": event["ts"]}
        if what == "checkpoint":  # keyed by step, so a late catch-up cannot reorder them
            state.handle.set((PARAMS_KEY, "checkpoints", str(event["step"])), record, strict=False)
        elif isinstance(what, str) and what:
            state.handle.set((PARAMS_KEY, "lifecycle", what), record, strict=False)
        if what == "train_end" and event["rank"] == 0:
            state.ended = True

    def _stats(self, run: Any, event: dict[str, Any]) -> None:
        """Client drop counts, per rank, stepped by seq: cumulative, so re-applying changes nothing."""
        numbers = self._numbers({f"relay_{k}": v for k, v in event["data"].items()})
        if numbers:
            run._tracker._track(numbers, event["ts"], None, event["seq"], None, context={"rank": event["rank"]})
            self.counters["values"] += len(numbers)

    # -- run-id export ----------------------------------------------------------------------------

    def _export(self, state: _RunState) -> None:
        """Write ``aim_tracker.json`` where the job's scripts look (its output dir), else beside
        the journal; a failure is counted and logged, never worth retrying the Aim batch for."""
        state.export_due = False
        run = state.handle
        if run is None:
            return
        if state.output_dir:
            target = Path(state.output_dir).expanduser() / EXPORT_NAME
        elif self._journal is not None:
            folder = self._journal if self._journal.is_dir() else self._journal.parent
            name = f"{state.run_id}.{EXPORT_NAME}" if self._journal.is_dir() else EXPORT_NAME
            target = folder / name
        else:
            return
        record = {"run_hash": run.hash, "run_id": state.run_id, "repo": self._repo_display(),
                  "experiment": state.experiment or self.default_experiment or "default"}
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(tmp, target)
        except OSError as exc:
            self.counters["export_errors"] += 1
            log.warning("aim sink: cannot write %s for run %s: %s", target, state.run_id, exc)

    def _repo_display(self) -> str:
        return self.repo_spec if self.remote else str(Path(self.repo_spec).expanduser().resolve())

    # -- journal catch-up -------------------------------------------------------------------------

    def _journal_file(self, run_id: str) -> Path | None:
        journal = self._journal
        assert journal is not None
        path = journal / f"{run_id}.jsonl" if journal.is_dir() else journal
        return path if path.is_file() else None

    def _journal_events(self, path: Path, run_id: str) -> Iterator[dict[str, Any]]:
        """Events of ``run_id`` in complete lines appended to ``path`` since its last sweep.

        The offset moves on only once every event was applied, so a failure re-reads them.
        """
        start = pos = self._swept.get((path, run_id), 0)
        quoted = orjson.dumps(run_id)  # cheap filter before parsing lines of other runs
        count = 0
        with open(path, "rb") as fh:
            fh.seek(start)
            for line in fh:
                if not line.endswith(b"\n"):
                    break  # a batch still being appended: the next sweep reads it
                pos += len(line)
                if quoted not in line:
                    continue
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self.counters["journal_bad_lines"] += 1
                    continue
                if type(event) is not dict or event.get("run") != run_id or type(event.get("data")) is not dict:
                    continue
                if event.get("type") == "metrics":
                    event["data"] = from_json_metrics(event["data"])
                count += 1
                yield event
        self._swept[(path, run_id)] = pos
        self.counters["sweeps"] += 1
        log.info("aim sink: run %s caught up from %s (%d events read)", run_id, path, count)


def _storable(obj: Any) -> Any:
    """A param value Aim can store: non-finite floats as json_safe writes them, ints beyond int64
    (which Aim's encoder refuses) as their decimal string, so the value is kept exactly."""
    kind = type(obj)
    if kind is int:
        return obj if obj in INT64 else str(obj)
    if kind is dict:
        return {k: _storable(v) for k, v in obj.items()}
    if kind is list:
        return [_storable(v) for v in obj]
    return json_safe(obj)


def _trainer_groups(stage: str, data: dict[str, Any]) -> dict[tuple, tuple[dict, dict]]:
    """Name and context exactly as Aim's own Hugging Face callback would.

    ``train_``/``eval_``/``test_`` prefixes (or the stage itself, for a trainer that already
    split them off) become ``{"subset": ...}``; plain training metrics keep ``{}``. With several
    eval sets (``eval_<set>_loss`` and no ``eval_loss``), ``<set>`` becomes ``sub_dataset``.
    """
    named: list[tuple[str | None, str, Any]] = []
    for key, value in data.items():
        subset = None if stage == "train" else stage
        for prefix in _SUBSET_PREFIXES:
            if key.startswith(prefix):
                subset, key = prefix[:-1], key[len(prefix):]
                break
        named.append((subset, key, value))
    sub_sets: dict[str, str] = {}
    for subset in {s for s, _, _ in named if s is not None}:
        names = {n for s, n, _ in named if s == subset}
        tagged = [n[:-len("_loss")] for n in names if n.endswith("_loss") and len(n) > len("_loss")]
        if "loss" not in names and len(tagged) == 1:
            sub_sets[subset] = tagged[0]
    groups: dict[tuple, tuple[dict, dict]] = {}
    for subset, name, value in named:
        context: dict[str, str] = {}
        if subset is not None:
            context["subset"] = subset
            tag = sub_sets.get(subset)
            if tag is not None and name.startswith(tag + "_"):
                context["sub_dataset"] = tag
                name = name[len(tag) + 1:]
        key = tuple(sorted(context.items()))
        groups.setdefault(key, (context, {}))[1][name] = value
    return groups
