"""``LinkMember``: the hub's member with one ``Link`` to a relay (relay/wire/io_thread.py), that
both the Publisher (relay/client/publisher.py) and the forward sink's Forwarder
(relay/forward/sender.py) are: it opens the link, reads the acks and the lost connections, and
reads the last acks before closing; each says what those mean to it. Client behaviour, so in the
client's room; the forward sink may import the client's.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import zmq

from relay.wire import auth, schema
from relay.wire.io_thread import Link, session_id

log = logging.getLogger(__name__)


class LinkMember:
    """A ``Member`` that talks to one relay over one ``Link``. Subclasses implement ``_tick`` and
    the hooks below (all called on the hub thread), and register with a Hub once constructed."""

    def __init__(self, address: str, server_key: str | None, client_cert: str | None,
                 interval: float) -> None:
        self._link_to = (address, server_key, client_cert)
        self._interval = interval
        self._stop = threading.Event()
        self._link: Link | None = None
        #: the relay refused our handshake: why, in one line (said once)
        self.refusal: str | None = None
        #: the link's routing id, chosen once: a Publisher's hello names it as its session's nonce
        #: (relay/journal/writers.py), and every frame of the link carries it
        self.session = session_id()
        #: streams whose frames the relay refuses from this link, and why (another writes them)
        self.refused_streams: dict[tuple[str, int], str] = {}

    def _link_up(self, now: float) -> None:
        """The link is connecting (ZeroMQ connects in the background): the member is ready."""

    def _link_failed(self, exc: zmq.ZMQError | ValueError) -> None:
        """No link can be made (bad address or CURVE key): the member leaves the hub at once."""

    def _link_lost(self) -> None:
        """The connection went down: what was in flight on it may be lost."""

    def _acks(self, acks: list[tuple[str, int, int]], now: float) -> None:
        """One ack message from the relay: (run, rank, acknowledged up to seq) each."""

    def _bad_ack(self, exc: schema.FrameError) -> None:
        """A message from the relay that is no ack; it is skipped."""

    def _refused(self, refused: list[tuple[str, int, str]]) -> None:
        """The relay refuses these streams' frames from this link: (run, rank, why) each. Said once
        per reason, in one line; the events stay (bounded) and are sent again, and are taken if the
        other writer has gone and they do not repeat its seqs."""
        for run, rank, why in refused:
            if self.refused_streams.get((run, rank)) != why:
                self.refused_streams[(run, rank)] = why
                log.error("%s", why)

    def _left(self) -> None:
        """The link is closed (its last acks read): the member has left the hub."""

    def _open(self, ctx: zmq.Context) -> Sequence[zmq.Socket]:
        try:
            self._link = Link(ctx, *self._link_to, routing_id=self.session)
        except (zmq.ZMQError, ValueError) as exc:
            self._link_failed(exc)
            return ()
        self._link_up(time.monotonic())
        return self._link.sock, self._link.monitor

    def _readable(self, sock: zmq.Socket) -> None:
        link = self._link
        assert link is not None
        if sock is link.sock:
            self._read_acks(link)
            return
        if link.lost():
            self._link_lost()
        if self.refusal is None and len(link.refused) >= auth.REFUSALS_TOLD:
            self.refusal = auth.refusal(link.auth, link.address, link.refused)
            log.error("%s; events are kept (bounded) and resent once it accepts this process",
                      self.refusal)

    def _shut(self) -> None:
        if self._link is not None:
            self._read_acks(self._link)
            self._link.close()
            self._link = None
        self._left()

    def _read_acks(self, link: Link) -> None:
        now = time.monotonic()
        while (frame := link.recv()) is not None:
            try:
                acks = schema.decode_ack(frame)
                refused = schema.decode_refused(frame) if b"refused" in frame else None
            except schema.FrameError as exc:
                self._bad_ack(exc)
                continue
            self._acks(acks, now)
            if refused:
                self._refused(refused)
