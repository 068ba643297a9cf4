"""A real trainer job (``python -m trainer``'s ``main``) whose rank 1 SIGKILLs itself in the middle of
a step, for tests/test_rank_death.py: run under torchrun as a script,

    dying_rank_job.py STEP POINTS -- TRAINER FLAGS...

POINTS is a comma-separated list of forward, backward, optimizer and between; under torchrun's
``--max-restarts`` attempt N (TORCHELASTIC_RESTART_COUNT) uses the Nth, so one launch kills rank 1
at each in turn. ``forward``: inside step STEP's first forward pass; ``backward``: while its
gradients are computed; ``optimizer``: as the optimizer starts its step; ``between``: as step STEP
begins, after step STEP - 1 ended. The death is real (SIGKILL, nothing flushed: what rank 1 had not
sent is lost with it) and its peer is stopped by torchrun's agent as in any failed job. The kill is a
callback given to ``main(argv, callbacks=...)``; nothing of it is in the product.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any

from transformers import TrainerCallback

from trainer.__main__ import main

POINTS = ("forward", "backward", "optimizer", "between")
RANK = 1


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DyingRank(TrainerCallback):
    def __init__(self, step: int, point: str) -> None:
        self.step, self.point = step, point
        self.armed = False  # inside step ``step``

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if args.process_index != RANK:
            return
        if self.point == "forward":
            model.register_forward_pre_hook(self.hook)
        elif self.point == "backward":
            next(p for p in model.parameters() if p.requires_grad).register_hook(self.hook)
        elif self.point == "optimizer":
            getattr(optimizer, "optimizer", optimizer).register_step_pre_hook(self.hook)  # (accelerate wraps it)

    def hook(self, *_: Any) -> None:  # None: the hooked call goes on unchanged, unless it dies here
        if self.armed:
            die()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.process_index == RANK and state.global_step == self.step - 1:
            if self.point == "between":
                die()
            self.armed = True


if __name__ == "__main__":
    step, points, dashes, *flags = sys.argv[1:]
    chosen = points.split(",")
    if dashes != "--" or not set(chosen) <= set(POINTS):
        sys.exit(__doc__)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    sys.exit(main(flags, callbacks=[DyingRank(int(step), chosen[attempt % len(chosen)])]))
