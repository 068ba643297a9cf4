"""A real trainer job (``python -m trainer``'s ``main``) with one rank made slow, or killed, for the
straggler tests (tests/test_stragglers_torchrun.py): run under torchrun as a script,

    slow_rank_job.py RANK|all collator|forward SECONDS -- TRAINER FLAGS...
    slow_rank_job.py RANK optimizer CPU_SECONDS@STEPS -- TRAINER FLAGS...
    slow_rank_job.py RANK kill STEP -- TRAINER FLAGS...

``collator``: rank RANK's (or every rank's: ``all``) data collator sleeps SECONDS per batch (slow
between steps: its peers wait in the token-count gather before the step). ``forward``: its model's
forward sleeps SECONDS per micro-batch (slow inside the step: its peers wait in the gradient
all-reduce). ``optimizer``: after its optimizer step, at the steps STEPS (``1-5,7-10``), it burns
CPU_SECONDS of CPU time (tests/cpu_burn.py): slow after the gradient all-reduce, so with every step
logged its peers wait in the Trainer's loss gather for logging, between steps. ``kill``: rank
RANK flushes what it published and SIGKILLs itself at the end of step STEP, after the step's
gradient all-reduce and before it reports the step (its peers report STEP, then block at their next
collective). The slowness or death is a callback given to ``main(argv, callbacks=...)``
(called before the relay's own); nothing of it is in the product.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from transformers import TrainerCallback

from cpu_burn import burn
from trainer import custom_metrics
from trainer.__main__ import main


class SlowRank(TrainerCallback):
    def __init__(self, rank: int | None, where: str, seconds: float) -> None:
        self.rank, self.where, self.seconds = rank, where, seconds  # rank None: every rank

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if self.rank is not None and args.process_index != self.rank:
            return
        if self.where == "forward":
            model.register_forward_pre_hook(lambda module, inputs: time.sleep(self.seconds))
        else:
            # accelerate's loader wraps a torch DataLoader, which reads collate_fn when the epoch's
            # iterator is made (after this)
            loader = getattr(train_dataloader, "base_dataloader", train_dataloader)
            collate = loader.collate_fn

            def slow_collate(rows: Any) -> Any:
                time.sleep(self.seconds)
                return collate(rows)

            loader.collate_fn = slow_collate


class SlowOptimizer(TrainerCallback):
    def __init__(self, rank: int, spec: str) -> None:
        seconds, steps = spec.split("@")
        self.rank, self.seconds, self.step = rank, float(seconds), 0
        self.steps = {n for part in steps.split(",") for n in range(int(part.split("-")[0]),
                                                                   int(part.split("-")[-1]) + 1)}

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if args.process_index == self.rank:
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds torch's
            inner.register_step_post_hook(lambda *_: burn(self.seconds) if self.step in self.steps else None)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step + 1  # the step being taken


class KilledRank(TrainerCallback):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.process_index == self.rank and state.global_step == self.step:
            publisher = custom_metrics.publisher()
            assert publisher is not None
            publisher.flush(30.0)  # the steps before this one reached the relay
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    rank, where, value, dashes, *flags = sys.argv[1:]
    if dashes != "--" or where not in ("collator", "forward", "optimizer", "kill"):
        sys.exit(__doc__)
    if where == "kill":
        callback: TrainerCallback = KilledRank(int(rank), int(value))
    elif where == "optimizer":
        callback = SlowOptimizer(int(rank), value)
    else:
        callback = SlowRank(None if rank == "all" else int(rank), where, float(value))
    sys.exit(main(flags, callbacks=[callback]))
