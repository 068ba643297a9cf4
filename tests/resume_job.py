"""The trainer (``trainer.sft.main``) as torchrun runs it, plus, when ``RESUME_TEST_HOLD_AT`` is set, a
callback that holds every rank at the beginning of the step after that global step, until the test
kills the job: what tests/test_resume.py's first attempt is, a job that died after its checkpoint
with steps logged past it."""
import os
import sys
import time

from transformers import TrainerCallback

from trainer.sft import main


class HoldAt(TrainerCallback):
    """Every rank waits (for the SIGKILL) once ``step`` is done: logged, saved, evaluated."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        while state.global_step >= self.step:
            time.sleep(1)


if __name__ == "__main__":
    hold = os.environ.get("RESUME_TEST_HOLD_AT")
    sys.exit(main(sys.argv[1:], callbacks=[HoldAt(int(hold))] if hold else []))
