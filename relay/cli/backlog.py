"""``relay tail``'s first look at a journal: its last N events, or the lines of its last N steps,
read from the files' ends, so the look costs what it shows (docs/watching.md, "One line per step").

A line whose ts is not a number takes that of the line after it, so it stays where its file has it
(reading forwards, relay/cli/tail.py, it takes that of the line before). The steps window doubles
until every line shown is certain (``Row.certain``: relay/cli/step_view.py), or holds every file.
"""
from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from operator import itemgetter
from typing import Any

from relay.cli.backward import lines_from, placed_lines_backwards
from relay.cli.follow import Ending
from relay.cli.step_view import Row, StepView
from relay.wire.lines import parse_line

#: Seconds an event's time may be past its file's last write (the ranks' clocks against the
#: relay's), for which a file written before the newest line found so far is still opened.
CLOCK_SLACK_S = 300.0
#: Events per step shown that the first window reads (a two-rank job writes about 4 per logged step;
#: a job of more ranks, more: the window doubles until it holds the steps shown).
EVENTS_PER_STEP = 8

Keyed = tuple[float, dict[str, Any], bytes]  # (ts to merge by, event, its line)
# ... and its file's index in the list, its offset there
Placed = tuple[float, dict[str, Any], bytes, int, int]
Wanted = Callable[[dict[str, Any]], bool]
#: Events a steps view is fed between two looks for the steps now complete (which then leave
#: memory).
FEED_CHUNK = 4096


def newest_first(files: list[Ending], wanted: Wanted) -> Iterator[Placed]:
    """The wanted lines of ``files`` (each read up to its end offset) newest first, parsed, each
    with where it is. Files are opened newest first (by when they were last written) and only while
    one may hold a line newer than the newest not yet given: a directory of thousands of old runs
    beside a live one costs a look at each file's size and time, not a read of each."""
    waiting = sorted(range(len(files)), key=lambda i: files[i].mtime, reverse=True)
    heap: list[tuple[float, int, int, dict[str, Any], bytes, int,
                     Iterator[tuple[float, dict[str, Any], bytes, int]]]] = []
    order = 0

    def push(index: int, stream: Iterator[tuple[float, dict[str, Any], bytes, int]]) -> None:
        nonlocal order
        item = next(stream, None)
        # ties: the later file first, so that reversed this is a forward merge's order
        if item is not None:
            order += 1
            heapq.heappush(heap, (-item[0], -index, order, item[1], item[2], item[3], stream))

    while True:
        while waiting and (not heap or files[waiting[0]].mtime + CLOCK_SLACK_S >= -heap[0][0]):
            index = waiting.pop(0)
            push(index, _keyed(files[index], wanted))
        if not heap:
            return
        key, index, _, ev, raw, offset, stream = heapq.heappop(heap)
        yield -key, ev, raw, -index, offset
        push(-index, stream)


def _keyed(file: Ending, wanted: Wanted) -> Iterator[tuple[float, dict[str, Any], bytes, int]]:
    later = math.inf
    for offset, raw in placed_lines_backwards(file.path, file.end, file.identity):
        ev = parse_line(raw)
        if ev is None or not wanted(ev):
            continue
        ts = ev.get("ts")
        if type(ts) is int or (type(ts) is float and ts == ts):  # (bool is no time, NaN no order)
            later = ts
        yield later, ev, raw, offset


def ts_keys(events: Iterable[tuple[dict[str, Any], bytes]]) -> Iterator[Keyed]:
    """Each line, read forwards, with its ts to merge by; a line whose ts is not a number (a hand
    edit, an older relay's "NaN") takes the one of the line before it, so it stays where the file
    has it."""
    last: float = 0
    for ev, raw in events:
        ts = ev.get("ts")
        if type(ts) is int or (type(ts) is float and ts == ts):  # (bool is no time, NaN no order)
            last = ts
        yield last, ev, raw


def parsed(lines: Iterable[bytes], wanted: Wanted) -> Iterator[tuple[dict[str, Any], bytes]]:
    """The lines that are JSON objects ``wanted`` takes, parsed, with their bytes."""
    for raw in lines:
        ev = parse_line(raw)
        if ev is not None and wanted(ev):
            yield ev, raw


def last_events(files: list[Ending], wanted: Wanted,
                last: int) -> list[tuple[dict[str, Any], bytes]]:
    """The last ``last`` wanted events of ``files``, oldest first."""
    picked = list(islice(newest_first(files, wanted), last))
    picked.reverse()
    return [(ev, raw) for _, ev, raw, _, _ in picked]


def last_steps(files: list[Ending], wanted: Wanted, last: int,
               view: Callable[[bool], StepView], *, now: float,
               final: bool) -> tuple[StepView, list[Row]]:
    """The last ``last`` lines of the steps view of ``files``, and the view that made them (with
    the steps it still waits for, when following). ``view(from_middle)`` makes a fresh StepView.

    Memory stays the same whatever ``last``: the window of newest events is read from the files'
    ends only to learn where in each file it begins (nothing of it is kept), then read again
    forwards from there, fed to the view a chunk at a time, and only the last ``last`` lines
    kept."""
    stream = newest_first(files, wanted)
    starts: dict[int, int] = {}  # file index -> offset of the oldest line of the window in it
    taken, size = 0, EVENTS_PER_STEP * (last + 2)
    while True:
        for _, _, _, index, offset in islice(stream, size - taken):
            starts[index] = offset
            taken += 1
        whole = taken < size  # every file read to its start
        steps = view(not whole)
        shown: collections.deque[Row] = collections.deque(maxlen=last)
        lines = 0
        window = heapq.merge(*(ts_keys(parsed(lines_from(files[i].path, start, files[i].end,
                                                         files[i].identity),
                                                wanted)) for i, start in sorted(starts.items())),
                             key=itemgetter(0))
        for count, (_, ev, _) in enumerate(window, 1):
            rows = steps.feed(ev, now)
            if count % FEED_CHUNK == 0:
                rows += steps.ready(now, backlog=True)
            shown.extend(rows)
            lines += len(rows)
        rows = steps.ready(now, final=final, backlog=True)
        shown.extend(rows)
        lines += len(rows)
        if whole or (lines >= last and all(row.certain for row in shown)):
            return steps, list(shown)
        size *= 2
