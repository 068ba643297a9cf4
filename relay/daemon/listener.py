"""The relay's one ROUTER socket, made and bound: its bounds, who may connect (relay/daemon/gate.py)
and how it routes to its peers (relay/daemon/peers.py). The loop (relay/daemon/loop.py) makes it at
start and again after dropping every connection (the memory guard)."""
from __future__ import annotations

import errno

import zmq

from relay.daemon import peers
from relay.daemon.bounds import RECV_HWM
from relay.daemon.gate import Gate
from relay.wire import schema
from relay.wire.address import AddressInUse, BadAddress, is_ipv6


def listen(ctx: zmq.Context, address: str, gate: Gate) -> zmq.Socket:
    """The socket bound to ``address``; raises AddressInUse or BadAddress."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.MAXMSGSIZE, schema.MAX_TRANSPORT_BYTES)
    sock.setsockopt(zmq.RCVHWM, RECV_HWM)  # per peer: bounds what ZeroMQ buffers for us
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.IPV6, is_ipv6(address))
    peers.route_strictly(sock)
    gate.secure(sock)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        gate.release(sock)
        sock.close(0)
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(f"{address} is already in use (another relay?)") from None
        raise BadAddress(f"cannot bind {address}: {exc}; give an address of this machine "
                         "(tcp://127.0.0.1:PORT, tcp://0.0.0.0:PORT for every interface) or "
                         "ipc:///PATH") from None
    return sock
