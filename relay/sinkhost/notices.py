"""What a shipper (relay/ship/base.py) learns from its relay: per journal write, one notice per run,
``RUN OFFSET EVENTS``, not the lines, since it reads the journal itself. The event counts keep the
host's counters (written, queued, lag) in events, as every sink's are.
"""
from __future__ import annotations

from relay.journal.journal_queue import News
from relay.wire.schema import valid_run_id


def encode(news: News) -> bytes:
    return b"".join([b"%s %d %d\n" % (run.encode(), end, events)
                     for run, (events, end) in news.items()])


class NoticeDecoder:
    """Notices arriving in pieces (a pipe) -> news, the events of a run added up and its file's end
    the furthest said; a partial last notice waits for the rest. ``bad_lines`` counts what was not
    a notice (as ``LineDecoder`` counts lines)."""

    def __init__(self) -> None:
        self.bad_lines = 0
        self._rest = b""

    def feed(self, data: bytes) -> News:
        *notices, self._rest = (self._rest + data).split(b"\n")
        news: News = {}
        for notice in notices:
            try:
                run, end, events = notice.decode("ascii").split(" ")
                offset, count = int(end), int(events)
            except ValueError:
                run, count = "", -1
            if not valid_run_id(run) or count < 0:
                self.bad_lines += 1
                continue
            had, last = news.get(run, (0, 0))
            news[run] = (had + count, max(last, offset))
        return news
