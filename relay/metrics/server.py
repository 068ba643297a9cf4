"""The endpoint's HTTP server: ``GET /metrics`` in Prometheus's text format, on a thread of its own
that cannot stall ingest (docs/monitoring.md, "How it is read, and what it costs ingest").

It answers one request at a time: a thread per connection would let a flood of them grow without
bound. It listens on loopback unless told otherwise (``[HOST:]PORT``; a bare port is 127.0.0.1's):
what it shows names every run, rank and sink (docs/security.md), so any other address is logged as
a warning.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from relay.wire.address import AddressInUse, BadAddress, is_loopback

log = logging.getLogger("relay.metrics")

TIMEOUT = 5.0  # seconds a client may take to send its request and read the answer
RENDER_TTL = 0.5  # seconds one rendering answers every scrape
#: The classic text format, which every Prometheus 2.x and 3.x reads (the metric names need no
#: escaping).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def parse_bind(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPv6]:PORT`` as (host, port); BadAddress says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not port.isdigit() or not 0 <= int(port) <= 65535 or not host
            or ("[" in host or "]" in host)):
        raise BadAddress(f"--metrics-bind {text!r} is not [HOST:]PORT; "
                         "give 9464, 127.0.0.1:9464 or [::1]:9464")
    return host, int(port)


class _Server(HTTPServer):
    def __init__(self, address: tuple[str, int], render: _Render) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.render = render
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    timeout = TIMEOUT
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] == "/metrics":
            self._answer(200, self.server.render(), CONTENT_TYPE)
        elif self.path == "/":
            self._answer(200, b"metrics-relay: see /metrics\n", "text/plain; charset=utf-8")
        else:
            self._answer(404, b"not found: the metrics are at /metrics\n",
                         "text/plain; charset=utf-8")

    def _answer(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics request from %s: " + format, self.address_string(), *args)


class _Render:
    """The exposition, rendered at most once per RENDER_TTL (only the server's thread calls it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.body = b""
        self.at = float("-inf")

    def __call__(self) -> bytes:
        now = time.monotonic()
        if now - self.at >= RENDER_TTL:
            self.body = generate_latest(self.registry)
            self.at = now
        return self.body


class MetricsServer:
    """``start()`` binds (AddressInUse, BadAddress) and serves on a daemon thread; ``stop()`` ends
    it."""

    def __init__(self, bind: str, registry: CollectorRegistry) -> None:
        self.host, self.port = parse_bind(bind)
        self.registry = registry
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Listen; returns the URL scraped."""
        try:
            self._server = _Server((self.host, self.port), _Render(self.registry))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(
                    f"--metrics-bind {self.host}:{self.port} is already in use") from None
            raise BadAddress(f"cannot listen on --metrics-bind {self.host}:{self.port}: "
                             f"{exc.strerror or exc}; give an address of this machine, "
                             "e.g. 127.0.0.1:9464") from None
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="relay-metrics",
                                        daemon=True)
        self._thread.start()
        host = f"[{self.host}]" if ":" in self.host else self.host
        url = f"http://{host}:{self.port}/metrics"
        if not is_loopback(f"tcp://{host}:{self.port}"):
            log.warning("metrics endpoint %s is reachable from other machines: it names every run, "
                        "rank and sink (and losses, with --metrics-loss) to anyone who can reach "
                        "it; see docs/security.md", url)
        log.info("Prometheus metrics at %s", url)
        return url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
