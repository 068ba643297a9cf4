"""What every ``relay`` command is built of: the exit codes and the one line a failure says, logging
to stderr, the options several commands share (``--log-level``, ``--sink-queue``,
``--world-readable``), and the command that takes the options of the sinks it names
(``--sink NAME``), with the journal and sinks it then builds. The commands themselves are declared
in relay/cli/main.py, relay/cli/viewers.py and relay/cli/consume.py."""
from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import click

from relay.cli.targets import JOURNAL_SUMMARY, JournalFlags, Named, load_named, named, owner
from relay.daemon.live_line import LiveLine, LiveLogHandler
from relay.journal.journal import NAME as JOURNAL, Journal
from relay.sinkhost.spec import SinkSpec, jsonable
from sinks.base import SinkError

log = logging.getLogger("relay")

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_ADDRESS_IN_USE = 3
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C), as the shell reports a command it killed
# ctx.meta: name -> (what to load, class) of the sinks named on the command line
SINKS = "relay.sinks"
_SINK_PARAMS = "relay.sink_params"  # ctx.meta: their options, added to the command's own
LOG_LEVEL = click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info", show_default=True)
SINK_QUEUE = click.option(
    "--sink-queue", type=click.IntRange(1), default=200_000, show_default=True,
    help="Events each non-journal sink may fall behind before its batches are dropped (counted).")
WORLD_READABLE = click.option(
    "--world-readable", is_flag=True,
    help="Create the journal, stats, dead letters and sink files with your umask's modes. "
         "Default: 0600 files and 0700 folders, since a journal names every run and seq a local "
         "peer would need to forge events (docs/security.md).")


def fail(code: int, message: str) -> NoReturn:
    click.echo(f"relay: error: {message}", err=True)
    sys.exit(code)


def setup_logging(level: str, live: LiveLine | None = None) -> None:
    """Log to stderr; with a live status line, above it."""
    handler = logging.StreamHandler(sys.stderr) if live is None else LiveLogHandler(live)
    logging.basicConfig(level=level.upper(), handlers=[handler],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def build_sinks(ctx: click.Context, params: dict[str, Any],
                log_level: str = "info") -> tuple[Journal, list[SinkSpec]]:
    """The journal (always present: ``--sink jsonl`` is implied) and what each sink's process needs
    to build it: its name, what to load, and only its own options."""
    sinks = dict(ctx.meta[SINKS])
    del sinks[JOURNAL]
    specs = [SinkSpec(name, {o.name: jsonable(params[o.name])
                             for o in cls.options() if o.name in params},
                      source=source, log_level=log_level)
             for name, (source, cls) in sinks.items()]
    return JournalFlags.journal(params), specs


class SinkCommand(click.Command):
    """A command that takes the options of the sinks named on its command line (``--sink NAME``)
    and of no other, so a plugin is imported only when asked for (``relay --sink aim --help``
    shows Aim's options). ``journal_always``: the journal is named whether or not ``--sink jsonl``
    is."""

    def __init__(self, *args: Any, journal_always: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.journal_always = journal_always

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            classes = load_named(list(dict.fromkeys(named(args) + [JOURNAL] * self.journal_always)))
        except SinkError as exc:
            fail(EXIT_USAGE, str(exc))
        ctx.meta[SINKS] = classes
        ctx.meta[_SINK_PARAMS] = self._sink_params(classes)
        try:
            return super().parse_args(ctx, args)
        # another sink's option: say which (else the group's one line)
        except click.NoSuchOption as exc:
            declared_by = owner(exc.option_name, classes)
            if declared_by is not None:
                fail(EXIT_USAGE, f"{exc.option_name} belongs to the {declared_by} sink; "
                                 f"add --sink {declared_by}")
            raise

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = [*self.params, *ctx.meta.get(_SINK_PARAMS, ())]
        help_option = self.get_help_option(ctx)
        return params + [help_option] if help_option is not None else params

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List what ``--sink`` takes: the journal and every installed sink, third-party ones
        too."""
        super().format_epilog(ctx, formatter)
        from sinks.registry import summaries  # reads the sinks' source: imports none of them

        heading = "Installed sinks (--sink NAME; --sink NAME --help adds its options)"
        with formatter.section(heading):
            formatter.write_dl([(JOURNAL, JOURNAL_SUMMARY), *summaries()])

    def _sink_params(self, classes: dict[str, tuple[str, Named]]) -> list[click.Parameter]:
        """The named sinks' options (the first declaration of a name wins)."""
        owners: dict[str, str] = {p.name: "relay" for p in self.params if p.name}
        params: list[click.Parameter] = []
        for name, (_, cls) in classes.items():
            for option in cls.options():
                if option.name in owners:
                    log.warning("sink %s option %s clashes with %s; ignored",
                                name, option.opts[0], owners[option.name])
                    continue
                owners[option.name] = name
                option.help = f"[{name} sink] {option.help or ''}"
                params.append(option)
        return params
