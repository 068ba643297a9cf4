"""A shipper: a worker of the relay that sends the journal itself onward, where a sink is handed
events (docs/architecture.md, "Shippers").

Shippers are registered in the sinks' entry-point group, so users pick destinations from one list,
and the host tells the two kinds apart by class (``is_shipper``).
"""
from __future__ import annotations

import abc
from typing import ClassVar

import click

from relay.journal.journal_queue import News
from sinks.base import CLOSE_TIMEOUT, Sink, SinkContext


class Shipper(abc.ABC):
    """Sends the relay's journal onward; registered under ``metrics_relay.sinks`` like a sink."""

    #: Registry name, used as ``relay --sink NAME``.
    name: ClassVar[str]

    #: Its own counters (the relay's stats show them under ``sinks.NAME.sink``).
    counters: dict[str, int]

    @classmethod
    def options(cls) -> list[click.Option]:
        """CLI options this shipper adds to ``relay`` (as a sink's, sinks/base.py)."""
        return []

    def check(self, context: SinkContext) -> None:
        """What the relay checks before it listens, cheaply (as ``Sink.check``); SinkError:
        exit 2."""
        return  # optional: nothing to check by default

    @abc.abstractmethod
    def open(self, context: SinkContext) -> None:
        """Start shipping ``context.journal`` from the positions saved beside it, on threads of its
        own; SinkError for a configuration problem (the host tries again with backoff)."""

    @abc.abstractmethod
    def notify(self, news: News) -> None:
        """These runs have new journal lines, the run's file ending at the offset given. Never
        raises, never waits: the shipping happens on the shipper's own threads."""

    @abc.abstractmethod
    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait up to ``timeout`` for the far side's last acknowledgements, save the positions and
        stop. False when some are missing: they stay in the journal, and the next relay on it sends
        them."""


def is_shipper(cls: type) -> bool:
    """Whether a class ``--sink`` names is a shipper (else a sink)."""
    return issubclass(cls, Shipper)


def load(name: str) -> type[Sink] | type[Shipper]:
    """The sink or shipper ``--sink name`` names (sinks.registry); SinkError if neither."""
    from sinks import registry  # (the relay reads entry points only once it needs them)

    cls = registry.load(name, (Sink, Shipper))
    assert issubclass(cls, (Sink, Shipper))
    return cls
