"""Whether a stream's owner is still connected, asked of the ROUTER socket itself at the moment
another connection sends for one of its streams.

The relay's socket is ROUTER_MANDATORY: a message to a routing id that has no connection fails at
once (EHOSTUNREACH) instead of vanishing. So when a second connection sends for a (run, rank),
ingest (relay/daemon/ingest.py) asks ``connected`` about the owner, and the socket answers from
its own table of connections as it stands then, with nothing to reorder: socket-monitor reports
(which once told this, and could arrive after the frame of the connection that replaced the owner
and free its live streams) are not used. The question is an empty ack, which a client ignores.

ROUTER_HANDOVER: a link's routing id is its session's (relay/wire/io_thread.py), kept across
reconnections, so a client that reconnects takes its id, and its streams, back from the connection
it left, however late the relay notices that one's end.
"""
from __future__ import annotations

import zmq

from relay.wire.encoding import encode_ack

PROBE = encode_ack([])


def route_strictly(sock: zmq.Socket) -> None:
    """Make ``sock`` (a ROUTER, before it binds) answer ``connected`` and take sessions back."""
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)


def connected(sock: zmq.Socket, peer: bytes) -> bool:
    """Whether ``peer`` has a connection on ``sock`` now (one whose queue is full is there too)."""
    # first take in what ZeroMQ's I/O thread told the socket (connections ended)
    sock.getsockopt(zmq.EVENTS)
    try:
        sock.send_multipart([peer, PROBE], zmq.NOBLOCK)
    except zmq.ZMQError as exc:
        return exc.errno != zmq.EHOSTUNREACH
    return True
