"""The TensorBoard sink: one TensorBoard run (``--logdir DIR/<run id>``) per training run
(docs/sinks/tensorboard.md), written with the tensorboard package alone: no torch, no TensorFlow.

Exactly once in append-only files (docs/sinks/tensorboard.md, that section): a batch's records
are framed in memory and appended when it is done, then the run's state file is replaced; bytes
past what it names are cut off before the file is written again (sinks/tensorboard_run.py).
"""
from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import socket
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from sinks.base import CLOSE_TIMEOUT, FLUSH_TIMEOUT, PermanentError, SinkContext, SinkError
from sinks.events import Event
from sinks.naming import SYSTEM, WORKERS, system_key
from sinks.preflight import need_package, need_writable_dir, tool_import
from sinks.tensorboard_run import Board, Pending
from sinks.tracker_base import Spans, TrackerSink

log = logging.getLogger(__name__)

#: Per run directory: applied spans, committed bytes per event file, stepless counters, hparams.
STATE_NAME = ".metrics-relay-applied.json"
#: Held (flock) by the one process writing a run directory; it names that process.
LOCK_NAME = ".metrics-relay.lock"
#: Our event files end with this (TensorBoard reads any name containing "tfevents").
FILE_SUFFIX = ".metrics-relay"
#: Seconds without events after which a run's event file is closed (a late event reopens it).
IDLE_CLOSE_S = 600.0
#: Params groups written as text under the names transformers' TensorBoardCallback uses.
TEXT_NAMES = {"hparams": "args", "model": "model_config"}
#: ``train_end`` status -> hparams plugin session status (anything else: STATUS_UNKNOWN).
STATUS = {"completed": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}
# ints a double (the hparams plugin's number) keeps exactly
_SAFE_INT = range(-(1 << 53), (1 << 53) + 1)


def _import_tensorboard() -> types.SimpleNamespace:
    """The tensorboard modules the sink writes with, or say how to get them."""
    with tool_import("tensorboard", "TensorBoard"):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.record_writer import RecordWriter
    return types.SimpleNamespace(Event=event_pb2.Event, SessionLog=event_pb2.SessionLog,
                                 Summary=summary_pb2.Summary, Value=summary_pb2.Summary.Value,
                                 api=api_pb2, hp_meta=metadata, plugin_data=plugin_data_pb2,
                                 hparams_pb=summary_v2.hparams_pb, text_pb=text_pb,
                                 RecordWriter=RecordWriter)


class RunLocked(Exception):
    """Another process writes this run directory (a relay's previous sink process still draining,
    a ``relay replay``): transient, so the relay retries the batch until that one is done."""


def _encodable(method: Callable[..., None]) -> Callable[..., None]:
    """A name or text protobuf cannot encode (a lone surrogate) is refused for good:
    dead-lettered."""
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any) -> None:
        try:
            method(self, *args)
        except UnicodeEncodeError as exc:
            raise PermanentError(f"TensorBoard cannot encode this event: {exc}") from None
    return wrapper


class TensorBoardSink(TrackerSink):
    """Write relay events as TensorBoard event files, one run directory per training run."""

    name = "tensorboard"

    @classmethod
    def options(cls) -> list[click.Option]:
        """``--logdir``: the name ``tensorboard --logdir`` and transformers' ``logging_dir`` users
        know."""
        return [click.Option(["--logdir"], metavar="DIR", default=None,
                             help="TensorBoard log directory: each training run gets DIR/<run id> "
                                  "(created if missing); view it with `tensorboard --logdir DIR`.")]

    def __init__(self, logdir: str | None = None) -> None:
        super().__init__()
        if not logdir:
            raise SinkError("--sink tensorboard needs --logdir DIR (a directory, created if "
                            "missing)")
        self.logdir = Path(logdir).expanduser()
        self._boards: dict[str, Board] = {}
        self.idle_close_s = IDLE_CLOSE_S

    def check(self, context: SinkContext) -> None:
        """TensorBoard installed, the log directory writable."""
        need_package("tensorboard", self.name, "tensorboard",
                     tested=("tensorboard>=2.21,<2.22", "RecordWriter"))
        need_writable_dir(self.logdir, "TensorBoard log directory",
                          "pass a writable --logdir directory")

    def open(self, context: SinkContext) -> None:
        """Check that the log directory is writable and that tensorboard imports."""
        super().open(context)
        self._tb = _import_tensorboard()
        need_writable_dir(self.logdir, "TensorBoard log directory",
                          "pass a writable --logdir directory", create=True)
        self._host = socket.gethostname()
        log.info("tensorboard sink writing to %s", self.logdir)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Close every event file (all records were committed with their batch)."""
        for board in self._boards.values():
            board.close_file()
            os.close(board.lock)
        log.info("tensorboard sink closed: %s", dict(sorted(self.counters.items())))
        return True

    def write(self, events: Sequence[Event]) -> None:
        """Apply a batch (sinks/tracker_base.py); on failure drop its records with the spans."""
        try:
            super().write(events)
        except Exception:
            self._discard()
            raise
        self._close_quiet()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        self._close_quiet()
        return True

    def start_run(self, run: str, params: dict[str, Any]) -> None:
        folder = self.logdir / run
        folder.mkdir(parents=True, exist_ok=True)
        lock = _lock(run, folder)
        try:
            path = folder / STATE_NAME
            state = json.loads(path.read_text()) if path.exists() else {}
            self._cut_uncommitted(run, folder, state.get("files", {}))
        except BaseException:
            os.close(lock)
            raise
        self.counters["runs_resumed" if state else "runs_created"] += 1
        self._boards[run] = Board(run, folder, lock, state, self._tb.RecordWriter,
                                  folder / STATE_NAME)

    @_encodable
    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        board, tb = self._boards[run], self._tb
        board.last_ts = ts
        tags = [_tag(rank, context, name) for name in values]
        if step is not None:
            points = zip(tags, values.values(), strict=True)
            self._record(board, tb.Event(wall_time=ts, step=step, summary=tb.Summary(value=[
                tb.Value(tag=tag, simple_value=value) for tag, value in points])))
        else:  # TensorBoard needs a step: number each series' points 0, 1, 2 ... (saved with spans)
            for tag, value in zip(tags, values.values(), strict=True):
                auto = board.auto.get(tag, 0)
                board.auto[tag] = auto + 1
                self._record(board, tb.Event(wall_time=ts, step=auto, summary=tb.Summary(
                    value=[tb.Value(tag=tag, simple_value=value)])))
        if rank is None and board.hparams and not context.get(SYSTEM):
            # the Trainer logs after on_train_begin published its params
            self._session_start(board, ts)

    @_encodable
    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        board, tb = self._boards[run], self._tb
        # in the params' own order, as TrainingArguments.to_json_string writes the callback's
        # ``args``
        text = json.dumps(params, indent=2, ensure_ascii=False, default=str)
        # as torch's SummaryWriter.add_text names it
        tag = TEXT_NAMES.get(name, name) + "/text_summary"
        event = tb.Event(wall_time=board.last_ts or time.time(), step=0,
                         summary=tb.text_pb(tag, text))
        self._record(board, event)
        if name == "relay" or name.startswith("relay."):
            return  # the relay's own bookkeeping: text only
        if board.hparams is None:
            if not self.counters["late_hparams"]:
                log.info("tensorboard sink: params %r of run %s came after its hparams session "
                         "was written: they are in the TEXT tab only, as TensorBoard keeps a "
                         "run's first session (counted as late_hparams; not logged again)",
                         name, run)
            self.counters["late_hparams"] += len(params)
            return
        _flatten("" if name == "hparams" else name, params, board.hparams)

    def finish_run(self, run: str, status: str) -> None:
        board, tb = self._boards[run], self._tb
        when = board.last_ts or time.time()
        if board.hparams:
            self._session_start(board, when)
        end_status = tb.api.Status.Value(STATUS.get(status, "STATUS_UNKNOWN"))
        info = tb.plugin_data.SessionEndInfo(status=end_status, end_time_secs=when)
        summary = tb.Summary()  # as the hparams plugin's own summary_v2._summary_pb builds it
        summary.value.add(tag=tb.hp_meta.SESSION_END_INFO_TAG, tensor=tb.hp_meta.NULL_TENSOR,
                          metadata=tb.hp_meta.create_summary_metadata(
                              tb.plugin_data.HParamsPluginData(session_end_info=info)))
        self._record(board, tb.Event(wall_time=when, step=0, summary=summary))
        board.ended = True

    def supersede(self, run: str, step: int) -> None:
        """What ``torch.utils.tensorboard.SummaryWriter(purge_step=step + 1)`` writes: a session
        START at the step after the checkpoint, on which TensorBoard's readers drop every point of
        the run read before it at that step or later (its "orphaned data" purge), so each step shows
        the last attempt's."""
        board, tb = self._boards[run], self._tb
        self._record(board, tb.Event(wall_time=board.last_ts or time.time(), step=step + 1,
                                     session_log=tb.SessionLog(status=tb.SessionLog.START)))

    def load_applied(self, run: str) -> Spans:
        return self._boards[run].spans

    def save_applied(self, run: str, spans: Spans) -> None:
        """Append the run's framed records, then say in its state file that they are there."""
        if self._boards[run].save(spans, self._header, self._file_name):
            self.counters["files_created"] += 1

    def _file_name(self, number: int) -> str:
        """This process's ``number``th event file of a run (named as TensorBoard names one)."""
        return (f"events.out.tfevents.{int(time.time()):010d}.{self._host}.{os.getpid()}."
                f"{number}{FILE_SUFFIX}")

    def _record(self, board: Board, event: Any) -> None:
        board.records.write(event.SerializeToString())

    def _header(self) -> bytes:
        """The first record of every event file, as TensorBoard's own EventFileWriter writes it
        (it also tells TensorBoard's readers not to drop points whose steps go back)."""
        first = Pending()
        version = self._tb.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._tb.RecordWriter(first).write(version.SerializeToString())
        return first[0]

    def _session_start(self, board: Board, ts: float) -> None:
        """The run's session in the hparams plugin: TensorBoard keeps only a run's first one, so it
        is written once, when the Trainer starts logging (its params are all published by then)."""
        self._record(board, self._tb.Event(wall_time=ts, step=0, summary=self._tb.hparams_pb(
            board.take_hparams(), trial_id=board.run, start_time_secs=ts)))
        self.counters["sessions"] += 1

    def _cut_uncommitted(self, run: str, folder: Path, files: dict[str, int]) -> None:
        """A process that died between appending and saving left bytes no state file names."""
        for name, size in files.items():
            path = folder / name
            actual = path.stat().st_size if path.exists() else 0
            if actual > size:
                os.truncate(path, size)
                self.counters["uncommitted_bytes_cut"] += actual - size
                log.info("tensorboard sink: run %s: cut %d uncommitted bytes off %s", run,
                         actual - size, name)
            elif actual < size:
                self.counters["missing_bytes"] += size - actual
                log.warning("tensorboard sink: run %s: %s holds %d bytes, %d were written: "
                            "removed or cut by someone else (`relay replay` into a fresh --logdir "
                            "rebuilds it)", run, name, actual, size)

    def _discard(self) -> None:
        """After a failure: back to what the state files say; the retry writes the rest."""
        self.counters["discarded_batches"] += 1
        for board in self._boards.values():
            board.pending.clear()
            board.restore()

    def _close_quiet(self) -> None:
        quiet_since = time.monotonic() - self.idle_close_s
        for board in self._boards.values():
            if board.fd is not None and (board.ended or board.last_used < quiet_since):
                board.close_file()


def _lock(run: str, folder: Path) -> int:
    """Take the run directory for this process: two writers would each append what the other
    already wrote, as neither sees the other's applied spans."""
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunLocked(f"run {run} in {folder} is being written by another process "
                        f"(pid {holder}); it is retried once that one is done (replay into "
                        "another --logdir meanwhile)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


#: The group of the relay's figures. TensorBoard lists a run's groups (a tag's part before its first
#: ``/``) by name and opens the first two: after ``train``, so the Trainer's ``eval`` and ``train``
#: come first and open, as with transformers' own TensorBoardCallback.
def _tag(rank: int | None, context: dict[str, Any], name: str) -> str:
    """A series' tag, as transformers' ``rewrite_logs`` would name it; the relay's figures and other
    ranks' custom metrics in ``workers/...`` (docs/sinks/tensorboard.md)."""
    if context.get(SYSTEM):
        return system_key(context, name)
    subset = context.get("subset")
    if rank is None:  # the Trainer's own (reduced) series
        sub = context.get("sub_dataset")
        name = f"{sub}_{name}" if sub else name
        if subset in ("eval", "test"):
            return f"{subset}/{name}"
        return f"train/train_{name}" if subset == "train" else f"train/{name}"
    plain = name if subset == "additional_metrics" else f"{subset}/{name}"  # fms-hf-tuning's names
    return f"train/{plain}" if rank == 0 else f"{WORKERS}/{subset}/{name}/rank_{rank}"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """Params as the hparams plugin takes them: dotted names; bool, number or string values."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, inner, out)
    elif value is None:
        return
    elif isinstance(value, (bool, str, float)):
        out[prefix] = value
    elif isinstance(value, int):
        out[prefix] = value if value in _SAFE_INT else str(value)
    else:
        out[prefix] = json.dumps(value, default=str)
