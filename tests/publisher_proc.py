"""Stand-in for one training rank: publish COUNT metrics events at RATE/s (0 = as fast as possible),
flush, and print the client's counters as one JSON line. An 8th argument is the run's attempt.
SIGUSR1: the rest as fast as possible (a test whose faults are over need not wait out the rate)."""
import json
import signal
import sys
import time

from relay.client.publisher import Publisher

address, run, rank, count, world, rate, flush_timeout = sys.argv[1:8]
rank, count, world, rate, flush_timeout = int(rank), int(count), int(world), float(rate), float(flush_timeout)
attempt = int(sys.argv[8]) if len(sys.argv) > 8 else 0
pub = Publisher(run, rank, world_size=world, address=address, attempt=attempt)
pause = [1.0 / rate if rate else 0.0]
signal.signal(signal.SIGUSR1, lambda *_: pause.__setitem__(0, 0.0))
for i in range(count):
    pub.publish("metrics", {"i": i, "loss": 1.0 / (i + 1)}, step=i, stage="train")
    if pause[0]:
        time.sleep(pause[0])
left = pub.close(flush_timeout)
print(json.dumps({**pub.stats, "left": left}))
