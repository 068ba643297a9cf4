"""Many Publishers in one process share one I/O thread and still deliver every event exactly once."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import ROOT, read_jsonl
from relay.client.publisher import Publisher


def _publisher_threads() -> int:
    return sum(t.name == "relay-publisher" for t in threading.enumerate())


def test_many_publishers_share_one_thread_and_lose_nothing(relays, tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)])
    pubs = [Publisher("hub", rank, world_size=40, address=relay.address) for rank in range(40)]
    assert _publisher_threads() == 1
    for step in range(25):
        for pub in pubs:
            pub.publish("metrics", {"loss": 1.0 / (step + 1)}, step=step, stage="train")
    pubs[0].close(20)  # one leaves early; the others keep going
    for pub in pubs[1:]:
        pub.publish("metrics", {"late": 1.0}, step=25, stage="train")
    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(lambda p: p.close(30), pubs[1:])) == 0
    assert relay.stop() == 0
    seen: dict[int, list[int]] = {}
    for event in read_jsonl(journal):
        seen.setdefault(event["rank"], []).append(event["seq"])
    assert sorted(seen) == list(range(40))
    for rank, seqs in seen.items():
        assert seqs == list(range(len(seqs))), rank  # per-rank order, no gap, no duplicate
        assert len(seqs) == 1 + 25 + (rank > 0) + 1  # hello, metrics, late, closing stats
    deadline = time.monotonic() + 5
    while _publisher_threads() and time.monotonic() < deadline:  # it ends with the last Publisher
        time.sleep(0.01)
    assert _publisher_threads() == 0


IMPORTS_START_NOTHING = """
import os, sys, threading
fds = len(os.listdir("/proc/self/fd"))
import relay, relay.sinkhost.child, relay.daemon.loop
print("io_thread" if "relay.wire.io_thread" in sys.modules else "-",
      "publisher" if "relay.client.publisher" in sys.modules else "-")
import relay.client.publisher as publisher
import relay.wire.io_thread as io_thread
assert relay.Publisher is publisher.Publisher
print(io_thread._hub, threading.active_count(), len(os.listdir("/proc/self/fd")) - fds)
"""


def test_importing_the_relay_or_the_client_starts_nothing() -> None:
    """The sink child and the daemon import relay.* without the publisher's I/O thread; the client
    itself makes it (a thread and a pipe) only for its first Publisher."""
    proc = subprocess.run([sys.executable, "-c", IMPORTS_START_NOTHING], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["- -", "None 1 0"]
