"""Ports for tests that must know a port before they bind it, or bind it again: a relay restarted at
its address (its publishers reconnect there), a relay started after its publishers, torchrun's
rendezvous, a server a test stops and starts.

A port the kernel hands out (``bind(("127.0.0.1", 0))``) comes from the ephemeral range, where any
process may be given it the moment it is free: another test's ``bind(0)``, or the source port of an
outgoing connection. A publisher reconnecting to a killed relay's port can even be given that very
port as its source and connect to itself (TCP's simultaneous open), so the restarted relay cannot
bind. So these ports are taken below the ephemeral range, where nothing is handed out, and each is
claimed (an ``flock`` on a file named after it, shared by every checkout's test runs on this machine)
until the test that took it ends: no other test process picks it meanwhile, and a claim dies with
its process.
"""
from __future__ import annotations

import fcntl
import os
import random
import socket
from pathlib import Path

#: Below Linux's ephemeral range (32768-60999 by default, /proc/sys/net/ipv4/ip_local_port_range) and
#: above the well-known servers' defaults (NATS 4222, MLflow 5000, Prometheus 9090...).
LOW, HIGH = 20000, 32767
CLAIMS = Path(os.environ.get("TMPDIR", "/tmp")) / "metrics-relay-test-ports"

_held: list[int] = []  # file descriptors holding this process's claims


def _below_ephemeral() -> range:
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = HIGH + 1
    return range(LOW, max(min(HIGH + 1, first), LOW + 1000))


def claim(held: list[int] | None = None) -> int:
    """A free loopback port outside the ephemeral range, claimed until :func:`release`; with ``held`` (the
    caller's own list), until ``release(held)``: a server a module-scoped fixture keeps outlives the test
    that started it, and its ports its restarts."""
    CLAIMS.mkdir(exist_ok=True)
    ports = _below_ephemeral()
    for _ in range(1000):
        port = random.choice(ports)
        fd = os.open(CLAIMS / str(port), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _bindable(port):
            (_held if held is None else held).append(fd)
            return port
        os.close(fd)
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} after 1000 tries")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: a TIME_WAIT left is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def release(held: list[int] | None = None) -> None:
    """Give up every claim of this process (the test that took them ended), or those in ``held``."""
    claims = _held if held is None else held
    while claims:
        os.close(claims.pop())
