"""One rank of a whole job of the collective-timing benchmark against DDP's built-in all-reduce
(bench/bench_collectives.py runs it under torchrun on two CPU ranks): the demo fine-tune under DDP,
every step logged, with the trainer's RelayCallback publishing to an embedded relay, its collective
timing on (``timed``: gradients stamped, the backward pass and the blocking collectives wrapped) or off
(``builtin``: DDP's own C++ all-reduce, nothing wrapped) for the whole job. Rank 0 writes, as JSON to
``OUT``, each step cycle's wall time (begin to begin) and the CPU time this process used in it (every
thread: gloo's, the publisher's), after ``WARMUP`` steps.

    torchrun --nproc_per_node 2 bench/ddp_whole_job.py WORKDIR STEPS timed|builtin OUT
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

WARMUP = 10


def main(workdir: Path, steps: int, mode: str, out: Path) -> None:
    import torch
    from transformers import TrainerCallback

    from bench.ddp_timing_job import demo_trainer
    from relay.client.publisher import Publisher
    from trainer.callback import RelayCallback
    from trainer.custom_metrics import SEND_INTERVAL
    from trainer.embedded import EmbeddedRelay

    trainer = demo_trainer(workdir, steps)
    config = trainer.args
    rank = config.process_index
    relay = EmbeddedRelay.start(str(workdir)) if rank == 0 else None  # the job's relay, as the trainer starts it
    address = [relay.address if relay is not None else None]
    torch.distributed.broadcast_object_list(address)
    pub = Publisher(f"bench-{mode}", rank, world_size=config.world_size, address=address[0],
                    send_interval=SEND_INTERVAL)
    wall: list[float] = []
    cpu: list[float] = []

    class Cycle(TrainerCallback):
        last: tuple[float, float] | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.perf_counter(), time.process_time()
            if self.last is not None and state.global_step > WARMUP:
                wall.append(now[0] - self.last[0])
                cpu.append(now[1] - self.last[1])
            self.last = now

    try:
        trainer.add_callback(Cycle())
        trainer.add_callback(RelayCallback(pub, trainer=trainer, time_collectives=mode == "timed"))
        trainer.train()
        if pub.close(30) != 0:
            raise RuntimeError("the relay did not acknowledge every benchmark event")
    finally:
        torch.distributed.barrier()  # every rank flushed before the relay goes
        if relay is not None:
            relay.stop()
    if rank == 0:
        out.write_text(json.dumps({"wall": wall, "cpu": cpu}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
