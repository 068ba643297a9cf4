"""Which run a job is: a new one, or the next attempt of the run it resumes (docs/trainer.md, "A
resumed job continues its run": where rank 0 finds it, and why attempt N's seqs start at
``attempt_base(N)``).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from sinks.events import MAX_ATTEMPT

log = logging.getLogger(__name__)

RUN_FILE_NAME = "tracking_run.json"
#: What the Trainer saves in a checkpoint: its global_step among it.
TRAINER_STATE = "trainer_state.json"


@dataclass
class RunIdentity:
    """The run a job publishes as, its attempt, and the step and checkpoint it resumed from."""

    run: str
    attempt: int = 0
    resumed_from: int | None = None
    checkpoint: str | None = None


def identify(new_id: str, checkpoint: str | None, output_dir: str, *,
             continue_run: str | None = None, new_run: bool = False) -> RunIdentity:
    """On rank 0: ``new_id`` (a fresh run id) unless the job continues a run (module docstring)."""
    if new_run or (checkpoint is None and continue_run is None):
        if new_run and checkpoint is not None:
            log.info("--new_run: resuming from %s as the new run %s", checkpoint, new_id)
        return RunIdentity(new_id, checkpoint=checkpoint)
    records = [r for r in (read_run_file(checkpoint), read_run_file(output_dir)) if r]
    run = continue_run or next((r["run"] for r in records if isinstance(r.get("run"), str)), None)
    if run is None:
        log.info("resuming from %s, which names no run (no %s in it or in %s): a new run %s",
                 checkpoint, RUN_FILE_NAME, output_dir, new_id)
        return RunIdentity(new_id, checkpoint=checkpoint)
    attempts = [_attempts(r).get(run) for r in records]
    attempts += [r.get("attempt") for r in records if r.get("run") == run]
    attempt = max((a for a in attempts if type(a) is int), default=0) + 1
    if attempt >= MAX_ATTEMPT:
        raise ValueError(
            f"run {run} has had {attempt} attempts, the most a run can have; use --new_run")
    step = checkpoint_step(checkpoint) if checkpoint is not None else 0
    log.info("continuing run %s: attempt %d, from step %d%s", run, attempt, step,
             f" ({checkpoint})" if checkpoint else "")
    return RunIdentity(run, attempt, step, checkpoint)


def checkpoint_step(checkpoint: str) -> int:
    """The global step a checkpoint was saved at: its trainer state's, else its folder's ``-N``."""
    try:
        with open(os.path.join(checkpoint, TRAINER_STATE), encoding="utf-8") as fh:
            return int(json.load(fh)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        tail = os.path.basename(os.path.normpath(checkpoint)).rpartition("-")[2]
        return int(tail) if tail.isdigit() else 0


def read_run_file(folder: str | None) -> dict[str, Any] | None:
    """``folder``'s run file, or None (none there, or not one of ours)."""
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, RUN_FILE_NAME), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _attempts(record: dict[str, Any]) -> dict[str, Any]:
    attempts = record.get("attempts")
    return dict(attempts) if isinstance(attempts, dict) else {}


def write_run_file(folder: str, record: dict[str, Any]) -> None:
    """Replace ``folder``'s run file whole (a reader never sees half of one); in the output
    directory, ``attempts`` keeps the highest attempt of every run recorded there."""
    os.makedirs(folder, exist_ok=True)
    old = read_run_file(folder) or {}
    attempts = _attempts(old)
    if isinstance(old.get("run"), str) and type(old.get("attempt")) is int:
        attempts[old["run"]] = max(attempts.get(old["run"], 0), old["attempt"])
    if isinstance(record.get("run"), str) and type(record.get("attempt")) is int:
        attempts[record["run"]] = max(attempts.get(record["run"], 0), record["attempt"])
    path = os.path.join(folder, RUN_FILE_NAME)
    part = f"{path}.{os.getpid()}.tmp"
    with open(part, "w", encoding="utf-8") as fh:
        json.dump({**record, "attempts": attempts}, fh)
    os.replace(part, path)
