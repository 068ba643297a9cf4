"""How a client socket proves itself to a relay, and what it is told when the relay refuses it
(docs/security.md: CURVE keys from the user's secret on TCP, explicit certificates, none on
``ipc://`` or with $RELAY_OPEN).

Every client of a relay goes through ``secure_client``: the Publisher's and the forward sink's link
(relay/wire/io_thread.py), ``relay status``, the tests' and benchmarks' raw sockets.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import zmq

from relay.wire import curve, secret

OPEN_ENV = "RELAY_OPEN"
#: The socket monitor events of a handshake that failed (the relay refused us, or we it).
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
MECHANISM_MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
#: Failed handshakes in a row before a client says why: the side that hangs up first tells the
#: other nothing (HANDSHAKE_FAILED_NO_DETAIL), so the reason may show only at a later try, and one
#: failure alone may be a relay that died mid-handshake.
REFUSALS_TOLD = 3


def open_by_env() -> bool:
    """$RELAY_OPEN says to run without authentication (1, true, yes, on)."""
    return os.environ.get(OPEN_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class ClientAuth:
    """What a client socket uses: ``mode`` is secret, curve (certificates), open or ipc; ``source``
    names where its keys came from, for the messages."""

    mode: str
    source: str = ""


def mode(address: str, server_key: str | None = None) -> str:
    """How a client proves itself to the relay at ``address``: curve (certificates), ipc, open or
    secret."""
    if server_key:
        return "curve"
    if address.startswith("ipc://"):
        return "ipc"
    return "open" if open_by_env() else "secret"


def check(address: str) -> None:
    """Raise secret.SecretError now if this process could not prove itself to the relay at
    ``address`` (a job checks this before it trains; the secret is created here on first use)."""
    if mode(address, os.environ.get(curve.SERVER_KEY_ENV)) == "secret":
        secret.find()


def secure_client(sock: zmq.Socket, address: str, server_key: str | None = None,
                  client_cert: str | None = None) -> ClientAuth:
    """Set ``sock`` up (before it connects) to prove itself to the relay at ``address``. Raises
    ValueError (secret.SecretError: one line naming the fix) when the keys cannot be had."""
    how = mode(address, server_key)
    if how == "curve":
        assert server_key is not None
        curve.secure_client(sock, server_key, client_cert)
        cert = f" and {client_cert}" if client_cert else ""
        return ClientAuth("curve", f"${curve.SERVER_KEY_ENV}{cert}")
    if how != "secret":
        return ClientAuth(how, f"${OPEN_ENV}" if how == "open" else "")
    found = secret.find()
    sock.curve_serverkey = secret.curve_keys(found.value, "relay")[0]
    sock.curve_publickey, sock.curve_secretkey = secret.curve_keys(found.value, "client")
    return ClientAuth("secret", found.source)


def refusal(auth: ClientAuth, address: str, failed: list[tuple[int, int]]) -> str:
    """One line for handshakes with the relay at ``address`` that failed (monitor events and their
    values): what most likely disagrees, and what to do."""
    if (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, MECHANISM_MISMATCH) in failed:
        if auth.mode == "open":
            return (f"the relay at {address} authenticates its peers and this process does not "
                    f"(${OPEN_ENV} is set): unset {OPEN_ENV}")
        return (f"the relay at {address} runs without authentication (relay --open): "
                f"set {OPEN_ENV}=1 for this process too, or restart the relay without --open")
    if auth.mode == "secret":
        return (f"the relay at {address} refused the handshake: the relay secret this process uses "
                f"({auth.source}) is not the relay's; {secret.SHARE}")
    if auth.mode == "curve":
        return (f"the relay at {address} refused the handshake: "
                f"${curve.SERVER_KEY_ENV} must be its public key, and with --curve-clients "
                f"this process's certificate ({auth.source}) must be listed there")
    return (f"the relay at {address} refused the handshake "
            f"(this process does not authenticate: {auth.mode})")
