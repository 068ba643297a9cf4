"""The viewers given the fleet's folders (docs/deployment.md, "Reading a run from the fleet").

The views are read in order rather than written in order (relay/journal/fleet_views.py says why):
each run's lines from every view go into a private temporary journal folder (``FleetMirror``, which
relay/cli/fleet_stream.py shares), which the viewer then reads as any journal; ``relay tail -f``
then follows the views themselves.
"""

from __future__ import annotations

import abc
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from relay.cli.follow import Follower
from relay.cli.runs import RunSummary, summarize
from relay.cli.tail import Tail
from relay.journal.fleet_views import (
    FRESH_S,
    Key,
    View,
    is_fleet,
    is_relay_root,
    key_of,
    ordered_lines,
    read_stats,
    run_files,
    unseen,
    views,
)


def wanted(paths: list[Path], several: bool = True) -> bool:
    """Whether the viewer reads ``paths`` through FleetRead: a fleet folder among them, or
    (``several``) more than one journal, read as one."""
    return is_fleet(paths) or (several and len(paths) > 1)


_Mirror = TypeVar("_Mirror", bound="FleetMirror")


class FleetMirror(abc.ABC):
    """Runs' lines in order in ``folder``, a private temporary journal folder a viewer reads as any
    journal, until ``close()``; ``seen`` holds their keys so that ``fresh`` gives each line once."""

    def __init__(self, prefix: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        self.seen: set[Key] = set()

    def put(self, run: str, lines: list[bytes], remember: bool = True) -> None:
        if remember:
            self.seen.update(key for line in lines if (key := key_of(line)) is not None)
        (self.folder / f"{run}.jsonl").write_bytes(b"".join(lines))

    @abc.abstractmethod
    def fresh(self) -> Iterator[bytes]:
        """The lines committed since the last look that were not seen yet."""

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self: _Mirror) -> _Mirror:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class FleetRead(FleetMirror):
    """The runs of ``paths`` in order. ``follow``: followers of every folder given, placed at their
    ends before the runs were read, so ``fresh`` gives what is committed after, each line once."""

    def __init__(self, paths: list[Path], follow: bool = False) -> None:
        self.paths = paths
        self.views: list[View] = views(paths)
        self.sources = run_files(paths, self.views)
        followed = [v.folder for v in self.views] + [p for p in paths if not is_fleet([p])]
        self.followers = [Follower(folder) for folder in followed] if follow else []
        for follower in self.followers:
            follower.skip_to_end()
        super().__init__("relay-fleet-")
        try:
            for run, files in self.sources.items():
                self.put(run, ordered_lines(files), remember=follow)
        except BaseException:
            self.close()
            raise

    def notes(self) -> list[str]:
        """One line per view whose relay does not hold it (and no other view given holds it)."""
        return [view.note for view in self.views if view.note]

    def stale(self, run: str) -> bool:
        """Whether ``run`` was read only from stale views."""
        noted = {view.folder for view in self.views if view.note}
        files = self.sources.get(run, [])
        return bool(files) and all(file.parent in noted for file in files)

    def summaries(self) -> list[RunSummary]:
        """``relay runs``'s summaries: the files each run was read from, stale ones marked."""
        found = summarize(self.folder)
        for summary in found:
            summary.file = ", ".join(map(str, self.sources.get(summary.run, [])))
            summary.stale = self.stale(summary.run)
        return found

    def fresh(self) -> Iterator[bytes]:
        for follower in self.followers:
            for _, lines in follower.poll():
                yield from (line for line, _ in unseen(lines, self.seen))

    def close(self) -> None:
        for follower in self.followers:
            follower.close()
        super().close()


class FleetTail(Tail):
    """``relay tail`` over a FleetMirror: the first look at the runs in order, then (``-f``) each
    line committed since, once, as it comes."""

    def __init__(self, read: FleetMirror, *args: Any, **kwargs: Any) -> None:
        super().__init__(read.folder, *args, **kwargs)
        self.read = read

    def _fresh_lines(self) -> Iterator[bytes]:
        return self.read.fresh()


def status_lines(path: Path, now: float | None = None, as_json: bool = False) -> list[str]:
    """``relay status`` of a consuming relay's folder (or one of its views): who it is, the
    partitions it holds, and per view its runs with their last step, stale views said so;
    ``as_json``: its stats file as JSON."""
    now = time.time() if now is None else now
    root = path if is_relay_root(path) else path.parent
    snap = read_stats(root)
    if as_json:
        return [json.dumps(snap, indent=1, sort_keys=True)]
    found = views([path], now)
    if snap:
        age = now - snap["ts"]
        held = ", ".join(map(str, snap.get("held") or [])) or "none"
        of = f" of {snap['partitions_total']}" if snap.get("partitions_total") else ""
        state = "stopped" if snap.get("final") else "running" if age < FRESH_S else "not running"
        out = [f"consuming relay {snap.get('name')} (pid {snap.get('pid')}, {state}, stats file "
               f"written {age:.0f} s ago): holds partitions {held}{of}; "
               f"{snap.get('errors', 0)} errors"]
    else:
        out = [f"{root}: no consuming relay's stats file (_relay_consume_NAME.json) here"]
    parts = snap.get("partitions") or {}
    for view in found:
        with FleetRead([view.folder]) as read:
            runs = ", ".join(_run_words(s) for s in read.summaries()) or "none"
        counts = parts.get(str(view.partition)) or {}
        if view.held:
            extra = (f"; position {view.position}, {counts.get('pending', 0)} pending, "
                     f"lag {counts.get('lag_s', 0)} s")
        else:
            extra = f" ({view.note or f'{view.holder} holds it'})"
        out.append(f"p{view.partition} {'held' if view.held else 'stale'}: runs {runs}{extra}")
    return out


def _run_words(summary: RunSummary) -> str:
    step = "-" if summary.last_step is None else summary.last_step
    return f"{summary.run} step {step} ({summary.status})"
