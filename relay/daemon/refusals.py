"""Refusals made loud, in bounded measure: a refused frame and a refused handshake are each
counted by reason, logged (the first ones, then sparsely) and dead-lettered. Ingest's (relay/daemon/
ingest.py), apart from it because how often to speak is a job of its own. No socket, no clock.
"""
from __future__ import annotations

import logging

from relay.daemon.counters import Counters
from relay.journal.deadletter import DeadLetters

log = logging.getLogger("relay")

#: Seconds between the log lines (and dead letters) of refused handshakes after the first: a peer
#: without the secret retries every few seconds for as long as it runs, and each try is counted.
REFUSED_REPORT_EVERY = 60.0
#: Log lines per refusal reason before only every thousandth is logged (each reason counts its own,
#: so no flood of one reason hides another).
REJECT_LOG_FIRST = 10


class Refusals:
    """Counts into the relay's ``counters``; keeps what it refused in ``deadletters``."""

    def __init__(self, counters: Counters, deadletters: DeadLetters) -> None:
        self.counters = counters
        self.deadletters = deadletters
        self._refused_at: float | None = None  # when a refused handshake was last logged
        self._refused_since = 0  # refused handshakes since then

    def connection(self, why: str, now: float) -> None:
        """A connection failed the handshake (relay/daemon/gate.py): nothing of it was read. Counted
        as ``auth_failed`` every time; logged in one line and dead-lettered the first time, then at
        most every REFUSED_REPORT_EVERY seconds with how many came since."""
        self.counters.rejected["auth_failed"] += 1
        self._refused_since += 1
        if self._refused_at is not None and now - self._refused_at < REFUSED_REPORT_EVERY:
            return
        count, self._refused_since, self._refused_at = self._refused_since, 0, now
        detail = f"{why} ({count} refused since the last report)" if count > 1 else why
        log.warning("refused a connection (%d so far): %s; nothing it sends is read "
                    "(docs/security.md)", self.counters.rejected["auth_failed"], detail)
        if not self.deadletters.add("auth_failed", detail, b"", b""):
            self.counters.deadletter_overflow += 1

    def frame(self, reason: str, detail: str, frame: bytes, peer: bytes) -> None:
        """A refused frame: counted by ``reason``, logged (each reason's first ten, then every
        thousandth), dead-lettered."""
        count = self.counters.rejected[reason] = self.counters.rejected[reason] + 1
        if count <= REJECT_LOG_FIRST or count % 1000 == 0:
            log.warning("rejected frame from peer %s (%d %s so far): %s: %s", peer.hex(), count,
                        reason, reason, detail)
        if not self.deadletters.add(reason, detail, frame, peer):
            self.counters.deadletter_overflow += 1
