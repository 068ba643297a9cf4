"""Explicit CURVE certificates (ZeroMQ certificate files, ``zmq.auth``), for relays whose clients do
not share the user's secret (docs/security.md, "Explicit CURVE certificates").
"""
from __future__ import annotations

from pathlib import Path

import zmq
import zmq.auth

SERVER_KEY_ENV = "RELAY_CURVE_SERVER_KEY"
CLIENT_CERT_ENV = "RELAY_CURVE_CLIENT_CERT"


def generate(directory: Path, name: str) -> tuple[Path, Path]:
    """Write ``name.key`` (public, share it) and ``name.key_secret`` (keep it) into
    ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def how_to_use(public: Path, secret: Path, role: str) -> str:
    """What ``relay keygen`` prints: the pair, and how a relay's (``role`` "relay") or a client's
    certificate is used; a client's never shows the server-key export, which would mislead."""
    key = load_secret(secret)[0].decode()
    if role == "relay":
        use = f"  relay: relay --curve-cert {secret} ...\n  ranks: export {SERVER_KEY_ENV}='{key}'"
    else:
        use = (f"  relay: copy {public} into its --curve-clients directory\n"
               f"  ranks on this client: export {CLIENT_CERT_ENV}={secret}")
    return (f"secret certificate: {secret} (keep it private)\n"
            f"public certificate: {public}\n"
            f"public key: {key}\n"
            f"{use}")


def load_secret(cert: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file; ValueError says what is wrong with it."""
    try:
        public, secret = zmq.auth.load_certificate(cert)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read CURVE certificate {cert}: {exc}") from None
    if not secret:
        raise ValueError(f"{cert} holds no secret key; pass the .key_secret file")
    return public, secret


def secure_client(sock: zmq.Socket, server_key: str, client_cert: str | None) -> None:
    """Make ``sock`` a CURVE client of the relay whose public key is ``server_key`` (Z85)."""
    if client_cert:
        public, secret = load_secret(Path(client_cert))
    else:
        public, secret = zmq.curve_keypair()
    sock.curve_serverkey = server_key.encode()
    sock.curve_publickey = public
    sock.curve_secretkey = secret
