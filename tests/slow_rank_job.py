"""A real trainer job (``python -m trainer``'s ``main``) with one rank made slow, or killed, for the
straggler tests (tests/test_stragglers_torchrun.py): run under torchrun as a script,

    slow_rank_job.py RANK|all collator|forward SECONDS -- TRAINER FLAGS...
    slow_rank_job.py RANK kill STEP -- TRAINER FLAGS...

``collator``: rank RANK's (or every rank's: ``all``) data collator sleeps SECONDS per batch (slow between steps: its peers
wait in the token-count gather before the step). ``forward``: its model's forward sleeps SECONDS
per micro-batch (slow inside the step: its peers wait in the gradient all-reduce). ``kill``: rank
RANK flushes what it published and SIGKILLs itself at the end of step STEP, after the step's
gradient all-reduce and before it reports the step (its peers report STEP, then block at their next
collective). The slowness or death is a callback given to ``trainer.sft.main(argv, callbacks=...)``
(called before the relay's own); nothing of it is in the product.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from transformers import TrainerCallback

from trainer import custom_metrics
from trainer.sft import main


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
    if dashes != "--" or where not in ("collator", "forward", "kill"):
        sys.exit(__doc__)
    if where == "kill":
        callback: TrainerCallback = KilledRank(int(rank), int(value))
    else:
        callback = SlowRank(None if rank == "all" else int(rank), where, float(value))
    sys.exit(main(flags, callbacks=[callback]))
