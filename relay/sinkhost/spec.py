"""What a sink's process is started with (``SinkSpec``); a module of its own so that those who only
name a sink need not import the child's process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SinkSpec:
    """What a child needs to build its sink: what to load (a registry name or ``module:Class``), its
    options, the journal it may read to catch up and its dead-letter file."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # what sinks.registry.load gets; the name when empty
    journal: str | None = None  # ends with os.sep in the directory layout
    deadletter: str | None = None
    max_events: int = 200_000
    drain_timeout: float = 10.0
    log_level: str = "INFO"


def jsonable(value: Any) -> Any:
    """An option value as the sink's process receives it (its click type converts it back)."""
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
