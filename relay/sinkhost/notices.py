"""What a follower of the journal learns from its relay: a sink that reads the journal itself
(``wants_events = False``: the forward and nats sinks) needs to know only which runs have new lines
and how far, not the lines. So its process is sent, for each write of the journal, one notice per
run: ``RUN OFFSET EVENTS`` (where the run's file ends after that write, and how many of its events
the write held), instead of every line it would read again from the journal and drop. The relay
writes a few bytes to the pipe per write instead of every line, and the sink's process splits none.

The child hands the sink one read-only stand-in ``{"run": RUN, "offset": OFFSET}`` per event (the
same object for all of one notice), so its counters (written, queued, lag) count events as every
sink's do.
"""
from __future__ import annotations

from typing import Any

from relay.journal.journal_queue import News
from relay.wire.schema import valid_run_id


def encode(news: News) -> bytes:
    return b"".join([b"%s %d %d\n" % (run.encode(), end, events) for run, (events, end) in news.items()])


class NoticeDecoder:
    """Notices arriving in pieces (a pipe) -> one stand-in per event; a partial last notice waits for
    the rest. ``bad_lines`` counts what was not a notice (as ``LineDecoder`` counts lines)."""

    def __init__(self) -> None:
        self.bad_lines = 0
        self._rest = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        *notices, self._rest = (self._rest + data).split(b"\n")
        out: list[dict[str, Any]] = []
        for notice in notices:
            try:
                run, end, events = notice.decode("ascii").split(" ")
                stand_in, count = {"run": run, "offset": int(end)}, int(events)
            except ValueError:
                run, count = "", -1
            if not valid_run_id(run) or count < 0:
                self.bad_lines += 1
                continue
            out += [stand_in] * count
        return out
