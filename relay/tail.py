"""``relay tail``: a journal as one readable line per event, optionally following new writes.

A viewer for humans, so it shows every JSON object line as far as it can, also those the other
readers skip as not events (a hand edit, an older relay's "NaN" ts): nothing in a line stops it."""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson

from relay.journal import JournalReader


def format_event(ev: dict[str, Any]) -> str:
    """``HH:MM:SS run rank type stage step  k=v ...`` with short numbers."""
    when = _clock(ev.get("ts"))
    head = f"{when} {_short(ev.get('run'))} r{_short(ev.get('rank'))} {_short(ev.get('type'))}"
    if ev.get("stage"):
        head += f"/{_short(ev['stage'])}"
    if ev.get("step") is not None:
        head += f" step={_short(ev['step'])}"
    data = ev.get("data") or {}
    body = " ".join(f"{k}={_short(v)}" for k, v in data.items()) if isinstance(data, dict) else _short(data)
    return f"{head}  {body}"


def _clock(ts: Any) -> str:
    """HH:MM:SS of a unix time; a journal written by an older relay may hold anything there."""
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"ts={_short(ts)[:20]}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        try:
            text = orjson.dumps(value).decode()
        except orjson.JSONEncodeError:  # nested deeper than orjson writes (a line no relay wrote)
            return "[...]" if isinstance(value, list) else "{...}"
        return text if len(text) <= 80 else text[:77] + "..."
    return str(value)


def _sort_keys(events: list[dict[str, Any]]) -> list[float]:
    """Each event's ts to sort by; a line whose ts is not a number (a hand edit, an older relay's
    "NaN") takes the one of the line before it, so it stays where the file has it."""
    keys: list[float] = []
    last: float = 0
    for ev in events:
        ts = ev.get("ts")
        if type(ts) is int or (type(ts) is float and ts == ts):  # (bool is no time, NaN no order)
            last = ts
        keys.append(last)
    return keys


def tail_journal(path: Path, *, follow: bool, runs: set[str], types: set[str], last: int) -> None:
    if not path.exists():
        raise FileNotFoundError(path)

    def wanted(ev: dict[str, Any]) -> bool:  # --run and --type are strings: only a string matches
        run, kind = ev.get("run"), ev.get("type")
        return ((not runs or (type(run) is str and run in runs))
                and (not types or (type(kind) is str and kind in types)))

    reader = JournalReader(path, restore=False, lenient=True)  # shown as written: "NaN" stays a string
    backlog = [ev for ev in reader.read() if wanted(ev)]
    keys = _sort_keys(backlog)
    backlog = [backlog[i] for i in sorted(range(len(backlog)), key=keys.__getitem__)]  # stable
    for ev in backlog[-last:] if last > 0 else []:
        click.echo(format_event(ev))
    while follow:
        time.sleep(0.2)
        for ev in reader.read():  # complete new lines of every file, new run files included
            if wanted(ev):
                click.echo(format_event(ev))
