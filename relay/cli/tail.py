"""``relay tail``: a journal for humans, or for ``jq`` with ``--json`` (docs/relay.md, "Watching a
journal: relay tail").

A viewer, so it shows every JSON object line as far as it can, also those other readers skip as not
events: nothing in a line stops it.
"""
from __future__ import annotations

import heapq
import select
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from relay.cli.backlog import last_events, last_steps, parsed, ts_keys
from relay.cli.columns import terminal_width
from relay.cli.filters import Selection, clock
from relay.cli.follow import Follower
from relay.cli.step_view import Row, StepView
from sinks.events import RELAY_RANK

#: Seconds between two looks at the journal when following.
POLL_S = 0.2
_TYPE_COLOURS = {"lifecycle": "yellow", "params": "blue", "hello": "bright_black",
                 "stats": "bright_black"}
_ALARMS = ("straggler", "rank_lost")


def format_event(ev: dict[str, Any], keys: Iterable[str] | None = None, color: bool = False) -> str:
    """``HH:MM:SS run rank type/stage step=S  k=v ...`` with short numbers; only ``keys`` of the
    data when given; the relay's own events show as rank ``relay``."""
    rank = ev.get("rank")
    who = "relay" if rank == RELAY_RANK and type(rank) is int else f"r{_short(rank)}"
    kind = _short(ev.get("type")) + (f"/{_short(ev['stage'])}" if ev.get("stage") else "")
    data = ev.get("data")
    if isinstance(data, dict):
        shown = list(data) if keys is None else keys
        body = " ".join(f"{k}={_short(data[k])}" for k in shown)
        alarm = data.get("event") in _ALARMS
    else:
        body, alarm = _short(data), False
    step = f" step={_short(ev['step'])}" if ev.get("step") is not None else ""
    if not color:
        return f"{clock(ev.get('ts'))} {_short(ev.get('run'))} {who} {kind}{step}  {body}"
    colour = ("red" if alarm else "cyan" if who == "relay"
              else _TYPE_COLOURS.get(ev.get("type")))  # type: ignore[arg-type]
    return (f"{click.style(clock(ev.get('ts')), dim=True)} {_short(ev.get('run'))} {who} "
            f"{click.style(kind, fg=colour, bold=alarm)}{step}  {body}")


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


def reader_gone(stream: TextIO, wait: float) -> bool:
    """Wait up to ``wait`` seconds; True as soon as the reader of ``stream`` has gone (``| head``
    exited, the terminal hung up). A closed pipe is otherwise noticed only by the next write, which
    a quiet journal may never make; GNU ``tail -f`` watches its output the same way."""
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):  # not a real file (captured output): just wait
        time.sleep(wait)
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: only POLLERR / POLLHUP / POLLNVAL come back
    return bool(poller.poll(wait * 1000))


class Tail:
    """One ``relay tail``: what to show (``selection``), how (``view``: events or steps;
    ``as_json``: the lines as written), and where (stdout, styled when ``color``)."""

    def __init__(self, path: Path, selection: Selection, *, view: str = "events",
                 as_json: bool = False, color: bool = False, straggler_ratio: float = 1.3) -> None:
        self.path = path
        self.view = view
        # in the steps view --metric picks the columns;
        # the slowest rank still needs every rank's events
        per_step = view == "steps" and not as_json
        self.selection = replace(selection, metrics=()) if per_step else selection
        self.as_json = as_json
        self.color = color
        self.metrics = selection.metrics
        self.straggler_ratio = straggler_ratio
        self.steps = self._view(False)
        self._run_shown: str | None = None
        self._follower = Follower(path,
                                  notice=lambda text: click.echo(f"relay tail: {text}", err=True))

    def run(self, *, follow: bool, last: int | None) -> None:
        """Show the last ``last`` (None: all) of what is there, then, when following, what comes."""
        if not follow and not self.path.exists():
            raise FileNotFoundError(self.path)
        if follow and not self.path.exists():
            click.echo(f"relay tail: waiting for {self.path} to appear", err=True)
        try:
            self.first_look(last, follow=follow)
            while follow and not reader_gone(sys.stdout, POLL_S):
                self.poll_once()
        finally:
            self.close()

    def first_look(self, last: int | None, *, follow: bool) -> None:
        """Show the last ``last`` (None: all) of what is there; when following, the follower goes on
        from there."""
        if last is None:
            self._show_all(final=not follow)
        else:
            self._show_last(last, final=not follow)

    def close(self) -> None:
        self._follower.close()

    def _view(self, from_middle: bool) -> StepView:
        return StepView(self.metrics, color=self.color, straggler_ratio=self.straggler_ratio,
                        from_middle=from_middle, width=terminal_width(sys.stdout))

    def _show_last(self, last: int, final: bool) -> None:
        """The last ``last`` events or steps, read from the files' ends; the follower goes on from
        there."""
        files = self._follower.skip_to_end(final=final)
        if self.view == "steps" and not self.as_json:
            self.steps, rows = last_steps(files, self.selection.wants, last, self._view,
                                          now=time.monotonic(), final=final)
            self._show_rows(rows)
        else:
            self._show_events(last_events(files, self.selection.wants, last))

    def _show_all(self, final: bool) -> None:
        """Everything there is (that the selection wants), read forwards: each file in its own
        order, files merged by time; parsed as it is consumed, so only what the view keeps stays in
        memory."""
        files = [parsed(lines, self.selection.wants)
                 for _, lines in self._follower.poll(final=final)]
        backlog = files[0] if len(files) == 1 else (
            (ev, raw) for _, ev, raw in heapq.merge(*map(ts_keys, files), key=lambda k: k[0]))
        if self.view != "steps" or self.as_json:
            self._show_events(list(backlog))
            return
        now = time.monotonic()
        rows: list[Row] = []
        for i, (ev, _) in enumerate(backlog):
            rows.extend(self.steps.feed(ev, now))
            if i % 4096 == 4095:  # steps shown leave memory as the backlog is read
                rows.extend(self.steps.ready(now, backlog=True))
                self._show_rows(rows)
                rows = []
        self._show_rows(rows + self.steps.ready(now, final=final, backlog=True))

    def poll_once(self) -> None:
        """One look when following: what was written since, shown."""
        fresh = list(self._wanted(self._fresh_lines()))
        if self.view == "steps" and not self.as_json:
            now = time.monotonic()
            rows = [row for ev, _ in fresh for row in self.steps.feed(ev, now)]
            self._show_rows(rows + self.steps.ready(now))
        else:
            self._show_events(fresh)

    def _fresh_lines(self) -> Iterator[bytes]:
        """The lines written since the last look (relay/cli/fleet_read.py: the fleet's views')."""
        return (line for _, lines in self._follower.poll() for line in lines)

    def _wanted(self, lines: Iterable[bytes]) -> Iterator[tuple[dict[str, Any], bytes]]:
        """The lines that are JSON objects the selection wants, parsed, with their bytes."""
        return parsed(lines, self.selection.wants)

    def _show_events(self, events: list[tuple[dict[str, Any], bytes]]) -> None:
        if not events:
            return
        if self.as_json:
            out = sys.stdout.buffer
            for _, raw in events:
                out.write(raw if raw.endswith(b"\n") else raw + b"\n")
            out.flush()
            return
        narrow = self.selection.keys if self.selection.metrics else lambda _: None
        sys.stdout.write("".join(format_event(ev, narrow(ev), self.color) + "\n"
                                 for ev, _ in events))
        sys.stdout.flush()

    def _show_rows(self, rows: list[Row]) -> None:
        if not rows:
            return
        text = []
        for row in rows:
            # each run's rows under its own name and the column names
            if row.run != self._run_shown:
                text += [self.steps.run_line(row.run), self.steps.header]
                self._run_shown = row.run
            text.append(row.text)
        sys.stdout.write("\n".join(text) + "\n")
        sys.stdout.flush()
