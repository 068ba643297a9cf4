"""The W&B sink: one Weights & Biases run per training run, offline by default
(docs/sinks/wandb.md; its layout: sinks/wandb_layout.py; its state and lock: sinks/wandb_run.py).

wandb is imported only when the sink opens, so the relay works without the ``[wandb]`` extra.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sinks.base import CLOSE_TIMEOUT, FLUSH_TIMEOUT, SinkContext, SinkError
from sinks.events import Event
from sinks.naming import SYSTEM
from sinks.preflight import need_package, need_writable_dir
from sinks.tracker_base import Spans, TrackerSink, exact_ints
from sinks.wandb_access import api_key_present, import_wandb
from sinks.wandb_layout import STEP_KEY, config_update, row_and_summary, stats_items
from sinks.wandb_run import STATE_DIR, WbRun

log = logging.getLogger(__name__)

DISCARD_DIR = "relay-discarded"
ENDED_CLOSE_S = 30.0  # quiet seconds after rank 0's train_end before the W&B run is finished
IDLE_CLOSE_S = 600.0  # quiet seconds before a run that never ended is finished (as failed)
# the process exits with it when W&B may have lost points (the relay restarts it)
EXIT_DATA_LOST = 75
CORE_WRITE_ERROR = b"failed to save record"  # what wandb-core logs when the .wandb file fails


class WandbSink(TrackerSink):
    """Write relay events into W&B runs: offline directories (``wandb sync`` later) or online."""

    name = "wandb"

    @classmethod
    def options(cls) -> list[click.Option]:
        """W&B's own settings, prefixed; project and entity also from W&B's environment
        variables."""
        return [
            click.Option(["--wandb-project"], metavar="NAME", envvar="WANDB_PROJECT",
                         show_envvar=True, help="W&B project."),
            click.Option(["--wandb-entity"], metavar="NAME", envvar="WANDB_ENTITY",
                         show_envvar=True, help="W&B user or team (default: W&B's own)."),
            click.Option(["--wandb-mode"], type=click.Choice(["offline", "online"]),
                         default="offline", show_default=True,
                         help="offline: local files for `wandb sync`; online: also stream."),
            click.Option(["--wandb-dir"], metavar="PATH", default=None,
                         help="Where W&B's wandb/ folder goes (default: beside the journal, else "
                              "the cwd)."),
        ]

    def __init__(self, wandb_project: str | None = None, wandb_entity: str | None = None,
                 wandb_mode: str = "offline", wandb_dir: str | None = None) -> None:
        super().__init__()
        if not wandb_project:
            raise SinkError("--sink wandb needs --wandb-project NAME (or $WANDB_PROJECT)")
        self.project, self.entity = wandb_project, wandb_entity
        self.mode, self.dir_option = wandb_mode, wandb_dir
        self.idle_close_s, self.ended_close_s = IDLE_CLOSE_S, ENDED_CLOSE_S
        self._wb: dict[str, WbRun] = {}
        # published once the write that made them succeeds
        self._system_held: list[tuple[Any, Any]] = []
        self._lock = threading.RLock()  # the relay's writer thread and this sink's closer thread
        self._stop = threading.Event()

    def check(self, context: SinkContext) -> None:
        """wandb installed, its directory writable; online, an API key where wandb looks for one."""
        need_package("wandb", self.name, "wandb",
                     tested=("wandb>=0.31,<0.32", "the run's _interface"))
        need_writable_dir(self._root(context.journal) / "wandb", "W&B directory",
                          "pass a writable --wandb-dir")
        if self.mode == "online" and not api_key_present():
            raise SinkError("--wandb-mode online needs W&B credentials (no WANDB_API_KEY, no "
                            "netrc entry): run `wandb login` or set WANDB_API_KEY, or use "
                            "--wandb-mode offline and `wandb sync` later")

    def _root(self, journal: Path | None) -> Path:
        """Where the wandb/ folder goes: --wandb-dir, else beside the journal, else the cwd."""
        base = Path(self.dir_option) if self.dir_option else (
            (journal if journal.is_dir() else journal.parent) if journal is not None
            else Path.cwd())
        return base.expanduser().resolve()

    def open(self, context: SinkContext) -> None:
        """Import wandb, check the directory (and credentials, online); SinkError if unusable."""
        super().open(context)
        # A wandb-core inherited through $WANDB_SERVICE (a relay started by a process using W&B)
        # dies with that process and keeps the runs of a sink that died: use this process's own.
        os.environ.pop("WANDB_SERVICE", None)
        self._wandb, self._core_gone = import_wandb()
        from wandb.proto import wandb_internal_pb2

        self._pb: Any = wandb_internal_pb2  # (generated protobuf: its classes are made at import)
        self.root = self._root(context.journal)
        self.state_dir = self.root / "wandb" / STATE_DIR
        need_writable_dir(self.state_dir, "W&B directory", "pass a writable --wandb-dir",
                          create=True)
        if self.mode == "online":
            try:
                self._wandb.login(verify=False)
            except Exception as exc:  # wandb words it; every case means "no credentials here"
                raise SinkError(f"--wandb-mode online needs W&B credentials ({exc}): run "
                                "`wandb login` or set WANDB_API_KEY, or use --wandb-mode offline "
                                "and `wandb sync` later") from None
        threading.Thread(target=self._close_quiet_loop, name="wandb-sink-closer",
                         daemon=True).start()
        log.info("wandb sink writing %s runs of project %s under %s/wandb", self.mode, self.project,
                 self.root)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Finish every open W&B run (exit code 1 for runs that did not end) and log the
        counters."""
        self._stop.set()
        with self._lock:
            for wb in list(self._wb.values()):
                if wb.handle is not None:
                    self._finish(wb)
                self._release(wb)
        log.info("wandb sink closed: %s", dict(sorted(self.counters.items())))
        return True

    def write(self, events: Sequence[Event]) -> None:
        """On an error the ``_step`` counters fall back with the spans (the retry logs the same
        rows at the same steps, which W&B drops) and the system records held back are dropped (W&B
        would keep a second copy: they go out only with a write that succeeded); a dead wandb-core
        cannot be recovered in this process."""
        with self._lock:
            try:
                super().write(events)
                for interface, record in self._system_held:
                    interface._publish(interface._make_record(stats=record))
            except self._core_gone as exc:
                self._data_lost(f"wandb-core is gone ({type(exc).__name__}: {exc})")
            except Exception:
                for wb in self._wb.values():
                    wb.back_to_saved()
                raise
            finally:
                self._system_held.clear()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Check wandb-core wrote what it got."""
        with self._lock:
            for wb in self._wb.values():
                if wb.handle is not None:
                    self._check_core(wb, wb.handle)
        return True

    def start_run(self, run: str, params: dict[str, Any]) -> None:
        self._wb.setdefault(run, WbRun(run))

    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        wb = self._handle(run)
        if context.get(SYSTEM):  # the relay's figures: W&B's System section, out of the history
            self._system(wb, context, values, ts)
            return
        row, summary = row_and_summary(rank, context, values)
        # (track() before training: model_load_time) a scalar of the run, not a history row at
        # step 0, which HF's callback never writes
        if row and step is None:
            summary.update(row)
            row = {}
        if summary:
            wb.handle.summary.update(summary)
        if row:
            wb.add_to_row(row, step, ts)

    def _system(self, wb: WbRun, context: dict[str, Any], values: dict[str, float | int],
                ts: float) -> None:
        """A system stats record at the event's own time (sinks/wandb_layout.py:
        ``stats_items``)."""
        record = self._pb.StatsRecord(stats_type=self._pb.StatsRecord.StatsType.SYSTEM)
        record.timestamp.FromMicroseconds(int(ts * 1_000_000))
        for key, value in stats_items(context, values).items():
            record.item.add(key=key, value_json=value)
        # (no public call takes a time: wandb's own monitor uses the run's interface)
        self._system_held.append((wb.handle._interface, record))

    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        """Config keys as sinks/wandb_layout.py lays them out; the ``run`` params' ``run_name``
        names the W&B run (``--run_name``, as the HF callback does)."""
        wb = self._handle(run)
        if name == "hparams":
            wb.hparams.update(params)
        update = config_update(name, params, wb.hparams)
        wb.handle.config.update({k: exact_ints(v) for k, v in update.items()},
                                allow_val_change=True)
        run_name = params.get("run_name") if name == "run" else None
        if isinstance(run_name, str) and run_name and run_name != wb.name:
            wb.name = wb.handle.name = run_name

    def finish_run(self, run: str, status: str) -> None:
        self._wb[run].ends(completed=status == "completed")

    def supersede(self, run: str, step: int) -> None:
        """W&B keeps every history row, so the earlier attempt's rows after ``step`` are dropped the
        way W&B drops them: the run is rewound (``resume_from="<id>?_step=N"``, W&B's own rewind) to
        the last ``_step`` before the first row it logged past ``step``; the next rows go on from
        there, in a new instance, which ``wandb sync`` uploads as the rewind."""
        wb = self._wb[run]
        if wb.handle is not None:
            wb.commit_row()
        first = wb.first_step_after(step)
        if first is None:
            return  # nothing was logged past the checkpoint
        if wb.handle is not None:
            self._finish(wb)
        wb.rewind_before(first, self.state_dir)
        self.counters["rewinds"] += 1
        log.info("W&B run %s: attempt after step %d; rewound to _step %d (its rows past the step "
                 "are superseded)", run, step, wb.rewind)

    def load_applied(self, run: str) -> Spans:
        """Take the run's lock (waiting for a process still finishing it), then its saved state; a
        directory left open by a process that died is moved aside and its part applied again."""
        wb = self._wb.setdefault(run, WbRun(run))
        wb.acquire(self.state_dir)
        state = wb.read_state(self.state_dir)
        exit_code, left_open = state.get("exit_code"), state.get("open")
        if left_open:  # out of `wandb sync`'s way, which looks one level down only
            for run_dir in self._left_open(run, left_open):
                target = self.root / "wandb" / DISCARD_DIR / run_dir.name
                if run_dir.is_dir() and not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(run_dir, target)
                    self.counters["discarded_dirs"] += 1
                    log.warning("W&B directory %s left incomplete: moved to %s, its points are "
                                "applied again", run_dir, target)
            state = left_open
        spans = wb.restore(state, exit_code)
        if left_open:
            wb.write_state(self.state_dir)
        return spans

    def _run_dirs(self, run: str) -> list[Path]:
        return sorted((self.root / "wandb").glob(f"*-run-*-{run}"))

    def _left_open(self, run: str, left_open: dict[str, Any]) -> list[Path]:
        """The directories a dead process left open: the one it recorded, or, if it died in
        wandb.init before it could record one, every directory of the run made since it began."""
        if left_open.get("dir"):
            return [Path(left_open["dir"])]
        return [d for d in self._run_dirs(run) if d.name not in left_open.get("before", [])]

    def save_applied(self, run: str, spans: Spans) -> None:
        wb = self._wb[run]
        if wb.handle is not None:
            wb.commit_row()  # the spans say its events are in
        try:
            wb.save(spans, self.state_dir)
        except OSError as exc:
            if wb.handle is not None:  # the same disk holds the .wandb file wandb-core is buffering
                self._data_lost(f"W&B run {run}: cannot save the sink's state ({exc})")
            raise

    def _handle(self, run: str) -> WbRun:
        """The run's open W&B run, made (or resumed, as a new instance) on demand."""
        wb = self._wb[run]
        wb.last_event = time.monotonic()
        if wb.handle is not None:
            return wb
        settings = self._wandb.Settings(
            mode=self.mode, reinit="create_new", silent=True, console="off", x_disable_stats=True,
            x_disable_meta=True, x_disable_machine_info=True, disable_code=True, disable_git=True,
            save_code=False, x_save_requirements=False)
        try:
            wb.opening([d.name for d in self._run_dirs(run)], self.state_dir)
        except OSError as exc:
            self._data_lost(f"W&B run {run}: cannot save the sink's state ({exc})")
        # a rewound run (a later attempt: ``supersede``) continues from its rewind point, else after
        # its last row
        resume = ({"resume_from": f"{run}?_step={wb.rewind}"} if wb.rewind is not None
                  else {"resume": "allow"})
        try:
            handle = self._wandb.init(project=self.project, entity=self.entity, id=run,
                                      name=wb.name or run, dir=str(self.root), settings=settings,
                                      **resume)
        except self._core_gone as exc:
            self._data_lost(f"wandb-core is gone ({type(exc).__name__}: {exc})")
        except Exception as exc:  # transient for the relay: the batch is retried with backoff
            self.counters["init_errors"] += 1
            raise RuntimeError(f"wandb.init for run {run} failed: {type(exc).__name__}: "
                               f"{exc}") from exc
        handle.define_metric(STEP_KEY)  # as the HF callback defines them
        handle.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        directory = str(Path(handle.dir).parent)
        try:
            wb.opened(handle, directory, self.state_dir)
        except OSError as exc:
            self._data_lost(f"W&B run {run}: cannot save the sink's state ({exc})")
        self.counters["wandb_runs_opened"] += 1
        log.info("W&B run %s opened in %s", run, directory)
        return wb

    def _finish(self, wb: WbRun) -> None:
        """Finish the W&B run; its directory counts as complete only if wandb-core wrote it all."""
        wb.commit_row()
        handle = wb.detach()
        try:
            handle.finish(exit_code=1 if wb.exit_code is None else wb.exit_code)
        except Exception as exc:  # wandb-core is gone: the directory stays marked open, to rebuild
            self.counters["finish_errors"] += 1
            log.error("W&B run %s not finished (%s: %s); the next process rebuilds it from the "
                      "journal", wb.run_id, type(exc).__name__, exc)
            return
        self.counters["wandb_runs_finished"] += 1
        if wb.logged_step > wb.saved_step:  # a failed batch was never retried: rebuild instead
            log.warning("W&B run %s finished with points not confirmed; the next process rebuilds "
                        "it", wb.run_id)
            return
        self._check_core(wb, handle)
        try:
            wb.complete(self.state_dir)
        except OSError as exc:  # the directory stays marked open: the next process rebuilds it
            self.counters["state_errors"] += 1
            log.error("W&B run %s finished but the sink's state was not saved: %s", wb.run_id, exc)

    def _close_quiet_loop(self) -> None:
        """Finish runs gone quiet, so a long-lived relay leaves complete directories to sync."""
        while not self._stop.wait(1.0):
            with self._lock:
                now = time.monotonic()
                for wb in list(self._wb.values()):
                    quiet = now - wb.last_event
                    if wb.handle is not None and wb.logged_step <= wb.saved_step and not (
                            self.catch_up_due(wb.run_id)) and (  # a catch-up is due first
                            quiet >= self.idle_close_s or (wb.exit_code is not None and (
                                quiet >= self.ended_close_s or self.run_settled(wb.run_id)))):
                        self._finish(wb)
                        self._release(wb)

    def _release(self, wb: WbRun) -> None:
        """Let another process take the run; a later event here reloads its state (and the lock)."""
        wb.release()
        self._wb.pop(wb.run_id, None)
        self.forget_run(wb.run_id)

    def _check_core(self, wb: WbRun, handle: Any) -> None:
        """wandb-core reports a failed write of the .wandb file only in its own log."""
        try:
            with open(handle.settings.log_internal, "rb") as fh:
                fh.seek(wb.core_log_at)
                seen = fh.read()
        except OSError:
            return
        wb.core_log_read(len(seen))
        if CORE_WRITE_ERROR in seen:
            self._data_lost(f"W&B run {wb.run_id}: wandb-core failed to write "
                            f"{handle.settings.sync_file}")

    def _data_lost(self, why: str) -> None:
        """W&B may lack points this sink counts as applied: start again, from a clean slate."""
        self.counters["data_lost_exits"] += 1
        log.critical("wandb sink: %s; exiting, so that the relay starts this sink again, which "
                     "moves the open directory to wandb/%s/ and applies its points again", why,
                     DISCARD_DIR)
        logging.shutdown()
        os._exit(EXIT_DATA_LOST)
