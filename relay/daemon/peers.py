"""When a connection that owns streams is gone, so that its streams pass to its reconnection.

A ROUTER socket says nothing when a peer disconnects (ZMQ_ROUTER_NOTIFY is libzmq's draft API,
absent from pyzmq's wheels). Its socket monitor does report DISCONNECTED, with the connection's
file descriptor, and each message carries the descriptor it came in on (ZMQ_SRCFD): ``Connections``
ties the two together, socket-free. A descriptor that shows up again under another routing id was
closed and reused, so its former peers are gone too, whatever order the two reports come in.
What this cannot see (a report lost in that race) the owner's silence settles (relay/journal/dedupe.py).
"""
from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message


class Connections:
    """The descriptor each stream owner's messages came in on (owners only: other peers cost nothing)."""

    def __init__(self) -> None:
        self.fd_of: dict[bytes, int] = {}
        self.on_fd: dict[int, bytes] = {}  # one routing id per connection

    def arrived(self, peer: bytes, fd: int) -> bytes | None:
        """``peer`` (now an owner) sends on ``fd``; returns the peer that used it before: gone."""
        old = self.on_fd.get(fd)
        if old == peer:
            return None
        if old is not None:
            del self.fd_of[old]
        self.on_fd[fd] = peer
        self.fd_of[peer] = fd
        return old

    def closed(self, fd: int) -> bytes | None:
        """The connection on ``fd`` is gone; returns its peer (None: not an owner's)."""
        peer = self.on_fd.pop(fd, None)
        if peer is not None:
            del self.fd_of[peer]
        return peer

    def clear(self) -> None:
        self.fd_of.clear()
        self.on_fd.clear()


def watch(sock: zmq.Socket) -> zmq.Socket:
    """A monitor of ``sock``'s disconnections (read with ``closed_fds``)."""
    return sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)


def closed_fds(monitor: zmq.Socket) -> list[int]:
    """The descriptors of the connections that closed since the last look."""
    fds = []
    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return fds
        if event["event"] == zmq.EVENT_DISCONNECTED:
            fds.append(int(event["value"]))
