"""What a stopping relay's sinks still lack, said so a user can act on it: progress while the relay
waits, then per sink stopped early how many events it lacks and the ``relay replay`` command that
gives them (safe whatever it finds: every sink skips what it holds). A sink's process never outlives
its relay, so the relay's exit is the last moment a sink can be complete.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relay.ship.base import Shipper, is_shipper, load
from relay.sinkhost.spec import SinkSpec
from sinks.base import Sink

#: Seconds between the progress lines of a relay waiting for its sinks.
PROGRESS_EVERY = 5.0


def lacking(stats: Mapping[str, Any]) -> int:
    """Events a sink has not applied (its process's ``stats()``): still queued or in flight, and
    those it dropped or lost on the way (which only the journal holds now)."""
    return int(stats.get("queued", 0)) + int(stats.get("dropped", 0))


def progress_line(sinks: Mapping[str, Mapping[str, Any]], waited: float, bound: float) -> str:
    """``waiting for sinks to apply what the journal took: mlflow 1,234 events to go (opening), aim
    done (12 s of at most 60 s)``."""
    parts = []
    for name, stats in sinks.items():
        if stats.get("complete"):
            parts.append(f"{name} done")
            continue
        left = lacking(stats)
        state = " (opening)" if not stats.get("open") else ""
        parts.append(f"{name} {left:,} events to go{state}" if left else f"{name} finishing{state}")
    return (f"waiting for sinks to apply what the journal took: {', '.join(parts)} "
            f"({waited:.0f} s of at most {bound:.0f} s)")


def behind(sinks: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The sinks that are not complete at the end, and how many events each lacks."""
    return {name: lacking(stats) for name, stats in sinks.items() if not stats.get("complete")}


def option_args(cls: type[Sink] | type[Shipper], options: Mapping[str, Any]) -> list[str]:
    """A sink's options (as its ``SinkSpec`` holds them) as its command line spells them; defaults
    left out."""
    args: list[str] = []
    for option in cls.options():
        value = options.get(option.name)
        if value is None or value == option.default or value == ():
            continue
        if option.is_flag:
            flags = option.opts if value else option.secondary_opts
            args += flags[:1]
            continue
        for item in (value if option.multiple else [value]):
            args += [option.opts[0], str(item)]
    return args


def replay_command(journal: Path | str, specs: Sequence[SinkSpec],
                   names: Sequence[str]) -> list[str]:
    """``relay replay JOURNAL --sink NAME OPTIONS ...`` for the sinks ``names`` of ``specs``; not
    for a shipper (relay/ship/base.py): the next relay on the journal ships what it lacks."""
    command = ["relay", "replay", str(journal)]
    for spec in specs:
        cls = load(spec.source or spec.name) if spec.name in names else None
        if cls is not None and not is_shipper(cls):
            command += ["--sink", spec.source or spec.name, *option_args(cls, spec.options)]
    return command


def shortfall(name: str, count: int, stats: Mapping[str, Any]) -> str:
    """What a sink not complete lacks: ``mlflow lacks 1,234 events``, ``aim's close did not
    complete`` (what it wrote may not be durable: ``incomplete_closes``), both, or ``wandb did not
    finish``."""
    said = [f"{name} lacks {count:,} events"] if count else []
    if stats.get("incomplete_closes"):
        said.append("its close did not complete" if said else f"{name}'s close did not complete")
    return " and ".join(said) or f"{name} did not finish"


def report(lacks: Mapping[str, int], command: Sequence[str],
           sinks: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: which sinks lack how many events (``sinks``: their stats), and the command that
    completes them."""
    which = ", ".join(shortfall(name, count, sinks.get(name, {})) for name, count in lacks.items())
    if "--sink" not in command:  # shippers only
        return (f"sinks not complete at shutdown: {which}; the journal has every event: the next "
                "relay on it ships them")
    return (f"sinks not complete at shutdown: {which}; the journal has every event: "
            f"complete them with: {shlex.join(command)}")
