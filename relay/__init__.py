"""metrics-relay, the wire side: rooms by role (docs/architecture.md); importing it starts nothing.

``from relay import Publisher`` still works: the names below load on first use, so importing any
``relay.*`` module (the sink child, the daemon) does not load the publisher or ZeroMQ."""
from __future__ import annotations

from typing import Any

__all__ = ["Publisher", "resolve_address", "SCHEMA_VERSION"]


def __getattr__(name: str) -> Any:
    if name == "Publisher":
        from relay.client.publisher import Publisher
        return Publisher
    if name == "resolve_address":
        from relay.wire.address import resolve_address
        return resolve_address
    if name == "SCHEMA_VERSION":
        from relay.wire.schema import SCHEMA_VERSION
        return SCHEMA_VERSION
    raise AttributeError(f"module 'relay' has no attribute {name!r}")
