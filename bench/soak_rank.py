"""One training rank of the soak (bench/soak.py): realistic telemetry through a real Publisher until
SIGTERM, then a clean close, then its counters as one JSON line on stdout.

    python -m bench.soak_rank ADDRESS RUN RANK WORLD_SIZE RATE_HZ SEED

Every 1/RATE s a ``train`` metrics event at the next step; every 50 steps an ``eval`` metrics event,
a ``params`` event and a ``checkpoint`` lifecycle event; now and then a NaN loss or an infinite
grad norm, as a diverging run sends. ``next_seq`` in the output is how many sequence numbers the
Publisher handed out (hello and stats events included): the journal must hold exactly 0..next_seq-1.
"""
from __future__ import annotations

import json
import logging
import math
import random
import signal
import sys
import threading
import time
from collections.abc import Callable

from relay.client.publisher import Publisher

EVAL_EVERY = 50
CLOSE_TIMEOUT = 60.0


def telemetry(step: int, rng: random.Random) -> dict[str, float]:
    """A train step's figures, shaped like what the trainer's callback sends."""
    loss = 2.5 * math.exp(-step / 4000) + 0.3 + rng.gauss(0, 0.02)
    grad_norm = abs(rng.gauss(1.0, 0.3))
    if rng.random() < 0.002:
        loss = math.nan
    if rng.random() < 0.001:
        grad_norm = math.inf
    return {"loss": loss, "learning_rate": 2e-5 * max(0.0, 1 - step / 1e6), "grad_norm": grad_norm,
            "step_time": 0.05 + abs(rng.gauss(0, 0.005)), "samples_per_second": 160.0 + rng.gauss(0, 3),
            "mean_token_accuracy": min(1.0, 0.4 + step / 1e5), "num_tokens": float(step * 4096)}


def run(address: str, run_id: str, rank: int, world: int, rate: float, seed: int) -> dict[str, int]:
    """Publish until SIGTERM; returns the Publisher's counters plus ``next_seq`` and ``left``."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(seed * 1000 + rank)
    pub = Publisher(run_id, rank, local_rank=rank % 8, world_size=world, address=address)
    pub.publish("params", {"model": "soak-tiny", "lr": 2e-5, "batch_size": 8, "seed": seed}, stage="hparams")
    pub.publish("lifecycle", {"event": "train_begin"})
    steps_per_epoch = 1000
    t0 = time.monotonic()
    step = 0
    while not stop.wait(max(0.0, t0 + step / rate - time.monotonic())):
        step += 1
        epoch = step / steps_per_epoch
        pub.publish("metrics", telemetry(step, rng), step=step, epoch=epoch, stage="train")
        if step % 10 == 0:
            pub.publish("metrics", {"step_time": 0.05, "samples_per_second": 160.0, "max_memory_mb": 812.0 + rank},
                        step=step, epoch=epoch, stage="rank")
        if step % EVAL_EVERY == 0:
            pub.publish("metrics", {"eval_loss": 0.4 + rng.random() * 0.1, "eval_accuracy": rng.random()},
                        step=step, epoch=epoch, stage="eval")
            pub.publish("params", {"checkpoint_step": step, "tokens_seen": step * 4096}, stage="progress")
            pub.publish("lifecycle", {"event": "checkpoint", "step": step}, step=step)
    pub.publish("lifecycle", {"event": "train_end", "steps": step}, step=step)
    left = pub.close(CLOSE_TIMEOUT)
    return {**pub.stats, "left": left, "next_seq": pub._window.next_seq, "steps": step}


def main(argv: list[str], publish: Callable[..., dict[str, int]] = run, name: str = "soak_rank") -> None:
    """ADDRESS RUN RANK WORLD_SIZE RATE_HZ SEED -> ``publish``'s counters as one JSON line (bench.crash_rank too)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"%(asctime)s %(levelname)s {name}: %(message)s")
    address, run_id, rank, world, rate, seed = argv
    print(json.dumps(publish(address, run_id, int(rank), int(world), float(rate), int(seed))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
