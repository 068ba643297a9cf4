"""The Aim sink: one Aim run per training run, whatever the number of ranks (docs/aim.md).

The applied spans live inside the Aim run (its metadata, not a param), so Aim's own store says
what it holds. Aim is imported only when the sink opens, so the relay works without the ``[aim]``
extra. Finding and indexing runs: sinks/aim_repo.py; the ``aim_tracker.json`` export:
sinks/tracker_export.py.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson

from sinks.aim_repo import PARAMS_KEY, RunLookup, forget_listing, index, open_local
from sinks.aim_run import close_at, relay_run_class
from sinks.base import CLOSE_TIMEOUT, FLUSH_TIMEOUT, SinkContext, SinkError
from sinks.events import Event, json_safe
from sinks.naming import SYSTEM
from sinks.preflight import need_package, need_writable_dir, tool_import
from sinks.tracker_base import Spans, TrackerSink, exact_ints
from sinks.tracker_export import export_dir, tracker_file, write_tracker_file

log = logging.getLogger(__name__)

#: The run-id export file the seed's users already script against.
EXPORT_NAME = "aim_tracker.json"
#: Aim's prefix for system metrics (``aim.ext.resource.configs.AIM_RESOURCE_METRIC_PREFIX``): its UI
#: shows such series in the run page's System tab and the explorers' System group.
SYSTEM_PREFIX = "__system__"
#: Per-rank figures that are what Aim's own resource tracker records per process, under its names:
#: the run page's System tab shows only those names (its UI's list), one chart per rank (context
#: ``rank``). The other figures keep the prefix, so the explorers list them in their System group.
AIM_RESOURCES = {"rank_cpu_percent": SYSTEM_PREFIX + "cpu",
                 "rank_memory_percent": SYSTEM_PREFIX + "p_memory_percent"}
#: Key in the run's own metadata (not a param) for the applied (rank, seq) spans.
STATE_KEY = "metrics_relay_applied"
#: Key beside it for the newest event ``ts`` applied: the run's end time when it is closed.
LAST_TS_KEY = "metrics_relay_last_ts"
#: Seconds without events after which a run's Aim handle is closed (a job that died without
#: train_end must not stay "active" in Aim, nor hold files and threads, on a long-lived relay).
IDLE_CLOSE_S = 600.0


@dataclass
class _RunState:
    """What this sink knows about one training run's Aim side; survives its handle being closed."""

    run_id: str
    handle: Any = None  # aim.Run while open
    unclosable: bool = False  # close failed: keep the (still writable) handle, never close again
    take_over: bool = False  # its remote handle was abandoned: take the run's lock over on reopen
    experiment: str | None = None
    output_dir: str | None = None  # where aim_tracker.json goes (sinks/tracker_export.py)
    output_from_run: bool = False  # the `run` group's folder beats hparams' own output_dir
    export_due: bool = False
    ended: bool = False  # rank 0 said train_end: close after every batch that touches the run
    # of its last write: what "idle" counts from
    last_event: float = field(default_factory=time.monotonic)
    # the earliest event ts seen: the creation time, if the run is new
    first_ts: float | None = None
    # the newest event ts written to it (or stored in it): its end time
    last_ts: float | None = None


def _import_aim() -> Any:
    """Import Aim, or say how to get it: the sink is optional and so is the ``[aim]`` extra."""
    with tool_import("aim", "Aim"):
        import aim  # noqa: F401 - imported for its side effect of failing early
        from aim.sdk.repo import Repo
    return Repo


def _server_address(spec: str) -> None:
    """SinkError unless ``spec`` is aim://HOST:PORT."""
    host, _, port = spec[len("aim://"):].rpartition(":")
    if not host or not port.isdigit():
        raise SinkError(f"--repo {spec!r} is not aim://HOST:PORT")


class AimSink(TrackerSink):
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
        super().__init__()
        if not repo:
            raise SinkError("--sink aim needs --repo PATH (a local Aim repository, created if "
                            "missing) or --repo aim://HOST:PORT (an `aim server`)")
        self.repo_spec = repo
        self.default_experiment = experiment
        self.remote = repo.startswith("aim://")
        self._repo: Any = None
        self._aim: dict[str, _RunState] = {}
        self._lookup = RunLookup(self.counters)
        self.idle_close_s = IDLE_CLOSE_S

    def check(self, context: SinkContext) -> None:
        """Aim installed; a local repository's directory writable, a remote one's address well
        formed."""
        need_package("aim", self.name, "aim",
                     tested=("aim>=3.29,<3.30", "Run._tracker._track, aim.sdk internals"))
        if self.remote:
            _server_address(self.repo_spec)
        else:
            need_writable_dir(Path(self.repo_spec), "Aim repository",
                              "pass a writable --repo directory")

    def open(self, context: SinkContext) -> None:
        """Open (or create) the repository; SinkError when it cannot be used at all."""
        super().open(context)
        repo_cls = _import_aim()
        # One INFO line per opened run from Aim's status reporter is noise in the relay's log.
        logging.getLogger("aim.sdk.reporter").setLevel(logging.WARNING)
        if self.remote:
            self._open_remote(repo_cls)
        else:
            self._open_local(repo_cls)

    def _open_local(self, repo_cls: Any) -> None:
        root = Path(self.repo_spec).expanduser()
        need_writable_dir(root, "Aim repository", "pass a writable --repo directory", create=True)
        try:
            self._repo = open_local(repo_cls, root)
        except OSError as exc:
            raise SinkError(f"Aim repository {root} is not usable: {exc.strerror or exc}; "
                            "pass a writable --repo directory") from None
        except Exception as exc:  # Aim reports a broken repo in many ways; all are a config error
            raise SinkError(f"Aim repository {root} cannot be opened ({type(exc).__name__}: "
                            f"{exc}): check it with `aim up --repo`, or pass another --repo"
                            ) from None
        log.info("aim sink writing to %s", self._repo.path)

    def _open_remote(self, repo_cls: Any) -> None:
        _server_address(self.repo_spec)
        try:
            self._repo = repo_cls.from_path(self.repo_spec)
        except Exception as exc:  # server down: training must not wait, the journal catches up
            self.counters["open_errors"] += 1
            log.warning("aim server %s not reachable yet (%s: %s); retrying with every batch, "
                        "the journal keeps everything meanwhile", self.repo_spec,
                        type(exc).__name__, exc)
        else:
            log.info("aim sink writing to %s", self.repo_spec)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Persist progress and close every open Aim run (errors are counted, never fatal). Aim's
        remote client waits without limit for an unreachable server before a run closes: the relay
        leaves such a close running once ``timeout`` has passed and says so
        (relay/sinkhost/driver.py)."""
        for state in list(self._aim.values()):
            if state.handle is not None and not state.unclosable:
                self._close_handle(state)
        log.info("aim sink closed: %s", dict(sorted(self.counters.items())))
        return True

    def write(self, events: Sequence[Event]) -> None:
        """Apply a batch (sinks/tracker_base.py); then export, close ended runs and idle ones. On an
        Aim error a remote client is dropped too, as a restarted server forgets its handles."""
        self._note_times(events)
        try:
            self._ensure_repo()
            super().write(events)
        except Exception:
            self._reset_remote()
            raise
        self._finish({e["run"] for e in events})
        self._close_idle()

    def _note_times(self, events: Sequence[Event]) -> None:
        """The span of event times each run was seen with: its creation and end time in Aim."""
        for event in events:
            run = event["run"]
            state = self._aim.get(run) or self._aim.setdefault(run, _RunState(run))
            ts = event["ts"]
            if state.first_ts is None or ts < state.first_ts:
                state.first_ts = ts
            if state.last_ts is None or ts > state.last_ts:
                state.last_ts = ts

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        self._finish(list(self._aim))
        return True

    def _ensure_repo(self) -> None:
        if self._repo is None:  # a remote server that was down at open
            self._repo = _import_aim()(self.repo_spec)  # not from_path: that pools the old client
            log.info("aim sink connected to %s", self.repo_spec)

    def _finish(self, runs: Iterable[str]) -> None:
        for run in runs:
            state = self._aim.get(run)
            if state is None or state.handle is None:
                continue
            if state.export_due:
                self._export(state)
            if state.ended and self.run_settled(run):  # not before: a late event would reopen it
                self._close_handle(state)

    def _close_idle(self) -> None:
        """Close the runs that went quiet; a late event reopens them."""
        now = time.monotonic()
        for state in self._aim.values():
            if state.handle is not None and now - state.last_event >= self.idle_close_s:
                log.info("aim run of run %s idle for %.0f s: closing it", state.run_id,
                         now - state.last_event)
                self._close_handle(state)

    def _reset_remote(self) -> None:
        """A restarted server no longer knows this client or its run handles, and Aim's client
        only reconnects its write queue: start over with a new client and take the runs over."""
        if self.remote:
            self._repo = None
            for state in self._aim.values():
                if state.handle is not None:
                    state.handle, state.take_over = None, True

    def start_run(self, run: str, params: dict[str, Any]) -> None:
        self._aim.setdefault(run, _RunState(run))

    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        handle = self._handle(run)
        # the relay's figures: named as Aim's own system metrics (see AIM_RESOURCES)
        if context.get(SYSTEM):
            context = {k: v for k, v in context.items() if k != SYSTEM}
            values = {AIM_RESOURCES.get(name) or SYSTEM_PREFIX + name: value
                      for name, value in values.items()}
        # the event's own time
        handle._tracker._track(values, ts, None, step, epoch, context=context)

    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        handle, state = self._handle(run), self._aim[run]
        path = tuple(name.split("."))
        for key, value in params.items():
            # what Aim can store
            handle.set((*path, key), json_safe(exact_ints(value)), strict=False)
        run_name = params.get("run_name") if name == "run" else None
        if isinstance(run_name, str) and run_name and handle.name != run_name:
            # the job's --run_name, as the run's name (AimCallback leaves Aim's own)
            handle.name = run_name
        if name in ("run", "hparams"):
            experiment = params.get("experiment")
            if isinstance(experiment, str) and experiment and experiment != state.experiment:
                state.experiment = experiment
                handle.experiment = experiment
                state.export_due = True
            output_dir = export_dir(params)
            if (output_dir is not None and output_dir != state.output_dir
                    and (name == "run" or not state.output_from_run)):
                state.output_dir, state.output_from_run = output_dir, name == "run"
                state.export_due = True

    def finish_run(self, run: str, status: str) -> None:
        self._aim[run].ended = True

    def load_applied(self, run: str) -> Spans:
        saved = self._handle(run).meta_run_tree.get(STATE_KEY, None)
        return {int(rank): spans for rank, spans in orjson.loads(saved).items()} if saved else {}

    def save_applied(self, run: str, spans: Spans) -> None:
        tree = self._handle(run).meta_run_tree
        tree[STATE_KEY] = orjson.dumps(spans, option=orjson.OPT_NON_STR_KEYS).decode()
        tree[LAST_TS_KEY] = self._aim[run].last_ts

    def _handle(self, run: str) -> Any:
        """The open Aim run of ``run``, opened (or created) on demand."""
        state = self._aim.get(run) or self._aim.setdefault(run, _RunState(run))
        if state.handle is None:
            self._ensure_repo()
            self._open_run(state)
        state.last_event = time.monotonic()
        return state.handle

    def _open_run(self, state: _RunState) -> None:
        """Resume the Aim run of this run id, or create it; load what it already holds."""
        run_class = relay_run_class()
        quiet = {"system_tracking_interval": None, "log_system_params": False,
                 "capture_terminal_logs": False}
        run_hash = self._lookup.find(self._repo, state.run_id)
        if run_hash is None:
            run = run_class(repo=self._repo, experiment=state.experiment or self.default_experiment,
                            created_at=state.first_ts, **quiet)
            run[PARAMS_KEY] = {"run_id": state.run_id}
            run.name = state.run_id
            self._lookup.made(state.run_id, run.hash)
            state.export_due = True
            self.counters["runs_created"] += 1
            log.info("aim run %s created for run %s", run.hash, state.run_id)
        else:
            forget_listing(self._repo)  # Aim refuses to resume a run missing from its listing
            run = run_class(run_hash, repo=self._repo, force_resume=state.take_over, **quiet)
            state.take_over = False
            stored = run.meta_run_tree.get(LAST_TS_KEY, None)
            if isinstance(stored, (int, float)) and (
                    state.last_ts is None or stored > state.last_ts):
                # events seen now may be older than those it holds (a catch-up)
                state.last_ts = stored
            if state.experiment:
                run.experiment = state.experiment
            self.counters["runs_opened"] += 1
            log.info("aim run %s resumed for run %s", run_hash, state.run_id)
        state.handle = run

    def _close_handle(self, state: _RunState) -> None:
        """Close and index the run. Aim cannot retry a failed close, but the handle stays
        writable, so it is kept (the run then shows as active until ``aim runs close``)."""
        run = state.handle
        if run is None or state.unclosable:
            return
        try:
            close_at(run, state.last_ts)
        except Exception as exc:  # counted; later events of the run still go through this handle
            state.unclosable = True
            self.counters["close_errors"] += 1
            log.warning("aim run %s of run %s could not be closed (%s: %s); it stays marked active "
                        "until `aim runs close --force %s`", run.hash, state.run_id,
                        type(exc).__name__, exc, run.hash)
            return
        state.handle = None
        self.counters["runs_closed"] += 1
        if not self.remote:
            index(self._repo, run.hash, self.counters)

    def _export(self, state: _RunState) -> None:
        """A failure is counted and logged, never worth retrying the Aim batch for; a replay's
        file goes into its own repo, as the job's names the live run (docs/aim.md)."""
        state.export_due = False
        run = state.handle
        if run is None:
            return
        if not self.context.replay:
            target = tracker_file(EXPORT_NAME, state.run_id, state.output_dir, self.context.journal)
        elif not self.remote:
            target = Path(self.repo_spec).expanduser() / f"{state.run_id}.{EXPORT_NAME}"
        else:
            target = None
        if target is None:
            return
        record = {"run_hash": run.hash, "run_id": state.run_id, "repo": self._repo_display(),
                  "experiment": state.experiment or self.default_experiment or "default"}
        write_tracker_file(target, record, self.counters, self.name, state.run_id)

    def _repo_display(self) -> str:
        return self.repo_spec if self.remote else str(Path(self.repo_spec).expanduser().resolve())
