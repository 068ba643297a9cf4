"""Who may connect to the relay: CURVE keys from the user's secret by default on TCP, explicit
certificates, or nobody checked (``--open``, and ``ipc://``, which its 0700 folder guards);
docs/security.md says why CURVE.

The ZAP handler is an inproc socket answered on the relay's own loop, not zmq.auth's thread; it
admits the client key of the secret, or the certificates of ``--curve-clients``, or
(``--curve-cert`` alone) any key. Every failed handshake shows on the socket's monitor and is
counted, logged and dead-lettered by ingest (``Ingest.refuse_connection``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from relay.daemon.config import RelayConfig
from relay.wire import curve, secret
from relay.wire.address import is_loopback
from relay.wire.monitor import recv_event

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: what the relay's monitor reports: a handshake that failed for a reason of the peer's (not a
#: peer that merely hung up half-way, HANDSHAKE_FAILED_NO_DETAIL)
REFUSALS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


class AuthError(ValueError):
    """The relay secret or a certificate cannot be used: one line that names the fix."""


@dataclass(frozen=True)
class Policy:
    """How the relay's socket authenticates peers: ``mode`` secret, curve, open or ipc; ``source``
    names the keys for the start-up line; ``allowed``: raw client keys admitted (None: any)."""

    mode: str
    source: str = ""
    public: bytes | None = None
    private: bytes | None = None
    allowed: frozenset[bytes] | None = None

    def describe(self) -> str:
        clients = ", listed clients only" if self.allowed is not None else ", any client key"
        return {"secret": f"peers must hold the relay secret in {self.source}",
                "curve": f"CURVE certificate {self.source}{clients}",
                "open": "no authentication (--open): any process that can connect may publish",
                "ipc": "an ipc socket: its folder's permissions decide who connects"}[self.mode]


def policy(config: RelayConfig) -> Policy:
    """The relay's policy from its options; AuthError says what is wrong."""
    try:
        return _policy(config)
    except ValueError as exc:  # secret.SecretError, or a certificate curve.load_secret cannot read
        raise AuthError(str(exc)) from None


def _policy(config: RelayConfig) -> Policy:
    if config.curve_cert is not None:
        public, private = curve.load_secret(config.curve_cert)
        allowed = None if config.curve_clients is None else _listed(config.curve_clients)
        return Policy("curve", str(config.curve_cert), public, private, allowed)
    if config.address.startswith("ipc://"):
        return Policy("ipc")
    if config.open:
        return Policy("open")
    found = secret.find(config.secret_file)
    public, private = secret.curve_keys(found.value, "relay")
    return Policy("secret", found.source, public, private,
                  frozenset({z85.decode(secret.curve_keys(found.value, "client")[0])}))


def _listed(folder: Path) -> frozenset[bytes]:
    keys = set()
    for path in sorted(folder.glob("*.key")):
        try:
            keys.add(z85.decode(zmq.auth.load_certificate(path)[0]))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--curve-clients {folder}: cannot read {path.name}: {exc}") from None
    return frozenset(keys)


def warning(policy: Policy, address: str) -> str | None:
    """What to say at start when the socket is reachable from other machines unencrypted."""
    if policy.mode == "open" and not is_loopback(address):
        return (f"listening on {address} without encryption or authentication (--open): anyone "
                "who can reach it can publish; drop --open (see docs/security.md)")
    return None


class Gate:
    """The ZAP handler on one relay's ZeroMQ context, and the refused handshakes of its socket."""

    def __init__(self, ctx: zmq.Context, policy: Policy) -> None:
        self.policy = policy
        self.zap: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        if policy.public is not None:
            self.zap = ctx.socket(zmq.ROUTER)
            self.zap.setsockopt(zmq.LINGER, 0)
            self.zap.bind(ZAP_ENDPOINT)

    def secure(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (before it binds) a CURVE server when the policy has keys, and watch its
        refused handshakes (read with ``refused``)."""
        if self.policy.public is not None:
            sock.curve_publickey = self.policy.public
            sock.curve_secretkey = self.policy.private
            sock.curve_server = True
        self._monitor = sock.get_monitor_socket(REFUSALS)

    def release(self, sock: zmq.Socket) -> None:
        """Stop watching ``sock`` (before it closes)."""
        if self._monitor is not None:
            sock.disable_monitor()
            self._monitor.close(0)
            self._monitor = None

    def refused(self) -> list[str]:
        """Why each handshake refused since the last look failed, one line each."""
        out: list[str] = []
        while self._monitor is not None:
            try:
                event = recv_event(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            out.append(_why(event.event, event.value, self.policy))
        return out

    def answer(self) -> None:
        """Admit or refuse every connection waiting for the ZAP handler (RFC 27: version, request
        id, domain, address, identity, mechanism, credentials)."""
        assert self.zap is not None
        allowed = self.policy.allowed
        while True:
            try:
                parts = self.zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            split = parts.index(b"") + 1 if b"" in parts else 0
            envelope, request = parts[:split], parts[split:]
            if len(request) < 6:
                continue  # not a ZAP request: nobody waits for an answer
            version, request_id, mechanism = request[0], request[1], request[5]
            credentials = request[6:]
            ok = mechanism == b"CURVE" and bool(credentials) \
                and (allowed is None or credentials[0] in allowed)
            self.zap.send_multipart([*envelope, version, request_id, b"200" if ok else b"400",
                                     b"OK" if ok else b"key not allowed", b"", b""])

    def close(self) -> None:
        if self.zap is not None:
            self.zap.close(0)


def _why(event: int, value: int, policy: Policy) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"a peer's CURVE key is not among the allowed ones (ZAP status {value})"
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        if policy.public is None:
            return ("a peer that authenticates connected to this relay, which runs without "
                    "authentication (--open)")
        return ("a peer connected without authenticating: it does not use the relay secret (an old "
                "client, or RELAY_OPEN)")
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return ("a peer failed the CURVE handshake: it does not hold this relay's "
                + ("secret" if policy.mode == "secret" else "public key"))
    return f"a peer broke the ZeroMQ handshake (protocol error {value:#x})"
