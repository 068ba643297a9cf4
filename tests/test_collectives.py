"""trainer/collectives.py on a real two-process gloo group (no Trainer): the all-reduce wait is the
tail after a rank's last gradient, not a bucket's whole time in flight, so the rank that computes
late waits least and its peer waits as long as it was late; DDP keeps its own all-reduce (no
communication hook), and the gradients are its own.

How late rank 1 was is measured in the same run, not assumed: each rank stamps when its last
gradient is ready (the same monotonic clock in both processes), so a loaded machine that slows one
rank's computing changes the lateness and the waits together, and the test compares the two."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two processes importing torch: over ~10 s on a loaded machine

LATE = 0.8  # seconds rank 1 spends computing in the middle of its backward pass
STEPS = 5


def _rank(rank: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainer.collectives import CollectiveClock

    # A file store, not a TCP port picked beforehand: no other job on the machine can take it meanwhile
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256) for _ in range(4)]
    if rank == 1:  # slow in the middle of backward: the buckets of later layers are in flight meanwhile
        layers[1].register_full_backward_hook(lambda *args: time.sleep(LATE))
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.25)  # one bucket a layer or so
    clock = CollectiveClock()
    clock.watch(model)
    backward = clock.timed_backward(torch.Tensor.backward)
    ready: list[float] = []
    for param in model.parameters():  # CLOCK_MONOTONIC: one clock for both ranks
        param.register_post_accumulate_grad_hook(lambda _: ready.append(time.perf_counter()))
    clock.in_step = True
    firsts, launches, waits, grads = [], [], [], []
    for step in range(STEPS):
        x = torch.full((8, 256), float(rank + step))
        backward(model(x).sum())
        firsts.append(min(ready))  # the first gradient of this pass: its bucket went then
        launches.append(max(ready))  # the last gradient of this pass
        ready.clear()
        waits.append(clock.take())
        grads.append(float(sum(p.grad.sum() for p in model.parameters())))
        model.zero_grad()
    # The same gradients without the hook: a second DDP model on the same weights.
    plain = DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]))
    plain.load_state_dict(model.state_dict())
    expected = []
    for step in range(STEPS):
        plain(torch.full((8, 256), float(rank + step))).sum().backward()
        expected.append(float(sum(p.grad.sum() for p in plain.parameters())))
        plain.zero_grad()
    Path(out, f"{rank}.json").write_text(json.dumps({"waits": waits, "grads": grads, "expected": expected,
                                                     "firsts": firsts, "launches": launches}))
    dist.destroy_process_group()


def test_the_late_rank_waits_least_and_its_peer_as_long_as_it_was_late(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(str(tmp_path),), nprocs=2, start_method="spawn")
    found = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    for rank in (0, 1):
        assert found[rank]["grads"] == pytest.approx(found[rank]["expected"], rel=1e-5)  # DDP's own all-reduce
        assert all(outside == 0.0 for _, outside in found[rank]["waits"])  # no gather: nothing between steps
    waits = [[inside for inside, _ in found[rank]["waits"]] for rank in (0, 1)]
    # from its first gradient (its bucket went then) to its last
    computing = [[last - first for first, last in zip(one["firsts"], one["launches"], strict=True)]
                 for one in found]
    assert len(waits[1]) == STEPS and all(t >= LATE for t in computing[1]), computing  # the sleep is in it
    # Which rank was late is measured per step: rank 1 computes LATE longer, but on a loaded machine a
    # descheduled rank 0 was later than that now and then (-0.23 s once in 4 runs at load 7-14).
    gaps = (b - a for a, b in zip(found[0]["launches"], found[1]["launches"], strict=True))
    # (the late rank, the early one, how late)
    steps = [(1, 0, gap) if gap > 0 else (0, 1, -gap) for gap in gaps]
    seen = {"waits": waits, "computing": computing, "late": steps}
    for i, (late, early, lateness) in enumerate(steps):
        # the early rank waited as long as the late one was late (the last all-reduce needs its bucket),
        # the late one less ...
        assert waits[early][i] >= 0.95 * lateness and waits[late][i] < waits[early][i], seen
    # ... and less than it computed while its first buckets were in flight, which is not waiting (a wait
    # timed from a bucket's launch would be at least that). Not a fraction of the lateness: what the late
    # rank waits is gloo's last all-reduce, which a descheduled peer holds up (at load 25-34 for 0.17-0.53 s
    # of steps 0.52-1.37 s late); the median step, as now and then it is long.
    assert statistics.median(waits[late][i] / computing[late][i] for i, (late, _, _) in enumerate(steps)) < 1, seen
