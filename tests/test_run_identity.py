"""Which run a job is (trainer/run_identity.py): a job resumed from a checkpoint continues the run its
run file names, as the next attempt; the output directory remembers each run's highest attempt, so a
job that resumes an older checkpoint still numbers above every earlier attempt; the flags say
otherwise. And the command line's checks (trainer/args.py): --resume_from_checkpoint True is the
last checkpoint, a missing one or contradicting flags are usage errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.args import _resume_args
from trainer.errors import UsageError
from trainer.run_identity import RunIdentity, identify, read_run_file, write_run_file
from trainer.tracker_flags import TrackingArguments


def _checkpoint(out: Path, step: int, run: str, attempt: int) -> str:
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    write_run_file(str(folder), {"run": run, "attempt": attempt, "step": step})
    return str(folder)


def test_a_resumed_job_continues_the_run_of_its_checkpoint_as_the_next_attempt(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert identify("new-1", None, str(out)) == RunIdentity("new-1")
    write_run_file(str(out), {"run": "job-a", "attempt": 0})
    first = _checkpoint(out, 50, "job-a", 0)
    assert identify("new-2", first, str(out)) == RunIdentity("job-a", 1, 50, first)
    write_run_file(str(out), {"run": "job-a", "attempt": 1})  # the second job, which saved checkpoint-100
    second = _checkpoint(out, 100, "job-a", 1)
    assert identify("new-3", second, str(out)).attempt == 2
    assert identify("new-4", first, str(out)).attempt == 2, "an older checkpoint: still above attempt 1"
    write_run_file(str(out), {"run": "other", "attempt": 0})  # another run in the same folder since
    assert read_run_file(str(out))["attempts"] == {"job-a": 1, "other": 0}
    assert identify("new-5", first, str(out)) == RunIdentity("job-a", 2, 50, first)
    assert identify("new-6", first, str(out), new_run=True) == RunIdentity("new-6", checkpoint=first)
    assert identify("new-7", first, str(out), continue_run="job-b").run == "job-b"
    assert identify("new-8", None, str(out), continue_run="job-a") == RunIdentity("job-a", 2, 0)


def test_a_checkpoint_no_run_file_names_starts_a_new_run(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    assert identify("fresh", str(folder), str(tmp_path / "elsewhere")) == RunIdentity("fresh", checkpoint=str(folder))


class _Training:
    def __init__(self, output_dir: Path, resume: str | None) -> None:
        self.output_dir, self.resume_from_checkpoint = str(output_dir), resume


def test_resume_flags_are_checked_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no checkpoint-N folder in --output_dir"):
        _resume_args(_Training(tmp_path, "True"), TrackingArguments())
    with pytest.raises(UsageError, match="is not a folder"):
        _resume_args(_Training(tmp_path, str(tmp_path / "nope")), TrackingArguments())
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-10").mkdir()
    training = _Training(tmp_path, "true")
    _resume_args(training, TrackingArguments())
    assert training.resume_from_checkpoint == str(tmp_path / "checkpoint-10")
    with pytest.raises(UsageError, match="contradict"):
        _resume_args(_Training(tmp_path, None), TrackingArguments(continue_run="a", new_run=True))
    with pytest.raises(UsageError, match="--continue_run: 'a b' must match"):
        _resume_args(_Training(tmp_path, None), TrackingArguments(continue_run="a b"))
