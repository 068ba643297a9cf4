"""What a Publisher does across ``fork()``: a forked child's events go to its parent through a pipe
(docs/trainer.md says what a user sees: the events, ``dropped_forked``, none after ``close()``).

A child inherits the Publisher but not its I/O thread, so what it published used to wait in a queue
nobody sends, uncounted. Like OpenTelemetry's SDK, which re-creates its exporter's worker after a
fork (``os.register_at_fork``), the Publisher is told about every fork: just before it, the parent
makes a pipe (``ForkPipe``); in the child, ``publish()`` writes each event to it, one record per
write of at most PIPE_BUF bytes, which POSIX keeps whole however many children write at once, and
never blocks; the parent's I/O thread reads the records and numbers the events in its own stream.
A child's drop count goes to the parent by the same pipe with its next record."""
from __future__ import annotations

import collections
import logging
import os
import select
import struct
import threading
import weakref
from typing import Any

import msgpack

from relay.client.send_window import SendWindow
from relay.wire.encoding import encode_row

log = logging.getLogger(__name__)

#: The largest write a pipe keeps whole among concurrent writers (POSIX: at least 512; Linux: 4096).
RECORD_MAX = select.PIPE_BUF
_HEADER = struct.Struct("<I")


class ForkPipe:
    """One Publisher's pipe to the children it forks: written by them, read by its I/O thread."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.unsent = 0  # (in a child) events it could not hand over and has not reported yet
        self.unencodable = 0  # (in a child) events it could not encode, all told: said in its log
        self._rest = b""  # (in the parent) the start of a record not read whole yet

    def in_child(self) -> None:
        """Now in the child (or a child's child, which writes to the same parent): it only
        writes."""
        if self.r >= 0:
            os.close(self.r)
            self.r = -1

    def send(self, event: tuple[Any, ...]) -> None:
        """Hand one event (publish()'s tuple) to the parent; never blocks, never raises."""
        try:
            blob = encode_row(*event)
        except Exception:  # noqa: BLE001 - a stray's tolist() may raise anything: counted, said
            self.unsent += 1
            self.unencodable += 1
            if self.unencodable == 1 or self.unencodable % 1000 == 0:
                log.exception("a forked child dropped a %s event it cannot encode (%d so far)",
                              event[1], self.unencodable)
        else:
            if not self._write(blob):
                self.unsent += 1
        # said at once, if the pipe has room
        if self.unsent and self._write(msgpack.packb(self.unsent)):
            self.unsent = 0

    def _write(self, blob: bytes) -> bool:
        if len(blob) + _HEADER.size > RECORD_MAX:
            return False
        try:
            os.write(self.w, _HEADER.pack(len(blob)) + blob)
        except OSError:  # full (the parent is not reading) or closed (it closed its Publisher)
            return False
        return True

    def receive(self) -> tuple[list[tuple[Any, ...]], int]:
        """What the children wrote since the last call: their events, in order, and how many more
        they could not hand over."""
        chunks = [self._rest]
        try:
            while chunk := os.read(self.r, 1 << 16):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        data = b"".join(chunks)
        events: list[tuple[Any, ...]] = []
        dropped = 0
        start = 0
        while len(data) - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(data, start)
            end = start + _HEADER.size + size
            if end > len(data):
                break
            item = msgpack.unpackb(data[start + _HEADER.size:end], raw=False, strict_map_key=False)
            if isinstance(item, int):
                dropped += item
            else:
                events.append(tuple(item))
            start = end
        self._rest = data[start:]
        return events, dropped

    def close(self) -> None:
        for fd in (self.r, self.w):
            if fd >= 0:
                os.close(fd)
        self.r = self.w = -1


class ForkHandover:
    """The Publisher's side of a fork (a base of relay/client/publisher.py's Publisher, which owns
    the attributes named here; the I/O thread calls ``_take_forked``)."""

    _fork: ForkPipe | None
    _child: bool
    _closed: bool
    _pending: collections.deque
    _window: SendWindow
    _done: threading.Event
    _dropped_closed: int
    _forwarded: int
    _dropped_forked: int

    def _will_fork(self) -> None:
        """Just before this process forks: the pipe its children will hand their events to."""
        if self._fork is None and not self._closed and not self._child:
            self._fork = ForkPipe()

    def _in_child(self) -> None:
        """In the forked child: what the parent queued is the parent's to send; what the child
        publishes goes to the parent (``_to_parent``)."""
        self._child = True
        self._pending = collections.deque()
        self._window = SendWindow(max_events=1, max_bytes=1, resend_after=1.0, now=0.0)
        self._done.set()  # nothing of its own to flush or wait for
        if self._fork is not None:
            self._fork.in_child()

    def _to_parent(self, event: tuple[Any, ...]) -> None:
        """publish() in a forked child; counted where it cannot go (no pipe: the parent had
        closed)."""
        if self._fork is None or self._closed:
            self._dropped_closed += 1
        else:
            self._fork.send(event)

    def _take_forked(self) -> list[tuple[Any, ...]]:
        """The events the forked children handed over since the last call; counts what they could
        not."""
        if self._fork is None or self._child:
            return []
        events, dropped = self._fork.receive()
        self._forwarded += len(events)
        self._dropped_forked += dropped
        return events


#: Every Publisher not closed yet: each hears of a fork (os.register_at_fork, as OpenTelemetry's SDK
#: does).
live: weakref.WeakSet[ForkHandover] = weakref.WeakSet()


def _before_fork() -> None:
    for member in list(live):
        member._will_fork()


def _after_fork_in_child() -> None:
    for member in list(live):
        member._in_child()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
