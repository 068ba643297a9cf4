"""Sinks are found through the ``metrics_relay.sinks`` entry-point group, so a third-party
package adds one with a line in its own pyproject and no change here."""
from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points

from sinks.base import Sink, SinkError

log = logging.getLogger(__name__)

GROUP = "metrics_relay.sinks"


def available() -> dict[str, EntryPoint]:
    """Registered sink names, without importing them."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load(name: str) -> type[Sink]:
    """The sink class registered as ``name``; SinkError names the known sinks otherwise."""
    eps = available()
    if name not in eps:
        raise SinkError(f"unknown sink {name!r}; installed sinks: {', '.join(sorted(eps)) or 'none'}")
    try:
        cls = eps[name].load()
    except Exception as exc:  # a broken plugin is reported, never fatal for the other sinks
        raise SinkError(f"sink {name!r} ({eps[name].value}) failed to import: {type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise SinkError(f"sink {name!r} ({eps[name].value}) is not a sinks.base.Sink subclass")
    return cls


def load_all() -> dict[str, type[Sink]]:
    """Every sink that imports; broken ones are logged and left out (asking for one by name
    with ``load`` still gives its error)."""
    classes = {}
    for name in sorted(available()):
        try:
            classes[name] = load(name)
        except SinkError as exc:
            log.warning("%s", exc)
    return classes
