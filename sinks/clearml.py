"""The ClearML sink: one ClearML task per training run, as an offline session that ClearML's own
code writes, never touching the network (docs/sinks/clearml.md, "Idempotent, and never doubled",
"Several runs, one process").

ClearML is imported only when the sink opens, so the relay works without the ``[clearml]`` extra.
It runs over 350 lines because the offline session is built by hand in several places (task
construction, synchronous scalar writes, session state and its zip), each needing the others.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sinks.base import CLOSE_TIMEOUT, FLUSH_TIMEOUT, SinkContext, SinkError
from sinks.clearml_task import Session, whole_task_json
from sinks.events import Event, json_safe
from sinks.files import write_atomic
from sinks.naming import SYSTEM
from sinks.preflight import need_package, need_writable_dir, tool_import
from sinks.tracker_base import Spans, TrackerSink

log = logging.getLogger(__name__)

#: What ClearMLCallback (transformers) reports with ``report_single_value`` rather than per step.
SINGLE_VALUE_SCALARS = frozenset({"train_runtime", "train_samples_per_second",
                                  "train_steps_per_second", "train_loss", "total_flos", "epoch"})
#: ClearMLCallback's hyperparameter section for the TrainingArguments, and its model config object.
HPARAMS_SECTION = "Transformers"
MODEL_CONFIG = "Model Configuration"
#: ClearML's own title and iteration for single values (``Logger.report_single_value``).
SUMMARY_TITLE, SUMMARY_ITER = "Summary", -(2 ** 31)
#: The custom-metrics stage whose names fms-hf-tuning's ClearML tracker leaves without a prefix.
PLAIN_STAGE = "additional_metrics"
#: The title prefix of ClearML's own machine monitoring (``:monitor:machine``, ``:monitor:gpu``).
MONITOR = ":monitor:"
STATE_NAME, LOCK_NAME = "relay-clearml.json", "relay-clearml.lock"


class ClearmlSink(TrackerSink):
    """Write relay events as ClearML offline sessions under ``--clearml-dir``."""

    name = "clearml"

    @classmethod
    def options(cls) -> list[click.Option]:
        """The names fms-hf-tuning's ClearML tracker config uses, plus where the sessions go."""
        return [
            click.Option(["--clearml-project"], metavar="NAME", default=None,
                         help="ClearML project of the tasks (required)."),
            click.Option(["--clearml-task"], metavar="NAME", default=None,
                         help="Task name (default: the relay run id); the run id is always in the "
                              "task's `relay/run_id` parameter."),
            click.Option(["--clearml-dir"], metavar="DIR", default=None,
                         help="ClearML cache directory for the offline sessions "
                              "(<DIR>/offline/<task id>); default: ClearML's own "
                              "(CLEARML_CACHE_DIR or ~/.clearml/cache)."),
        ]

    def __init__(self, clearml_project: str | None = None, clearml_task: str | None = None,
                 clearml_dir: str | None = None) -> None:
        super().__init__()
        if not clearml_project:
            raise SinkError("--sink clearml needs --clearml-project NAME (the ClearML project of "
                            "the tasks)")
        self.project = clearml_project
        self.task_name = clearml_task
        self.cache_dir = clearml_dir
        self.root = Path()
        self._sessions: dict[str, Session] = {}
        self._state: dict[str, dict[str, Any]] = {}
        self._lock_fh: Any = None

    def check(self, context: SinkContext) -> None:
        """ClearML installed, the cache directory (where the offline sessions go) writable."""
        need_package("clearml", self.name, "clearml",
                     tested=("clearml>=2.1,<2.2",
                             "Task._Task__create_protection, Task._save_data_to_offline_dir"))
        cache = self.cache_dir or os.environ.get("CLEARML_CACHE_DIR") or "~/.clearml/cache"
        need_writable_dir(Path(cache), "ClearML session directory", "pass a writable --clearml-dir")

    def open(self, context: SinkContext) -> None:
        """Import ClearML in offline mode and check the session directory; SinkError if unusable."""
        super().open(context)
        with tool_import("clearml", "ClearML"):
            from clearml import Task
            from clearml.backend_interface.metrics.events import ScalarEvent
            from clearml.config import get_offline_dir
        if self.cache_dir:  # read by ClearML at every call: where each task's offline folder goes
            os.environ["CLEARML_CACHE_DIR"] = str(Path(self.cache_dir).expanduser().resolve())
        Task.set_offline(True)
        self._task_cls, self._event_cls = whole_task_json(Task), ScalarEvent
        self.root = get_offline_dir()
        need_writable_dir(self.root, "ClearML session directory", "pass a writable --clearml-dir",
                          create=True)
        try:
            self._take_lock()
        except RuntimeError as exc:  # not fatal: the first write tries again, with relay's backoff
            log.warning("clearml sink: %s", exc)
        log.info("clearml sink writing offline sessions to %s", self.root)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Close every task (ClearML writes its zip then); errors are counted, never fatal."""
        for run, session in self._sessions.items():
            if session.handle is not None:
                self._close_task(run, session)
        if self._lock_fh is not None:
            self._lock_fh.close()  # releases the lock
            self._lock_fh = None
        log.info("clearml sink closed: %s", dict(sorted(self.counters.items())))
        return True

    def state_path(self) -> Path:
        return self.root / STATE_NAME

    def write(self, events: Sequence[Event]) -> None:
        """Apply a batch (sinks/tracker_base.py); on failure drop what was not written, so the retry
        starts from the saved state; then write the zips of runs that ended."""
        self._take_lock()
        try:
            super().write(events)
        except Exception:
            self._discard_pending()
            raise
        self._close_ended({e["run"] for e in events})

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        self._close_ended(list(self._sessions))
        return True

    def _take_lock(self) -> None:
        """One process per directory; the state is read once the lock is held, never before."""
        if self._lock_fh is not None:
            return
        fh = open(self.root / LOCK_NAME, "a+")  # noqa: SIM115 (the lock is held while it is open)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            self.counters["lock_busy"] += 1
            raise RuntimeError(f"{self.root} is in use by another process (pid {holder}), e.g. a "
                               "relay's previous sink process still draining") from None
        path = self.state_path()
        try:
            self._state = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError) as exc:
            fh.close()
            raise SinkError(f"ClearML sink state {path} unreadable ({exc}): move it away to start "
                            "over (a replay then writes new tasks)") from None
        fh.truncate(0)
        fh.write(str(os.getpid()))
        fh.flush()
        self._lock_fh = fh

    def _discard_pending(self) -> None:
        for session in self._sessions.values():
            session.pending.clear()

    def _close_ended(self, runs: Any) -> None:
        for run in runs:
            session = self._sessions.get(run)
            if (session is not None and session.ended and session.handle is not None
                    and self.run_settled(run)):
                self._close_task(run, session)

    def start_run(self, run: str, params: dict[str, Any]) -> None:
        if run in self._sessions:
            return
        saved = self._state.get(run)
        if saved is not None and (self.root / saved["task_id"] / "task.json").is_file():
            session = Session(saved["task_id"], metrics_bytes=saved["metrics_bytes"])
            self._sessions[run] = session
            self._open_task(run, session)
            self._cut_tail(run, session)
            self.counters["runs_resumed"] += 1
            log.info("clearml task %s resumed for run %s", session.task_id, run)
            return
        if saved is not None:
            log.warning("clearml session %s of run %s is gone; starting a new task",
                        saved["task_id"], run)
        task = self._task_cls(private=self._task_cls._Task__create_protection,
                              project_name=self.project, task_name=self.task_name or run,
                              task_type=self._task_cls.TaskTypes.training)
        task.update_parameters({"relay/run_id": run})
        session = self._sessions[run] = Session(task.id, handle=task)
        self._state[run] = {"task_id": task.id, "metrics_bytes": 0, "applied": {}}
        self._write_state()  # before any point: a restart finds this task, never makes a second one
        self.counters["runs_created"] += 1
        log.info("clearml task %s created for run %s", task.id, run)

    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        session = self._sessions[run]
        subset = context.get("subset")
        system = context.get(SYSTEM)
        for name, value in values.items():
            if system:
                # titled as ClearML's own monitoring (":monitor:gpu"): one chart per figure, a
                # series per rank
                series = "cluster" if rank is None else f"rank {rank}"
                self._scalar(session, f"{MONITOR}{name}", series, step, value, ts)
            elif rank is None:  # the Trainer's own series, named exactly as ClearMLCallback.on_log
                key = name if subset is None else f"{subset}_{name}"
                if "sub_dataset" in context:
                    key = f"{subset}_{context['sub_dataset']}_{name}"
                if key in SINGLE_VALUE_SCALARS:
                    self._single(session, key, value, ts)
                elif subset in ("eval", "test"):
                    self._scalar(session, subset, key[len(subset) + 1:], step, value, ts)
                else:
                    self._scalar(session, "train", key, step, value, ts)
            else:  # custom metrics: single values, named as fms-hf-tuning's tracker
                label = name if subset == PLAIN_STAGE else f"{subset}.{name}"
                self._single(session, label if rank == 0 else f"{label}/rank {rank}", value, ts)

    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        from clearml.utilities.proxy_object import flatten_dictionary

        # "Infinity" as the journal keeps it: live == replay
        task, params = self._task(run), json_safe(params)
        if name == "model":  # ClearMLCallback's configuration object; JSON text takes any key
            stored = task.get_configuration_object(MODEL_CONFIG)
            merged = {**(json.loads(stored) if stored else {}), **params}
            config_text = json.dumps(merged, indent=2, sort_keys=True)
            task.set_configuration_object(MODEL_CONFIG, config_text=config_text, config_type="json")
            return
        section, _, sub = (HPARAMS_SECTION, "", "") if name == "hparams" else name.partition(".")
        prefix = f"{section}/" + "".join(f"{part}/" for part in sub.split(".") if part)
        task.update_parameters({prefix + key: value
                                for key, value in flatten_dictionary(params).items()})

    def finish_run(self, run: str, status: str) -> None:
        """Offline tasks have no status (the import marks them completed): kept as a tag."""
        self._task(run).add_tags([status])
        self._sessions[run].ended = True

    def load_applied(self, run: str) -> Spans:
        saved = self._state.get(run, {}).get("applied", {})
        return {int(rank): spans for rank, spans in saved.items()}

    def save_applied(self, run: str, spans: Spans) -> None:
        """Write the run's pending points, then the spans and the file size that covers them."""
        session = self._sessions[run]
        size = session.metrics_bytes
        if session.pending:
            self._cut_tail(run, session)
            metrics = self._metrics_manager(run)
            metrics.write_events(session.pending, async_enable=False)
            session.pending.clear()
            size = Path(metrics._offline_log_filename).stat().st_size
        previous = self._state[run]
        self._state[run] = {"task_id": session.task_id, "metrics_bytes": size, "applied": spans}
        try:
            self._write_state()
        except Exception:
            # the points just written are past the saved size: cut, then redone
            self._state[run] = previous
            raise
        session.metrics_bytes = size

    def _scalar(self, session: Session, title: str, series: str, step: int | None, value: float,
                ts: float) -> None:
        if step is None:  # ClearML plots need an iteration: without one, it is the latest value
            self._single(session, f"{title}/{series}", value, ts)
            return
        if not math.isfinite(value):
            self.counters["nonfinite_values"] += 1  # ClearML stores them as 0.0 (its default)
        session.pending.append(self._event_cls(metric=title, variant=series, value=float(value),
                                               iter=step, timestamp=int(ts * 1000)))

    def _single(self, session: Session, name: str, value: float, ts: float) -> None:
        """``report_single_value``: the newest by publish time wins, also after a late catch-up."""
        if session.single_ts.get(name, -math.inf) > ts:
            self.counters["older_single_values"] += 1
            return
        session.single_ts[name] = ts
        self._scalar(session, SUMMARY_TITLE, name, SUMMARY_ITER, value, ts)

    def _task(self, run: str) -> Any:
        session = self._sessions[run]
        if session.handle is None:
            self._open_task(run, session)
        return session.handle

    def _open_task(self, run: str, session: Session) -> None:
        """Resume the offline task by its id: ClearML reads its task.json back."""
        session.handle = self._task_cls(private=self._task_cls._Task__create_protection,
                                        task_id=session.task_id)

    def _metrics_manager(self, run: str) -> Any:
        task = self._task(run)
        return task._get_metrics_manager(task.get_output_destination())

    def _cut_tail(self, run: str, session: Session) -> None:
        """Cut metrics.jsonl back to what the saved spans cover: lines past it belong to events
        that are not in the spans (a failed batch, a crash before the save) and come again."""
        path = Path(self._metrics_manager(run)._offline_log_filename)
        size = path.stat().st_size if path.exists() else 0
        if size > session.metrics_bytes:
            with path.open("r+b") as fh:
                fh.truncate(session.metrics_bytes)
            self.counters["truncated_bytes"] += size - session.metrics_bytes
            log.info("clearml task %s: cut %d bytes of metrics.jsonl written after the last saved "
                     "state", session.task_id, size - session.metrics_bytes)
        elif size < session.metrics_bytes:
            self.counters["metrics_shorter_than_state"] += 1
            log.error("clearml task %s: metrics.jsonl is shorter than the state says (%d < %d "
                      "bytes): changed by someone else; points may be missing", session.task_id,
                      size, session.metrics_bytes)
            session.metrics_bytes = size

    def _write_state(self) -> None:
        write_atomic(self.state_path(), json.dumps(self._state))

    def _close_task(self, run: str, session: Session) -> None:
        """ClearML writes the session's zip (what the import takes) when a task closes."""
        task, session.handle = session.handle, None
        try:
            task.close()
        except Exception as exc:  # counted: the folder itself is complete and importable
            self.counters["close_errors"] += 1
            log.warning("clearml task %s of run %s: zip not written (%s: %s); the folder %s is "
                        "importable", session.task_id, run, type(exc).__name__, exc,
                        self.root / session.task_id)
            return
        self.counters["tasks_closed"] += 1
