"""One training run's side of the TensorBoard sink (sinks/tensorboard.py): its run directory,
the framed records of the batch in hand, and the exactly-once bookkeeping of its append-only event
files (what the state file says is committed; a batch's records appended, then the state file
replaced). Apart from the sink, as wandb_run.py and mlflow_run.py are, so the run's state is
changed by its own methods.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sinks.files import write_atomic
from sinks.tracker_base import Spans


class Pending(list):
    """Framed records of the batch in hand: ``RecordWriter`` writes into it, a commit appends it."""

    write = list.append


class Board:
    """One training run's TensorBoard run directory and what is committed to it."""

    def __init__(self, run: str, folder: Path, lock: int, state: dict[str, Any], records: Any,
                 state_file: Path) -> None:
        self.run = run
        self.dir = folder
        self.state_file = state_file  # applied spans, bytes committed per event file, ...
        self.lock = lock
        self.committed = state  # the state file as last written: what a failure goes back to
        self.restore()
        self.pending = Pending()
        self.records = records(self.pending)
        self.current: str | None = None  # this process's event file, made at its first commit
        self.fd: int | None = None
        self.ended = False
        self.last_used = time.monotonic()
        self.last_ts: float | None = None

    def restore(self) -> None:
        state = self.committed
        self.spans: Spans = {int(rank): spans for rank, spans in state.get("spans", {}).items()}
        self.files: dict[str, int] = dict(state.get("files", {}))
        self.auto: dict[str, int] = dict(state.get("auto", {}))
        hparams = state.get("hparams", {})
        self.hparams: dict[str, Any] | None = None if hparams is None else dict(hparams)

    def take_hparams(self) -> dict[str, Any] | None:
        """The params for the run's one session (its start is written once: None from then on)."""
        hparams, self.hparams = self.hparams, None
        return hparams

    def save(self, spans: Spans, header: Callable[[], bytes],
             new_file: Callable[[int], str]) -> bool:
        """Append the framed records to this process's event file (named ``new_file(files)`` and in
        the state file before any byte lands in it; a new one starts with ``header()``), then say in
        the state file that they are there. True if an event file was made."""
        self.last_used = time.monotonic()
        made = False
        if self.pending:
            if self.current not in self.files:
                self.current = self.current or new_file(len(self.files))
                self.files[self.current] = 0
                self.write_state({**self.committed, "files": self.files})
                made = True
            if self.fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                self.fd = os.open(self.dir / self.current, flags, 0o644)
            size = self.files[self.current]
            if os.fstat(self.fd).st_size != size:  # a failed batch's tail: never committed
                os.ftruncate(self.fd, size)
            data = (header() if size == 0 else b"") + b"".join(self.pending)
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
            self.files[self.current] = size + len(data)
            self.pending.clear()
        self.write_state({"spans": spans, "files": self.files, "auto": self.auto,
                          "hparams": self.hparams})
        return made

    def write_state(self, state: dict[str, Any]) -> None:
        write_atomic(self.state_file, json.dumps(state))
        self.committed = json.loads(json.dumps(state))  # a copy: the live dicts go on changing

    def close_file(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
