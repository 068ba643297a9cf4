"""trainer/dist_waits.py and trainer/collectives.attach on a real one-rank gloo group in this process:
blocking collectives are timed once each (also one called from inside another), asynchronous ones
and everything after uninstall are not, the originals come back; attach times what it knows how
to time and says in words what it does not."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_blocking_collectives_are_timed_once_and_asynchronous_ones_not(group: None) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from trainer import dist_waits

    originals = (dist.all_reduce, distributed_c10d.all_gather, dist.barrier)
    calls: list[float] = []
    dist_waits.install(calls.append)
    try:
        assert dist.all_reduce is not originals[0] and dist.all_reduce.__wrapped__ is originals[0]
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(2), dist.ReduceOp.SUM, None, False)  # async_op given by position
        assert len(calls) == 2
        dist.all_reduce(torch.ones(2), async_op=True).wait()  # its wait is elsewhere: not timed here
        dist.all_reduce(torch.ones(2), dist.ReduceOp.SUM, None, True).wait()
        assert len(calls) == 2
        found: list[object] = [None]
        dist.all_gather_object(found, {"a": 1})  # calls all_gather (and more) inside: counted once
        dist.barrier()
        assert len(calls) == 4 and found == [{"a": 1}] and all(0 <= s < 30 for s in calls)
        other: list[float] = []
        thread = threading.Thread(target=lambda: other.append(dist.all_reduce(torch.ones(1))))
        thread.start()
        thread.join()
        assert len(calls) == 5  # timed on any thread
    finally:
        dist_waits.uninstall()
    assert (dist.all_reduce, distributed_c10d.all_gather, dist.barrier) == originals
    dist.all_reduce(torch.ones(2))
    assert len(calls) == 5


def test_the_clock_counts_a_wait_inside_or_between_steps(group: None) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from trainer import collectives

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    model.register_comm_hook(None, allreduce_hook)  # a hook of the job's own is left alone
    accelerator = SimpleNamespace(backward=lambda loss: loss.backward())
    trainer = SimpleNamespace(model_wrapped=model, accelerator=accelerator)
    plain_backward = accelerator.backward
    timing = collectives.attach(trainer)
    try:
        assert timing.clock is not None
        assert timing.what == ("DDP gradient all-reduce (after the last gradient), blocking torch.distributed "
                               "collectives (gathers, barriers)")
        clock = timing.clock
        clock.in_step = True
        accelerator.backward(model(torch.ones(2, 4)).sum())  # from the last gradient to its return: inside
        inside, outside = clock.take()
        assert inside > 0 and outside == 0
        dist.all_reduce(torch.ones(1))
        clock.in_step = False
        dist.all_reduce(torch.ones(1))
        inside, outside = clock.take()
        assert inside > 0 and outside > 0 and clock.take() == (0.0, 0.0)
    finally:
        collectives.detach(trainer, timing)
    assert accelerator.backward is plain_backward and not clock._hooks
    accelerator.backward(model(torch.ones(2, 4)).sum())
    assert clock.take() == (0.0, 0.0)  # nothing timed after detach


def test_attach_says_what_it_cannot_time(group: None) -> None:
    import torch

    from trainer import collectives

    off = collectives.attach(SimpleNamespace(model_wrapped=torch.nn.Linear(2, 2)), enabled=False)
    assert off.clock is None and off.what.startswith("collective timing turned off (--time_collectives false)")
    plain = collectives.attach(SimpleNamespace(model_wrapped=torch.nn.Linear(2, 2)))
    assert plain.clock is None and plain.what.startswith("a Linear model: not DDP or FSDP")
    meta = collectives.attach(SimpleNamespace(model_wrapped=torch.nn.Linear(2, 2, device="meta")))
    assert meta.clock is None and meta.what.startswith("gloo on meta: a collective returns before the device has "
                                                       "done it")
