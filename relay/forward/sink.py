"""The ``forward`` shipper's face: options, their checks, open/notify/close (docs/deployment.md,
"One relay per node, forwarding to a central relay"); the work is relay/forward/sender.py's.

    relay --sink forward --to tcp://central:5557 [--curve-server-key KEY --curve-client-cert CERT]

It lives in ``relay/`` because it speaks the relay's wire (sinks/ must not know ZeroMQ). On TCP the
link proves it holds the user's relay secret, as a rank's does (relay/wire/auth.py).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import click
import zmq.auth
from zmq.utils import z85

from relay.forward.sender import Forwarder
from relay.journal.journal_queue import News
from relay.ship.base import Shipper
from relay.wire import auth, curve
from relay.wire.address import BadAddress, check_bind_address, is_loopback
from relay.wire.io_thread import Hub
from sinks.base import CLOSE_TIMEOUT, SinkContext, SinkError

log = logging.getLogger(__name__)

CLOSE_WAIT = 5.0  # seconds close() waits for the central's last acks


class ForwardSink(Shipper):
    """Forward every event of this relay's journal to a central relay. (The module's docstring says
    how.)"""

    name = "forward"

    @classmethod
    def options(cls) -> list[click.Option]:
        return [
            click.Option(["--to"], metavar="tcp://HOST:PORT", default=None,
                         help="The central relay to forward every event to."),
            click.Option(["--curve-server-key"], metavar="KEY|FILE", default=None,
                         help="The central relay's CURVE public key (as `relay keygen` prints it) "
                              "or its .key file, for a central with a certificate (--curve-cert); "
                              "by default the link proves and checks the relay secret, as a "
                              "rank's does."),
            click.Option(["--curve-client-cert"], metavar="FILE", default=None,
                         help="This node's CURVE secret certificate (`relay keygen DIR --name "
                              "NODE`), for a central that admits only listed clients "
                              "(--curve-clients)."),
            click.Option(["--forward-window"], type=click.IntRange(1), default=100_000,
                         show_default=True,
                         help="Events held until the central acknowledges them; beyond, reading "
                              "the journal pauses (nothing is dropped)."),
        ]

    def __init__(self, to: str | None = None, curve_server_key: str | None = None,
                 curve_client_cert: str | None = None, forward_window: int = 100_000) -> None:
        self.to = _address(to)
        self.server_key = _server_key(curve_server_key) if curve_server_key else None
        if curve_client_cert:
            if not self.server_key:
                raise SinkError("--curve-client-cert needs --curve-server-key, the central relay's "
                                "public key")
            try:
                curve.load_secret(Path(curve_client_cert))
            except ValueError as exc:
                raise SinkError(f"--curve-client-cert: {exc}") from None
        self.client_cert = curve_client_cert or None
        self.max_events = forward_window
        #: the forwarder's, once open (the relay's stats show them)
        self.counters: dict[str, int] = {}
        self._hub = Hub()
        self._forwarder: Forwarder | None = None

    def open(self, context: SinkContext) -> None:
        if context.journal is None:
            raise SinkError("the forward sink sends on what the relay journals: use it as "
                            "`relay --sink forward --to ADDRESS`, with the relay's journal")
        fw = self._forwarder = Forwarder(context.journal, self.to, server_key=self.server_key,
                                         client_cert=self.client_cert, max_events=self.max_events)
        self.counters = fw.counters
        self._hub.register(fw)
        fw.ready.wait(10.0)
        if fw.error:
            raise SinkError(f"--to {self.to}: cannot connect: {fw.error}")
        how = auth.mode(self.to, self.server_key)
        secure = {"curve": "CURVE, with this node's certificate" if self.client_cert else "CURVE",
                  "secret": "CURVE, with the relay secret", "ipc": "ipc",
                  "open": "unencrypted ($RELAY_OPEN)"}[how]
        log.info("forwarding to %s (%s); state in %s", self.to, secure, fw.state_path)
        if how == "open" and not is_loopback(self.to):
            log.warning("forwarding to %s unencrypted: anyone on the way can read the events; "
                        "unset RELAY_OPEN (see docs/security.md)", self.to)

    def notify(self, news: News) -> None:
        """The journal is what is forwarded: only note which runs have news."""
        assert self._forwarder is not None
        self._forwarder.notify(set(news))
        self._hub.wake()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait up to CLOSE_WAIT (or ``timeout``, if sooner) for the central's last acks, then stop;
        False when some are missing: those events stay in the journal and are sent by the next relay
        on it."""
        fw = self._forwarder
        if fw is None:
            return True
        self._forwarder = None
        wait = min(CLOSE_WAIT, timeout)
        deadline = time.monotonic() + wait
        while not fw.idle and time.monotonic() < deadline:
            time.sleep(0.02)
        fw.stop()
        self._hub.wake()
        fw.finished.wait(wait)
        if not fw.idle:
            log.warning("the central relay %s has not acknowledged %d events (and %d runs are left "
                        "to read) at shutdown: they stay in the journal and are sent when a relay "
                        "runs on it again", self.to, fw.unacked, len(fw.dirty))
        log.info("forward sink closed: %s", self.counters)
        return fw.idle


def _address(to: str | None) -> str:
    if not to:
        raise SinkError("--sink forward needs --to tcp://HOST:PORT, the central relay's address")
    try:
        check_bind_address(to)
    except BadAddress:
        raise SinkError(f"--to {to!r} is not an address to forward to: give tcp://HOST:PORT "
                        "(or ipc:///path.sock)") from None
    if to.endswith(":*"):
        raise SinkError(f"--to {to!r} needs the central relay's port, not '*'")
    return to


def _server_key(value: str) -> str:
    """The central's public key in Z85, from the key itself or its ``.key`` certificate file."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise SinkError(f"--curve-server-key {value}: cannot read the certificate: "
                            f"{exc}") from None
        value = public.decode()
    try:
        valid = len(z85.decode(value)) == 32
    except (ValueError, KeyError, IndexError):
        valid = False
    if not valid:
        raise SinkError(f"--curve-server-key {value!r} is not a CURVE public key: give the 40 "
                        "characters `relay keygen` printed, or the central's .key file")
    return value
