"""Putting events on the wire: an event, a batch of them, a compact batch (the envelope once, then
rows), and the relay's acks, as msgpack frames. The sender's side of the format; reading a frame
back and what makes it valid is relay/wire/schema.py (docs/protocol.md has both)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack

from sinks.events import ENVELOPE


def _default(obj: Any) -> Any:
    """Turn numpy/torch scalars and other strays into msgpack types instead of losing the event."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)



def encode_event(event: dict[str, Any]) -> bytes:
    """Encode one event (a msgpack map); batches are these bytes behind an array header."""
    return msgpack.packb(event, default=_default, use_bin_type=True)


def array_header(n: int) -> bytes:
    """The msgpack array header of ``n`` items: what goes before items packed back to back."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_batch(encoded_events: list[bytes]) -> bytes:
    """Join already-encoded events into one frame: a msgpack array of maps."""
    return array_header(len(encoded_events)) + b"".join(encoded_events)


def compact_prefix(envelope: dict[str, Any]) -> bytes:
    """The constant head of every compact batch of one (run, rank): its envelope fields, then the
    ``events`` key; a frame is this, an array header, and the rows (see compact_frame)."""
    body = b"".join(msgpack.packb(k) + msgpack.packb(envelope[k], use_bin_type=True)
                    for k in ENVELOPE)
    return bytes((0x80 | (len(ENVELOPE) + 1),)) + body + msgpack.packb("events")


def encode_row(*row: Any) -> bytes:
    """One event of a compact batch: the values of its ROW_FIELDS, in order."""
    return msgpack.packb(row, default=_default, use_bin_type=True)


def row_packer() -> msgpack.Packer:
    """A reusable encoder for rows given as tuples (same bytes as encode_row, a third of the cost,
    as it is not rebuilt per call); one per thread, since a Packer is not thread-safe."""
    return msgpack.Packer(default=_default, use_bin_type=True)


def compact_frame(prefix: bytes, rows: list[bytes]) -> bytes:
    """A compact batch frame: the envelope once, then the rows (half the bytes of a batch of
    maps)."""
    return prefix + encode_batch(rows)


def encode_frame(events: Iterable[dict[str, Any]]) -> bytes:
    """Encode events into one frame (tests, raw senders and the benchmarks use this)."""
    return encode_batch([encode_event(e) for e in events])


def encode_refused(refused: list[tuple[str, int, str]]) -> bytes:
    """Relay -> client: these streams' frames are refused, each (run, rank, why in one line). An
    ack message with no acks, so a client older than it ignores it."""
    return msgpack.packb({"ack": [], "refused": refused}, use_bin_type=True)


def encode_ack(acks: list[tuple[str, int, int]]) -> bytes:
    """Relay -> client: cumulative acks, each (run, rank, next_seq): every seq below is durable."""
    return msgpack.packb({"ack": acks}, use_bin_type=True)
