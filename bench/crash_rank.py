"""One publishing rank of the crash-consistency run (bench/crash.py): events of 100 B up to the
frame limit through a real Publisher until SIGTERM, then a clean close, then its counters as one
JSON line on stdout.

    python -m bench.crash_rank ADDRESS RUN RANK WORLD_SIZE RATE_HZ SEED

Sizes are log-uniform between 100 B and the largest event a Publisher sends; one in four is
control characters (6 bytes each in JSON, up to the longest line the relay takes), so the relay
also dies in the middle of lines megabytes long. ``next_seq`` is how many seqs the Publisher handed
out: the journal must hold exactly 0..next_seq-1 once each, and ``acked`` of them were acknowledged.
"""
from __future__ import annotations

import math
import random
import signal
import sys
import threading
import time

from bench import soak_rank
from relay.client.publisher import Publisher
from relay.wire import schema

CLOSE_TIMEOUT = 120.0
SMALLEST = 100
LARGEST = schema.MAX_FRAME_BYTES - 4096  # the frame's envelope and row around the data
LARGEST_CONTROL = (schema.MAX_LINE_BYTES - 4096) // 6


def payload(rng: random.Random) -> str:
    size = int(math.exp(rng.uniform(math.log(SMALLEST), math.log(LARGEST))))
    if rng.random() < 0.25:
        return "\x01" * min(size, LARGEST_CONTROL)
    return chr(rng.randrange(97, 123)) * size


def run(address: str, run_id: str, rank: int, world: int, rate: float, seed: int) -> dict[str, int]:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(seed * 1000 + rank)
    pub = Publisher(run_id, rank, world_size=world, address=address, max_bytes=256 << 20)
    t0 = time.monotonic()
    n = 0
    while not stop.wait(max(0.0, t0 + n / rate - time.monotonic())):
        pub.publish("params", {"i": n, "s": payload(rng)})
        n += 1
    left = pub.close(CLOSE_TIMEOUT)
    return {**pub.stats, "left": left, "next_seq": pub._window.next_seq, "events": n}


if __name__ == "__main__":
    soak_rank.main(sys.argv[1:], run, "crash_rank")
