"""The fan-out: the other sinks' processes, each handed every batch the journal took, and fed only
while ingest waits for frames (``idle``), so that under a burst the CPU is ingest's.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from relay.journal.journal import Journal
from relay.journal.journal_queue import News
from relay.sinkhost.process import SinkProcess
from relay.sinkhost.spec import SinkSpec


class FanOut:
    """One SinkProcess per sink spec, started once; ``idle`` is set while ingest does not need the
    CPU."""

    def __init__(self) -> None:
        self.workers: list[SinkProcess] = []
        self.idle = threading.Event()

    def start(self, specs: list[SinkSpec], journal: Journal, sink_queue: int, drain_timeout: float,
              write_above: Callable[[bytes], None] | None) -> None:
        """Start each sink's process without waiting for it: it opens its sink in its own time,
        takes the lines that arrive meanwhile, and catches up from the journal."""
        where = str(journal.path) + (os.sep if journal.directory else "")
        for spec in specs:
            deadletter = journal.sidecar(f"_deadletter_{spec.name}.jsonl")
            worker = SinkProcess(replace(spec, journal=where, deadletter=str(deadletter),
                                         max_events=sink_queue, drain_timeout=drain_timeout),
                                 self.idle, write_above)
            worker.start()
            self.workers.append(worker)

    def submit(self, lines: bytes, events: int, news: News) -> None:
        """A batch the journal took, for every other sink: its lines; to a shipper, only its news
        (relay/sinkhost/notices.py)."""
        for worker in self.workers:
            if worker.ships:
                worker.ship(news)
            else:
                worker.submit(lines, events)

    def sample(self, now: float) -> None:
        for worker in self.workers:
            worker.sample(now)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {worker.name: worker.stats() for worker in self.workers}

    def close(self, deadline: float, progress: Callable[[float], None] | None = None) -> None:
        """Let the sinks have the CPU for good: each drains what it has until ``deadline``
        (monotonic), given half a second at least, all at once; ``progress(waited)`` is called about
        every second meanwhile (the relay says what it waits for)."""
        self.idle.set()
        started = time.monotonic()
        closers = [threading.Thread(target=worker.close, args=(max(0.5, deadline - started),),
                                    name=f"sink-{worker.name}-close", daemon=True)
                   for worker in self.workers]
        for closer in closers:
            closer.start()
        for closer in closers:
            while closer.is_alive():
                closer.join(1.0)
                if closer.is_alive() and progress is not None:
                    progress(time.monotonic() - started)
