"""``relay consume``: a relay fed by the fleet's JetStream stream instead of ranks
(relay/fleet/consumer.py). Why a command of its own, not ``relay serve --from``: docs/deployment.md,
"Consuming relays".
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import click

from relay.cli.command import (
    EXIT_ADDRESS_IN_USE,
    EXIT_USAGE,
    LOG_LEVEL,
    SINK_QUEUE,
    WORLD_READABLE,
    SinkCommand,
    build_sinks,
    fail,
    setup_logging,
)
from relay.cli.metrics_flags import take_metrics_options
from relay.daemon.bounds import private_files
from sinks.base import SinkError

log = logging.getLogger("relay")


def _fleet_options(command: Any) -> Any:
    """The NATS connection options and the stream's name and prefix, as the ``nats`` sink has
    them."""
    from relay.fleet.connection import nats_options
    from relay.fleet.stream import stream_options

    wanted = [o for o in stream_options() if o.name in ("nats_stream", "nats_prefix")]
    command.params.extend(nats_options() + wanted)
    return command


@_fleet_options
@click.command(cls=SinkCommand, journal_always=True,
               short_help="Journal the fleet's NATS stream and fan it out to sinks.")
@click.option("--sink", "sink_names", multiple=True, metavar="NAME",
              help="A sink to write to besides the journal (repeatable), as for relay serve.")
@click.option("--name", default="",
              help="This relay's name among the consuming relays (default: HOST-PID).")
@click.option("--lease-ttl", type=click.FloatRange(1.0), default=10.0, show_default=True,
              metavar="SECONDS",
              help="A dead relay's partitions are taken over this long after its last lease "
                   "renewal (renewed every 2 s, or a third of it if less); a relay cut off from "
                   "NATS stops consuming a quarter of it before that. The lease bucket's: every "
                   "consuming relay of a stream gives the same (another is refused, exit 2).")
@click.option("--fetch", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Messages fetched (and journaled in one write) at once per partition.")
@click.option("--max-ack-pending", type=click.IntRange(1), default=512, show_default=True,
              help="Messages a partition's consumer may have delivered and not acknowledged "
                   "(applied to the existing consumers).")
@click.option("--ack-wait", type=click.FloatRange(1.0), default=10.0, show_default=True,
              metavar="SECONDS",
              help="A message not acknowledged this long (its relay died) is delivered again "
                   "(applied to the existing consumers).")
@SINK_QUEUE
@LOG_LEVEL
@WORLD_READABLE
@click.pass_context
def consume(ctx: click.Context, sink_names: tuple[str, ...], name: str, lease_ttl: float,
            fetch: int, max_ack_pending: int, ack_wait: float, sink_queue: int, log_level: str,
            world_readable: bool, **params: Any) -> None:
    """Consume the fleet's stream: commit each event once to the central journal, keep a view of
    each partition held under --path (a folder of this machine's own) and fan out to the sinks.
    Several consuming relays share the partitions; see docs/deployment.md."""
    import asyncio  # here: the other relay commands start without it

    from relay.fleet.connection import check_package, probe, settings_from_options
    from relay.fleet.consumer import ConsumeConfig, Consumer
    from relay.fleet.reconcile import Mismatch
    from relay.fleet.stream import check_prefix
    from relay.sinkhost.check import check_sinks
    from sinks.preflight import need_writable_dir

    private_files(world_readable)
    setup_logging(log_level)
    nats_params = {k: params.pop(k) for k in list(params) if k.startswith("nats_")}
    stream, prefix = nats_params.pop("nats_stream"), nats_params.pop("nats_prefix")
    try:
        metrics = take_metrics_options(params)
        check_package()
        settings = settings_from_options(**nats_params)
        check_prefix(prefix)
        journal, sinks = build_sinks(ctx, params, log_level)
        need_writable_dir(journal.path, "the partition views' folder", "choose a writable --path",
                          create=True)
        check_sinks(sinks, journal.path)
        down = asyncio.run(probe(settings))
    except SinkError as exc:
        fail(EXIT_USAGE, str(exc))
    if down:
        log.warning("NATS at %s is not reachable now (%s); waiting for it", settings.display, down)
    config = ConsumeConfig(settings=settings, path=journal.path, sinks=sinks, stream=stream,
                           prefix=prefix, name=name, ttl=lease_ttl, renew=min(2.0, lease_ttl / 3),
                           fetch=fetch, max_ack_pending=max_ack_pending, ack_wait=ack_wait,
                           fsync=journal.fsync, sink_queue=sink_queue)
    consumer = Consumer(config)
    if metrics is not None:
        from relay.metrics.endpoint import serve_consumer
        from relay.wire.address import AddressInUse, BadAddress
        try:
            serve_consumer(consumer, metrics)
        except (AddressInUse, BadAddress) as exc:
            fail(EXIT_ADDRESS_IN_USE if isinstance(exc, AddressInUse) else EXIT_USAGE, str(exc))
    try:
        asyncio.run(_serve(consumer))
    except Mismatch as exc:  # an option other consuming relays of the stream set otherwise
        fail(EXIT_USAGE, str(exc))
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)  # as serve: a sink library's exit handler must not hang a finished relay


async def _serve(consumer: Any) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, consumer.stop)
    await consumer.run()
