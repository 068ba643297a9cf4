"""What ``--sink NAME`` names on the command line: the journal (``jsonl``, which the relay writes
itself and is not a sink), a sink or a shipper (relay/ship/base.py), found through sinks.registry;
each with its options, and which of them declares an option. The command line alone treats them
alike: for it each is a name with options."""
from __future__ import annotations

from typing import Any

import click

from relay.journal.journal import DEFAULT_PATH, NAME, Journal
from relay.ship.base import Shipper, load
from sinks.base import Sink, SinkError

#: One line on the journal, where ``--help`` lists what ``--sink`` takes.
JOURNAL_SUMMARY = ("The journal (JSONL): always written by serve; in replay, a journal given what "
                   "it lacks.")


class JournalFlags:
    """The journal's options (``--path``, ``--fsync``) and the Journal they make."""

    @staticmethod
    def options() -> list[click.Option]:
        return [
            click.Option(["--path"], default=DEFAULT_PATH, show_default=True,
                         help="JSONL journal: a file for every run, or a directory (existing, or "
                              "ending in '/') holding one <run>.jsonl per run."),
            click.Option(["--fsync/--no-fsync"], default=False, show_default=True,
                         help="fsync the journal before acknowledging (survives power loss, costs "
                              "latency)."),
        ]

    @classmethod
    def journal(cls, params: dict[str, Any]) -> Journal:
        return Journal(**{o.name: params[o.name] for o in cls.options()})


#: What ``--sink`` names: a sink or shipper class, or the journal's flags (each has ``options()``
#: and makes its part)
Named = type[Sink] | type[Shipper] | type[JournalFlags]


def named(args: list[str]) -> list[str]:
    """The ``--sink NAME`` / ``--sink=NAME`` values of a command line, in order, once each."""
    names, words = [], iter(args)
    for word in words:
        if word == "--":
            break
        if word == "--sink":
            names.append(next(words, ""))
        elif word.startswith("--sink="):
            names.append(word[len("--sink="):])
    return list(dict.fromkeys(name for name in names if name))


def installed() -> list[str]:
    """Every name ``--sink`` takes without a ``module:Class``: the journal's and each installed
    sink's."""
    from sinks.registry import available

    return sorted({NAME, *available()})


def resolve(given: str) -> tuple[str, Named]:
    """(display name, class) of what ``--sink given`` names; SinkError for an unknown or broken
    sink."""
    from sinks.registry import known

    if given == NAME:
        return NAME, JournalFlags
    if ":" not in given and not known(given):
        raise SinkError(f"unknown sink {given!r}; installed sinks: {', '.join(installed())} "
                        "(or give package.module:Class)")
    cls = load(given)
    return getattr(cls, "name", None) or cls.__name__.lower(), cls


def load_named(names: list[str]) -> dict[str, tuple[str, Named]]:
    """Display name -> (what a sink process loads, class), for the named ones. SinkError for an
    unknown or broken sink, or two that go by the same name."""
    classes: dict[str, tuple[str, Named]] = {}
    for given in names:
        name, cls = resolve(given)
        if name in classes:
            raise SinkError(f"--sink {given}: a sink named {name!r} was already given; "
                            "name each sink once")
        classes[name] = (given, cls)
    return classes


def owner(option: str, named: dict[str, tuple[str, Named]]) -> str | None:
    """What ``--sink`` should name to get ``option``, among those not named on the command line
    (only now are the other installed sinks imported: this is the path of a usage error)."""
    for name in installed():
        if name in named:
            continue
        try:
            cls = resolve(name)[1]
        except SinkError:
            continue
        if any(option in o.opts or option in o.secondary_opts for o in cls.options()):
            return name
    return None
