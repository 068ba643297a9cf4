"""The commands that show a journal to people: ``relay tail`` (its events or steps, from the end,
following it), ``relay runs`` (a listing of its runs) and ``relay plot`` (its metrics in an image).
Their options are declared here; what each does lives in its own module, imported when it runs.
relay/cli/__init__.py adds them to the ``relay`` group."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from relay.cli.command import EXIT_USAGE, fail
from relay.cli.filters import selection, selection_options
from relay.journal.journal import DEFAULT_PATH


def _stream_options(command: Any) -> Any:
    """``relay tail --nats-url URL RUN``'s options: the connection's (as the nats sink has them) and
    the stream's name and prefix."""
    from relay.fleet.connection import nats_options
    from relay.fleet.stream import stream_options

    url = click.Option(["--nats-url"], default=None, metavar="nats://HOST:4222[,...]",
                       help="Read RUN from the fleet's central journal on these NATS servers "
                            "instead of PATH (docs/deployment.md); the other --nats-* options as "
                            "the nats sink's.")
    rest = [o for o in nats_options() if o.name != "nats_url"]
    command.params.extend([url, *rest, *(o for o in stream_options()
                                         if o.name in ("nats_stream", "nats_prefix"))])
    return command


@_stream_options
@click.command(short_help="Show a journal readably from its end; -f follows it.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="PATH")
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing as lines are written, like tail -F: PATH may appear later, be "
                   "rotated or truncated.")
@click.option("--view", type=click.Choice(["events", "steps"]), default="events", show_default=True,
              help="One line per event, or per logged step (loss, lr, tokens/s, slowest rank, "
                   "straggler flag).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the journal lines as written (for jq); filters apply.")
@selection_options
@click.option("--type", "types", multiple=True, metavar="TYPE",
              help="Only these event types (metrics, params, ...).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="Only events with these data keys, and only those keys shown (repeatable; "
                   "stage/name picks one stage, as in eval/loss); in --view steps, the columns "
                   "instead of loss, lr, tok/s.")
@click.option("-n", "--lines", type=click.IntRange(0), default=None,
              help="Start with the last N lines (events or steps) [default: 20, all with --since].")
@click.option("--straggler-ratio", type=click.FloatRange(1.0), default=1.3, show_default=True,
              help="--view steps: flag a step whose slowest rank took this many times the median.")
def tail(paths: tuple[Path, ...], follow: bool, view: str, as_json: bool, types: tuple[str, ...],
         metrics: tuple[str, ...], lines: int | None, straggler_ratio: float,
         **filters: Any) -> None:
    """Print a journal (a JSONL file or directory) readably, or its lines for jq; follow it with -f.
    A consuming relay's folder, or several (docs/deployment.md): each run whole, each rank in order.

    Colour only on a terminal (and not with NO_COLOR set); Ctrl-C and a closed pipe end it with
    status 0."""
    from relay.cli.tail import Tail

    nats = {k: filters.pop(k) for k in list(filters) if k.startswith("nats_")}
    chosen = selection(types=types, metrics=metrics, **filters)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    if lines is None:
        lines = None if chosen.since is not None else 20
    options: dict[str, Any] = {"view": view, "as_json": as_json, "color": color,
                               "straggler_ratio": straggler_ratio}
    try:
        if nats["nats_url"] is not None:
            _tail_stream(paths, nats, chosen, options, follow, lines)
        elif _fleet(paths):
            from relay.cli.fleet_read import FleetRead, FleetTail
            with FleetRead(list(paths), follow=follow) as read:
                _say_notes("tail", read)
                FleetTail(read, chosen, **options).run(follow=follow, last=lines)
        else:
            Tail(paths[0], chosen, **options).run(follow=follow, last=lines)
    except FileNotFoundError:
        fail(EXIT_USAGE, f"{paths[0]} does not exist; give the relay's --path (file or "
                         "directory), or -f to wait for it")
    except KeyboardInterrupt:
        pass
    # the reader went away (| head): nothing more to say, and nothing to flush at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@click.command(short_help="Draw a journal's metrics against the step into an image.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="PATH")
@click.option("--metric", "metrics", multiple=True, required=True, metavar="NAME",
              help="A metric to draw, one panel each (repeatable): name, or stage/name "
                   "(eval/loss, rank/step_time).")
@click.option("--by", type=click.Choice(["run", "rank"]), default="run", show_default=True,
              help="One line per run, or per run and rank.")
@selection_options
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The image to write: .png, .svg or .pdf.")
def plot(paths: tuple[Path, ...], metrics: tuple[str, ...], by: str, output: Path,
         **filters: Any) -> None:
    """Draw metrics of a journal (file or directory; a consuming relay's folder, or several) against
    the step, for users without a UI."""
    from relay.cli.plot import PlotError, plot_journal

    _need(paths)
    chosen = selection(metrics=metrics, **filters)
    try:
        if _fleet(paths):
            from relay.cli.fleet_read import FleetRead
            with FleetRead(list(paths)) as read:
                _say_notes("plot", read)
                drawn = plot_journal(read.folder, chosen, output, by_rank=by == "rank")
        else:
            drawn = plot_journal(paths[0], chosen, output, by_rank=by == "rank")
    except PlotError as exc:
        fail(EXIT_USAGE, str(exc))
    if drawn.note():
        click.echo(f"relay plot: {drawn.note()}", err=True)


@click.command(short_help="List a journal's runs: start, status, steps, loss, stragglers.")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path), metavar="[PATH...]")
@click.option("--json", "as_json", is_flag=True, help="Every run as a JSON object, for scripts.")
def runs(paths: tuple[Path, ...], as_json: bool) -> None:
    """List the runs of a journal (a JSONL file or directory; default relay-logs/): when each
    started, its status (train_end's, else running or unfinished), attempts, ranks, last step and
    train loss, and the stragglers and lost ranks the relay named; oldest first. A consuming relay's
    folder, or several: each run whole, read from every view given; '(stale)' marks a run read only
    from views their relays no longer hold (docs/deployment.md)."""
    from relay.cli.columns import terminal_width
    from relay.cli.runs import as_json as json_of, summarize, table

    paths = paths or (Path(DEFAULT_PATH),)
    path = paths[0]
    _need(paths)
    if _fleet(paths):
        from relay.cli.fleet_read import FleetRead
        with FleetRead(list(paths)) as read:
            _say_notes("runs", read)
            found = read.summaries()
    else:
        found = summarize(path)
    try:
        if as_json:
            sys.stdout.buffer.write(json_of(found))
        elif found:
            click.echo("\n".join(table(found, terminal_width(sys.stdout))))
        else:
            click.echo(f"relay runs: no runs in {', '.join(map(str, paths))}", err=True)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (| head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _tail_stream(runs: tuple[Path, ...], nats: dict[str, Any], chosen: Any, options: dict[str, Any],
                 follow: bool, lines: int | None) -> None:
    """``relay tail --nats-url URL RUN`` (relay/cli/fleet_stream.py)."""
    from relay.cli.fleet_read import FleetTail
    from relay.cli.fleet_stream import StreamRead
    from relay.fleet.connection import check_package, settings_from_options
    from sinks.base import SinkError

    stream, prefix = nats.pop("nats_stream"), nats.pop("nats_prefix")
    if len(runs) != 1:
        fail(EXIT_USAGE, "--nats-url reads one run: give its id, as relay tail --nats-url URL RUN")
    try:
        check_package()
        settings = settings_from_options(**nats)
    except SinkError as exc:
        fail(EXIT_USAGE, str(exc))
    with StreamRead(settings, stream, prefix, str(runs[0])) as read:
        FleetTail(read, chosen, **options).run(follow=follow, last=lines)


def _need(paths: tuple[Path, ...]) -> None:
    """Exit 2 with one line for a path that is not there."""
    for path in paths:
        if not path.exists():
            fail(EXIT_USAGE, f"{path} does not exist; give the relay's --path (file or directory)")


def _fleet(paths: tuple[Path, ...]) -> bool:
    """Whether a viewer reads ``paths`` as the fleet's, in order (relay/cli/fleet_read.py)."""
    from relay.cli.fleet_read import wanted

    return wanted(list(paths))


def _say_notes(command: str, read: Any) -> None:
    """The line for each stale view read, on stderr: where a user looks."""
    for note in read.notes():
        click.echo(f"relay {command}: {note}", err=True)
