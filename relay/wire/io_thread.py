"""The ZeroMQ side of the publisher: one I/O thread per process (``Hub``) and each Publisher's
DEALER socket with its monitor (``Link``).

A rank has one Publisher, but a process simulating hundreds of ranks (or publishing several runs)
shares the one thread and context, so it pays for one thread waking every ``send_interval``, not
hundreds. What to send and when lives in relay/client/send_window.py; the Publisher
(relay/client/publisher.py) wires the two together, as a ``LinkMember``
(relay/client/link_member.py).

Each link is one session to the relay: its routing id is chosen here, at random, and ZeroMQ keeps
it across reconnections (docs/protocol.md, "A stream belongs to the session sending it"). How it
proves itself to a TCP relay is relay/wire/auth.py's; a refused handshake is said once, in one line.
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import Protocol

import zmq

from relay.wire import auth
from relay.wire.address import is_ipv6
from relay.wire.monitor import recv_event

log = logging.getLogger(__name__)

REDIAL_AFTER = 2.0  # seconds before a link that ZeroMQ gave up on dials again (RECONNECT_IVL_MAX)
#: The failed handshakes after which ZeroMQ stops reconnecting.
_GIVES_UP = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


class Member(Protocol):
    """What the hub needs of a Publisher; every method runs on the hub thread."""

    _interval: float  # how often it wants _tick
    _stop: threading.Event  # set (then Hub.wake()) to leave the hub

    def _open(self, ctx: zmq.Context) -> Sequence[zmq.Socket]:
        """Connect; the sockets to watch, or none if it cannot (then it is not a member)."""

    def _readable(self, sock: zmq.Socket) -> None:
        """One of its sockets has messages."""

    def _tick(self, now: float) -> None:
        """Every ``_interval``: encode, resend, send."""

    def _shut(self) -> None:
        """It leaves (or the hub ends): release the sockets."""


class Hub:
    """The process's one publisher I/O thread and ZeroMQ context, started with the first member
    and ended with the last, so a process hosting many Publishers stays cheap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._adds: list[Member] = []
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = self._pipe()

    @staticmethod
    def _pipe() -> tuple[int, int]:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        return r, w

    def register(self, member: Member) -> None:
        """Have the thread (started if need be) open ``member`` and tick it from now on."""
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's thread does not exist here
                self._pid, self._adds, self._thread = os.getpid(), [], None
                self._wake_r, self._wake_w = self._pipe()
            self._adds.append(member)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="relay-publisher",
                                                daemon=True)
                self._thread.start()
        self.wake()

    def wake(self) -> None:
        """Have the thread look at new, stopping or flushing members now, not at its next tick."""
        with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
            os.write(self._wake_w, b"x")

    def _serve(self) -> None:
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 1 << 16)  # three sockets per Publisher
        poller = zmq.Poller()
        members: dict[Member, Sequence[zmq.Socket]] = {}
        owner: dict[zmq.Socket, Member] = {}
        next_tick = interval = 0.0
        woken = True
        try:
            while True:
                with self._lock:
                    adds, self._adds = self._adds, []
                    if not adds and not members:
                        self._thread = None
                        return
                for member in adds:
                    socks = member._open(ctx)
                    if socks:
                        members[member] = socks
                        for s in socks:
                            owner[s] = member
                            poller.register(s, zmq.POLLIN)
                if adds:
                    interval = min(m._interval for m in members) if members else 0.0
                # Sleep on the wake-up pipe only, then look at every socket once: polling them all
                # whenever an ack arrives would cost O(members) per ack.
                wait = max(0.0, next_tick - time.monotonic())
                if select.select([self._wake_r], [], [], wait)[0]:
                    self._drain()
                    woken = True
                for s, _ in poller.poll(0):
                    owner[s]._readable(s)
                # close() wakes us
                stopping = [m for m in members if m._stop.is_set()] if woken else []
                woken = False
                for member in stopping:
                    for s in members.pop(member):
                        poller.unregister(s)
                        del owner[s]
                    member._shut()
                now = time.monotonic()
                if now >= next_tick:
                    for member in members:
                        member._tick(now)
                    next_tick = now + interval
        finally:
            for member in members:
                member._shut()
            ctx.term()

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass


_hub: Hub | None = None
_hub_lock = threading.Lock()


def shared_hub() -> Hub:
    """The process's one I/O thread and its pipe, made for the first Publisher: importing this
    module (the sink child, the daemon, any ``relay.*`` import) starts nothing."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub


def _hub_in_child() -> None:
    """A forked child has none of its parent's threads: its first Publisher makes its own hub (and
    a lock another thread of the parent may have held at the fork is not the child's)."""
    global _hub, _hub_lock
    _hub, _hub_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_hub_in_child)


def session_id() -> bytes:
    """A link's routing id: random, and never starting with a zero byte (ZeroMQ's own ids do)."""
    return b"s" + os.urandom(15)


class Link:
    """One Publisher's DEALER socket, connected to the relay, and the monitor that says when the
    connection is lost or the relay refused the handshake. Raises zmq.ZMQError or ValueError (bad
    address, CURVE key or relay secret), holding nothing."""

    def __init__(self, ctx: zmq.Context, address: str, curve_server_key: str | None,
                 curve_client_cert: str | None, routing_id: bytes | None = None) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, routing_id or session_id())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        # Sends fail (and events stay in the bounded window) while no relay is connected, so after
        # a reconnect everything unacknowledged goes out again from the oldest, in order.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.IPV6, is_ipv6(address))
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | auth.HANDSHAKE_FAILED)
        try:
            self.auth = auth.secure_client(sock, address, curve_server_key, curve_client_cert)
            sock.connect(address)
        except (zmq.ZMQError, ValueError):
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
            raise
        self.sock, self.monitor, self.address = sock, monitor, address
        self.refused: list[tuple[int, int]] = []  # the first failed handshakes (event, value)
        # protocol errors since the last dial: ZeroMQ stopped reconnecting
        self.gave_up: list[int] = []
        self.redial_at: float | None = None

    def send(self, frame: bytes) -> bool:
        """Hand one frame to ZeroMQ without blocking; False if not connected or the HWM is
        reached."""
        if self.redial_at is not None and time.monotonic() >= self.redial_at:
            self._redial()
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv(self) -> bytes | None:
        """The next message from the relay, or None if there is none now."""
        try:
            return self.sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    def lost(self) -> bool:
        """True if the connection went down since the last look (failed handshakes go to
        ``refused``). A handshake that failed on a protocol error (the other side does not
        authenticate as we do) makes ZeroMQ give up the address for good: it is dialled again
        REDIAL_AFTER seconds later, at the next send (a squatter without the secret must not cut a
        client off its relay)."""
        lost = read_monitor(self.monitor, self.refused, self.gave_up)
        if self.gave_up and self.redial_at is None:
            self.redial_at = time.monotonic() + REDIAL_AFTER
        return lost

    def _redial(self) -> None:
        self.redial_at = None
        self.gave_up.clear()
        with contextlib.suppress(zmq.ZMQError):  # ZeroMQ already let go of it
            self.sock.disconnect(self.address)
        self.sock.connect(self.address)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


def read_monitor(monitor: zmq.Socket, refused: list[tuple[int, int]] | None = None,
                 gave_up: list[int] | None = None) -> bool:
    """True if the connection to the relay went down since the last look: what was in flight on
    it may be lost. (Not when it comes up: with ZMQ_IMMEDIATE nothing was sent while it was down,
    and what went out since it came up is on the new connection; resending that too only made
    the relay count the first frame of every publisher as duplicates.) The first failed handshakes
    are appended to ``refused`` as (event, value); those after which ZeroMQ stops reconnecting
    (a protocol error) to ``gave_up``."""
    lost = False
    while True:
        try:
            event = recv_event(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return lost
        kind = event.event
        lost = lost or kind == zmq.EVENT_DISCONNECTED
        if (refused is not None and kind & auth.HANDSHAKE_FAILED
                and len(refused) < auth.REFUSALS_TOLD):
            refused.append((kind, event.value))
        if gave_up is not None and kind & _GIVES_UP:
            gave_up.append(kind)
