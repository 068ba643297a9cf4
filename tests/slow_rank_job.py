"""A real trainer job (``python -m trainer``'s ``main``) with one rank made slow, or killed, for the
straggler tests (tests/test_stragglers_torchrun.py): run under torchrun as a script,

    slow_rank_job.py RANK|all collator|forward SECONDS -- TRAINER FLAGS...
    slow_rank_job.py RANK optimizer CPU_SECONDS@STEPS -- TRAINER FLAGS...
    slow_rank_job.py RANK kill STEP -- TRAINER FLAGS...
    slow_rank_job.py RUN [--then RUN]...   (each RUN one of the above: its runs one after another)

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

Several runs, each with its own flags (its own ``--output_dir``), run one after another in one
launch: what a launch costs is three processes importing torch, transformers and trl, not its steps
(docs/development.md, "A torchrun launch"). Between runs the process group that ``main`` closed is
forgotten by accelerate too (its state is a per-process singleton), so the next run's training
arguments start a new one, as a fresh process's would. A run that fails ends the launch there.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from transformers import TrainerCallback

from cpu_burn import burn
from trainer import custom_metrics, sft
from trainer.__main__ import main
from trainer.stopping import STOP


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


def callback_for(rank: str, where: str, value: str) -> TrainerCallback:
    if where == "kill":
        return KilledRank(int(rank), int(value))
    if where == "optimizer":
        return SlowOptimizer(int(rank), value)
    return SlowRank(None if rank == "all" else int(rank), where, float(value))


def runs(argv: list[str]) -> list[tuple[TrainerCallback, list[str]]]:
    """Each ``RANK WHERE VALUE -- FLAGS`` of the command line (split at ``--then``): its callback and flags."""
    parsed = []
    while argv:
        cut = argv.index("--then") if "--then" in argv else len(argv)
        (rank, where, value, dashes, *flags), argv = argv[:cut], argv[cut + 1:]
        if dashes != "--" or where not in ("collator", "forward", "optimizer", "kill"):
            sys.exit(__doc__)
        parsed.append((callback_for(rank, where, value), flags))
    return parsed


def fresh_process_group(run: int) -> None:
    """Let the next run's training arguments start a process group, as in a fresh process. ``main``
    destroyed the last one; accelerate still holds its state (a per-process singleton), and torch
    would name the new group as it named the last ("0"), whose keys in torchrun's store still hold
    the last group's gloo addresses: a rank that read them waited forever for its peer. Every rank
    sets the same new name (counting from ``1000 * run``)."""
    import torch.distributed.distributed_c10d as c10d
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    c10d._world.group_count = 1000 * run


def run_all(argv: list[str]) -> int:
    """Every run in turn; the first that fails ends the launch with its status. Each run's status is
    printed (``slow_rank_job: run I rank R returned S``) for the tests, as a launch's exit status was."""
    *first, (last_callback, last_flags) = runs(argv)
    rank = os.environ.get("RANK", "0")
    for i, (callback, flags) in enumerate(first):
        status = sft.main(flags, callbacks=[callback])
        print(f"slow_rank_job: run {i} rank {rank} returned {status}", flush=True)
        if status != 0:
            return status
        fresh_process_group(i + 1)
        STOP.closing = False  # the next run is not closing
    status = main(last_flags, callbacks=[last_callback])
    print(f"slow_rank_job: run {len(first)} rank {rank} returned {status}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(run_all(sys.argv[1:]))
