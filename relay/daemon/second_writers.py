"""Ingest's judge of second writers: the hellos of a frame held against each stream's writer
(relay/journal/writers.py says the rule), and a refused frame made loud (docs/protocol.md, "One
writer per stream": counted, dead-lettered, told, logged and journaled once as ``conflict``).

Later refusals are summed up in the log at most every REFUSED_REPORT_EVERY seconds: a limit of their
own, so no flood of other refusals hides them. No socket, no clock: ingest gives both.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from relay.daemon.counters import Counters
from relay.daemon.owners import Owners
from relay.daemon.runs import Key, Runs
from relay.journal.deadletter import DeadLetters
from relay.journal.dedupe import RankState
from relay.journal.writers import (
    REFUSED_REPORT_EVERY,
    Conflict,
    Writers,
    judge,
    session_of,
    writer_of,
)
from relay.wire import schema
from relay.wire.lines import Derived

log = logging.getLogger("relay")

#: Tells a connection why its frames for some streams are refused: (run, rank, one line) each.
Tell = Callable[[bytes, list[tuple[str, int, str]]], None]


class SecondWriters:
    """Judges each frame's hellos, and refuses a second writer's frames loudly. Given ingest's run
    table, owners, writers, counters and dead letters, and what to call: ``lookup`` a stream's
    dedupe state (None: a new run past its connection's budget), ``connected`` (None: every owner
    is), ``gone`` (a connection found gone), ``derive`` (queue the relay's own events) and
    ``tell``."""

    def __init__(self, runs: Runs, owners: Owners, writers: Writers, counters: Counters,
                 deadletters: DeadLetters,
                 *, lookup: Callable[[bytes, str, int, float], RankState | None],
                 connected: Callable[[bytes], bool] | None, gone: Callable[[bytes], None],
                 derive: Callable[[list[Derived]], None], tell: Tell | None) -> None:
        self.runs, self.owners, self.writers, self.counters = runs, owners, writers, counters
        self.deadletters = deadletters
        self.lookup, self.connected, self.gone = lookup, connected, gone
        self.derive, self.tell = derive, tell
        self._summed_at: float | None = None  # when repeated refusals were last summed up
        self._since = 0  # frames refused as second writers, not logged, since then

    def judge(self, peer: bytes, decoded: schema.Frame, now: float) -> Conflict | None:
        """The first stream of the frame that another session writes: a hello of a new session
        judged, or any frame of a connection already refused the stream."""
        writers = self.writers
        if decoded.first_seq is not None:  # one stream, and no hello among its events
            if not writers.refused:
                return None
            return writers.refusal(decoded.streams().pop(), peer)
        hellos = {(e["run"], e["rank"]): e for e in decoded.events if e["type"] == "hello"}
        if writers.refused:
            for key in decoded.streams():
                standing = None if key in hellos else writers.refusal(key, peer)
                if standing is not None:
                    return standing
        for key, hello in hellos.items():
            state = self.lookup(peer, key[0], key[1], now)
            if state is None:  # a new run past the connection's budget: refused as such by ingest
                continue
            session = session_of(hello["data"], peer)
            writer = writers.of.get(key)
            why = None
            if writer is not None and writer.session not in (None, session):
                live = self._writer_live(key, peer, now)
                why = judge(writer, session, live=live, above=hello["seq"] > state.top)
            if why is None:
                writers.passed(key, peer)
                continue
            assert writer is not None
            by = writer_of(hello["data"], hello["host"], session)
            conflict = Conflict(key, why, writer, by, hello["seq"])
            writers.refuse(key, peer, conflict)
            return conflict
        return None

    def _writer_live(self, key: Key, peer: bytes, now: float) -> bool:
        """Whether ``key``'s owner is another connection that is still there (and not silent)."""
        owner = self.owners.of(key)
        if owner is None or not self.owners.foreign(key, peer, now):
            return False
        if self.connected is None or self.connected(owner):
            return True
        self.gone(owner)
        return False

    def refuse(self, conflict: Conflict, events: list[dict[str, Any]], frame: bytes, peer: bytes,
               now: float) -> None:
        """A second writer's frame, refused loudly (the module's docstring says how)."""
        run, rank = conflict.key
        self.counters.rejected["conflict"] += 1
        line = conflict.line()
        if self.writers.first_time(conflict):
            log.error("refused a second writer of run %s rank %d: a process (%s, session %s) %s, "
                      "written by %s (session %s); its frames are refused and never acknowledged: "
                      "give each job its own run id",
                      run, rank, conflict.by.who(), conflict.session,
                      "sent while the first is connected" if conflict.why == "live"
                      else f"starts at seq {conflict.seq}, which the stream already holds",
                      conflict.writer.who(), conflict.writer.session)
            writer, by = conflict.writer, conflict.by
            data = {"event": "conflict", "rank": rank, "why": conflict.why, "seq": conflict.seq,
                    "writer_pid": writer.pid, "writer_host": writer.host, "refused_pid": by.pid,
                    "refused_host": by.host}
            world = self.runs.world.get(run, events[0]["world_size"])
            self.derive([Derived(run, world, "lifecycle", None, None, data)])
        else:
            self._since += 1
            if self._summed_at is None or now - self._summed_at >= REFUSED_REPORT_EVERY:
                log.warning("%d more frames refused as second writers (%d so far); the last: %s",
                            self._since, self.counters.rejected["conflict"], line)
                self._summed_at, self._since = now, 0
        if not self.deadletters.add("conflict", line, frame, peer):
            self.counters.deadletter_overflow += 1
        if self.tell is not None:
            self.tell(peer, [(run, rank, line)])
