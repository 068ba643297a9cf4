"""The ``relay`` command: serve (the default, so ``relay --sink aim --repo PATH`` works as typed),
``replay`` a JSONL journal into sinks, and ``tail`` a journal for humans.

Exit codes: 0 clean stop, 1 runtime failure, 2 bad usage or configuration, 3 address in use.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from relay.address import AddressInUse, BadAddress
from relay.client import ADDRESS_ENV, DEFAULT_ADDRESS
from relay.sinkproc import SinkSpec
from sinks.base import SinkError
from sinks.jsonl import JsonlSink
from sinks.registry import load, load_all

log = logging.getLogger("relay")

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_ADDRESS_IN_USE = 3


class _ServeByDefault(click.Group):
    """``relay [OPTIONS]`` means ``relay serve [OPTIONS]``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["serve", *args]
        return super().parse_args(ctx, args)


def _fail(code: int, message: str) -> None:
    click.echo(f"relay: error: {message}", err=True)
    sys.exit(code)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


_SINK_CLASSES = load_all()


def _sink_options(func: Callable) -> Callable:
    """Add every registered sink's own options (first declaration of a name wins)."""
    owners: dict[str, str] = {}
    params = getattr(func, "__click_params__", [])
    for name, cls in _SINK_CLASSES.items():
        for option in cls.options():
            if option.name in owners:
                log.warning("sink %s option %s clashes with sink %s; ignored", name, option.opts[0], owners[option.name])
                continue
            owners[option.name] = name
            option.help = f"[{name} sink] {option.help or ''}"
            params.append(option)
    func.__click_params__ = params  # type: ignore[attr-defined]
    return func


def build_sinks(names: tuple[str, ...], params: dict[str, Any], ctx: click.Context,
                log_level: str = "info") -> tuple[JsonlSink, list[SinkSpec]]:
    """The journal (always present: ``--sink jsonl`` is implied) and what each other sink's process
    needs to build it: its name and only its own options. An option given for a sink that was not
    asked for is a usage error, and so is an unknown sink."""
    wanted = list(dict.fromkeys(names or ("jsonl",)))
    classes = {name: load(name) for name in wanted}
    for name, cls in _SINK_CLASSES.items():
        if name in classes or name == JsonlSink.name:  # the journal is always on
            continue
        for option in cls.options():
            if ctx.get_parameter_source(option.name) is click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"{option.opts[0]} belongs to the {name} sink; add --sink {name}")
    journal = JsonlSink(**{o.name: params[o.name] for o in JsonlSink.options()})
    specs = [SinkSpec(name, {o.name: _jsonable(params[o.name]) for o in cls.options() if o.name in params},
                      log_level=log_level)
             for name, cls in classes.items() if name != JsonlSink.name]
    return journal, specs


def _jsonable(value: Any) -> Any:
    """An option value as the sink process receives it (its click type converts it back)."""
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@click.group(cls=_ServeByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="metrics-relay")
def main() -> None:
    """metrics-relay: receive training metrics from every rank and write them to sinks.

    \b
    relay [serve] [--bind ADDR] [--sink NAME ...] [sink options]   run the relay (default)
    relay replay FILE.jsonl --sink NAME [sink options]              rebuild a sink from a journal
    relay tail PATH [-f]                                            follow a journal, readably
    relay keygen DIR [--name NAME]                                  CURVE certificates for remote ranks
    """


@main.command()
@click.option("--bind", "--address", "address", envvar=ADDRESS_ENV, default=DEFAULT_ADDRESS, show_default=True,
              help=f"Where to listen: tcp://HOST:PORT (port '*' picks a free one) or ipc:///path.sock. "
                   f"Also ${ADDRESS_ENV}.")
@click.option("--sink", "sink_names", multiple=True, metavar="NAME",
              help="A sink to write to (repeatable). The jsonl journal is always on.")
@click.option("--flush-interval", type=click.FloatRange(0.001, 10.0), default=0.05, show_default=True,
              help="Seconds between journal flushes (and acknowledgements).")
@click.option("--stats-interval", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="Seconds between counter logs and stats-file updates.")
@click.option("--sink-queue", type=click.IntRange(1), default=200_000, show_default=True,
              help="Events each non-journal sink may fall behind before its batches are dropped (counted).")
@click.option("--forget-after", type=click.FloatRange(1.0), default=3600.0, show_default=True,
              help="Seconds after which a silent run's dedupe state is dropped (rebuilt from the journal "
                   "if it returns), so memory stays bounded on a long-lived relay.")
@click.option("--run-rate", type=click.FloatRange(1.0), default=60.0, show_default=True,
              help="New run ids one connection may start per minute (and at once); frames starting more are "
                   "refused (counted, not acknowledged: a real client sends them again later).")
@click.option("--max-runs", type=click.IntRange(1), default=10_000, show_default=True,
              help="Runs whose dedupe state is kept in memory; past it the least recently active one is "
                   "forgotten (rebuilt from the journal if it returns).")
@click.option("--max-memory", type=click.IntRange(0), default=1024, show_default=True, metavar="MIB",
              help="Resident memory at which every connection is dropped to free what ZeroMQ holds (clients "
                   "reconnect and resend); 0: never.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write {\"address\", \"pid\"} here once listening (for scripts binding port '*').")
@click.option("--watch-pid", type=int, help="Shut down cleanly when this process is gone.")
@click.option("--curve-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The relay's CURVE secret certificate (relay keygen): encrypt a non-loopback relay.")
@click.option("--curve-clients", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory of client public certificates (*.key): only these may publish.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              default="info", show_default=True)
@_sink_options
@click.pass_context
def serve(ctx: click.Context, address: str, sink_names: tuple[str, ...], flush_interval: float,
          stats_interval: float, sink_queue: int, forget_after: float, run_rate: float, max_runs: int,
          max_memory: int, ready_file: Path | None, watch_pid: int | None,
          curve_cert: Path | None, curve_clients: Path | None, log_level: str, **sink_params: Any) -> None:
    """Run the relay until SIGINT/SIGTERM."""
    from relay.daemon import Relay, RelayConfig

    _setup_logging(log_level)
    try:
        journal, sinks = build_sinks(sink_names, sink_params, ctx, log_level)
    except SinkError as exc:
        _fail(EXIT_USAGE, str(exc))
    config = RelayConfig(address=address, flush_interval=flush_interval, stats_interval=stats_interval,
                         sink_queue=sink_queue, forget_after=forget_after, run_rate=run_rate, max_runs=max_runs,
                         max_memory=max_memory, ready_file=ready_file, watch_pid=watch_pid,
                         curve_cert=curve_cert, curve_clients=curve_clients)
    relay = Relay(config, journal, sinks)
    try:
        relay.bind()
    except AddressInUse as exc:
        _fail(EXIT_ADDRESS_IN_USE, f"{exc}; stop the other relay or choose another --bind")
    except BadAddress as exc:
        _fail(EXIT_USAGE, str(exc))
    try:
        relay.open_sinks()
    except SinkError as exc:
        _fail(EXIT_USAGE, str(exc))
    relay.serve()
    logging.shutdown()
    sys.stderr.flush()
    # Everything is flushed and closed; skip interpreter teardown, where a sink library's own
    # exit handler (Aim's remote client waiting for a dead server) could hang a finished relay.
    os._exit(0)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--sink", "sink_names", multiple=True, required=True, metavar="NAME",
              help="A sink to rebuild (repeatable).")
@click.option("--run", "runs", multiple=True, help="Only these run ids (repeatable).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              default="info", show_default=True)
@_sink_options
@click.pass_context
def replay(ctx: click.Context, files: tuple[Path, ...], sink_names: tuple[str, ...], runs: tuple[str, ...],
           log_level: str, **sink_params: Any) -> None:
    """Feed JSONL journal FILES (or directories of them) through sinks, in order."""
    from relay.replay import replay_files

    _setup_logging(log_level)
    try:
        classes = {name: load(name) for name in dict.fromkeys(sink_names)}
        sinks = [cls(**{o.name: sink_params[o.name] for o in cls.options() if o.name in sink_params})
                 for cls in classes.values()]
        result = replay_files(files, sinks, set(runs))
    except SinkError as exc:
        _fail(EXIT_USAGE, str(exc))
    click.echo(f"replayed {result.events} events from {result.files} files into "
               f"{', '.join(classes)}; {result.bad_lines} unreadable lines skipped", err=True)
    if result.bad_lines:
        sys.exit(EXIT_RUNTIME)


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they are written.")
@click.option("--run", "runs", multiple=True, help="Only these run ids.")
@click.option("--type", "types", multiple=True, help="Only these event types (metrics, params, ...).")
@click.option("-n", "--lines", type=int, default=20, show_default=True, help="Start with the last N events.")
def tail(path: Path, follow: bool, runs: tuple[str, ...], types: tuple[str, ...], lines: int) -> None:
    """Print a journal (a JSONL file or directory) as one readable line per event."""
    from relay.tail import tail_journal

    try:
        tail_journal(path, follow=follow, runs=set(runs), types=set(types), last=lines)
    except FileNotFoundError:
        _fail(EXIT_USAGE, f"{path} does not exist; give the relay's --path (file or directory)")
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", default="relay", show_default=True, help="Certificate name (relay, or one per client).")
def keygen(directory: Path, name: str) -> None:
    """Create a CURVE certificate pair NAME.key / NAME.key_secret in DIRECTORY."""
    from relay.curve import SERVER_KEY_ENV, generate, load_secret

    try:
        public, secret = generate(directory, name)
    except OSError as exc:
        _fail(EXIT_USAGE, f"cannot write certificates to {directory}: {exc.strerror}")
    key = load_secret(secret)[0].decode()
    click.echo(f"secret certificate: {secret} (keep it private)\npublic certificate: {public}\n"
               f"public key: {key}\n  relay: relay --curve-cert {secret} ...\n  ranks: export {SERVER_KEY_ENV}='{key}'")
