"""Where the relay listens: the default, parsing, the loopback check, and failing fast when the
address is taken. The relay, its command line and every Publisher take the default from here."""
from __future__ import annotations

import ipaddress
import os
import socket
from urllib.parse import urlsplit

DEFAULT_ADDRESS = "tcp://127.0.0.1:5557"
ADDRESS_ENV = "RELAY_ADDRESS"
MAX_PORT = 65535


class AddressInUse(Exception):
    """Another process (most likely another relay) already listens on this address."""


class BadAddress(ValueError):
    """Not an address ZeroMQ can bind."""


def resolve_address(address: str | None = None) -> str:
    """Argument first, then $RELAY_ADDRESS (torchrun workers inherit it), then the default."""
    return address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def check_bind_address(address: str) -> str:
    """Validate a bind address and return its transport (``tcp`` or ``ipc``)."""
    return _check(address, wildcard=True)


def check_connect_address(address: str) -> str:
    """Validate an address to connect to (a rank's ``--relay_address``): as a bind address, but
    the port must be a number."""
    return _check(address, wildcard=False)


def _check(address: str, wildcard: bool) -> str:
    scheme, _, rest = address.partition("://")
    if scheme not in ("tcp", "ipc") or not rest or any(c.isspace() for c in address):
        raise BadAddress(f"address {address!r} must look like tcp://HOST:PORT "
                         "or ipc:///path/relay.sock")
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        if not host or not ((wildcard and port == "*") or port.isdigit()):
            raise BadAddress(f"address {address!r} needs a host and a port number"
                             + (" (or '*' for any free port)" if wildcard else ""))
        if port != "*" and int(port) > MAX_PORT:  # ZeroMQ would take it modulo 65536
            raise BadAddress(f"address {address!r}: port {port} is past {MAX_PORT}; "
                             f"give a port from 1 to {MAX_PORT}")
    return scheme


def is_ipv6(address: str) -> bool:
    """A tcp:// address whose host is an IPv6 literal (``tcp://[::1]:5557``): ZeroMQ binds and
    connects those only on a socket with its IPV6 option set, and says "No such device"
    otherwise."""
    return address.startswith("tcp://[")


def is_loopback(address: str) -> bool:
    """ipc:// sockets and loopback TCP stay on this machine; anything else is reachable from
    outside."""
    if address.startswith("ipc://"):
        return True
    host = urlsplit(address.replace("*", "0")).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_ipc_free(address: str) -> None:
    """ZeroMQ silently steals an ipc path from a live listener; refuse instead if one answers."""
    path = address[len("ipc://"):]
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return  # nothing there, or a stale socket file left by a dead relay
    except OSError as exc:
        raise BadAddress(f"cannot use {address}: {exc.strerror}") from None
    finally:
        probe.close()
    raise AddressInUse(f"{address} is already served by another process")
