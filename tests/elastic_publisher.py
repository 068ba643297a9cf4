"""A rank that torchrun restarts (``--max-restarts``), for tests/test_one_writer.py: it publishes
COUNT metrics events; at its first start it waits until they are acknowledged and SIGKILLs itself
(its session lost, nothing closed), and its restart (TORCHELASTIC_RESTART_COUNT=1) publishes them
again and closes, printing its counters as one JSON line.

    torchrun --nproc_per_node=1 --max-restarts=1 tests/elastic_publisher.py ADDRESS RUN COUNT
"""
import json
import os
import signal
import sys

from relay.client.publisher import Publisher

address, run, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
pub = Publisher(run, int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), address=address)
for i in range(count):
    pub.publish("metrics", {"i": i, "restart": restart}, step=i, stage="train")
if restart == 0:
    assert pub.flush(60) == 0
    os.kill(os.getpid(), signal.SIGKILL)
left = pub.close(60)
print(json.dumps({**pub.stats, "left": left}))
