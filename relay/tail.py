"""``relay tail``: a journal as one readable line per event, optionally following new writes."""
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
    head = f"{when} {ev.get('run')} r{ev.get('rank')} {ev.get('type')}"
    if ev.get("stage"):
        head += f"/{ev['stage']}"
    if ev.get("step") is not None:
        head += f" step={ev['step']}"
    data = ev.get("data") or {}
    body = " ".join(f"{k}={_short(v)}" for k, v in data.items()) if isinstance(data, dict) else str(data)
    return f"{head}  {body}"


def _clock(ts: Any) -> str:
    """HH:MM:SS of a unix time; a journal written by an older relay may hold anything there."""
    try:
        return datetime.fromtimestamp(float(ts)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"ts={str(ts)[:20]}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        text = orjson.dumps(value).decode()
        return text if len(text) <= 80 else text[:77] + "..."
    return str(value)


def tail_journal(path: Path, *, follow: bool, runs: set[str], types: set[str], last: int) -> None:
    if not path.exists():
        raise FileNotFoundError(path)

    def wanted(ev: dict[str, Any]) -> bool:
        return (not runs or ev.get("run") in runs) and (not types or ev.get("type") in types)

    reader = JournalReader(path, restore=False)  # shown as written: "NaN" stays a string
    backlog = [ev for ev in reader.read() if wanted(ev)]
    backlog.sort(key=lambda ev: ev.get("ts", 0))
    for ev in backlog[-last:] if last > 0 else []:
        click.echo(format_event(ev))
    while follow:
        time.sleep(0.2)
        for ev in reader.read():  # complete new lines of every file, new run files included
            if wanted(ev):
                click.echo(format_event(ev))
