"""The forward sink's send window: every (run, rank) stream's events the central has not
acknowledged, under docs/protocol.md's delivery rules for events that keep their own seqs.

Not ``relay.client.send_window.SendWindow``: that one numbers its own events without gaps and gives
up the oldest past its bounds, while forwarded events keep their rank's seqs (gaps included), one
window holds many streams, and nothing is given up: a full window only means "read no further for
now". No sockets and no clock; only the forwarder's I/O thread touches it.
"""
from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable

import msgspec

from relay.client.send_window import MAX_BACKOFF, MAX_BATCH_BYTES, MAX_BATCH_EVENTS
from relay.wire.encoding import array_header

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (run, rank)
#: After this long with the central's ack parked at a seq this node never had (and every held event
#: sent, and acknowledged as received), the events above are released as ``unconfirmed``.
STALL_S = 5.0
MAX_GAPS = 16  # gaps remembered per stream, the newest kept


#: A rank's consecutive events as the window holds them: (first seq, how many, the envelope's
#: compact prefix, their rows packed back to back), sent in one frame with any neighbours of the
#: same prefix.
Segment = tuple[int, int, bytes, bytes]


_encode, _decode = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder().decode


class Stream:
    """One (run, rank): ``held`` are the segments not yet acknowledged, oldest first; the first
    ``sent`` of them were handed to the connection since the last rewind."""

    __slots__ = ("acked", "held", "sent", "expect", "gaps", "upto", "backoff", "last_progress",
                 "last_send", "last_ack")

    def __init__(self, acked: int, resend_after: float) -> None:
        #: the central holds every seq below (or this node gave up on them, counted)
        self.acked = acked
        self.held: collections.deque[Segment] = collections.deque()
        self.sent = 0
        self.expect = acked  # the seq the next event read should have, if the journal has no gap
        self.gaps: list[int] = []  # first seqs of ranges this node never had (or could not send)
        self.upto = -1  # the central's latest ack on this connection (-1: none yet)
        self.backoff = resend_after
        self.last_progress = self.last_send = self.last_ack = 0.0

    def events_sent(self) -> int:
        return sum(count for _, count, _, _ in itertools.islice(self.held, self.sent))


class ForwardWindow:
    """Held events of every stream, bounded in events and bytes for the whole window."""

    def __init__(self, *, max_events: int, max_bytes: int, resend_after: float = 2.0) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.resend_after = resend_after
        self.streams: dict[Key, Stream] = {}
        self.active: dict[Key, Stream] = {}  # those holding events, in order of first hold
        self.events = 0
        self.bytes = 0
        self.acked = 0  # events the central acknowledged
        self.resent = 0
        self.unconfirmed = 0  # released at a gap without the central's word (see release_stalled)
        self.last_ack = 0.0  # of any stream

    def room(self) -> bool:
        """Whether another event may be held (else: read no further until acks free some)."""
        return self.events < self.max_events and self.bytes < self.max_bytes

    def stream(self, key: Key, acked: int = 0) -> Stream:
        """``key``'s stream, made with ``acked`` as its floor (what the state file says) if new."""
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = Stream(acked, self.resend_after)
        return stream

    def hold(self, key: Key, stream: Stream, seq: int, prefix: bytes, row: bytes) -> None:
        """Keep one event (seq not below ``stream.acked``, ``row`` packed) until the central
        acknowledges it."""
        self.hold_segment(key, stream, seq, 1, prefix, row)

    def hold_segment(self, key: Key, stream: Stream, first: int, count: int, prefix: bytes,
                     rows: bytes) -> None:
        """Keep events ``first`` .. ``first + count - 1`` (not below ``stream.acked``), their rows
        packed back to back in ``rows``, until the central acknowledges them."""
        if first > stream.expect:  # the journal lacks stream.expect .. first - 1
            stream.gaps = (stream.gaps + [stream.expect])[-MAX_GAPS:]
        stream.expect = max(stream.expect, first + count)
        if not stream.held:
            self.active[key] = stream
        stream.held.append((first, count, prefix, rows))
        self.events += count
        self.bytes += len(rows)

    def ack(self, key: Key, upto: int, now: float) -> None:
        """The central journaled every seq of ``key`` below ``upto``."""
        stream = self.stream(key)
        stream.last_ack = self.last_ack = now
        stream.upto = upto
        if upto <= stream.acked:
            return
        stream.acked = upto
        stream.expect = max(stream.expect, upto)
        held = stream.held
        popped = segments = 0
        while held and held[0][0] < upto:
            first, count, prefix, rows = held.popleft()
            # acknowledged in part (after a loss): the rest stays, packed again
            if first + count > upto:
                left = _decode(array_header(count) + rows)[upto - first:]
                packed = _encode(left)[len(array_header(len(left))):]
                held.appendleft((upto, len(left), prefix, packed))
                self.bytes -= len(rows) - len(held[0][3])
                popped += count - len(left)
                break
            self.bytes -= len(rows)
            popped += count
            segments += 1
        if popped:
            self.events -= popped
            self.acked += popped
            stream.sent = max(0, stream.sent - segments)
            stream.last_progress = now
            stream.backoff = self.resend_after
            if not held:
                del self.active[key]

    def connected(self, now: float) -> None:
        """A link to the central relay is up: a wait for acks counts from now."""
        self.last_ack = now

    def rewind(self, why: str) -> None:
        """Send every stream again from its oldest held event: what was in flight may be lost."""
        resent = sum(stream.events_sent() for stream in self.active.values())
        if resent:
            log.debug("resending %d unacknowledged events (%s)", resent, why)
        self.resent += resent
        for stream in self.active.values():
            stream.sent = 0

    def pump(self, now: float, send: Callable[[bytes, list[bytes], int], bool]) -> None:
        """Per stream: rewind if its acks stalled for its backoff (then double it); then hand every
        held event not yet sent to ``send(prefix, rows, count)`` (``count`` events' rows packed back
        to back in the pieces ``rows``), a batch of one envelope at a time, until it refuses one
        (not connected, or its queue is full)."""
        for stream in self.active.values():
            held = stream.held
            if stream.sent and now - stream.last_progress > stream.backoff:
                self.resent += stream.events_sent()
                stream.sent = 0
                stream.last_progress = now
                stream.backoff = min(stream.backoff * 2, MAX_BACKOFF)
            if stream.sent >= len(held):
                continue
            if not stream.sent:
                # the ack timeout runs from the send, not from an idle spell
                stream.last_progress = now
            pieces: list[bytes] = []
            prefix, count, size = b"", 0, 0
            for _, n, pre, rows in itertools.islice(held, stream.sent, None):
                if pieces and (pre is not prefix or count + n > MAX_BATCH_EVENTS
                               or size + len(rows) > MAX_BATCH_BYTES):
                    if not send(prefix, pieces, count):
                        return
                    stream.sent += len(pieces)
                    stream.last_send = now
                    pieces, count, size = [], 0, 0
                prefix = pre
                pieces.append(rows)
                count += n
                size += len(rows)
            if not send(prefix, pieces, count):
                return
            stream.sent += len(pieces)
            stream.last_send = now

    def release_stalled(self, now: float) -> list[tuple[Key, int, int]]:
        """Streams whose acks are parked where nothing will move them: at a seq this node never had
        (the rank dropped it, or it could not be forwarded), or below what the central already
        acknowledged before. A rank's loss report moves the central's floor past its gap, but only
        for the connection that carried it: after a restart of either relay the central's ack for
        this connection waits at the gap for good. So once every held event was sent, the central
        answered after that send, and ``STALL_S`` passed since, the held events are released and
        counted as ``unconfirmed`` (they were sent, and they are still in this node's journal).
        Returns (key, the central's ack, released) for each."""
        out = []
        for key, stream in list(self.active.items()):
            parked = stream.upto in stream.gaps or 0 <= stream.upto < stream.acked
            if (parked and stream.sent >= len(stream.held)
                    and stream.last_send < stream.last_ack and now - stream.last_ack >= STALL_S):
                n = sum(count for _, count, _, _ in stream.held)
                gap = stream.upto
                last, count, _, _ = stream.held[-1]
                stream.acked = max(stream.acked, last + count)
                self.bytes -= sum(len(rows) for _, _, _, rows in stream.held)
                self.events -= n
                self.unconfirmed += n
                stream.held.clear()
                stream.sent = 0
                del self.active[key]
                out.append((key, gap, n))
        return out

    def drop(self, key: Key) -> int:
        """Let go of every event held for ``key`` (the central refuses the stream); how many."""
        stream = self.streams.get(key)
        if stream is None or not stream.held:
            return 0
        n = sum(count for _, count, _, _ in stream.held)
        self.bytes -= sum(len(rows) for _, _, _, rows in stream.held)
        self.events -= n
        stream.held.clear()
        stream.sent = 0
        del self.active[key]
        return n

    def floors(self) -> dict[Key, int]:
        """Per stream, the seq below which nothing needs sending again (the state file's)."""
        return {key: stream.acked for key, stream in self.streams.items()}
