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
from sinks.wandb_layout import STEP_KEY

STATE_DIR = "relay-applied"  # under <wandb-dir>/wandb/: a state file and a lock per run
LOCK_WAIT_S = 30.0  # a restarted relay's sink waits this long for the old one to finish the run
# steps whose first row a run's state keeps (a resumed job rewinds to a recent checkpoint)
MAX_ROWS = 10_000


class WbRun:
    """One relay run's W&B side in this process: handle, lock, ``_step``s and what is saved."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.handle: Any = None  # wandb Run while open
        self.lock: Any = None  # the locked file while this process owns the run
        self.step = self.saved_step = self.logged_step = 0  # next _step: now, as saved, as sent
        self.saved_spans: Spans = {}
        # {"dir", "spans", "step"} of the directory being written
        self.open: dict[str, Any] | None = None
        self.exit_code: int | None = None  # from rank 0's train_end
        self.last_event = 0.0
        self.core_log_at = 0  # bytes of wandb-core's log already checked
        self.name: str | None = None  # the W&B run's name: the job's --run_name once known
        # the Trainer's arguments: they win a key the model config shares
        self.hparams: dict[str, Any] = {}
        # the history row in hand (sinks/wandb.py: _add_to_row)
        self.row: dict[str, Any] | None = None
        self.row_key: tuple[Any, float] | None = None
        self.last_x = 0  # the highest train/global_step logged
        #: [train/global_step, the first _step logged at it], the newest MAX_ROWS:
        #: where to rewind to
        self.rows: list[list[int]] = []
        self.rewind: int | None = None  # the _step the next instance resumes from (a later attempt)

    def acquire(self, state_dir: Path) -> None:
        """Own the run across processes: a restarted relay's sink waits for the old one to
        finish."""
        if self.lock is not None:  # already ours (a load that failed after taking it is retried)
            return
        fh = open(state_dir / f"{self.run_id}.lock", "a+")  # noqa: SIM115 (held while open)
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
        state = json.loads(path.read_text()) if path.exists() else {}
        self.name, self.rows = state.get("name"), state.get("rows", [])
        self.last_x = max((x for x, _ in self.rows), default=0)
        return state

    def write_state(self, state_dir: Path) -> None:
        write_atomic(state_dir / f"{self.run_id}.json", json.dumps(
            {"spans": self.saved_spans, "step": self.saved_step, "open": self.open,
             "exit_code": self.exit_code,
             "name": self.name, "rows": self.rows, "rewind": self.rewind}))

    def add_to_row(self, values: dict[str, Any], step: int | None, ts: float) -> None:
        """One history row per Trainer log, as the HF callback's one ``wandb.log`` per ``on_log``:
        the groups of one event (an eval log's ``eval/*`` and its ``train/epoch``) share a row. A
        metric without a step (``model_load_time``, before training) goes to the summary instead
        (WandbSink.log_metrics); one that comes here anyway is at step 0."""
        x = 0 if step is None else step
        if self.row is not None and self.row_key != (x, ts):
            self.commit_row()
        if self.row is None:
            # the event's own time, even late
            self.row, self.row_key = {STEP_KEY: x, "_timestamp": ts}, (x, ts)
        self.row.update(values)

    def commit_row(self) -> None:
        """Log the row in hand at the run's next ``_step``."""
        row, self.row = self.row, None
        if row is None:
            return
        self.handle.log(row, step=self.step, commit=True)
        x = row[STEP_KEY]
        if x > self.last_x or not self.rows:
            self.rows.append([x, self.step])
            del self.rows[:-MAX_ROWS]
        self.last_x = max(self.last_x, x)
        self.step += 1
        self.logged_step = max(self.logged_step, self.step)

    def back_to_saved(self) -> None:
        """After a failed write: the row in hand dropped, the next ``_step`` the one last saved."""
        self.step, self.row = self.saved_step, None

    def first_step_after(self, x: int) -> int | None:
        """The first ``_step`` of a row logged past step ``x`` (None: none was)."""
        return min((step for row_x, step in self.rows if row_x > x), default=None)

    def forget_rows_from(self, step: int) -> None:
        """Rows from ``_step`` ``step`` on are rewound away."""
        self.rows = [row for row in self.rows if row[1] < step]
        self.last_x = max((x for x, _ in self.rows), default=0)

    def rewind_before(self, first: int, state_dir: Path) -> None:
        """A later attempt: the rows from ``_step`` ``first`` on are superseded; the next instance
        resumes from the ``_step`` before it (saved at once)."""
        self.rewind = max(first - 1, 0)
        self.step = self.saved_step = self.logged_step = self.rewind + 1
        self.forget_rows_from(first)
        self.write_state(state_dir)

    def restore(self, state: dict[str, Any], exit_code: int | None) -> Spans:
        """What the state (saved, or of a directory left open) says was applied; its spans."""
        self.exit_code = exit_code
        self.saved_spans = {int(r): s for r, s in state.get("spans", {}).items()}
        self.step = self.saved_step = self.logged_step = state.get("step", 0)
        self.rewind = state.get("rewind")
        return self.saved_spans

    def save(self, spans: Spans, state_dir: Path) -> None:
        """The rows so far hold ``spans``: said in the state file (left as it was if that fails)."""
        saved = self.saved_spans, self.saved_step
        self.saved_spans, self.saved_step = spans, self.step
        try:
            self.write_state(state_dir)
        except OSError:
            self.saved_spans, self.saved_step = saved
            raise

    def ends(self, completed: bool) -> None:
        """Rank 0's train_end: the W&B run finishes with exit code 0 if it completed, else 1."""
        self.exit_code = 0 if completed else 1

    def opening(self, before: list[str], state_dir: Path) -> None:
        """Marked as opening before wandb.init writes anything: a process that dies in between
        leaves a directory the next one finds by what was not there ``before``, and discards."""
        self.open = {"dir": None, "before": before, "spans": self.saved_spans,
                     "step": self.saved_step, "rewind": self.rewind}
        self.write_state(state_dir)

    def opened(self, handle: Any, directory: str, state_dir: Path) -> None:
        """Its W&B run is open in ``directory``: marked open before its first point (a process that
        dies leaves it to be discarded, and what came after the earlier directories applied
        again); the rewind is done."""
        self.handle, self.core_log_at = handle, 0
        self.open = {"dir": directory, "spans": self.saved_spans, "step": self.saved_step,
                     "rewind": self.rewind}
        self.rewind = None
        self.write_state(state_dir)

    def detach(self) -> Any:
        """The open W&B run, to finish: from here the run has none."""
        handle, self.handle = self.handle, None
        return handle

    def complete(self, state_dir: Path) -> None:
        """Its W&B directory holds all it was sent: no longer open (saved)."""
        self.open = None
        self.write_state(state_dir)

    def release(self) -> None:
        """Let another process take the run."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def core_log_read(self, size: int) -> None:
        """``size`` more bytes of wandb-core's log were checked."""
        self.core_log_at += size
