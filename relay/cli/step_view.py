"""``relay tail --view steps``: one line per logged step of a run, assembled from that step's
events; what each column is and where it comes from: docs/relay.md, "Watching a journal: relay
tail", and docs/watching.md, "One line per step".

A job's word that its ranks' own work is not measured (rank 0's ``params`` of stage ``own_work``
with ``measured`` false) is a line of its own, and no level own_s is taken for it. A step is
complete once a later step of its run began or the run ended, and one more look found nothing late
for it; or once its run was quiet for ``SETTLE_S``; or at the end of a one-shot read. Data for a
step already shown is not shown.
"""
from __future__ import annotations

import heapq
import math
import re
import statistics
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import click

from relay.cli.columns import Column, Layout, fit
from relay.cli.filters import MetricName, clock, number
from relay.daemon.status import cut

#: Seconds a step waits after a later step began, for a rank's late report
#: (one look of ``tail -f``).
GRACE_S = 0.25
#: Seconds without news after which a step is shown even though no later step began.
SETTLE_S = 1.5

_NOTES = {"rank_lost": "red", "rank_back": "green", "train_end": "yellow"}
_FLAG_COLOURS = {"STRAGGLER": "red", "cleared": "green"}
#: Room kept for the flag: "STRAGGLER r12 x2.01 (3 steps)";
#: on a narrow terminal, "STRAGGLER r12 x2.01".
FLAG_ROOM = 29
SHORT_FLAG_ROOM = 19
_BRACKETS = re.compile(r" \(.*?\)")


class Row(NamedTuple):
    """A line of the view and its run; ``certain`` False for a line that events before the first
    one fed may change (a view fed from the middle of a journal: ``StepView(from_middle=True)``)."""

    run: str
    text: str
    certain: bool = True


#: Steps of a run fed from the middle of its journal whose lines may lack events read before: the
#: first, cut by where reading began, and the next (ranks report a step at about the same time, so
#: its first events may come before the first step's last).
_UNSURE_STEPS = 2


@dataclass
class _Step:
    step: int
    seen: float  # monotonic time its first event was read
    last: float  # ... and its latest
    ts: Any = None
    values: dict[tuple[Any, str], Any] = field(default_factory=dict)  # (stage, key) -> first value
    rank_times: dict[int, float] = field(default_factory=dict)
    rank_own: dict[int, float] = field(default_factory=dict)
    cluster: dict[str, Any] | None = None
    tokens_per_s: float | None = None
    certain: bool = True  # see Row
    # when its run's train_end was read, which completes it like a later step
    ended: float = math.inf
    flags: list[str] = field(default_factory=list)  # the relay's straggler events of this step
    # lines to show after this step's (a rank lost meanwhile)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Run:
    steps: dict[int, _Step] = field(default_factory=dict)
    shown: int | None = None  # the latest step shown
    tokens: tuple[float, float] | None = None  # (num_tokens, ts) of the previous train log
    late: list[str] = field(default_factory=list)  # flags for steps already shown: on the next line
    begun: int = 0  # steps seen


class StepView:
    """Feed it events (``feed``), take the lines that are ready (``ready``): each a Row;
    ``header`` is the column line, ``run_line`` the line that opens a run's rows. ``from_middle``:
    the first events fed are not a run's first (relay/cli/backlog.py reads a journal's end)."""

    def __init__(self, metrics: tuple[MetricName, ...] = (), *, color: bool = False,
                 straggler_ratio: float = 1.3, from_middle: bool = False,
                 width: int | None = None) -> None:
        self.metrics = metrics
        self.from_middle = from_middle
        self.color = color
        self.straggler_ratio = straggler_ratio
        self.width = width
        self._runs: dict[str, _Run] = {}
        self._world: dict[str, int] = {}
        self._begin: dict[str, float] = {}
        heads = [m.text for m in metrics] if metrics else ["loss", "lr", "tok/s"]
        self.layout = fit(_layouts(heads), width)
        self.header = self._style(cut(self.layout.header("flag"), width), bold=True)

    def run_line(self, run: str) -> str:
        world = self._world.get(run)
        ranks = "" if not world else " (1 rank)" if world == 1 else f" ({world} ranks)"
        return self._style(cut(f"run {run}{ranks}", self.width), fg="cyan", bold=True)

    def feed(self, ev: dict[str, Any], now: float) -> list[Row]:
        """Take one event; what must be shown at once: a rank lost or back, the end of training,
        when no step is waiting to be shown before it."""
        run, step, data = ev.get("run"), ev.get("step"), ev.get("data")
        stage, kind = ev.get("stage"), ev.get("type")
        if (type(run) is not str or type(data) is not dict
                or not (stage is None or type(stage) is str)):
            return []  # (a line no relay wrote: a viewer skips it)
        if type(ev.get("world_size")) is int and ev.get("world_size", 0) > 0:
            self._world[run] = ev["world_size"]
        state = self._runs.setdefault(run, _Run())
        if kind == "lifecycle":
            return self._lifecycle(run, state, ev, data, now)
        if kind == "params" and stage == "own_work" and data.get("measured") is False:
            return self._note(run, state, ev, f"own work not measured: {data.get('timed')}",
                              "yellow")
        if (kind != "metrics" or type(step) is not int
                or (state.shown is not None and step <= state.shown)):
            return []
        rec = state.steps.get(step)
        if rec is None:
            certain = not self.from_middle or state.begun >= _UNSURE_STEPS
            rec = state.steps[step] = _Step(step, now, now, ev.get("ts"), certain=certain)
            state.begun += 1
        rec.last = now
        for key, value in data.items():
            rec.values.setdefault((stage, key), value)
        step_time, own_time = number(data.get("step_time")), number(data.get("own_time"))
        if stage == "rank" and type(ev.get("rank")) is int and step_time is not None:
            rec.rank_times[ev["rank"]] = step_time
            if own_time is not None:
                rec.rank_own[ev["rank"]] = own_time
        elif stage == "cluster":
            rec.cluster = data
        elif stage == "train" and (tokens := number(data.get("num_tokens"))) is not None:
            if self.from_middle and state.tokens is None and run not in self._begin:
                # the train log its tokens grew from is before where reading began
                rec.certain = False
            rec.tokens_per_s = self._tokens_per_s(run, state, tokens, ev.get("ts"))
        return []

    def ready(self, now: float, *, final: bool = False, backlog: bool = False) -> list[Row]:
        """Lines of the steps now complete, in step order per run and runs merged by the steps'
        times (``final``: every step left; ``backlog``: a step with a later step after it, or with
        its run's end after it, needs no grace, all was read at once)."""
        runs = []
        # (steps of two runs at the same time: by run id)
        for run, state in sorted(self._runs.items()):
            done: list[tuple[float, list[Row]]] = []
            pending = sorted(state.steps)
            later_seen = [math.inf] * len(pending)  # when the first step after each was first read
            for i in range(len(pending) - 1, 0, -1):
                later_seen[i - 1] = min(later_seen[i], state.steps[pending[i]].seen)
            for step, later in zip(pending, later_seen, strict=True):
                rec = state.steps[step]
                later = min(later, rec.ended)
                if not (final or now - rec.last >= SETTLE_S
                        or (later < math.inf and (backlog or now - later >= GRACE_S))):
                    break
                ts = number(rec.ts)
                key = (ts if ts is not None and math.isfinite(ts)
                       else done[-1][0] if done else -math.inf)
                done.append((key, self._show(run, state, step)))
            runs.append(done)
        return [row for _, rows in heapq.merge(*runs, key=itemgetter(0)) for row in rows]

    def _show(self, run: str, state: _Run, step: int) -> list[Row]:
        """The rows of a step that is complete: its line, then the notes that came after it
        began."""
        rec = state.steps.pop(step)
        state.shown = step
        line = self._line(state, rec)
        shown = [Row(run, line, rec.certain)] if line is not None else []
        return shown + [Row(run, note) for note in rec.notes]

    def _attempt(self, run: str, state: _Run, ev: dict[str, Any], attempt: int,
                 resumed: Any) -> list[Row]:
        """A resumed job's ``train_begin`` (attempt 1, 2 ...): the earlier attempt's steps still
        waiting are shown now (it will send nothing more), then a line of its own, and the steps
        after the checkpoint are shown again, as this attempt logs them."""
        rows = [row for step in sorted(state.steps) for row in self._show(run, state, step)]
        since = f": resumed from step {resumed}" if type(resumed) is int else ""
        rows += self._note(run, state, ev, f"attempt {attempt}{since}", "yellow")
        state.shown = resumed if type(resumed) is int else None
        state.tokens = None
        return rows

    def _lifecycle(self, run: str, state: _Run, ev: dict[str, Any], data: dict[str, Any],
                   now: float) -> list[Row]:
        event = data.get("event")
        if event == "train_begin" and (began := number(ev.get("ts"))) is not None:
            self._begin[run] = began
            if type(data.get("attempt")) is int and data["attempt"] > 0:
                return self._attempt(run, state, ev, data["attempt"], data.get("resumed_from"))
        elif event in ("straggler", "straggler_cleared") and type(data.get("rank")) is int:
            step, named = ev.get("step"), data.get("named_step")
            if event == "straggler":
                flag = f"STRAGGLER r{data['rank']}" + straggler_cost(data)
            else:
                named_at = f" (named at {named}" if type(named) is int else " ("
                lost = ", lost)" if data.get("why") == "lost" else ")"
                flag = (f"cleared r{data['rank']}" + named_at + lost).replace(" ()", "")
            rec = state.steps.get(step) if type(step) is int else None
            (rec.flags if rec is not None else state.late).append(flag)
        elif type(event) is str and event in _NOTES:
            detail = " ".join(f"{k}={_fmt(v, '.4g')}" for k, v in data.items() if k != "event")
            out = self._note(run, state, ev, f"{event} {detail}", _NOTES[event])
            # the run has said all it will: its steps need not wait for a later one
            if event == "train_end":
                for rec in state.steps.values():
                    rec.ended = min(rec.ended, now)
            return out
        return []

    def _note(self, run: str, state: _Run, ev: dict[str, Any], text: str, colour: str) -> list[Row]:
        """A line of its own: now, or after the lines of the steps begun before it."""
        step = f"{ev['step']:>7}" if type(ev.get("step")) is int else "      -"
        note = self._style(cut(f"{clock(ev.get('ts'))}  {step}  {text}", self.width), fg=colour)
        if not state.steps:
            return [Row(run, note)]
        state.steps[max(state.steps)].notes.append(note)
        return []

    def _tokens_per_s(self, run: str, state: _Run, tokens: float, ts: Any) -> float | None:
        ts = number(ts)
        if ts is None:
            return None
        before = state.tokens or ((0.0, self._begin[run]) if run in self._begin else None)
        state.tokens = (tokens, ts)
        if before is None or ts <= before[1] or tokens < before[0]:
            return None
        return (tokens - before[0]) / (ts - before[1])

    def _line(self, state: _Run, rec: _Step) -> str | None:
        if self.metrics:
            cells = [self._metric(rec, m) for m in self.metrics]
            texts = [_fmt(v, ".4g") for v in cells]
        else:
            cells = [rec.values.get(("train", "loss")), rec.values.get(("train", "learning_rate")),
                     rec.tokens_per_s]
            texts = [_fmt(cells[0], ".4g"), _fmt(cells[1], ".3e"), _fmt(cells[2], ",.0f")]
        slowest, own_s, own_x, step_s, step_x = self._slowest(rec)
        spread = own_x if own_x is not None else step_x
        flags = rec.flags + state.late
        state.late = []
        if not flags and spread is not None and spread >= self.straggler_ratio:
            flags.append(f"slow r{slowest} x{spread:.2f}")
        if all(c is None for c in cells) and slowest is None and not flags:
            return None  # a step with only other figures (an eval): nothing for these columns
        row = self.layout.line({"time": clock(rec.ts), "step": str(rec.step),
                                **{f"metric{i}": text for i, text in enumerate(texts)},
                                "slowest": f"r{slowest}" if slowest is not None else "-",
                                "own_s": _fmt(own_s, ".4g"), "own_x": _fmt(own_x, ".2f"),
                                "step_s": _fmt(step_s, ".4g"), "step_x": _fmt(step_x, ".2f"),
                                "spread": _fmt(spread, ".2f")})
        if self.layout.room < FLAG_ROOM:  # a narrow terminal: the flag without what the columns say
            flags = [_BRACKETS.sub("", flag) for flag in flags]
        if not flags:
            return cut(row, self.width)
        room = None if self.width is None else self.width - len(row) - len(self.layout.sep)
        if room is not None and len(" ".join(flags)) > room:
            flags = [cut(" ".join(flags), max(room, 1))]
        return row + self.layout.sep + " ".join(
            self._style(flag, fg=_FLAG_COLOURS.get(flag.split()[0], "yellow"), bold=True)
            for flag in flags)

    @staticmethod
    def _metric(rec: _Step, metric: MetricName) -> Any:
        """The first value of ``metric`` the step's events carried, preferring stage ``train``."""
        found = [v for (stage, key), v in rec.values.items() if metric.matches(stage, key)]
        train = [v for (stage, key), v in rec.values.items()
                 if stage == "train" and metric.matches(stage, key)]
        return (train or found or [None])[0]

    @staticmethod
    def _slowest(rec: _Step) -> tuple[int | None, float | None, float | None, float | None,
                                      float | None]:
        """(slowest rank, its own work, own-work spread, slowest step time, step-time spread); the
        rank by own work where the ranks sent it, else by step time."""
        cluster = rec.cluster or {}
        if type(cluster.get("slowest_rank")) is int:
            own_rank = cluster.get("own_slowest_rank")
            return ((own_rank if type(own_rank) is int else cluster["slowest_rank"]),
                    number(cluster.get("own_time_max")), number(cluster.get("own_time_spread")),
                    number(cluster.get("step_time_max")), number(cluster.get("step_time_spread")))
        if not rec.rank_times:
            return None, None, None, None, None
        rank, step_s, step_x = _spread(rec.rank_times)
        if rec.rank_own.keys() >= rec.rank_times.keys():
            own_rank, own_s, own_x = _spread({r: rec.rank_own[r] for r in sorted(rec.rank_times)})
            return own_rank, own_s, own_x, step_s, step_x
        return rank, None, None, step_s, step_x

    def _style(self, text: str, **style: Any) -> str:
        return click.style(text, **style) if self.color else text


def _layouts(heads: list[str]) -> list[Layout]:
    """The steps view's columns, widest first (docs/watching.md, "One line per step")."""
    time, step = Column("time", "time", 8, left=True), Column("step", "step", 7)
    slowest = Column("slowest", "slowest", 7)
    metrics = [Column(f"metric{i}", head, max(9, len(head))) for i, head in enumerate(heads)]
    own_x, step_x = Column("own_x", "own_x", 6), Column("step_x", "step_x", 6)
    own_s, step_s = Column("own_s", "own_s", 8), Column("step_s", "step_s", 8)
    short_step, spread = Column("step", "step", 6), Column("spread", "spread", 6)
    return [Layout((time, step, *metrics, slowest, own_s, own_x, step_s, step_x), room=FLAG_ROOM),
            Layout((time, step, *metrics, slowest, own_x, step_x), room=FLAG_ROOM),
            *(Layout((time, short_step, *metrics[:shown], slowest, spread), " ",
                     room=SHORT_FLAG_ROOM)
              for shown in range(len(metrics), 0, -1))]


def _spread(figures: dict[int, float]) -> tuple[int, float, float | None]:
    """The slowest rank of ``figures``, its figure and the spread (slowest / median)."""
    rank = max(figures, key=figures.__getitem__)
    slowest, median = figures[rank], statistics.median(figures.values())
    return rank, slowest, (slowest / median if median > 0 else None)


def _fmt(value: Any, spec: str) -> str:
    """A cell: a number (or the journal's "NaN") formatted, an integer as one
    (``global_step=483800``, never ``4.838e+05``), "-" for nothing."""
    if type(value) is int:
        return format(value, "," if "," in spec else "")
    num = number(value)
    if num is None:
        return "-" if value is None else str(value)[:12]
    if num != num or num in (float("inf"), float("-inf")):
        return str(num)
    return format(num, spec)


def straggler_cost(data: dict[str, Any]) -> str:
    """What a ``straggler`` event says the rank costs the job (`` 31% (0.15 s/step)``); an older
    relay's ratio to the median (`` x1.80 (3 steps)``)."""
    cost, cost_s = number(data.get("cost")), number(data.get("cost_s"))
    if cost is not None:
        return f" {cost:.0%}" + (f" ({cost_s:.2f} s/step)" if cost_s is not None else "")
    ratio, steps = number(data.get("ratio")), data.get("steps")
    return ((f" x{ratio:.2f}" if ratio is not None else "")
            + (f" ({steps} steps)" if type(steps) is int else ""))
