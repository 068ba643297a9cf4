"""Stand-in for one training rank: publish COUNT metrics events at RATE/s (0 = as fast as possible),
flush, and print the client's counters as one JSON line. An 8th argument is the run's attempt."""
import json
import sys
import time

from relay.client.publisher import Publisher

address, run, rank, count, world, rate, flush_timeout = sys.argv[1:8]
rank, count, world, rate, flush_timeout = int(rank), int(count), int(world), float(rate), float(flush_timeout)
attempt = int(sys.argv[8]) if len(sys.argv) > 8 else 0
pub = Publisher(run, rank, world_size=world, address=address, attempt=attempt)
pause = 1.0 / rate if rate else 0.0
for i in range(count):
    pub.publish("metrics", {"i": i, "loss": 1.0 / (i + 1)}, step=i, stage="train")
    if pause:
        time.sleep(pause)
left = pub.close(flush_timeout)
print(json.dumps({**pub.stats, "left": left}))
