"""``relay runs``: each run of a journal in one line (docs/watching.md, "Every run of a journal").

Nothing is parsed whole: a run file is read a chunk at a time and its relay-written lines counted by
their bytes, as the relay writes them, in C; only its first line, its last ``train_end`` and up to
LAST_LINES last lines are parsed. A file of several runs is read once, each line's run taken from
its head.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from relay.cli.backward import lines_backwards
from relay.cli.columns import Column, Layout, fit
from relay.cli.filters import number
from relay.daemon.status import cut
from relay.journal.reader import journal_files
from relay.wire.lines import parse_line

#: A run with no train_end whose journal was written this recently is running; else unfinished.
RUNNING_S = 300.0
#: Lines read back from a run's end for its last step (past them: "-").
LAST_LINES = 10_000

_HEAD = b'{"v":1,"run":'  # how every line the relay writes starts (sinks.events.FIELDS order)
_BEGIN, _END = b'"event":"train_begin"', b'"event":"train_end"'
_STRAGGLER, _LOST = b'"event":"straggler"', b'"event":"rank_lost"'
_CONFLICT = b'"event":"conflict"'  # the relay refused a second writer of one of its streams
_LOSS = b'"loss":'
_EVENT = b'"event":"'
_FINDINGS = (_BEGIN, _END, _STRAGGLER, _LOST, _CONFLICT)
_CHUNK = 8 << 20
#: Bytes read on each side of a finding for its line (a line is at most schema.MAX_LINE_BYTES).
_WINDOW = 1 << 20


@dataclass
class RunSummary:
    run: str
    file: str
    start: float | None  # ts of its first event
    end: float | None  # ts of its last
    #: conflict (a second writer was refused), else train_end's status (completed, failed ...),
    #: else running or unfinished
    status: str
    attempts: int  # train_begin events (torchrun restarts, resumed jobs)
    ranks: int | None  # world size
    last_step: int | None
    last_loss: float | None  # the Trainer's (stage train)
    stragglers: int  # the relay's straggler findings (episodes)
    lost_ranks: int  # ... and rank_lost ones
    stale: bool = False  # read only from partition views their consuming relays no longer hold
    conflicts: int = 0  # second writers the relay refused (docs/protocol.md)
    straggler_rank: int | None = None  # the last straggler named ...
    straggler_cost: float | None = None  # ... what it cost the job: a fraction of its time per step
    straggler_cost_s: float | None = None  # ... and seconds a step


def summarize(path: Path, now: float | None = None) -> list[RunSummary]:
    """Every run of the journal at ``path`` (a file or a directory of run files), by start time."""
    now = time.time() if now is None else now
    found = [summary for file in journal_files(path) for summary in _file(file, now)]
    return sorted(found, key=lambda s: (s.start is None, s.start or 0.0, s.run))


def _file(file: Path, now: float) -> list[RunSummary]:
    try:
        fh = open(file, "rb")  # noqa: SIM115 (closed by the with below; this try is open's alone)
    except OSError:  # gone since it was listed, or unreadable
        return []
    with fh:
        first = _event(fh.readline())
        if first is None:
            return _shared(file, fh, now)
        scan = _Scan(fh, _HEAD + orjson.dumps(first["run"]) + b",")
        # (a blank line, a hand edit or another run: read it line by line)
        if scan.heads != scan.lines:
            return _shared(file, fh, now)
        counts = scan.counts
        found = _Found(first, counts[_BEGIN], counts[_STRAGGLER], counts[_LOST], counts[_CONFLICT])
        if scan.last[_END] > scan.last[_BEGIN]:
            found.end_line = _line_at(fh, scan.last[_END])
        if scan.last[_STRAGGLER] >= 0:
            found.straggler_line = _line_at(fh, scan.last[_STRAGGLER])
        tail = (ev for raw in islice(lines_backwards(file), LAST_LINES)
                if (ev := _event(raw)) is not None)
        return [found.summary(file, now, tail)]


def _event(line: bytes) -> dict[str, Any] | None:
    """The event on ``line``, if it is one a relay could have written."""
    ev = parse_line(line)
    return ev if ev is not None and type(ev.get("run")) is str else None


def _line_at(fh: BinaryIO, pos: int) -> dict[str, Any] | None:
    """The event on the line that holds byte ``pos`` of the file."""
    start = max(0, pos - _WINDOW)
    window = os.pread(fh.fileno(), 2 * _WINDOW, start)
    begin = window.rfind(b"\n", 0, pos - start) + 1
    stop = window.find(b"\n", pos - start)
    return _event(window[begin:stop if stop >= 0 else len(window)])


class _Scan:
    """One pass over a file's bytes, a chunk at a time (memory: one chunk): its lines, the lines
    that start with ``head`` (the run's own), and how often each finding (``"event":"straggler"``
    and the like) occurs and where last. Three scans of each chunk in C: newlines, heads, and
    ``"event":"``, whose few places are looked at one by one."""

    def __init__(self, fh: BinaryIO, head: bytes) -> None:
        self.counts = dict.fromkeys(_FINDINGS, 0)
        self.last = dict.fromkeys(_FINDINGS, -1)
        self.lines = self.heads = 0
        longest = max(len(head), *map(len, _FINDINGS))
        fh.seek(0)
        pos, carry, ends_in_newline = 0, b"", True
        while chunk := fh.read(_CHUNK):
            data = carry + chunk  # (a needle cut by the previous chunk's end is whole here)
            # what starts and ends before ``seen`` was counted already
            base, seen = pos - len(carry), len(carry)
            self.lines += chunk.count(b"\n")
            self.heads += data.count(head, max(0, seen - len(head) + 1))
            at = data.find(_EVENT, max(0, seen - longest + 1))
            while at >= 0:
                for finding in _FINDINGS:
                    if data.startswith(finding, at) and at + len(finding) > seen:
                        self.counts[finding] += 1
                        self.last[finding] = base + at
                at = data.find(_EVENT, at + 1)
            pos += len(chunk)
            carry = data[-(longest - 1):]
            ends_in_newline = chunk.endswith(b"\n")
        self.lines += pos > 0 and not ends_in_newline


class _Found:
    """What is known of one run: its first event, counts, and the lines that say its end, last step
    and last train loss."""

    def __init__(self, first: dict[str, Any], attempts: int = 0, stragglers: int = 0, lost: int = 0,
                 conflicts: int = 0) -> None:
        self.first = first
        self.attempts, self.stragglers, self.lost = attempts, stragglers, lost
        self.conflicts = conflicts
        self.end_line: dict[str, Any] | None = None
        self.straggler_line: dict[str, Any] | None = None  # the last straggler finding
        # where its last line, step and train loss are (shared file)
        self.last_at = self.step_at = self.loss_at = -1

    def summary(self, file: Path, now: float, tail: Iterator[dict[str, Any]]) -> RunSummary:
        """The line about the run, its last step, train loss and size from ``tail`` (its events,
        newest first)."""
        last: dict[str, Any] | None = None
        step = ranks = loss = None
        for ev in tail:
            if ev.get("run") != self.first["run"]:
                continue
            last = last or ev
            if ranks is None and type(ev.get("world_size")) is int:
                ranks = ev["world_size"]
            if ev.get("type") == "metrics" and type(ev.get("step")) is int:
                step = ev["step"] if step is None else step
                if loss is None and ev.get("stage") == "train":
                    loss = number((ev.get("data") or {}).get("loss"))
            if step is not None and loss is not None:
                break
        end_ts = number((last or self.first).get("ts"))
        if self.end_line is not None:
            status = str((self.end_line.get("data") or {}).get("status", "ended"))
        else:
            status = "running" if end_ts is not None and now - end_ts < RUNNING_S else "unfinished"
        if self.conflicts:
            status = "conflict"
        world = self.first.get("world_size")
        named = (self.straggler_line or {}).get("data") or {}
        rank = named.get("rank") if type(named.get("rank")) is int else None
        if ranks is None and type(world) is int:
            ranks = world
        return RunSummary(self.first["run"], str(file), number(self.first.get("ts")), end_ts,
                          status, self.attempts, ranks, step, loss,
                          self.stragglers, self.lost, conflicts=self.conflicts, straggler_rank=rank,
                          straggler_cost=number(named.get("cost")),
                          straggler_cost_s=number(named.get("cost_s")))


def _shared(file: Path, fh: BinaryIO, now: float) -> list[RunSummary]:
    """The runs of a file that holds several, read once line by line; a line's run from its head."""
    runs: dict[bytes, _Found] = {}
    fh.seek(0)
    pos = 0
    for line in fh:
        at, pos = pos, pos + len(line)
        key = line[len(_HEAD):line.find(b",", len(_HEAD))] if line.startswith(_HEAD) else None
        found = runs.get(key) if key is not None else None
        if found is None:
            ev = _event(line)
            if ev is None:
                continue
            found = runs.setdefault(key if key is not None else orjson.dumps(ev["run"]), _Found(ev))
        found.last_at = at
        if b'"type":"lifecycle"' in line:
            found.attempts += _BEGIN in line
            if _STRAGGLER in line:
                found.stragglers += 1
                found.straggler_line = _event(line)
            found.lost += _LOST in line
            found.conflicts += _CONFLICT in line
            if _BEGIN in line:
                found.end_line = None
            elif _END in line:
                found.end_line = _event(line)
        elif b'"type":"metrics"' in line:
            found.step_at = at
            if _LOSS in line and b'"stage":"train"' in line:
                found.loss_at = at
    def telling(found: _Found) -> Iterator[dict[str, Any]]:
        """Its last line, last step and last train loss, newest first."""
        places = sorted({found.last_at, found.step_at, found.loss_at}, reverse=True)
        return (ev for at in places if at >= 0 and (ev := _line_at(fh, at)) is not None)

    return [found.summary(file, now, telling(found)) for found in runs.values()]


def as_json(summaries: list[RunSummary]) -> bytes:
    return orjson.dumps([asdict(s) for s in summaries],
                        option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def table(summaries: list[RunSummary], width: int | None) -> list[str]:
    """The listing, one line per run, fitted to ``width``."""
    rows = [{"run": s.run, "start": _when(s.start), "status": s.status + " (stale)" * s.stale,
             "attempts": str(s.attempts),
             "ranks": "-" if s.ranks is None else str(s.ranks),
             "step": "-" if s.last_step is None else str(s.last_step),
             "loss": "-" if s.last_loss is None else f"{s.last_loss:.4g}",
             "stragglers": str(s.stragglers), "lost": str(s.lost_ranks),
             "costliest": _costliest(s)} for s in summaries]
    runs = max([len(r["run"]) for r in rows] + [3])
    status = Column("status", "status", max([len(r["status"]) for r in rows] + [9]), left=True)
    counts = (Column("step", "step", 8), Column("loss", "loss", 9),
              Column("stragglers", "stragglers", 10), Column("lost", "lost", 4))
    every = (Column("start", "start", 16, left=True), status, Column("attempts", "attempts", 8),
             Column("ranks", "ranks", 5), *counts,
             Column("costliest", "last straggler", 21, left=True))
    few = (status, *counts[:2], Column("stragglers", "strag", 5), counts[3])  # a narrow terminal's
    layout = fit([Layout((Column("run", "run", runs, left=True), *every)),
                  Layout((Column("run", "run", runs, left=True), *every), " "),
                  *(Layout((Column("run", "run", min(runs, shown), left=True), *few), " ")
                    for shown in (runs, 32, 20))],
                 width)
    run_width = layout.columns[0].width
    return [cut(layout.header(), width).rstrip()] + [
        cut(layout.line({**row, "run": cut(row["run"], run_width)}), width).rstrip()
        for row in rows]


def _costliest(s: RunSummary) -> str:
    """The last straggler named and what it cost the job (``r1 31% 0.15 s/step``)."""
    if s.straggler_rank is None:
        return "-"
    cost = "" if s.straggler_cost is None else f" {s.straggler_cost:.0%}"
    seconds = "" if s.straggler_cost_s is None else f" {s.straggler_cost_s:.2f} s/step"
    return f"r{s.straggler_rank}{cost}{seconds}"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts is not None else "-"
