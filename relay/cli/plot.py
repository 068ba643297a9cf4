"""``relay plot``: metrics of a journal drawn against the step (docs/watching.md, "Plots without a
UI").

matplotlib is imported only here, when the command runs, with the Agg backend. Lines that hold no
metric's name are not parsed, unless most lines hold one (there the test costs more than it saves).
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import IO, Any

import orjson

from relay.cli.decimate import BUCKETS, MinMax
from relay.cli.filters import MetricName, Selection, number
from relay.cli.suggest import did_you_mean
from relay.journal.reader import journal_files
from relay.wire.lines import parse_line
from sinks.events import RELAY_RANK

FORMATS = (".png", ".svg", ".pdf")
#: Metrics named in an error, at most (a journal of custom metrics may hold thousands).
#: A file's first lines, on which the metric names' test is tried before it is kept for the rest.
_PROBE = 4096

#: (run, stage/name, rank or None) -> its points, per metric
Series = dict[tuple[str, str, int | None], MinMax]


class PlotError(Exception):
    """What the user must change (a usage error, exit 2): said in one line."""


@dataclass
class Drawn:
    """What a plot drew: its lines, the points read for them, and how many lines were decimated."""

    lines: int = 0
    points: int = 0
    decimated: int = 0

    def note(self) -> str:
        """What the command says when lines were decimated (nothing otherwise)."""
        if not self.decimated:
            return ""
        return (f"{self.points:,} points read; {self.decimated} of {self.lines} lines had more "
                f"than {2 * BUCKETS:,} and are drawn as the lowest and highest point of each of "
                f"{BUCKETS:,} buckets (every spike kept)")


def _metric_events(path: Path, chosen: Selection, needles: tuple[bytes, ...] | None) -> Iterator[
        tuple[str, int, str, Any, dict[str, Any]]]:
    """(run, rank, stage, step, data) of each selected metrics event of the journal; with
    ``needles``, only of the lines that hold one of them (the rest are not parsed)."""
    everything = Selection(chosen.runs, chosen.ranks, chosen.stages, frozenset({"metrics"}),
                           chosen.since)
    unfiltered = everything == Selection(types=everything.types)
    wants = (lambda ev: ev.get("type") == "metrics") if unfiltered else everything.wants
    holds = re.compile(b"|".join(map(re.escape, needles))).search if needles else None
    for file in journal_files(path):
        with open(file, "rb") as fh:
            for line in _lines(fh, holds):
                ev = parse_line(line)
                if ev is None or not wants(ev):
                    continue
                run, rank = ev.get("run"), ev.get("rank")
                stage, data = ev.get("stage"), ev.get("data")
                if (type(run) is str and type(rank) is int and type(data) is dict
                        and (stage is None or type(stage) is str)):
                    yield run, rank, stage or "", ev.get("step"), data


def _lines(fh: IO[bytes], holds: Callable[[bytes], Any] | None) -> Iterable[bytes]:
    """The lines of ``fh`` that ``holds`` finds a metric's name in, or all of them where that test
    would skip under a quarter of the file's first lines: a plot of metrics every line holds (a
    step's loss, each rank's step time, the cluster's spread) was a fifth slower for the test."""
    if holds is None:
        return fh
    head = list(islice(fh, _PROBE))
    kept = list(filter(holds, head))
    if len(kept) * 4 > len(head) * 3:
        return chain(head, fh)
    return chain(kept, filter(holds, fh))


def collect(path: Path, chosen: Selection, by_rank: bool) -> dict[MetricName, Series]:
    """Each selected metric's series. Points of one series keep the journal's order."""
    found: dict[MetricName, Series] = {m: {} for m in chosen.metrics}
    # the names as JSON strings, as the lines hold them: b'"loss"'
    needles = tuple({orjson.dumps(key) for m in chosen.metrics for key in (m.text, m.name)})
    # per stage: (series, data key, stage/key) to look up
    keys: dict[str, list[tuple[Series, str, str]]] = {}
    for run, rank, stage, step, data in _metric_events(path, chosen, needles):
        if type(step) is not int:
            continue
        wanted = keys.get(stage)
        if wanted is None:
            wanted = keys[stage] = [
                (series, key, f"{stage}/{key}" if stage else key)
                for metric, series in found.items()
                for key in dict.fromkeys([metric.text]
                                         + ([metric.name] if metric.stage == stage else []))]
        for series, key, name in wanted:
            value = data.get(key)
            if value is None:
                continue
            if type(value) is not float:  # (most are: no call for them)
                value = number(value)
                if value is None:
                    continue
            line = series.get((run, name, rank if by_rank else None))
            if line is None:
                line = series[(run, name, rank if by_rank else None)] = MinMax()
            line.add(step, value)
    return found


def known_metrics(path: Path, chosen: Selection) -> set[str]:
    """Every ``stage/name`` of the metrics the selected events hold: named when a metric is found
    nowhere (the one path that parses every line)."""
    return {f"{stage}/{key}" if stage else key
            for _, _, stage, _, data in _metric_events(path, chosen, None)
            for key in data}


def plot_journal(path: Path, chosen: Selection, output: Path, *, by_rank: bool = False) -> Drawn:
    """Draw ``chosen.metrics`` of the journal at ``path`` into ``output``; what it drew. PlotError
    for a format, a metric, matplotlib or an output that cannot be had."""
    if output.suffix.lower() not in FORMATS:
        raise PlotError(f"cannot tell the image format of {output}; "
                        f"end it with {', '.join(FORMATS)}")
    found = collect(path, chosen, by_rank)
    missing = [m.text for m, series in found.items() if not series]
    if missing:
        known = known_metrics(path, chosen)
        hint = (did_you_mean(missing[0], known, "metrics there") if known
                else "it holds no metrics events")
        filtered = " (with these filters)" if chosen != Selection(metrics=chosen.metrics) else ""
        raise PlotError(f"no metric {', '.join(missing)} with a step in {path}{filtered}; {hint}")
    pyplot = _pyplot()
    pyplot.rcParams["svg.fonttype"] = "none"  # labels as text in an SVG: searchable, and small
    fig, axes = pyplot.subplots(len(found), 1, sharex=True, squeeze=False,
                                figsize=(9, 1.2 + 2.6 * len(found)), layout="constrained")
    all_runs = {run for series in found.values() for run, _, _ in series}
    if len(all_runs) == 1:
        fig.suptitle(f"run {next(iter(all_runs))}", fontsize=10)
    drawn = Drawn()
    for ax, (metric, series) in zip(axes[:, 0], found.items(), strict=True):
        stages = {name for _, name, _ in series}
        # ranks per (run, name): one needs no label
        ranks: dict[tuple[str, str], int] = defaultdict(int)
        for run, name, _ in series:
            ranks[(run, name)] += 1
        decimated = 0
        for run, name, rank in sorted(series, key=_order):
            kept = series[(run, name, rank)]
            # stable: a repeated step keeps its order
            points = sorted(kept.points(), key=lambda p: p[0])
            # NaN breaks the line: a gap
            values = [v if math.isfinite(v) else math.nan for _, v in points]
            who = ("" if rank is None or ranks[(run, name)] == 1
                   else "relay" if rank == RELAY_RANK else f"rank {rank}")
            label = " ".join(filter(None, [run if len(all_runs) > 1 else "",
                                           name if len(stages) > 1 else "", who]))
            line, = ax.plot([s for s, _ in points], values, label=label or run,
                            marker="." if len(points) < 40 else None, linewidth=1.2)
            line.set_gid(f"series-{drawn.lines}")  # each line findable in an SVG
            drawn.lines += 1
            drawn.points += kept.seen
            decimated += kept.decimated
        drawn.decimated += decimated
        if decimated:  # said on the panel: what is drawn is not every point
            ax.text(1.0, 1.0, f"min/max of {BUCKETS:,} buckets", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=7, color="0.4")
        ax.set_title(metric.text, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[-1, 0].set_xlabel("step")
    try:
        fig.savefig(output)
    except OSError as exc:
        raise PlotError(f"cannot write {output}: {exc.strerror or exc}; "
                        "choose another -o") from None
    finally:
        pyplot.close(fig)
    return drawn


def _order(key: tuple[str, str, int | None]) -> tuple[Any, ...]:
    """Lines in a panel: by run, the Trainer's own stage first, then by rank."""
    run, name, rank = key
    return run, not name.startswith("train/"), name, -1 if rank is None else rank


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotError("relay plot needs matplotlib: "
                        "pip install './[plot]' in the metrics-relay checkout") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot
