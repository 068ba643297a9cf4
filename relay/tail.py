"""``relay tail``: a journal as one readable line per event, optionally following new writes."""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import click
import orjson

from sinks.jsonl import journal_files


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

    readers = {p: _Reader(p) for p in journal_files(path)}
    backlog = [ev for r in readers.values() for ev in r.read() if wanted(ev)]
    backlog.sort(key=lambda ev: ev.get("ts", 0))
    for ev in backlog[-last:] if last > 0 else []:
        click.echo(format_event(ev))
    while follow:
        time.sleep(0.2)
        for p in journal_files(path):
            readers.setdefault(p, _Reader(p))
        for reader in readers.values():
            for ev in reader.read():
                if wanted(ev):
                    click.echo(format_event(ev))


class _Reader:
    """Reads complete new lines of one file; a partial last line waits for its newline."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""

    def read(self) -> Iterator[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        data = self.rest + chunk
        *lines, self.rest = data.split(b"\n")
        for line in lines:
            try:
                ev = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(ev, dict):
                yield ev
