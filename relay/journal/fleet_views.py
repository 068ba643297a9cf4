"""The fleet's journal as readers see it: a consuming relay's folder, or several, read as one
journal (docs/deployment.md, "Reading a run from the fleet"; why views are read in order:
"Views are read in order, not written in order").

``ordered_lines`` takes a run's lines from every view given, each (run, rank, seq) once, and lays
each rank's lines in sequence order into the places that rank's lines take, so a view already in
order reads exactly as written. ``views`` says, for each partition view, whether its relay holds it
now and, when it does not, the one line a viewer prints.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.journal.reader import journal_files
from relay.wire.lines import parse_line

STATS_PREFIX = "_relay_consume_"  # + <name>.json: a consuming relay's stats file under its --path
VIEW_STATE = "_relay_view.json"  # in p<k>/: the view's position in the central journal
#: Seconds since its last stats write within which a consuming relay is taken to be running (it
#: writes them every second).
FRESH_S = 15.0
_PARTITION = re.compile(r"^p(\d+)$")

Key = tuple[str, int, int]


def _stats_files(root: Path) -> list[Path]:
    return sorted(root.glob(f"{STATS_PREFIX}*.json"))


def is_view(path: Path) -> bool:
    """A partition view: ``p<k>/`` with its position file, or under a consuming relay's folder."""
    return (
        _PARTITION.match(path.name) is not None  # (first: thousands of run files cost no stat)
        and path.is_dir()
        and ((path / VIEW_STATE).exists() or bool(_stats_files(path.parent)))
    )


def is_relay_root(path: Path) -> bool:
    """A consuming relay's ``--path``: a folder with its stats file or partition views."""
    return path.is_dir() and (bool(_stats_files(path)) or any(is_view(p) for p in path.iterdir()))


def is_fleet(paths: Iterable[Path]) -> bool:
    """Whether any of ``paths`` is a consuming relay's folder or one of its partition views."""
    return any(is_relay_root(p) or is_view(p) for p in paths)


@dataclass
class View:
    """One partition view, and what its relay's stats file says of it."""

    folder: Path
    partition: int
    relay: str | None  # the consuming relay whose folder it is (None: no stats file found)
    position: int  # the central journal's last commit it holds
    held: bool  # its relay holds the partition now
    running: bool  # its relay wrote its stats file within FRESH_S
    holder: str | None  # who holds the partition, as far as known
    as_of: float | None  # when the relay last wrote its stats (unix time)
    note: str = ""  # when not held: the line a viewer prints

    def runs(self) -> list[str]:
        return [file.stem for file in journal_files(self.folder)]


def read_stats(root: Path) -> dict[str, Any]:
    """The newest consuming relay's stats file under ``root`` (one relay writes a folder at a time:
    its journal locks), or {}."""
    newest: dict[str, Any] = {}
    for path in _stats_files(root):
        try:
            snap = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(snap, dict)
            and isinstance(snap.get("ts"), (int, float))
            and snap["ts"] >= newest.get("ts", float("-inf"))
        ):
            newest = snap
    return newest


def views(paths: Iterable[Path], now: float | None = None) -> list[View]:
    """Every partition view ``paths`` stand for (a consuming relay's folder: each of its ``p<k>/``),
    with a note on each that its relay does not hold now and that no other view given holds."""
    now = time.time() if now is None else now
    found: list[View] = []
    for path in paths:
        folders = (
            [path]
            if is_view(path)
            else sorted(p for p in path.iterdir() if is_view(p))
            if path.is_dir()
            else []
        )
        for folder in folders:
            found.append(_view(folder, read_stats(folder.parent), now))
    held = {v.partition: v for v in found if v.held}
    for view in found:
        if not view.held and view.partition not in held:
            view.note = _note(view)
        elif not view.held:
            view.holder = held[view.partition].relay
    return found


def _view(folder: Path, stats: dict[str, Any], now: float) -> View:
    k = int(_PARTITION.match(folder.name).group(1))  # type: ignore[union-attr]  # (a view's name)
    try:
        position = int(json.loads((folder / VIEW_STATE).read_text()).get("position", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        position = 0
    ts = stats.get("ts")
    running = isinstance(ts, (int, float)) and now - ts < FRESH_S and not stats.get("final")
    held = running and k in (stats.get("held") or [])
    holder = (stats.get("holders") or {}).get(str(k))
    return View(
        folder,
        k,
        stats.get("name"),
        position,
        held,
        running,
        holder if isinstance(holder, str) else None,
        ts if isinstance(ts, (int, float)) else None,
    )


def _note(view: View) -> str:
    """One line: this view's relay does not hold its partition, who does, what to read instead."""
    when = time.strftime("%H:%M:%S", time.localtime(view.as_of)) if view.as_of is not None else None
    who = view.relay or "its consuming relay"
    if view.relay is None:
        state = "no consuming relay's stats file beside it says who holds it"
    elif view.running:
        state = f"{who} no longer holds partition {view.partition}"
    else:
        state = (
            f"{who} is not running (its last stats at {when})" if when else f"{who} is not running"
        )
    if view.holder and view.holder not in ("?", view.relay):
        state += f"; {view.holder} holds it (as {who} read the leases at {when})"
    elif view.running and view.holder is None:  # (``?``: the leases could not be read)
        state += "; no relay holds it now"
    return (
        f"{view.folder} is a stale view of partition {view.partition}: {state}; it may lack the "
        f"partition's latest lines: give the holder's folder too (every consuming relay's folder "
        f"reads each run whole)"
    )


def run_files(paths: Iterable[Path], found: list[View]) -> dict[str, list[Path]]:
    """Each run's files among the views (and plain journal folders or files) given: run -> files."""
    groups: dict[str, list[Path]] = {}
    fleet = {v.folder for v in found}
    for view in found:
        for file in journal_files(view.folder):
            groups.setdefault(file.stem, []).append(file)
    for path in paths:
        if path in fleet or is_relay_root(path) or not path.exists():
            continue
        for file in journal_files(path):
            groups.setdefault(file.stem, []).append(file)
    return groups


def key_of(line: bytes) -> Key | None:
    """(run, rank, seq) of an event line; None for a line that is not one."""
    ev = parse_line(line)
    if ev is None:
        return None
    run, rank, seq = ev.get("run"), ev.get("rank"), ev.get("seq")
    return (run, rank, seq) if type(run) is str and type(rank) is int and type(seq) is int else None


def unseen(lines: Iterable[bytes], seen: set[Key]) -> Iterator[tuple[bytes, Key | None]]:
    """Each of ``lines`` with its (run, rank, seq) but those ``seen`` holds, which takes each new
    one; a line that is no event always (its key None)."""
    for line in lines:
        key = key_of(line)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        yield line, key


def ordered_lines(files: list[Path]) -> list[bytes]:
    """The whole lines of ``files`` (views of the same runs) ``in_order``; the largest file's order
    is the base (the most complete view), the others add what it lacks."""
    def whole(file: Path) -> list[bytes]:
        data = file.read_bytes()
        return data[: data.rfind(b"\n") + 1].splitlines(keepends=True)

    ordered = sorted(files, key=lambda f: f.stat().st_size, reverse=True)
    return in_order(line for file in ordered for line in whole(file))


def in_order(given: Iterable[bytes]) -> list[bytes]:
    """``given`` lines each (run, rank, seq) once (the first), each rank's in sequence order in the
    places that rank's lines take. A line that is no event keeps its place."""
    lines: list[bytes] = []
    keys: list[Key | None] = []
    for line, key in unseen(given, set()):
        lines.append(line)
        keys.append(key)
    places: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            places.setdefault(key[:2], []).append(i)
    out = list(lines)
    for slots in places.values():
        by_seq = sorted(slots, key=lambda i: keys[i][2])  # type: ignore[index]
        for slot, source in zip(slots, by_seq, strict=True):
            out[slot] = lines[source]
    return out
