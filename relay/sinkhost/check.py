"""Before the relay listens: every sink built in the relay's own process and its cheap ``check()``
run, so that what can never work is refused at once, not retried for ever beside a relay that
already listens (relay/sinkhost/process.py opens them there)."""
from __future__ import annotations

from pathlib import Path

from relay.sinkhost.child import build_sink
from relay.sinkhost.spec import SinkSpec
from sinks.base import SinkContext, SinkError

__all__ = ["check_sinks"]


def check_sinks(specs: list[SinkSpec], journal: Path) -> None:
    """Build every sink in the relay's own process and run its cheap ``check()`` (package installed,
    paths writable: see sinks/preflight.py), before the relay listens; the first SinkError stops it.
    The sinks' processes then open them beside a relay that already listens."""
    context = SinkContext(journal=journal)
    for spec in specs:
        sink = build_sink(spec)
        try:
            sink.check(context)
        except SinkError:
            raise
        except Exception as exc:  # a plugin's own bug: reported as the reason it cannot start
            said = str(exc).strip() or "it gave no reason"
            raise SinkError(f"sink {spec.name} failed its check: "
                            f"{type(exc).__name__}: {said}") from None
