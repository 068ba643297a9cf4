"""The ``relay`` command: serve (the default, so ``relay --sink aim --repo PATH`` works as typed),
``replay``, ``tail``, ``plot`` and ``status`` (docs/relay.md; exit codes: "Exit codes").

Every command's options are declared here but the viewers' and ``relay consume``'s, which
relay/cli/__init__.py adds to the group, and those several commands share (relay/cli/command.py);
what each command does lives in its own module, imported when it runs.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn, cast

import click

from relay.cli import sigterm
from relay.cli.cluster_flags import cluster_config, cluster_options
from relay.cli.command import (
    EXIT_ADDRESS_IN_USE,
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    EXIT_USAGE,
    LOG_LEVEL,
    SINK_QUEUE,
    SINKS,
    WORLD_READABLE,
    SinkCommand,
    build_sinks,
    fail,
    setup_logging,
)
from relay.cli.metrics_flags import start_metrics
from relay.cli.suggest import no_such_command
from relay.cli.targets import JournalFlags, Named
from relay.daemon.bounds import private_files
from relay.daemon.live_line import LiveLine, wanted
from relay.journal.journal import NAME as JOURNAL, Journal, JournalError
from relay.sinkhost.child import starting
from relay.wire.address import ADDRESS_ENV, DEFAULT_ADDRESS, AddressInUse, BadAddress
from sinks.base import Sink, SinkError

log = logging.getLogger("relay")

#: The commands as relay --help lists them.
_ORDER = ("serve", "tail", "runs", "plot", "status", "replay", "consume", "keygen")


class _ServeByDefault(click.Group):
    """``relay [OPTIONS]`` means ``relay serve [OPTIONS]``; a first word that is no option and no
    command is a mistyped command (serve takes no arguments), said as one with the nearest name.
    Commands are listed most used first."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            fail(EXIT_USAGE, no_such_command(args[0], self.list_commands(ctx)))
        if not args or (args[0] not in self.commands
                        and args[0] not in ("--help", "-h", "--version")):
            args = ["serve", *args]
        sigterm.for_command(args[0] == "serve")  # before serve loads its sinks' plugins
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        def place(name: str) -> tuple[int, str]:
            return (_ORDER.index(name) if name in _ORDER else len(_ORDER), name)

        return sorted(self.commands, key=place)

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Every command's usage errors in one line (``relay: error: ...; see 'relay CMD --help'``),
        exit 2, instead of click's usage block."""
        kwargs["standalone_mode"] = False
        try:
            status = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "relay"
            message = " ".join(exc.format_message().split()).rstrip(".")
            fail(EXIT_USAGE, f"{message}; see '{where} --help'")
        except click.ClickException as exc:
            fail(exc.exit_code, exc.format_message())
        except click.Abort:  # Ctrl-C where a command does not say more itself
            fail(EXIT_INTERRUPTED, "interrupted")
        except sigterm.Stopped:  # relay serve, before its body: nothing was made yet
            log.info("stopped (SIGTERM) before listening")
            sys.exit(0)
        # done: the exit need not walk what a sink's library built (relay replay into MLflow:
        # 0.5 CPU-s)
        gc.freeze()
        sys.exit(status if isinstance(status, int) else 0)


@click.group(cls=_ServeByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="metrics-relay")
def main() -> None:
    """metrics-relay: receive training metrics from every rank and write them to sinks.

    With no command, relay serves: 'relay --sink aim --repo PATH' is 'relay serve --sink aim --repo
    PATH'. 'relay COMMAND --help' shows a command's options.
    """


@main.command(cls=SinkCommand, journal_always=True,
              short_help="Run the relay (the default command): --bind ADDR, --sink NAME ...")
@click.option("--bind", "--address", "address", envvar=ADDRESS_ENV, default=DEFAULT_ADDRESS,
              show_default=True,
              help="Where to listen: tcp://HOST:PORT (port '*' picks a free one) or "
                   f"ipc:///path.sock. Also ${ADDRESS_ENV}.")
@click.option("--sink", "sink_names", multiple=True, metavar="NAME",
              help="A sink to write to (repeatable): an installed sink's name, or "
                   "package.module:Class. The jsonl journal is always on. Its options show with "
                   "it: relay --sink NAME --help.")
@click.option("--flush-interval", type=click.FloatRange(0.001, 10.0), default=0.05,
              show_default=True, help="Seconds between journal flushes (and acknowledgements).")
@click.option("--stats-interval", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="Seconds between counter logs and stats-file updates.")
@SINK_QUEUE
@click.option("--forget-after", type=click.FloatRange(1.0), default=3600.0, show_default=True,
              help="Seconds after which a silent run's dedupe state is dropped (rebuilt from the "
                   "journal if it returns), so memory stays bounded on a long-lived relay.")
@click.option("--run-rate", type=click.FloatRange(1.0), default=60.0, show_default=True,
              help="New run ids one connection may start per minute (and at once); frames starting "
                   "more are refused (counted, not acknowledged: a real client sends them again "
                   "later).")
@click.option("--max-runs", type=click.IntRange(1), default=10_000, show_default=True,
              help="Runs whose dedupe state is kept in memory; past it the least recently active "
                   "one is forgotten (rebuilt from the journal if it returns).")
@click.option("--max-memory", type=click.IntRange(0), default=1024, show_default=True,
              metavar="MIB",
              help="Resident memory at which every connection is dropped to free what ZeroMQ holds "
                   "(clients reconnect and resend); 0: never.")
@cluster_options
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write {\"address\", \"pid\"} here once listening "
                   "(for scripts binding port '*').")
@click.option("--watch-pid", type=int, help="Shut down cleanly when this process is gone.")
@click.option("--shutdown-timeout", type=click.FloatRange(0.5), default=120.0, show_default=True,
              metavar="SECONDS",
              help="At shutdown, wait this long at most for the sinks to apply what the journal "
                   "took (a progress line every 5 s); then say which lack how many events and the "
                   "relay replay command that completes them.")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="RELAY_SECRET_FILE",
              help="The relay secret a TCP peer must hold (created 0600 if missing). Default: "
                   "$RELAY_SECRET, else ~/.config/metrics-relay/secret; ranks find the same "
                   "(docs/security.md).")
@click.option("--open", "run_open", is_flag=True, envvar="RELAY_OPEN",
              help="On TCP, take events from any peer that can connect: no secret, no encryption "
                   "(clients need RELAY_OPEN=1 too).")
@click.option("--curve-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The relay's CURVE secret certificate (relay keygen), instead of keys from the "
                   "secret.")
@click.option("--curve-clients", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Directory of client public certificates (*.key): only these may publish.")
@LOG_LEVEL
@WORLD_READABLE
@click.option("--live", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="A status line redrawn every second on stderr (auto: on a terminal), else "
                   "logged.")
@click.pass_context
def serve(ctx: click.Context, address: str, sink_names: tuple[str, ...], flush_interval: float,
          stats_interval: float, sink_queue: int, forget_after: float, run_rate: float,
          max_runs: int, max_memory: int, cluster: bool, straggler_cost: float,
          straggler_min: float, straggler_window: int, rank_silence: float,
          ready_file: Path | None, watch_pid: int | None, shutdown_timeout: float,
          secret_file: Path | None, run_open: bool,
          curve_cert: Path | None, curve_clients: Path | None, log_level: str,
          world_readable: bool, live: str,
          **sink_params: Any) -> None:
    """Run the relay until SIGINT/SIGTERM."""
    from relay.daemon.config import RelayConfig
    from relay.daemon.gate import AuthError
    from relay.daemon.loop import Relay
    from relay.sinkhost.check import check_sinks

    # from here a SIGTERM stops it cleanly (exit 0)
    signal.signal(signal.SIGTERM, sigterm.stop_starting)
    journal: Journal | None = None
    try:
        private_files(world_readable)
        line = LiveLine(sys.stderr) if wanted(live, sys.stderr) else None
        setup_logging(log_level, line)
        config = RelayConfig(address=address, flush_interval=flush_interval,
                             stats_interval=stats_interval,
                             sink_queue=sink_queue, forget_after=forget_after, run_rate=run_rate,
                             max_runs=max_runs,
                             max_memory=max_memory, ready_file=ready_file, watch_pid=watch_pid,
                             shutdown_timeout=shutdown_timeout,
                             curve_cert=curve_cert, curve_clients=curve_clients, open=run_open,
                             secret_file=secret_file,
                             cluster=cluster_config(cluster, straggler_cost, straggler_min,
                                                    straggler_window, rank_silence))
        # every check before the relay listens: a bad option stops it before any training starts
        try:
            journal, sinks = build_sinks(ctx, sink_params, log_level)
        except SinkError as exc:
            fail(EXIT_USAGE, str(exc))
        relay = Relay(config, journal, sinks, live=line)
        # a relay that stops here leaves nothing behind: no journal lock, no empty journal folder
        try:
            relay.check_gate()
            relay.open_journal()
            check_sinks(sinks, journal.path)
            relay.bind()
            # --metrics-bind (its options: relay/cli/metrics_flags.py)
            start_metrics(relay, sink_params)
        except (SinkError, JournalError, AddressInUse, BadAddress, AuthError) as exc:
            journal.abandon()
            if isinstance(exc, AddressInUse):
                fail(EXIT_ADDRESS_IN_USE, f"{exc}; stop the other relay or choose another address")
            fail(EXIT_USAGE, str(exc))
        # listening: the loop stops, sinks starting or not
        signal.signal(signal.SIGTERM, relay.request_stop)
    except sigterm.Stopped:
        sigterm.exit_before_listening(journal)
    relay.serve()  # ready at once; the sinks' processes open beside it (Relay.open_sinks)
    logging.shutdown()
    sys.stderr.flush()
    # Everything is flushed and closed; skip interpreter teardown, where a sink library's own
    # exit handler (Aim's remote client waiting for a dead server) could hang a finished relay.
    os._exit(0)


@main.command(cls=SinkCommand, short_help="Rebuild a sink (or a journal) from journal files.")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--sink", "sink_names", multiple=True, required=True, metavar="NAME",
              help="A sink to rebuild (repeatable); jsonl: a journal (--path), given only what it "
                   "lacks.")
@click.option("--run", "runs", multiple=True, help="Only these run ids (repeatable).")
@click.option("--progress-every", type=click.FloatRange(0.0), default=10.0, show_default=True,
              metavar="SECONDS",
              help="Off a terminal, log how far the replay got this often "
                   "(on a terminal a bar says it).")
@LOG_LEVEL
@WORLD_READABLE
@click.pass_context
def replay(ctx: click.Context, files: tuple[Path, ...], sink_names: tuple[str, ...],
           runs: tuple[str, ...], progress_every: float, log_level: str, world_readable: bool,
           **sink_params: Any) -> None:
    """Feed JSONL journal FILES (or directories of them) through sinks, in order. A consuming
    relay's folder (or several): each run read whole from every view given, each rank in order.

    Stopped part way (Ctrl-C, exit 130), it says how far it got: run it again to finish, what each
    sink already holds is skipped."""
    from contextlib import ExitStack

    from relay.cli.fleet_read import FleetRead, wanted as fleet
    from relay.cli.progress import Progress, size_of
    from relay.daemon.rederive import SpoolDerivation
    from relay.ship.base import is_shipper
    from relay.sinkhost.replay import replay_files

    closing = ExitStack()
    deadletters = None
    if fleet(list(files), several=False):  # the fleet's views, in order (relay/cli/fleet_read.py)
        read = closing.enter_context(FleetRead(list(files)))
        for note in read.notes():
            click.echo(f"relay replay: {note}", err=True)
        deadletters, files = files[0] if files[0].is_dir() else files[0].parent, (read.folder,)

    private_files(world_readable)
    line = LiveLine(sys.stderr) if wanted("auto", sys.stderr) else None
    setup_logging(log_level, line)
    progress = Progress(size_of(files), line=line, every=progress_every)
    classes: dict[str, tuple[str, Named]] = dict(ctx.meta[SINKS])
    journal = JournalFlags.journal(sink_params) if classes.pop(JOURNAL, None) else None
    for name, (_, cls) in classes.items():
        if is_shipper(cls):
            fail(EXIT_USAGE, f"--sink {name} ships a relay's journal as it grows and takes no "
                             f"replay: run `relay serve --path JOURNAL --sink {name} ...` on the "
                             "journal (it sends what the far side lacks)")
    try:
        with closing:  # (the fleet's views put in order are removed)
            # (no journal)
            sink_classes = {name: cast("type[Sink]", cls) for name, (_, cls) in classes.items()}
            sinks = [starting(name, cls, **{o.name: sink_params[o.name] for o in cls.options()
                                            if o.name in sink_params})
                     for name, cls in sink_classes.items()]
            derive = SpoolDerivation() if journal is not None else None
            result = replay_files(files, sinks, set(runs), journal, progress=progress.update,
                                  derive=derive, deadletters=deadletters)
    except (SinkError, JournalError) as exc:
        progress.close()
        fail(EXIT_USAGE, str(exc))
    except KeyboardInterrupt:
        progress.close()
        fail(EXIT_INTERRUPTED, f"replay stopped by Ctrl-C after {progress.said()}; "
                               "what the sinks took is kept: run the same command again to finish "
                               "(what each sink already holds is skipped)")
    progress.close()
    done = []
    if journal is not None:
        derived = (f", {result.derived} of the relay's own derived from them" if result.derived
                   else "")
        done.append(f"{result.new} new in the journal {journal.path}, "
                    f"{result.events - result.new} it held already{derived}")
    if sinks:
        done.append("replayed into " + ", ".join(classes))
    refused = (f"; {result.dead_lettered} refused for good (see _deadletter files)"
               if result.dead_lettered else "")
    click.echo(f"read {result.events} events from {result.files} files: {'; '.join(done)}; "
               f"{result.bad_lines} unreadable lines skipped{refused}", err=True)
    if result.bad_lines or result.dead_lettered:
        sys.exit(EXIT_RUNTIME)


@main.command(short_help="A relay's status line, once (a live relay, or its stats file).")
@click.argument("target", required=False, metavar="[ADDRESS|JOURNAL|STATS_FILE]")
@click.option("--json", "as_json", is_flag=True,
              help="The whole snapshot as JSON instead of the line.")
@click.option("--timeout", type=click.FloatRange(0.01), default=2.0, show_default=True,
              help="Seconds to wait for a live relay's answer.")
def status(target: str | None, as_json: bool, timeout: float) -> None:
    """Print a relay's status line once: ask the relay at ADDRESS (default $RELAY_ADDRESS or
    tcp://127.0.0.1:5557), or read the stats file a relay keeps beside its JOURNAL."""
    from relay.cli.columns import terminal_width
    from relay.daemon.status import BadTarget, NoAnswer, status_text
    from relay.journal.fleet_views import is_fleet
    if target is not None and is_fleet([Path(target)]):  # a consuming relay's folder, or a view
        from relay.cli.fleet_read import status_lines
        click.echo("\n".join(status_lines(Path(target), as_json=as_json)))
        return
    try:
        click.echo(status_text(target, timeout, as_json, terminal_width(sys.stdout)))
    except NoAnswer as exc:
        fail(EXIT_RUNTIME, str(exc))
    except BadTarget as exc:
        fail(EXIT_USAGE, str(exc))


@main.command(short_help="Create CURVE certificates for remote ranks.")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", default="relay", show_default=True,
              help="Certificate name (relay, or one per client machine).")
@click.option("--role", type=click.Choice(["relay", "client"]),
              help="Whose certificate it is, for the hint printed "
                   "[default: relay for --name relay, else client].")
def keygen(directory: Path, name: str, role: str | None) -> None:
    """Create a CURVE certificate pair NAME.key / NAME.key_secret in DIRECTORY."""
    from relay.wire.curve import generate, how_to_use

    try:
        public, secret = generate(directory, name)
    except OSError as exc:
        fail(EXIT_USAGE, f"cannot write certificates to {directory}: {exc.strerror}")
    click.echo(how_to_use(public, secret, role or ("relay" if name == "relay" else "client")))
