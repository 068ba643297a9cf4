"""Whether a stream's owner is still connected, asked of the ROUTER socket itself at the moment
another connection sends for one of its streams (docs/protocol.md, "A stream belongs to the session
sending it": ROUTER_MANDATORY, the empty ack as the question).

Socket-monitor reports (which once told this, and could arrive after the frame of the connection
that replaced the owner and free its live streams) are not used. ROUTER_HANDOVER: a client that
reconnects takes its routing id, and its streams, back from the connection it left, however late
the relay notices that one's end.
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
