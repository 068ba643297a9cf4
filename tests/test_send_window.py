"""The publisher's delivery rules (docs/protocol.md) on the socket-free SendWindow: time is an
argument and the connection a list, so every test runs in milliseconds."""
from __future__ import annotations

import pytest

from relay.client.send_window import MAX_BACKOFF, MAX_BATCH_BYTES, MAX_BATCH_EVENTS, SendWindow


class Wire:
    """A connection that takes batches (or refuses them while ``up`` is False) and remembers them."""

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.batches: list[list[bytes]] = []

    def __call__(self, blobs: list[bytes]) -> bool:
        if self.up:
            self.batches.append(list(blobs))
        return self.up

    def take(self) -> list[bytes]:
        """Every blob sent since the last take, in order."""
        sent = [blob for batch in self.batches for blob in batch]
        self.batches.clear()
        return sent


def window(n: int = 0, *, max_events: int = 10_000, max_bytes: int = 1 << 20, resend_after: float = 2.0,
           size: int = 1) -> SendWindow:
    """A window at time 0 holding ``n`` events, seq i encoded as ``size`` bytes of chr(i)."""
    w = SendWindow(max_events=max_events, max_bytes=max_bytes, resend_after=resend_after, now=0.0)
    for i in range(n):
        w.push(blob(i, size))
    return w


def blob(seq: int, size: int = 1) -> bytes:
    return bytes([seq % 256]) * size


def seqs(w: SendWindow) -> list[int]:
    return [seq for seq, _ in w.unacked]


def test_lost_connection_resends_from_the_oldest_unacknowledged() -> None:
    w, wire = window(5), Wire()
    w.pump(0.0, wire)
    assert wire.take() == [blob(i) for i in range(5)] and w.next_send == 5
    w.ack(2, 0.01)
    w.rewind("connection lost")
    assert (w.next_send, w.resent) == (2, 3)
    w.pump(0.02, wire)
    assert wire.take() == [blob(2), blob(3), blob(4)], "oldest unacknowledged first, in order, once"
    w.ack(5, 0.03)
    w.rewind("connection lost")
    assert (w.resent, wire.take()) == (3, []), "nothing unacknowledged: nothing to resend"


def test_a_connection_coming_up_resends_nothing() -> None:
    """While down the wire refuses (ZMQ_IMMEDIATE), so nothing is in flight; when it comes up
    everything goes out once and the window never rewinds on its own before the ack timeout."""
    w, wire = window(3), Wire(up=False)
    for t in (0.0, 0.5, 1.0, 5.0):  # long past the ack timeout: nothing was in flight
        w.pump(t, wire)
    assert (w.next_send, w.resent, wire.take()) == (0, 0, [])
    wire.up = True
    w.pump(5.01, wire)
    assert wire.take() == [blob(0), blob(1), blob(2)]
    w.push(blob(3))
    w.pump(5.02, wire)
    assert wire.take() == [blob(3)] and w.resent == 0


def test_ack_timeout_resends_with_backoff_doubling_to_the_cap_and_reset_by_progress() -> None:
    w, wire = window(2), Wire()
    w.pump(0.0, wire)
    wire.take()
    w.pump(2.0, wire)
    assert wire.take() == [] and w.resent == 0, "not before resend_after"
    t, backoffs = 0.0, []
    for _ in range(6):
        t += w.backoff + 0.001
        w.pump(t, wire)
        assert wire.take() == [blob(0), blob(1)]
        backoffs.append(w.backoff)
    assert backoffs == [4.0, 8.0, 16.0, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]
    assert w.resent == 12
    assert w.ack(1, t + 1) is True and w.backoff == 2.0, "progress resets the backoff"
    w.pump(t + 2.9, wire)
    assert wire.take() == [], "the timeout runs from the last progress"
    w.pump(t + 3.002, wire)
    assert wire.take() == [blob(1)] and w.backoff == 4.0
    assert w.ack(1, t + 4) is False and w.backoff == 4.0, "a repeated ack is no progress"


def test_flush_hurries_a_long_backoff() -> None:
    w, wire = window(1), Wire()
    w.pump(0.0, wire)
    w.backoff = 16.0
    w.hurry()
    assert w.backoff == 2.0
    w.backoff = 1.0
    w.hurry()
    assert w.backoff == 1.0, "never lengthens it"


def test_ack_timeout_runs_from_the_send_not_from_an_idle_spell() -> None:
    w, wire = window(), Wire()
    w.pump(0.0, wire)
    w.push(blob(0))
    w.pump(100.0, wire)  # idle for 100 s, then one event: sent now, not "stalled for 100 s"
    w.pump(101.0, wire)
    assert wire.take() == [blob(0)] and w.resent == 0


def test_acks_are_cumulative_and_one_beyond_the_numbered_seqs_is_ignored_and_counted() -> None:
    w, wire = window(4), Wire()
    w.pump(0.0, wire)
    assert w.ack(2, 0.1) is True and seqs(w) == [2, 3] and w.acked == 2
    assert w.ack(1, 0.2) is False and seqs(w) == [2, 3], "a stale ack changes nothing"
    assert w.protocol_errors == 0
    assert w.ack(10, 0.3) is True, "held to what was numbered"
    assert (seqs(w), w.acked, w.unacked_bytes, w.protocol_errors) == ([], 4, 0, 1)
    w.push(blob(4))
    assert w.next_seq == 5 and w.next_send == 4, "the next event is still sent"
    w.pump(0.4, wire)
    assert wire.take()[-1:] == [blob(4)]


def test_ack_of_unsent_events_moves_the_send_point() -> None:
    """Another connection of this rank got them journaled: no need to send them."""
    w, wire = window(4), Wire()
    w.ack(3, 0.0)
    w.pump(0.0, wire)
    assert wire.take() == [blob(3)]


def test_drops_at_max_events_count_and_skip_the_oldest() -> None:
    w, wire = window(max_events=3), Wire()
    for i in range(3):
        w.push(blob(i))
    w.pump(0.0, wire)  # 0..2 in flight
    w.push(blob(3))
    w.push(blob(4))
    assert seqs(w) == [2, 3, 4] and (w.dropped_unacked, w.dropped_upto) == (2, 1)
    assert w.next_send == 3, "already sent: still sent"
    w.push(blob(5))
    w.push(blob(6))
    w.push(blob(7))
    assert seqs(w) == [5, 6, 7] and (w.dropped_unacked, w.dropped_upto) == (5, 4)
    assert w.next_send == 5, "the dropped unsent events are skipped"
    assert w.dropped_sent == 3, "0, 1 and 2 had been sent (a relay may have them), 3 and 4 not"
    w.pump(0.1, wire)
    assert wire.take()[-3:] == [blob(5), blob(6), blob(7)]
    w.rewind("connection lost")  # 5..7 unsent again, but sent once: a relay may have them still
    w.push(blob(8))
    assert (w.dropped_unacked, w.dropped_sent) == (6, 4)


def test_drops_at_max_bytes() -> None:
    w = window(max_bytes=10)
    for i in range(3):
        w.push(blob(i, 4))
    assert seqs(w) == [1, 2] and w.unacked_bytes == 8 and (w.dropped_unacked, w.dropped_upto) == (1, 0)
    w.push(blob(3, 10))
    assert seqs(w) == [3] and w.unacked_bytes == 10 and (w.dropped_unacked, w.dropped_upto) == (3, 2)


def test_a_loss_report_never_causes_a_drop() -> None:
    w = window(3, max_events=3, max_bytes=3)
    w.push(blob(3), droppable=False)
    assert seqs(w) == [0, 1, 2, 3] and w.dropped_unacked == 0 and w.dropped_upto == -1
    w.push(blob(4))
    assert seqs(w) == [2, 3, 4] and (w.dropped_unacked, w.dropped_upto) == (2, 1)


@pytest.mark.parametrize("n", [1, MAX_BATCH_EVENTS, MAX_BATCH_EVENTS + 1, 2 * MAX_BATCH_EVENTS + 5])
def test_batches_hold_at_most_max_batch_events(n: int) -> None:
    w, wire = window(n), Wire()
    w.pump(0.0, wire)
    assert [len(b) for b in wire.batches] == [MAX_BATCH_EVENTS] * (n // MAX_BATCH_EVENTS) + (
        [n % MAX_BATCH_EVENTS] if n % MAX_BATCH_EVENTS else [])
    assert w.next_send == n


def test_batches_hold_at_most_max_batch_bytes_and_an_oversized_event_goes_alone() -> None:
    third = MAX_BATCH_BYTES // 3 + 1
    w, wire = window(5, size=third), Wire()
    w.push(blob(5, MAX_BATCH_BYTES + 1))
    w.push(blob(6, 1))
    w.pump(0.0, wire)
    assert [len(b) for b in wire.batches] == [2, 2, 1, 1, 1]
    assert all(sum(map(len, b)) <= MAX_BATCH_BYTES for b in wire.batches if len(b) > 1)


def test_a_refused_batch_is_sent_from_where_it_stopped() -> None:
    w = window(MAX_BATCH_EVENTS + 10)
    calls = []

    def first_only(blobs: list[bytes]) -> bool:
        calls.append(len(blobs))
        return len(calls) == 1

    w.pump(0.0, first_only)
    assert calls == [MAX_BATCH_EVENTS, 10] and w.next_send == MAX_BATCH_EVENTS
    wire = Wire()
    w.pump(0.1, wire)
    assert wire.take() == [blob(i) for i in range(MAX_BATCH_EVENTS, MAX_BATCH_EVENTS + 10)]


def test_take_all_empties_the_window_oldest_first() -> None:
    w = window(3, size=2)
    w.ack(1, 0.0)
    assert w.take_all() == [blob(1, 2), blob(2, 2)]
    assert (seqs(w), w.unacked_bytes, w.next_seq) == ([], 0, 3)
