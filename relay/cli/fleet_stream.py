"""``relay tail --nats-url URL RUN``: a run read from the fleet's central journal itself
(docs/deployment.md, "Reading a run from the fleet"): the run's partition is the one its last
message in the fleet stream was stored under; its lines are put in order as a view's are, into a
private temporary journal folder; with ``-f`` the commits since are read every POLL_S.
"""
from __future__ import annotations

from collections.abc import Iterator

import click

from relay.cli.fleet_read import FleetMirror
from relay.fleet.central import CentralJournal
from relay.fleet.connection import NatsSettings, connect, describe, failures
from relay.fleet.loop_thread import LoopThread
from relay.fleet.stream import run_token
from relay.journal.fleet_views import in_order, key_of, unseen

ASK_S = 10.0  # seconds a question to JetStream waits for its answer


class StreamRead(FleetMirror):
    """Run ``run``'s lines from the central journal of ``stream``, in order. ClickException (one
    line, exit 1) when NATS does not answer or has no such run."""

    def __init__(self, settings: NatsSettings, stream: str, prefix: str, run: str) -> None:
        self.settings, self.stream, self.prefix, self.run = settings, stream, prefix, run
        self.loop = LoopThread("relay-tail-nats")
        super().__init__("relay-stream-")
        self.after = 0
        try:
            self.loop.run(self._open(), 3 * ASK_S)
            self.put("run", in_order(self.loop.run(self._read(), None)))
        except BaseException:
            self.close()
            raise

    async def _open(self) -> None:
        from nats.js.errors import NotFoundError
        try:
            self.nc = await connect(self.settings, retry_forever=False, timeout=ASK_S)
        except failures() as exc:  # said in one line
            raise click.ClickException(f"NATS {self.settings.display} did not answer: "
                                       f"{describe(exc)}") from None
        js = self.nc.jetstream(timeout=ASK_S)
        subject = f"{self.prefix}.*.*.{run_token(self.run)}"
        try:
            last = await js.get_last_msg(self.stream, subject)
        except NotFoundError:
            raise click.ClickException(f"stream {self.stream} holds no message of run {self.run} "
                                       f"({subject}); give the run id as the trainer named "
                                       "it") from None
        self.partition = int(last.subject.split(".")[len(self.prefix.split("."))])
        self.central = CentralJournal(self.nc, js, self.stream, self.prefix, self.nc.max_payload,
                                      "viewer")

    async def _read(self) -> list[bytes]:
        """The run's lines of the commits after ``after``."""
        lines: list[bytes] = []
        try:
            async for seq, body in self.central.read(self.partition, self.after):
                self.after = seq
                lines += [line for line in body.splitlines(keepends=True)
                          if (key := key_of(line)) is not None and key[0] == self.run]
        except failures() as exc:  # said in one line
            raise click.ClickException(f"the central journal {self.central.name} did not answer: "
                                       f"{describe(exc)}") from None
        return lines

    def fresh(self) -> Iterator[bytes]:
        return (line for line, _ in unseen(self.loop.run(self._read(), 3 * ASK_S), self.seen))

    def close(self) -> None:
        nc = getattr(self, "nc", None)
        if nc is not None:
            try:
                self.loop.run(nc.close(), ASK_S)
            except failures() as exc:  # closing a viewer's connection: nothing to keep
                click.echo(f"relay tail: closing the NATS connection: {describe(exc)}", err=True)
        self.loop.stop()
        super().close()
