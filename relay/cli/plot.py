"""``relay plot``: metrics of a journal drawn against the step with matplotlib, one panel per
``--metric``, one line per run (and per rank with ``--by rank``), for users without a UI.

matplotlib is imported only here, when the command runs, with the Agg backend (no display
needed); without it the command says which extra to install. Only lines that are events are read
(``relay.journal.reader.read_events``); a metric the journal holds as "NaN" or "Infinity" is a gap in
its line. The image format follows the output's extension."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from relay.journal.reader import journal_files, read_events
from relay.cli.filters import MetricName, Selection, number
from sinks.events import RELAY_RANK

FORMATS = (".png", ".svg", ".pdf")
#: Metrics named in an error, at most (a journal of custom metrics may hold thousands).
_LISTED = 40

#: (run, stage, rank or None) -> [(step, value)], per metric
Series = dict[tuple[str, str, int | None], list[tuple[int, float]]]


class PlotError(Exception):
    """What the user must change (a usage error, exit 2): said in one line."""


def collect(path: Path, chosen: Selection, by_rank: bool) -> tuple[dict[MetricName, Series], set[str]]:
    """Each selected metric's points, and every ``stage/name`` of the metrics the selected events
    hold (to name when a metric is found nowhere). Points of one series keep the journal's order."""
    found: dict[MetricName, Series] = {m: defaultdict(list) for m in chosen.metrics}
    known: set[str] = set()
    everything = Selection(chosen.runs, chosen.ranks, chosen.stages, frozenset({"metrics"}), chosen.since)
    for file in journal_files(path):
        for ev in read_events(file):
            if not everything.wants(ev):
                continue
            stage, step, data = ev["stage"] or "", ev["step"], ev["data"]
            if type(data) is not dict:
                continue
            known.update(f"{stage}/{key}" if stage else key for key in data)
            if type(step) is not int:
                continue
            for metric, series in found.items():
                for key, value in data.items():
                    num = number(value)
                    if num is not None and metric.matches(stage, key):
                        series[(ev["run"], f"{stage}/{key}" if stage else key, ev["rank"] if by_rank else None)]\
                            .append((step, num))
    return found, known


def plot_journal(path: Path, chosen: Selection, output: Path, *, by_rank: bool = False) -> int:
    """Draw ``chosen.metrics`` of the journal at ``path`` into ``output``; the number of lines drawn.
    PlotError for a format, a metric, matplotlib or an output that cannot be had."""
    if output.suffix.lower() not in FORMATS:
        raise PlotError(f"cannot tell the image format of {output}; end it with {', '.join(FORMATS)}")
    found, known = collect(path, chosen, by_rank)
    missing = [m.text for m, series in found.items() if not series]
    if missing:
        listed = ", ".join(sorted(known)[:_LISTED]) + (", ..." if len(known) > _LISTED else "")
        raise PlotError(f"no metric {', '.join(missing)} with a step in {path}"
                        + (f" (with these filters)" if chosen != Selection(metrics=chosen.metrics) else "")
                        + (f"; metrics there: {listed}" if known else "; it holds no metrics events"))
    pyplot = _pyplot()
    pyplot.rcParams["svg.fonttype"] = "none"  # labels as text in an SVG: searchable, and small
    fig, axes = pyplot.subplots(len(found), 1, sharex=True, squeeze=False,
                                figsize=(9, 1.2 + 2.6 * len(found)), layout="constrained")
    all_runs = {run for series in found.values() for run, _, _ in series}
    if len(all_runs) == 1:
        fig.suptitle(f"run {next(iter(all_runs))}", fontsize=10)
    drawn = 0
    for ax, (metric, series) in zip(axes[:, 0], found.items()):
        stages = {name for _, name, _ in series}
        ranks: dict[tuple[str, str], int] = defaultdict(int)  # ranks per (run, name): one needs no label
        for run, name, _ in series:
            ranks[(run, name)] += 1
        for run, name, rank in sorted(series, key=_order):
            points = sorted(series[(run, name, rank)], key=lambda p: p[0])  # stable: a repeated step keeps its order
            values = [v if math.isfinite(v) else math.nan for _, v in points]  # NaN breaks the line: a gap
            who = "" if rank is None or ranks[(run, name)] == 1 else "relay" if rank == RELAY_RANK else f"rank {rank}"
            label = " ".join(filter(None, [run if len(all_runs) > 1 else "", name if len(stages) > 1 else "", who]))
            line, = ax.plot([s for s, _ in points], values, label=label or run,
                            marker="." if len(points) < 40 else None, linewidth=1.2)
            line.set_gid(f"series-{drawn}")  # each line findable in an SVG
            drawn += 1
        ax.set_title(metric.text, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[-1, 0].set_xlabel("step")
    try:
        fig.savefig(output)
    except OSError as exc:
        raise PlotError(f"cannot write {output}: {exc.strerror or exc}; choose another -o") from None
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
        raise PlotError("relay plot needs matplotlib: pip install './[plot]' in the metrics-relay checkout") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot
