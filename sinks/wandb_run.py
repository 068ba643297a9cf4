"""One relay run's W&B side as the W&B sink (sinks/wandb.py) keeps it across processes: the record
of its handle and ``_step``s, the lock that makes one sink process at a time write the run, and the
state file that says which events its finished W&B directories hold."""
from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path
from typing import Any

from sinks.files import write_atomic
from sinks.tracker_base import Spans

STATE_DIR = "relay-applied"  # under <wandb-dir>/wandb/: a state file and a lock per run
LOCK_WAIT_S = 30.0  # a restarted relay's sink waits this long for the old one to finish the run


class WbRun:
    """One relay run's W&B side in this process: handle, lock, ``_step``s and what is saved."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.handle: Any = None  # wandb Run while open
        self.lock: Any = None  # the locked file while this process owns the run
        self.step = self.saved_step = self.logged_step = 0  # next _step: now, as saved, as sent
        self.saved_spans: Spans = {}
        self.open: dict[str, Any] | None = None  # {"dir", "spans", "step"} of the directory being written
        self.exit_code: int | None = None  # from rank 0's train_end
        self.last_event = 0.0
        self.defined: set[str] = set()
        self.core_log_at = 0  # bytes of wandb-core's log already checked

    def acquire(self, state_dir: Path) -> None:
        """Own the run across processes: a restarted relay's sink waits for the old one to finish."""
        if self.lock is not None:  # already ours (a load that failed after taking it is retried)
            return
        fh = open(state_dir / f"{self.run_id}.lock", "a+")
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.lock = fh
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    fh.close()
                    raise RuntimeError(f"W&B run {self.run_id} is still written by another process "
                                       f"(lock {fh.name}); retrying") from None
                time.sleep(0.1)

    def read_state(self, state_dir: Path) -> dict[str, Any]:
        """What the last process saved of the run (nothing for a new run)."""
        path = state_dir / f"{self.run_id}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def write_state(self, state_dir: Path) -> None:
        write_atomic(state_dir / f"{self.run_id}.json", json.dumps(
            {"spans": self.saved_spans, "step": self.saved_step, "open": self.open, "exit_code": self.exit_code}))
