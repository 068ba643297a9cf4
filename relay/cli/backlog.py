"""``relay tail``'s first look at a journal: its last N events, or the lines of its last N steps,
read from the files' ends (relay/cli/backward.py), so the look costs what it shows, not the size of
the journal (docs/benchmarks.md has the figures).

The files' lines are merged newest first by their ``ts``; a line whose ts is not a number (a hand
edit, an older relay's "NaN") takes that of the line after it, so it stays where its file has it
(reading forwards, the whole journal, it takes that of the line before it: relay/cli/tail.py).

Steps: a step's line is made of several events (each rank's figures, the Trainer's log, the relay's
cluster figures, a straggler event that may come later), so the last steps are assembled from a
window of the newest events: a StepView fed from the middle of the journal marks the lines its
first events may have cut short (relay/cli/step_view.py, ``Row.certain``), and the window doubles
until every line shown is certain, or the window holds every file whole."""
from __future__ import annotations

import heapq
import math
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterator

from relay.cli.backward import Identity, lines_backwards
from relay.cli.step_view import Row, StepView
from relay.wire.lines import parse_line

#: Events per step shown that the first window reads (a two-rank job writes about 4 per logged step;
#: a job of more ranks, more: the window doubles until it holds the steps shown).
EVENTS_PER_STEP = 8

Keyed = tuple[float, dict[str, Any], bytes]  # (ts to merge by, event, its line)
Wanted = Callable[[dict[str, Any]], bool]


def newest_first(files: list[tuple[Path, int, Identity]], wanted: Wanted) -> Iterator[Keyed]:
    """The wanted lines of ``files`` (each read up to its end offset) newest first, parsed."""
    # Ties go to the later file, so that reversed this is the order a forward merge gives.
    streams = [_keyed(path, end, identity, wanted) for path, end, identity in reversed(files)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=itemgetter(0), reverse=True)


def _keyed(path: Path, end: int, identity: Identity, wanted: Wanted) -> Iterator[Keyed]:
    later = math.inf
    for raw in lines_backwards(path, end, identity):
        ev = parse_line(raw)
        if ev is None or not wanted(ev):
            continue
        ts = ev.get("ts")
        if type(ts) is int or (type(ts) is float and ts == ts):  # (bool is no time, NaN no order)
            later = ts
        yield later, ev, raw


def last_events(files: list[tuple[Path, int, Identity]], wanted: Wanted,
                last: int) -> list[tuple[dict[str, Any], bytes]]:
    """The last ``last`` wanted events of ``files``, oldest first."""
    picked = list(islice(newest_first(files, wanted), last))
    picked.reverse()
    return [(ev, raw) for _, ev, raw in picked]


def last_steps(files: list[tuple[Path, int, Identity]], wanted: Wanted, last: int,
               view: Callable[[bool], StepView], *, now: float, final: bool) -> tuple[StepView, list[Row]]:
    """The last ``last`` lines of the steps view of ``files``, and the view that made them (with
    the steps it still waits for, when following). ``view(from_middle)`` makes a fresh StepView."""
    stream = newest_first(files, wanted)
    window: list[Keyed] = []
    size = EVENTS_PER_STEP * (last + 2)
    while True:
        window.extend(islice(stream, size - len(window)))
        whole = len(window) < size  # every file read to its start
        steps = view(not whole)
        rows = [row for _, ev, _ in reversed(window) for row in steps.feed(ev, now)]
        rows += steps.ready(now, final=final, backlog=True)
        shown = rows[max(0, len(rows) - last):]
        if whole or (len(rows) >= last and all(row.certain for row in shown)):
            return steps, shown
        size *= 2
