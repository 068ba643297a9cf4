"""The fan-out's sink threads: chunked writes, and no writes while ingest has frames to read."""
from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from relay.fanout import CHUNK, SinkWorker
from sinks.base import Sink


class Recording(Sink):
    name = "recording"

    def __init__(self) -> None:
        self.writes: list[list[int]] = []

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        self.writes.append([e["seq"] for e in events])


def _wait(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_sink_writes_in_chunks_and_only_while_ingest_is_idle() -> None:
    sink, idle = Recording(), threading.Event()
    worker = SinkWorker(sink, max_events=10_000, ingest_idle=idle)
    worker.start()
    try:
        worker.submit([{"seq": i} for i in range(3 * CHUNK + 5)])
        time.sleep(0.3)
        assert sink.writes == [] and worker.stats()["queued"] == 3 * CHUNK + 5  # ingest busy: the sink waits
        idle.set()
        assert _wait(lambda: worker.stats()["written"] == 3 * CHUNK + 5)
        assert [seq for chunk in sink.writes for seq in chunk] == list(range(3 * CHUNK + 5))
        assert max(map(len, sink.writes)) == CHUNK
        idle.clear()
        worker.submit([{"seq": -1}])
        time.sleep(0.3)
        assert worker.stats()["queued"] == 1
    finally:
        idle.set()
        worker.close(5.0)
    assert worker.stats() == {"written": 3 * CHUNK + 6, "errors": 0, "dropped": 0, "queued": 0}
