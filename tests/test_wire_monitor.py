"""relay/wire/monitor.py reads a ZeroMQ monitor's events as pyzmq's ``zmq.utils.monitor`` did (which it
replaces to keep asyncio out of every relay and rank): the event, its value (what the relay's and the
publisher's one-line reasons are chosen by) and the endpoint, from a real monitor socket on loopback."""
from __future__ import annotations

import pytest
import zmq

from conftest import free_port
from relay.wire.monitor import recv_event


def test_a_mechanism_mismatch_is_read_as_its_event_and_value() -> None:
    ctx = zmq.Context()
    try:
        address = f"tcp://127.0.0.1:{free_port()}"
        server = ctx.socket(zmq.ROUTER)  # no CURVE: a CURVE client is refused for its mechanism
        server.bind(address)
        client = ctx.socket(zmq.DEALER)
        client.curve_publickey, client.curve_secretkey = zmq.curve_keypair()
        client.curve_serverkey = zmq.curve_keypair()[0]
        monitor = client.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        with pytest.raises(zmq.Again):
            recv_event(monitor, zmq.NOBLOCK)
        client.connect(address)
        assert monitor.poll(60_000), "no handshake failure within 60 s"
        event = recv_event(monitor)
        assert event == (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
                         address.encode())
    finally:
        ctx.destroy(linger=0)
