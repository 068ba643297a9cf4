"""The sink interface: what the relay needs from any destination of events.

Sinks receive decoded, validated, de-duplicated events (plain dicts in the envelope of
docs/protocol.md) in batches; they know nothing of ZeroMQ. The relay runs each sink in its own
process and calls it from one thread there, so a sink need not be thread-safe. (The journal is not
a sink: the relay owns it, relay/journal/journal.py.)
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import click

from sinks.events import Event

#: Seconds ``flush``/``close`` may take when the caller names no deadline (OpenTelemetry's
#: exporters' 30 s).
FLUSH_TIMEOUT = 30.0
CLOSE_TIMEOUT = 30.0


class SinkError(Exception):
    """A sink cannot work with the options it was given (bad path, missing package, ...).

    Raised from ``__init__`` or ``check()``, the relay prints the message as one line and exits 2
    before it listens; raised from ``open()`` (in the sink's process, once the relay listens), it
    is logged and counted, and the relay tries to open the sink again with backoff.
    """


class PermanentError(Exception):
    """Raised by ``write()`` when retrying cannot help: the tool refuses what it was given (a value
    it cannot store, a name it forbids), not that it is unreachable for now. The events that fail
    on their own are dead-lettered, the rest written (docs/plugins.md, "Permanent errors")."""


@dataclass
class SinkContext:
    """What the relay tells every sink when it opens.

    ``journal`` is the JSONL source of truth (file or directory, see docs/jsonl.md); sinks that
    export files put them next to it. (A sink never reads it to catch up: the relay feeds a sink
    that is ``CatchesUp`` what it missed.) ``replay`` is True under ``relay replay``: the
    events are a finished job's, whose own files (in its output dir, beside its journal) name the
    live store and must stay as they are.
    """

    journal: Path | None = None
    replay: bool = False


class Sink(abc.ABC):
    """Base class for sinks, registered under the ``metrics_relay.sinks`` entry-point group."""

    #: Registry name, used as ``relay --sink NAME``.
    name: ClassVar[str]

    @classmethod
    def options(cls) -> list[click.Option]:
        """CLI options this sink adds to ``relay`` and ``relay replay``.

        Their parameter names are the keyword arguments ``__init__`` receives. Prefix them with
        the sink name (``--mysink-url``) unless users already know a bare name (``--repo``).
        """
        return []

    def check(self, context: SinkContext) -> None:
        """What the relay checks before it listens, in its own process, for each ``--sink``: cheap
        and without side effects (is the tool's package installed, is the output directory
        writable; see sinks/preflight.py). Raise SinkError: the relay exits 2 with that one line,
        before any training starts. ``open()`` runs later, in the sink's process, beside a relay
        that already listens; what only it can find out (a server down) it reports then."""
        return  # optional: nothing to check by default

    def open(self, context: SinkContext) -> None:
        """Acquire files, connections, locks. Raise SinkError for a configuration problem."""
        return  # optional: nothing to acquire by default

    @abc.abstractmethod
    def write(self, events: Sequence[Event]) -> None:
        """Take a batch, in arrival order. Raising means the batch is retried later, whole;
        raising PermanentError, that the events failing on their own are dead-lettered."""

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Make everything written so far durable or visible, within ``timeout`` seconds (as
        OpenTelemetry's ``force_flush``). True when it is; False when the deadline came first (never
        taken as durable); raise for a failure."""
        return True

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Flush and release resources within ``timeout`` seconds; called once at shutdown, also
        after failures. True when everything written is durable and released; False when the
        deadline came first (a tool that cannot be reached): docs/plugins.md has what follows."""
        return True


class CatchesUp(abc.ABC):
    """A sink the relay writes what it missed from the journal (relay/sinkhost/catch_up.py): the
    recent runs when its process starts, when its backend is back and after its queue dropped
    batches, and before a flush the runs it names in ``holes``. Only for a sink whose ``write()``
    skips what it already applied (every TrackerSink keeps the ``(rank, seq)`` spans it applied):
    most of what it is handed, it has. A plain Sink gets the live events only."""

    @abc.abstractmethod
    def holes(self, filled: Sequence[str]) -> list[str]:
        """Runs with events missing that the journal may hold (a rank's seqs skip some). The relay
        calls ``holes([])``, writes the sink those runs' journal events it has not read for it yet,
        then calls ``holes(filled)`` with them: what they still lack is not in the journal, so the
        sink stops naming them unless a new hole shows. One that raises is counted and logged; the
        runs it named are read again before the next flush."""
