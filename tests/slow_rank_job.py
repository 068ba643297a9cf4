"""A real trainer job (``python -m trainer``'s ``main``) with one rank made slow, or killed, for the
straggler tests (tests/test_stragglers_torchrun.py and the others tests/straggler_runs.py serves):
run under torchrun as a script,

    slow_rank_job.py RANK|all WHERE SECONDS[cpu][@STEPS] [RANK|all WHERE ...]... -- TRAINER FLAGS...
    slow_rank_job.py RANK kill STEP -- TRAINER FLAGS...
    slow_rank_job.py RUN [--then RUN]...   (each RUN one of the above: its runs one after another)

Rank RANK (or every rank: ``all``) is slow by SECONDS at WHERE: a sleep, or with ``cpu`` that much
CPU time burnt (tests/cpu_burn.py: load stretches it as it stretches the work it is compared with);
at the steps STEPS only (``1-5,7-10``), else at every step. WHERE is where in the step:

- ``collator``: its data collator, per batch (slow between steps: its peers wait in the
  token-count gather before the step);
- ``forward``: its model's forward, per micro-batch (slow inside the step: its peers wait in the
  gradient all-reduce);
- ``backward``: its model's backward (at the gradient of its first trainable tensor), per micro-batch
  (as forward);
- ``allreduce``: after the gradient all-reduce, before the optimizer step (``on_pre_optimizer_step``);
- ``optimizer``: after its optimizer step. After the all-reduce, so with every step logged its peers
  wait in the Trainer's loss gather for logging, between steps; else at the next step's collectives.

``kill``: rank RANK flushes what it published and SIGKILLs itself at the end of step STEP, after the
step's gradient all-reduce and before it reports the step (its peers report STEP, then block at
their next collective). The slowness or death is a callback given to ``main(argv, callbacks=...)``
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

WHERE = ("collator", "forward", "backward", "allreduce", "optimizer")


def steps_of(spec: str) -> set[int]:
    return {n for part in spec.split(",") for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}


class SlowRank(TrainerCallback):
    """Rank ``rank`` (None: every rank) slow at ``where`` by ``spec``: ``SECONDS[cpu][@STEPS]``."""

    def __init__(self, rank: int | None, where: str, spec: str) -> None:
        seconds, _, steps = spec.partition("@")
        self.rank, self.where, self.step = rank, where, 0
        self.cpu = seconds.endswith("cpu")
        self.seconds = float(seconds.removesuffix("cpu"))
        self.steps = steps_of(steps) if steps else None

    def slow(self, *_: Any) -> None:
        if self.steps is None or self.step in self.steps:
            (burn if self.cpu else time.sleep)(self.seconds)

    def mine(self, args: Any) -> bool:
        return self.rank is None or args.process_index == self.rank

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if not self.mine(args):
            return
        if self.where == "forward":
            model.register_forward_pre_hook(self.slow)
        elif self.where == "backward":  # the gradient of its first trainable tensor (the last computed)
            next(p for p in model.parameters() if p.requires_grad).register_hook(self.slow)
        elif self.where == "optimizer":
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds torch's
            inner.register_step_post_hook(self.slow)
        elif self.where == "collator":
            # accelerate's loader wraps a torch DataLoader, which reads collate_fn when the epoch's
            # iterator is made (after this)
            loader = getattr(train_dataloader, "base_dataloader", train_dataloader)
            collate = loader.collate_fn

            def slow_collate(rows: Any) -> Any:
                self.slow()
                return collate(rows)

            loader.collate_fn = slow_collate

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step + 1  # the step being taken (a collator's batch for it comes before)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step + 1  # the next step's batches are collated before its on_step_begin

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.where == "allreduce" and self.mine(args):
            self.slow()


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
    return SlowRank(None if rank == "all" else int(rank), where, value)


def runs(argv: list[str]) -> list[tuple[list[TrainerCallback], list[str]]]:
    """Each ``RANK WHERE VALUE [RANK WHERE VALUE]... -- FLAGS`` of the command line (split at
    ``--then``): its callbacks and flags."""
    parsed = []
    while argv:
        cut = argv.index("--then") if "--then" in argv else len(argv)
        run, argv = argv[:cut], argv[cut + 1:]
        dashes = run.index("--") if "--" in run else 0
        slow, flags = run[:dashes], run[dashes + 1:]
        if not slow or len(slow) % 3 or any(where not in (*WHERE, "kill") for where in slow[1::3]):
            sys.exit(__doc__)
        parsed.append(([callback_for(*slow[i:i + 3]) for i in range(0, len(slow), 3)], flags))
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
    *first, (last_callbacks, last_flags) = runs(argv)
    rank = os.environ.get("RANK", "0")
    for i, (callbacks, flags) in enumerate(first):
        status = sft.main(flags, callbacks=callbacks)
        print(f"slow_rank_job: run {i} rank {rank} returned {status}", flush=True)
        if status != 0:
            return status
        fresh_process_group(i + 1)
        STOP.closing = False  # the next run is not closing
    status = main(last_flags, callbacks=last_callbacks)
    print(f"slow_rank_job: run {len(first)} rank {rank} returned {status}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(run_all(sys.argv[1:]))
