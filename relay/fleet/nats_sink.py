"""The ``nats`` shipper's face: options, their checks, open/notify/close (docs/sinks/nats.md); the
work is relay/fleet/publisher.py.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
from pathlib import Path
from typing import Any

import click

from relay.fleet import connection, identity, stream
from relay.fleet.loop_thread import LoopThread
from relay.fleet.publisher import NatsPublisher, StreamSpec
from relay.journal.journal_queue import News
from relay.ship.base import Shipper
from sinks.base import CLOSE_TIMEOUT, SinkContext, SinkError

log = logging.getLogger(__name__)

CLOSE_WAIT = 5.0  # seconds close() waits for the last acks
CHECK_S = 10.0  # seconds each start-up ask waits for NATS; past it the relay starts, the sink waits


class NatsSink(Shipper):
    """Publish this relay's journal to JetStream. (The module's docstring says how.)"""

    name = "nats"

    @classmethod
    def options(cls) -> list[click.Option]:
        return [
            *connection.nats_options(),
            *stream.stream_options(),
            click.Option(["--nats-node"], default=None, metavar="NAME",
                         help="This relay's name in the subjects and headers (default: HOST-<16 "
                              "hex digits>, made once and kept beside the journal); two live "
                              "relays can never hold one name."),
            click.Option(["--nats-chunk-events"], type=click.IntRange(1), default=1000,
                         show_default=True, help="Journal lines per message at most."),
            click.Option(["--nats-chunk-bytes"], type=click.IntRange(1024), default=256 << 10,
                         show_default=True,
                         help="Bytes per message at most (and within the server's max_payload)."),
            click.Option(["--nats-linger"], type=click.FloatRange(0), default=0.02,
                         show_default=True,
                         help="Seconds a chunk short of its bounds waits for more lines before it "
                              "is published."),
            click.Option(["--nats-inflight"], type=click.IntRange(1), default=16, show_default=True,
                         help="Chunks in flight (all runs together) until JetStream acknowledges "
                              "them: what the sink holds in memory; beyond, reading the journal "
                              "waits."),
        ]

    def __init__(self, nats_url: str = connection.DEFAULT_URL, nats_user: str | None = None,
                 nats_password: str | None = None, nats_token: str | None = None,
                 nats_creds: str | None = None, nats_nkey: str | None = None,
                 nats_tls_ca: str | None = None, nats_tls_cert: str | None = None,
                 nats_tls_key: str | None = None, nats_stream: str = stream.DEFAULT_STREAM,
                 nats_prefix: str = stream.DEFAULT_PREFIX, nats_partitions: int = 8,
                 nats_replicas: int = 1, nats_duplicate_window: str = "10m",
                 nats_max_age: str = "7d", nats_node: str | None = None,
                 nats_chunk_events: int = 1000, nats_chunk_bytes: int = 256 << 10,
                 nats_linger: float = 0.02, nats_inflight: int = 16) -> None:
        self.settings = connection.settings_from_options(
            nats_url, nats_user, nats_password, nats_token, nats_creds, nats_nkey, nats_tls_ca,
            nats_tls_cert, nats_tls_key)
        if not nats_stream or any(c in nats_stream for c in " .*>\t/\\"):
            raise SinkError(f"--nats-stream {nats_stream!r} is not a stream name; give letters, "
                            "digits, _ or -")
        self.spec = StreamSpec(name=nats_stream, prefix=stream.check_prefix(nats_prefix),
                               partitions=nats_partitions, replicas=nats_replicas,
                               duplicate_window=stream.seconds(nats_duplicate_window,
                                                               "--nats-duplicate-window"),
                               max_age=stream.seconds(nats_max_age, "--nats-max-age"))
        self.given_node = stream.run_token(nats_node) if nats_node else None
        self.limits: dict[str, Any] = {
            "max_lines": nats_chunk_events, "max_bytes": nats_chunk_bytes, "linger": nats_linger,
            "inflight": nats_inflight}
        #: the publisher's, once open (the relay's stats show them)
        self.counters: dict[str, int] = {}
        self._publisher: NatsPublisher | None = None

    def check(self, context: SinkContext) -> None:
        """Before the relay listens: the package, the journal, and one attempt to connect, so
        credentials the server refuses, a node name another relay holds live or replicas a lone
        server cannot have stop the relay (exit 2). A server down now, or too slow to answer within
        CHECK_S (a busy machine, a cluster starting), is waited for, not fatal: the sink checks and
        publishes once it answers."""
        connection.check_package()
        journal = _need_journal(context)
        node = self.node(journal)
        loop = LoopThread("nats-check")
        asking = "connect"
        try:
            down = loop.run(connection.probe(self.settings), CHECK_S)
            if not down:
                asking = "check this relay's node and the stream"
                loop.run(self._check_fleet(journal, node), CHECK_S)
        except (TimeoutError, concurrent.futures.TimeoutError):  # (one class from Python 3.11)
            down = f"no answer within {CHECK_S:.0f} s to {asking}"
        finally:
            loop.stop()
        if down:
            log.warning("NATS %s is not reachable now (%s): the relay starts, and the nats sink "
                        "publishes the journal once it is", self.settings.display, down)

    async def _check_fleet(self, journal: Path, node: str) -> None:
        """``check``'s node and replica checks, on the loop: SinkError for what can never work, a
        warning for more replicas than the servers seen."""
        ours = identity.Claimant.here(journal, os.getpid())
        await identity.check_live(self.settings, self.spec.name, node, ours, self.id_file(journal))
        from nats.js.errors import NotFoundError
        try:
            nc = await connection.connect(self.settings, retry_forever=False, timeout=CHECK_S / 2)
        except connection.failures() as exc:  # gone since the probe: the sink waits for it
            log.debug("stream check: %s", connection.describe(exc))
            return
        try:
            await nc.jetstream(timeout=CHECK_S / 2).stream_info(self.spec.name)
            return  # there already: used as it is
        except NotFoundError:  # this relay would create it: can it have its replicas?
            seen = stream.servers_seen(getattr(nc, "_server_info", None) or {})
            problem = stream.replicas_problem(self.spec.name, self.spec.replicas, *seen)
        except connection.failures() as exc:  # JetStream slow or away: made sure of later
            log.debug("stream check: %s", connection.describe(exc))
            return
        finally:
            await nc.close()
        if problem is not None and problem[0]:
            raise SinkError(problem[1])
        if problem is not None:
            log.warning("%s", problem[1])

    def open(self, context: SinkContext) -> None:
        journal = _need_journal(context)
        connection.check_package()
        # certificates that do not load: SinkError now, not retries later
        connection.tls_context(self.settings)
        node = self.node(journal)
        publisher = self._publisher = NatsPublisher(journal, self.settings, self.spec, node,
                                                    identity.Claimant.here(journal, os.getppid()),
                                                    self.id_file(journal), **self.limits)
        self.counters = publisher.counters
        publisher.start()
        log.info("publishing the journal to NATS %s, stream %s, subjects %s.%s.RUN; state in %s",
                 self.settings.display, self.spec.name, self.spec.prefix, node,
                 publisher.state_path)

    def node(self, journal: Path) -> str:
        """``--nats-node``, else the journal's own node id (made once, kept beside it)."""
        return self.given_node or identity.local_id(journal, stream.run_token)

    def id_file(self, journal: Path) -> Path | None:
        """Where the node is kept (None: it is --nats-node's)."""
        return None if self.given_node else identity.id_file(journal)

    def notify(self, news: News) -> None:
        """The journal is what is published: only note which runs have news."""
        assert self._publisher is not None
        self._publisher.notify(set(news))

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait up to CLOSE_WAIT (or ``timeout``, if sooner) for the last acks, then stop; False
        when some are missing: what NATS has not acknowledged stays in the journal and is published
        by the next relay on it."""
        publisher, self._publisher = self._publisher, None
        if publisher is None:
            return True
        publisher.stop(min(CLOSE_WAIT, timeout))
        log.info("nats sink closed: %s", self.counters)
        return publisher.idle


def _need_journal(context: SinkContext) -> Any:
    if context.journal is None:
        raise SinkError("the nats sink publishes what the relay journals: use it as "
                        "`relay --sink nats --nats-url URL`, with the relay's journal")
    return context.journal

