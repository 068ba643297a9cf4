"""One rank of the in-process half of the collective-timing benchmark (bench/bench_collectives.py runs it
under torchrun on two CPU ranks): two DDP copies of one small model in one process group, both on DDP's
built-in C++ all-reduce, one of them timed by trainer/collectives.py (its gradients stamped, its
backward pass wrapped), stepped in turns of
``BLOCK`` steps (the order turning each block) so drift hits both alike; each step also gathers its
loss across the ranks, as the Trainer does when it logs, through the wrapped collective in the timed
turns (trainer/dist_waits.py installed) and the plain one in the built-in turns. Rank 0 writes each
step's wall and CPU seconds by mode as JSON to ``OUT``.

    torchrun --nproc_per_node 2 bench/ddp_pair_job.py BLOCKS OUT
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

BLOCK, WIDTH, LAYERS = 10, 512, 4


def main(blocks: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainer import dist_waits
    from trainer.collectives import CollectiveClock

    dist.init_process_group("gloo")
    torch.set_num_threads(1)

    def model() -> DistributedDataParallel:
        torch.manual_seed(0)
        return DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]))

    clock = CollectiveClock()
    builtin, timed = model(), model()
    clock.watch(timed)
    backward = {"builtin": torch.Tensor.backward, "timed": clock.timed_backward(torch.Tensor.backward)}
    found: dict[str, list[list[float]]] = {"builtin": [], "timed": []}
    batch = torch.randn(64, WIDTH)
    for block in range(blocks):
        for name in ("builtin", "timed") if block % 2 == 0 else ("timed", "builtin"):
            ddp = timed if name == "timed" else builtin
            if name == "timed":
                dist_waits.install(clock.waited)
            for _ in range(BLOCK):
                dist.barrier()  # both ranks start the step together: its time is this rank's, not the peer's lag
                wall, cpu = time.perf_counter(), time.process_time()
                clock.in_step = True
                loss = ddp(batch).pow(2).mean()
                backward[name](loss)
                ddp.zero_grad()
                clock.in_step = False
                gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
                dist.all_gather(gathered, loss.detach().reshape(1))  # the Trainer's loss gather when it logs
                found[name].append([time.perf_counter() - wall, time.process_time() - cpu])
                clock.take()
            dist_waits.uninstall()
    if dist.get_rank() == 0:
        out.write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
