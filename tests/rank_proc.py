"""Stand-in for one training rank that logs its step time: STEPS logged steps, each a real sleep of
STEP_SECONDS, published as ``stage="rank"`` metrics with the time it really took, as step time and as
own work (it waits for no peer; trainer/callback.py sends both); then flush and print the client's
counters as one JSON line.

    python tests/rank_proc.py ADDRESS RUN RANK WORLD_SIZE STEPS STEP_SECONDS [PAUSE_AT PAUSE_SECONDS]

With PAUSE_AT, the rank goes on stepping but publishes nothing for PAUSE_SECONDS after that step, as
a rank whose events stop reaching the relay for a while; then it publishes again, in step with the
others.
"""
import json
import sys
import time

from relay.client.publisher import Publisher

address, run = sys.argv[1:3]
rank, world, steps = (int(a) for a in sys.argv[3:6])
step_seconds = float(sys.argv[6])
pause_at, pause = (int(sys.argv[7]), float(sys.argv[8])) if len(sys.argv) > 8 else (-1, 0.0)
pub = Publisher(run, rank, world_size=world, address=address)
silent_until = 0.0
for step in range(1, steps + 1):
    start = time.perf_counter()
    time.sleep(step_seconds)
    took = time.perf_counter() - start
    if start >= silent_until:
        pub.publish("metrics", {"step_time": took, "own_time": took, "samples_per_second": 8 / took, "steps": 1}, step=step,
                    epoch=step / steps, stage="rank")
    if step == pause_at:
        silent_until = time.perf_counter() + pause
left = pub.close(30)
print(json.dumps({**pub.stats, "left": left}), flush=True)
