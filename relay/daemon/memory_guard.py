"""The relay's memory guard. ZeroMQ assembles a whole message before the relay sees any of it, and
bounds each part (MAXMSGSIZE) but not how many parts there are: a peer sending one message of
endless parts makes it allocate without limit. Past ``--max-memory`` MiB, the loop drops every
connection (it closes the socket and binds it again), which frees what ZeroMQ held; clients
reconnect and resend what was not acknowledged, so nothing is lost.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from relay.daemon.bounds import MemoryProbe
from relay.daemon.counters import Counters
from relay.wire.address import AddressInUse

log = logging.getLogger("relay")

REBIND_TIMEOUT = 5.0  # seconds to get the address back after dropping every connection


class MemoryGuard:
    """Whether the relay's resident memory is past ``limit`` MiB (0: never), said and counted."""

    def __init__(self, limit: int, counters: Counters) -> None:
        self.limit = limit
        self.counters = counters
        self._probe = MemoryProbe()

    def exceeded(self) -> bool:
        """True, counted and logged, when the relay must drop every connection."""
        limit = self.limit
        if not limit:
            return False
        rss = self._probe.rss_mib()
        if rss <= limit:
            return False
        self.counters.memory_resets += 1
        log.error("relay memory at %d MiB exceeds --max-memory %d MiB (a peer sending an endless "
                  "multipart message?): dropping every connection; clients reconnect and resend "
                  "(%d times so far)", rss, limit, self.counters.memory_resets)
        return True


def rebind(listen: Callable[[str], zmq.Socket], address: str) -> zmq.Socket:
    """``listen(address)`` once it works: ZeroMQ lets go of the address in its own thread, a
    moment after the old socket's close; AddressInUse after REBIND_TIMEOUT seconds."""
    deadline = time.monotonic() + REBIND_TIMEOUT
    while True:
        try:
            return listen(address)
        except AddressInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
