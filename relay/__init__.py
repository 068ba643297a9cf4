"""metrics-relay, the wire side: event schema, publisher client and relay daemon (no torch here)."""
from relay.client import Publisher, resolve_address
from relay.schema import SCHEMA_VERSION

__all__ = ["Publisher", "resolve_address", "SCHEMA_VERSION"]
