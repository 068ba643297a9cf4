"""The central journal: a partition's one history, written only through a fence, so a relay paused
past its lease cannot add anything its successor did not see (docs/deployment.md, "Exactly once
without shared storage").

A batch whose answer is lost is never sent again: the writer rereads, and dedupe decides.
"""
from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

from relay.fleet.connection import describe

log = logging.getLogger(__name__)

EXPECTED = "Nats-Expected-Last-Subject-Sequence"
BATCH_ID, BATCH_SEQUENCE, BATCH_COMMIT = "Nats-Batch-Id", "Nats-Batch-Sequence", "Nats-Batch-Commit"
HEADER_ROOM = 1024  # bytes of max_payload left for the headers
WRONG_LAST = (10071, 10164)  # JSStreamWrongLastSequence(Constant)Err
ATTEMPTS = 3  # publishes of one piece whose acknowledgement did not come, before the commit fails
BATCH_TIMEOUT = 10.0  # seconds an atomic batch's commit waits for its answer
MAX_BATCH = 1000  # messages in one atomic batch (the servers' default limit)


class Fenced(Exception):
    """Another relay committed the partition since this one last read it: nothing was written."""


def journal_stream(stream: str) -> str:
    return f"{stream}-journal"


def journal_subject(prefix: str, k: int) -> str:
    return f"{prefix}-journal.{k}"


class CentralJournal:
    """The central journal of one fleet stream, for one consuming relay (``writer`` names it in
    message ids)."""

    def __init__(self, nc: Any, js: Any, stream: str, prefix: str, max_payload: int,
                 writer: str) -> None:
        self.nc, self.js, self.name, self.prefix = nc, js, journal_stream(stream), prefix
        self.limit = max(1 << 10, max_payload - HEADER_ROOM)
        self.writer = f"{writer}-{secrets.token_hex(4)}"
        # the stream and its creation time, once ensured: what a view is a view of
        self.identity = self.name
        # whether the stream takes atomic batches (a commit of several messages in one)
        self.atomic = False
        self._batches = 0

    async def ensure(self, replicas: int) -> Any:
        """The stream's info, creating it when missing (an existing one is used as it is, but for
        atomic batches, which are switched on where the servers have them)."""
        from nats.js.api import StorageType, StreamConfig
        from nats.js.errors import APIError

        from relay.fleet.stream import ensure_stream
        config = StreamConfig(name=self.name, subjects=[f"{self.prefix}-journal.>"],
                              storage=StorageType.FILE, num_replicas=replicas, max_age=0,
                              allow_atomic=True)
        info, created = await ensure_stream(self.js, config)
        self.identity = f"{self.name}@{info.created}"
        if created:
            log.info("created the central journal, stream %s (replicas %d)", self.name, replicas)
        elif not info.config.allow_atomic:
            info.config.allow_atomic = True
            try:
                info = await self.js.update_stream(info.config)
            except APIError as exc:  # a server before 2.12, or no right to change the stream
                log.info("central journal %s: no atomic batches (%s): a commit of several messages "
                         "fences each on the one before", self.name, describe(exc))
        # (a server that does not know the option leaves it out)
        self.atomic = bool(info.config.allow_atomic)
        return info

    async def last(self, k: int) -> int:
        """The sequence of partition ``k``'s last commit (0: none yet)."""
        from nats.js.errors import NotFoundError
        try:
            msg = await self.js.get_last_msg(self.name, journal_subject(self.prefix, k))
        except NotFoundError:
            return 0
        return int(msg.seq)

    async def read(self, k: int, after: int) -> AsyncIterator[tuple[int, bytes]]:
        """Partition ``k``'s commits after sequence ``after``, in order, up to its last one now."""
        from nats.js.errors import NotFoundError
        subject = journal_subject(self.prefix, k)
        end = await self.last(k)
        seq = after
        while seq < end:
            try:
                msg = await self.js.get_msg(self.name, seq + 1, subject=subject, next=True)
            except NotFoundError:  # removed by the stream's own limits: nothing more to read
                log.warning("central journal %s: partition %d has no commit after %d (the stream's "
                            "limits removed it?); the view goes on from its end", self.name, k, seq)
                return
            seq = int(msg.seq)
            yield seq, msg.data or b""

    async def append(self, k: int, body: bytes, expected: int) -> int:
        """Commit ``body`` (whole journal lines) to partition ``k`` on top of sequence ``expected``;
        the sequence of its last message. Fenced if another commit came in between."""
        cut = pieces(body, self.limit)
        if self.atomic and 1 < len(cut) <= MAX_BATCH:
            return await self._batch(k, cut, expected)
        for piece in cut:
            expected = await self._publish(k, piece, expected)
        return expected

    async def _batch(self, k: int, cut: list[bytes], expected: int) -> int:
        """``cut`` as one atomic batch, fenced by its first message; the sequence of its last."""
        from nats.js.errors import APIError
        subject = journal_subject(self.prefix, k)
        self._batches += 1
        batch = f"{self.writer[-8:]}-{self._batches}"  # a batch id is at most 64 characters
        for n, piece in enumerate(cut[:-1], 1):
            headers = {BATCH_ID: batch, BATCH_SEQUENCE: str(n)}
            if n == 1:
                headers[EXPECTED] = str(expected)
            await self.nc.publish(subject, piece, headers=headers)
        commit = {BATCH_ID: batch, BATCH_SEQUENCE: str(len(cut)), BATCH_COMMIT: "1"}
        reply = await self.nc.request(subject, cut[-1], timeout=BATCH_TIMEOUT, headers=commit)
        answer = json.loads(reply.data)
        error = answer.get("error")
        if error:
            if error.get("err_code") in WRONG_LAST:
                raise Fenced(f"partition {k}: another relay committed since sequence {expected}")
            APIError.from_error(error)  # raises it
        return int(answer["seq"])

    async def _publish(self, k: int, piece: bytes, expected: int) -> int:
        from nats.js.errors import APIError
        headers = {EXPECTED: str(expected), "Nats-Msg-Id": f"{self.writer}:{k}:{expected}"}
        for attempt in range(ATTEMPTS):
            try:
                ack = await self.js.publish(journal_subject(self.prefix, k), piece,
                                            stream=self.name, headers=headers)
                return int(ack.seq)
            except APIError as exc:
                if exc.err_code in WRONG_LAST:
                    raise Fenced(f"partition {k}: another relay committed since sequence "
                                 f"{expected}") from None
                raise
            except TimeoutError as exc:
                log.debug("central journal: partition %d: no acknowledgement (%s), "
                          "publishing again", k, describe(exc))
                if attempt == ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")


def pieces(body: bytes, limit: int) -> list[bytes]:
    """``body`` cut at line ends into pieces of at most ``limit`` bytes (a longer line alone)."""
    if len(body) <= limit:
        return [body]
    out, start = [], 0
    while start < len(body):
        end = body.rfind(b"\n", start, start + limit) + 1
        if end <= start:  # one line longer than the limit
            end = body.index(b"\n", start) + 1
        out.append(body[start:end])
        start = end
    return out
