"""The sink interface: what the relay needs from any destination of events.

Sinks receive decoded, validated, de-duplicated events (plain dicts in the envelope of
docs/protocol.md) in batches; they know nothing of ZeroMQ. The relay calls them from one
thread per sink (the durable journal from the ingest thread), so a sink need not be
thread-safe.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Sequence

import click


class SinkError(Exception):
    """A sink cannot work with the options it was given (bad path, missing package, ...).

    Raised from ``__init__`` or ``open()``; the CLI prints the message as one line and exits 2.
    """


@dataclass
class SinkContext:
    """What the relay tells every sink when it opens.

    ``journal`` is the JSONL source of truth (file or directory, see docs/jsonl.md); sinks that
    can fall behind read it to catch up, and sinks that export files put them next to it.
    """

    journal: Path | None = None


class Sink(abc.ABC):
    """Base class for sinks, registered under the ``metrics_relay.sinks`` entry-point group."""

    #: Registry name, used as ``relay --sink NAME``.
    name: ClassVar[str]
    #: True only for the journal: the relay acknowledges events once a durable sink flushed them.
    durable: ClassVar[bool] = False

    @classmethod
    def options(cls) -> list[click.Option]:
        """CLI options this sink adds to ``relay`` and ``relay replay``.

        Their parameter names are the keyword arguments ``__init__`` receives. Prefix them with
        the sink name (``--mysink-url``) unless users already know a bare name (``--repo``).
        """
        return []

    def open(self, context: SinkContext) -> None:
        """Acquire files, connections, locks. Raise SinkError for a configuration problem."""

    @abc.abstractmethod
    def write(self, events: Sequence[dict[str, Any]]) -> None:
        """Take a batch, in arrival order. Raising means the batch is retried later, whole."""

    def flush(self) -> None:
        """Make everything written so far durable or visible."""

    def close(self) -> None:
        """Flush and release resources; called once at shutdown, also after failures."""

    def seen(self, run: str) -> Iterable[tuple[int, int]]:
        """(rank, seq) pairs this sink already holds for ``run``: only durable sinks answer, so a
        restarted relay recognises events it wrote but never acknowledged."""
        return ()
