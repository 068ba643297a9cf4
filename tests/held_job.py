"""The trainer (``python -m trainer``'s ``main``) as torchrun runs it, plus, when ``HELD_JOB_AT`` is set, a callback
that holds every rank at the beginning of the step after that global step: until the file
``HELD_JOB_UNTIL`` exists where that is set, else until the test kills the job. What
tests/test_resume.py's first attempt is (a job that died after its checkpoint with steps logged past
it), and how tests/test_trainer_torchrun.py has a job's relay come up mid-run however slow the
machine is."""
import os
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from trainer.__main__ import main


class HoldAt(TrainerCallback):
    """Every rank waits once ``step`` is done (logged, saved, evaluated) until ``until`` exists, if given."""

    def __init__(self, step: int, until: Path | None) -> None:
        self.step, self.until = step, until

    def on_step_begin(self, args, state, control, **kwargs):
        while state.global_step >= self.step and not (self.until is not None and self.until.exists()):
            time.sleep(0.2)


if __name__ == "__main__":
    hold, until = os.environ.get("HELD_JOB_AT"), os.environ.get("HELD_JOB_UNTIL")
    sys.exit(main(sys.argv[1:], callbacks=[HoldAt(int(hold), Path(until) if until else None)] if hold else []))
