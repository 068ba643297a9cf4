"""The filters ``relay tail`` and ``relay plot`` share, their options, and reading a journal value
as a number or a time of day. Both read lines no relay would take for an event (a hand edit, an
older relay's journal), so every test here checks a field's type before it uses it.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click

from sinks.events import NONFINITE_JSON, RELAY_RANK

_AGO = re.compile(r"(\d+(?:\.\d*)?)\s*([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """Unix seconds from ``10m``, ``2h``, ``30s``, ``1d`` (that long before ``now``), an ISO time
    (local time unless it names its zone) or unix seconds; ValueError saying what is accepted."""
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago:
        return (time.time() if now is None else now) - float(ago[1]) * _UNIT_S[ago[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"{text!r} is no time; give 10m, 2h, 30s, 1d, an ISO time "
                         "(2026-12-03T07:05) or unix seconds") from None


class SinceType(click.ParamType):
    """``--since``: converted on the command line, so a bad value is a usage error (exit 2)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_since(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@dataclass(frozen=True)
class MetricName:
    """A ``--metric``: ``name`` (in any stage) or ``stage/name`` (``eval/loss``,
    ``rank/step_time``). A data key that itself holds a slash (``track({"a/b": 1})``) is matched
    whole, in any stage."""

    text: str
    stage: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> MetricName:
        stage, slash, name = text.partition("/")
        return cls(text, stage, name) if slash and stage and name else cls(text, None, text)

    def matches(self, stage: Any, key: str) -> bool:
        return key == self.text or (key == self.name
                                    and (self.stage is None or stage == self.stage))


@dataclass(frozen=True)
class Selection:
    """The events a reader asked for; empty sets mean every value. With ``metrics``, an event must
    carry at least one of them in its data, and ``keys`` gives only those."""

    runs: frozenset[str] = frozenset()
    ranks: frozenset[int] = frozenset()
    stages: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    since: float | None = None
    metrics: tuple[MetricName, ...] = ()

    def wants(self, ev: dict[str, Any]) -> bool:
        run, rank, stage = ev.get("run"), ev.get("rank"), ev.get("stage")
        kind, ts = ev.get("type"), ev.get("ts")
        if self.runs and not (type(run) is str and run in self.runs):
            return False
        if self.ranks and not (type(rank) is int and rank in self.ranks):
            return False
        if self.stages and not (type(stage) is str and stage in self.stages):
            return False
        if self.types and not (type(kind) is str and kind in self.types):
            return False
        if self.since is not None and not (isinstance(ts, (int, float)) and ts >= self.since):
            return False
        return not self.metrics or bool(self.keys(ev))

    def keys(self, ev: dict[str, Any]) -> list[str]:
        """The data keys of ``ev`` to show: all of them, or only the selected metrics."""
        data = ev.get("data")
        if type(data) is not dict:
            return []
        if not self.metrics:
            return list(data)
        stage = ev.get("stage")
        return [k for k in data if any(m.matches(stage, k) for m in self.metrics)]


def number(value: Any) -> float | None:
    """A journal value as a float: numbers, and the strings the journal writes for non-finite ones
    ("NaN", "Infinity", "-Infinity"); None for anything else (a bool is no number)."""
    kind = type(value)
    if kind is float or kind is int:
        return float(value)
    if kind is str:
        return NONFINITE_JSON.get(value)
    return None


def clock(ts: Any) -> str:
    """HH:MM:SS (local) of a journal ts; a journal written by an older relay may hold anything
    there."""
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"ts={str(ts)[:20]}"


def selection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The filter options of ``relay tail`` and ``relay plot`` (what ``selection`` takes)."""
    for option in reversed([
        click.option("--run", "runs", multiple=True, metavar="ID",
                     help="Only these run ids (repeatable)."),
        click.option("--rank", "ranks", multiple=True, type=click.IntRange(0, RELAY_RANK),
                     metavar="N",
                     help="Only these ranks (repeatable; the relay's own events have rank "
                          f"{RELAY_RANK})."),
        click.option("--stage", "stages", multiple=True, metavar="NAME",
                     help="Only these stages: train, eval, rank, cluster, ... (repeatable)."),
        click.option("--since", type=SinceType(), default=None,
                     help="Only events from then on: 10m, 2h, 30s, 1d, an ISO time or unix "
                          "seconds."),
    ]):
        func = option(func)
    return func


def selection(runs: tuple[str, ...] = (), ranks: tuple[int, ...] = (), stages: tuple[str, ...] = (),
              since: float | None = None, types: tuple[str, ...] = (),
              metrics: tuple[str, ...] = ()) -> Selection:
    """The Selection the options of ``selection_options`` (and ``--type``, ``--metric``) ask for."""
    return Selection(frozenset(runs), frozenset(ranks), frozenset(stages), frozenset(types), since,
                     tuple(MetricName.parse(m) for m in metrics))
