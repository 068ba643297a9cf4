"""One Publisher's send window: sequence numbers, events awaiting an ack, resends and drops.

No sockets and no clock of its own (every call that needs the time is given ``now``), so the
delivery rules of docs/protocol.md are unit-tested in milliseconds (tests/test_send_window.py).
Only the publisher I/O thread changes a window (and close(), once that thread has let go of it).
"""
from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_BATCH_EVENTS = 512
MAX_BATCH_BYTES = 256 << 10
#: The ack timeout doubles while nothing is acknowledged, up to this.
MAX_BACKOFF = 30.0


class SendWindow:
    """Encoded events from ``first_seq`` (0) on: those not yet acknowledged are kept, in order, with
    their bytes counted; ``next_send`` is the first of them not handed to the connection since the
    last rewind."""

    def __init__(self, *, max_events: int, max_bytes: int, resend_after: float, now: float,
                 first_seq: int = 0) -> None:
        """``first_seq``: where numbering starts (a resumed run's attempt starts above its earlier
        ones')."""
        self.unacked: collections.deque[tuple[int, bytes]] = collections.deque()
        self.unacked_bytes = 0
        self.next_seq = first_seq
        self.next_send = first_seq
        self.acked = 0
        self.resent = 0
        self.dropped_unacked = 0
        self.dropped_sent = 0  # of those, once handed to a connection: a relay may have them
        self.sent_before = 0  # every seq below it was handed to a connection before the last rewind
        self.dropped_upto = -1  # the highest seq given up, for the relay to move its floor past
        self.protocol_errors = 0  # acks beyond what was numbered
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.resend_after = resend_after
        self.backoff = resend_after
        self.last_progress = now  # the ack timeout runs from here

    @property
    def in_flight(self) -> bool:
        """Whether some unacknowledged event has been handed to the connection."""
        return bool(self.unacked) and self.next_send > self.unacked[0][0]

    def push(self, blob: bytes, *, droppable: bool = True) -> None:
        """Keep the event encoded as ``blob`` with seq ``next_seq`` (which the blob must carry),
        then drop the oldest unacknowledged events past the bounds, unless this one is not
        ``droppable`` (a loss report never causes a loss it does not report)."""
        unacked = self.unacked
        unacked.append((self.next_seq, blob))
        self.unacked_bytes += len(blob)
        self.next_seq += 1
        if not droppable:
            return
        while len(unacked) > self.max_events or self.unacked_bytes > self.max_bytes:
            seq, old = unacked.popleft()
            self.unacked_bytes -= len(old)
            self.dropped_unacked += 1
            self.dropped_upto = seq
            if seq < self.next_send or seq < self.sent_before:
                self.dropped_sent += 1
            if self.next_send <= seq:
                self.next_send = seq + 1

    def ack(self, upto: int, now: float) -> bool:
        """The relay journaled every seq below ``upto``; True if that acknowledged something new
        (which restarts the ack timeout at its shortest)."""
        if upto > self.next_seq:  # seqs this client never numbered: not our relay's word
            self.protocol_errors += 1
            upto = self.next_seq
        unacked = self.unacked
        progressed = False
        while unacked and unacked[0][0] < upto:
            self.unacked_bytes -= len(unacked.popleft()[1])
            self.acked += 1
            progressed = True
        if self.next_send < upto:
            self.next_send = upto
        if progressed:
            self.last_progress = now
            self.backoff = self.resend_after
        return progressed

    def rewind(self, why: str) -> None:
        """Send again from the oldest unacknowledged event: what was in flight may be lost."""
        if self.in_flight:
            rewound = self.next_send - self.unacked[0][0]
            self.resent += rewound
            log.debug("resending %d unacknowledged events (%s)", rewound, why)
        if self.unacked:
            self.sent_before = max(self.sent_before, self.next_send)
            self.next_send = self.unacked[0][0]

    def connected(self, now: float) -> None:
        """A link to the relay is up: the ack timeout runs from now."""
        self.last_progress = now

    def hurry(self) -> None:
        """Someone waits in flush(): retry soon, not after a long backoff."""
        self.backoff = min(self.backoff, self.resend_after)

    def pump(self, now: float, send: Callable[[list[bytes]], bool]) -> None:
        """Rewind if acks stalled for ``backoff`` (then double it), then hand everything not yet
        sent to ``send`` in batches, oldest first, until it refuses one (False: not connected, or
        full)."""
        in_flight = self.in_flight
        if in_flight and now - self.last_progress > self.backoff:
            self.rewind(f"no acknowledgement for {self.backoff:.1f} s")
            self.last_progress = now
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)
            in_flight = False
        self._send(send)
        if not in_flight and self.in_flight:
            self.last_progress = now  # the ack timeout runs from the send, not from an idle spell

    def _send(self, send: Callable[[list[bytes]], bool]) -> None:
        unacked = self.unacked
        if not unacked or self.next_send > unacked[-1][0]:
            return
        blobs: list[bytes] = []
        size = 0
        for seq, blob in itertools.islice(unacked, self.next_send - unacked[0][0], None):
            if blobs and (len(blobs) >= MAX_BATCH_EVENTS or size + len(blob) > MAX_BATCH_BYTES):
                if not send(blobs):
                    return
                self.next_send = seq
                blobs, size = [], 0
            blobs.append(blob)
            size += len(blob)
        if send(blobs):
            self.next_send = unacked[-1][0] + 1

    def take_all(self) -> list[bytes]:
        """Empty the window (close() spools what is left); returns the blobs, oldest first."""
        blobs = [blob for _, blob in self.unacked]
        self.unacked.clear()
        self.unacked_bytes = 0
        return blobs
