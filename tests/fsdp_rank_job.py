"""One rank of a sharded training loop on the CPU (gloo), driving the project's callback and collective
timing the way the Trainer does (the Trainer cannot run FSDP without an accelerator), for
tests/test_fsdp_stragglers.py; run under torchrun:

    torchrun --nproc_per_node 2 tests/fsdp_rank_job.py ADDRESS PREFIX PHASE...

A PHASE is ``FSDP:WHERE:STEPS[:off]``: a small model of linear layers sharded with FSDP2's
``fully_shard`` (``2``) or wrapped in FSDP1's ``FullyShardedDataParallel`` (``1``), trained for STEPS
steps in a run of its own, ``PREFIX-fsdpFSDP-WHERE[-off]``, whose rank 1 is made slow at WHERE:
``none`` (a balanced run), ``forward`` (a layer's forward), ``backward`` (a layer's backward) or
``optimizer`` (after each optimizer step), by burning CPU time (tests/cpu_burn.py: load stretches it
as it stretches the work); ``off``: with the collective timing turned off. Each phase is a fresh run
with its own RelayCallback (``trainer=`` a stand-in holding the sharded model as ``model_wrapped``),
real TrainingArguments, TrainerState and TrainerControl; every step is logged.
"""
from __future__ import annotations

import gc
import sys
import time
from types import SimpleNamespace

#: CPU seconds rank 1 burns per step where it is slow: the issue's 0.05 s (issue 41), a sixth of a
#: step (this model's ~0.2 s of work and BASE_S).
SLOW_CPU_S = 0.05
#: Seconds every rank sleeps between steps (as if loading its next batch): a sleep does not compete
#: for the cores, so on a loaded machine descheduling stays a small part of the step.
BASE_S = 0.1
WIDTH, BATCH = 256, 2048


def sharded(version: str, torch):  # type: ignore[no-untyped-def]
    layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]
    model = torch.nn.Sequential(*layers)
    if version == "2":
        from torch.distributed.fsdp import fully_shard

        for layer in layers:
            fully_shard(layer)
        return layers, fully_shard(model)
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return layers, FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
                                            device_id=torch.device("cpu"))


def phase(address: str, run: str, steps: int, version: str, where: str, timed: bool,
          args) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from cpu_burn import burn
    from relay.client.publisher import Publisher
    from trainer.callback import RelayCallback

    rank = dist.get_rank()
    torch.manual_seed(0)
    layers, model = sharded(version, torch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if rank == 1:
        def slow(*_: object) -> None:
            burn(SLOW_CPU_S)

        if where == "forward":
            layers[1].register_forward_pre_hook(slow)
        elif where == "backward":
            layers[1].register_full_backward_pre_hook(slow)
        elif where == "optimizer":
            optimizer.register_step_post_hook(slow)
    pub = Publisher(run, rank, world_size=2, address=address)
    callback = RelayCallback(pub, trainer=SimpleNamespace(model_wrapped=model), time_collectives=timed)
    state = TrainerState(max_steps=steps, is_world_process_zero=rank == 0, is_local_process_zero=rank == 0)
    control = TrainerControl()
    callback.on_train_begin(args, state, control, model=model)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        time.sleep(BASE_S)
        callback.on_step_begin(args, state, control)
        batch = torch.randn(BATCH, WIDTH, generator=generator)
        model(batch).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        state.global_step += 1
        state.epoch = state.global_step / steps
        control.should_log = True
        callback.on_step_end(args, state, control)
        control.should_log = False
    dist.barrier()  # as the Trainer's gather of the FLOs after its last step: every rank has ended its steps
    callback.on_train_end(args, state, control)
    left = pub.close(30)
    assert left == 0, f"rank {rank}: {left} events unacknowledged"


def main(address: str, prefix: str, phases: list[str]) -> None:
    import torch
    from transformers import TrainingArguments

    torch.set_num_threads(1)
    # The Trainer's arguments set up the process group (gloo on the CPU), as they do in a job.
    args = TrainingArguments(output_dir=f"/tmp/{prefix}", use_cpu=True, report_to="none", logging_steps=1,
                             per_device_train_batch_size=BATCH)
    assert args.world_size == 2, args.world_size
    for spec in phases:
        version, where, steps, *off = spec.split(":")
        phase(address, f"{prefix}-fsdp{version}-{where}" + ("-off" if off else ""), int(steps), version, where,
              not off, args)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    gc.freeze()  # as trainer/__main__.py: the exit need not walk what torch and transformers built
