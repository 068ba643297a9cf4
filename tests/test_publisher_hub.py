"""Many Publishers in one process share one I/O thread and still deliver every event exactly once."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import read_jsonl
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
