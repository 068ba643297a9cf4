"""A ZeroMQ socket monitor's events, read without pyzmq's ``zmq.utils.monitor``: that module imports
``zmq.asyncio`` and so asyncio, a third of what a publisher imports (about 0.04 CPU-s in every rank,
publisher and relay process), for one ``struct.unpack`` (docs/development.md, "Where the time
goes")."""
from __future__ import annotations

import struct
from typing import NamedTuple

import zmq

# zmq_socket_monitor(3): a 16-bit event id, then a 32-bit value, native order
_HEAD = struct.Struct("=HI")


class MonitorEvent(NamedTuple):
    event: int
    value: int
    endpoint: bytes


def recv_event(monitor: zmq.Socket, flags: int = 0) -> MonitorEvent:
    """The monitor socket's next event; ``zmq.Again`` with ``zmq.NOBLOCK`` when there is none."""
    frames = monitor.recv_multipart(flags)
    if len(frames) != 2 or len(frames[0]) != _HEAD.size:
        raise RuntimeError(f"not a ZeroMQ monitor event: {frames!r}")
    event, value = _HEAD.unpack(frames[0])
    return MonitorEvent(event, value, frames[1])
