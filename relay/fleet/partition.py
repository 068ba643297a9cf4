"""One partition as a consuming relay holds it: its view of the central journal, its dedupe and its
sinks (docs/deployment.md, "Exactly once without shared storage").

``position`` is written after the lines, so a kill between the two only applies commits twice, and
``take`` drops them. Lines reach the folder only once committed centrally; after any failure
``reset`` forgets what was taken and not written and the caller applies the central journal again:
the view is rebuilt from it, never from a guess.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.fleet.sessions import CENTRAL_SEQ, Checked, FleetWriters
from relay.journal.dedupe import Dedupe, RankState
from relay.journal.journal import Journal, Seen
from relay.journal.journal_queue import JournalQueue, News
from relay.journal.reader import journal_files
from relay.sinkhost.fan_out import FanOut
from relay.sinkhost.spec import SinkSpec
from relay.wire.lines import ChunkCheck, Derived, encode_line, relay_event
from sinks.events import RELAY_RANK
from sinks.files import write_atomic

log = logging.getLogger(__name__)


@dataclass
class PartitionCounters:
    messages: int = 0
    written: int = 0
    duplicates: int = 0
    bad_lines: int = 0
    applied: int = 0  # lines the view took from the central journal (what another relay committed)
    #: lines written into the view once the lease could not be trusted: not handed to the sinks
    withheld: int = 0
    conflict: int = 0  # lines refused: a second writer's (relay/fleet/sessions.py)


@dataclass
class Partition:
    """Partition ``number``'s journal under ``root`` and its sinks' processes."""

    number: int
    root: Path
    sinks: list[SinkSpec]
    fsync: bool = False
    sink_queue: int = 200_000
    shutdown_timeout: float = 10.0
    counters: PartitionCounters = field(default_factory=PartitionCounters)
    #: whether the lease is still surely ours: a relay that may have lost it hands its sinks nothing
    #: more (the next holder's sinks take those lines from its own view)
    holding: Callable[[], bool] = lambda: True

    def __post_init__(self) -> None:
        self.journal = Journal(f"{self.root / f'p{self.number}'}{os.sep}", fsync=self.fsync)
        self.dedupe = Dedupe()
        self.sessions = FleetWriters(self.number)
        self.fan_out = FanOut()
        self._queue = JournalQueue()
        self.check = ChunkCheck(self._bad_line)
        self.position = 0  # the central journal's last commit of this partition that the view holds
        self._position_path = self.journal.sidecar("_view.json")
        self._central = ""  # the central journal the position is of (its stream's creation time)
        #: messages, duplicates and refused lines counted by the last take_all (reset uncounts them)
        self._counted = [0, 0, 0]
        #: messages of the partition in the stream not yet delivered, after the last fetch
        self.pending = 0
        self.published: float | None = None  # unix time of the last message fetched

    def open(self, central: str) -> None:
        """Lock the journal (JournalError if another relay still writes it) and read its position in
        ``central`` (the central journal's stream and creation time: a view of another one starts
        from 0); start the sinks if it holds runs already (they catch up from it what the last
        holder's sinks may lack), else at the first write: a partition without runs costs no sink
        processes."""
        self.journal.open()
        self._central = central
        self.position = self._read_position()
        if journal_files(self.journal.path):
            try:
                self._start_sinks()
            except BaseException:
                self.close()
                raise

    def _start_sinks(self) -> None:
        """The sinks' fan-out (relay/sinkhost/fan_out.py), always fed: no ingest here to make room
        for."""
        self.fan_out.idle.set()
        self.fan_out.start(self.sinks, self.journal, self.sink_queue, self.shutdown_timeout, None)

    def take_messages(self, msgs: list[Any], now: float) -> None:
        """A fetch's JetStream messages; the last one says what waits behind it in the stream, and
        since when."""
        self.take_all([msg.data for msg in msgs], now, [node_of(msg) for msg in msgs])
        if msgs:
            meta = msgs[-1].metadata
            self.pending, self.published = meta.num_pending, meta.timestamp.timestamp()

    def take_all(self, bodies: list[bytes], now: float, nodes: list[str] | None = None) -> None:
        """``take`` each of a batch, ``nodes`` naming each one's node relay (a batch taken again
        after ``reset`` is counted once)."""
        self._counted = [0, 0, 0]
        for i, body in enumerate(bodies):
            self.take(body, now, nodes[i] if nodes else "")

    def take(self, body: bytes, now: float, node: str = "") -> None:
        """Keep the lines of one message of ``node`` that this journal does not hold yet, and that
        no second writer sent: the message itself when it is all new events of one run (the common
        case: one write of it, not one per line)."""
        duplicates, refused = self._keep(body, now, node)
        self.counters.messages += 1
        self.counters.duplicates += duplicates
        self.counters.conflict += refused
        for i, n in enumerate((1, duplicates, refused)):
            self._counted[i] += n

    def _keep(self, body: bytes, now: float, node: str = "",
              replay: bool = False) -> tuple[int, int]:
        """Queue ``body``'s lines the view does not hold, judged by session
        (relay/fleet/sessions.py) as lines of ``node``, or with ``replay`` (lines of the central
        journal: judged already) only learned from; how many it held already, how many refused."""
        lines = [line for line in body.split(b"\n") if line]
        checked = self.check.keys(lines)
        seqs = _seqs(checked)
        states: dict[tuple[str, int], RankState] = {}
        for key in seqs:
            states[key] = self.dedupe.lookup(key[0], key[1], self)
            self.dedupe.touch(key[0], now)
        judged = None
        if replay:
            judged = self.sessions.learn(body, checked)
        elif self.sessions.concerned(node, body):
            judged = self.sessions.judge(node, checked, states, now)
            if judged.refused:
                checked = judged.kept
                seqs = _seqs(checked)
        if all(states[key].floor == got[0] and not states[key].above
               and got == list(range(got[0], got[0] + len(got))) for key, got in seqs.items()):
            # (the common case) every line new: each rank's next seqs, taken at once
            for key, got in seqs.items():
                states[key].take_run(got[0], len(got))
            taken = [(run, line) for line, (run, _, _) in checked]
        else:
            taken = [(run, line) for line, (run, rank, seq) in checked
                     if states[(run, rank)].take(seq)]
        if taken and len(taken) == len(lines) == body.count(b"\n") + (body[-1:] != b"\n") \
                and len({run for run, _ in seqs}) == 1:  # every line, and no empty one between them
            self._queue.add(taken[0][0], body if body[-1:] == b"\n" else body + b"\n", len(taken))
        else:
            for run, line in taken:
                self._queue.add(run, line + b"\n", 1)
        if judged is not None:
            if judged.hellos:
                lines_taken = {id(line) for _, line in taken}
                for hello in judged.hellos:
                    if id(hello.line) in lines_taken:
                        self.sessions.wrote(hello)
            self._derive(judged.derived)
        return len(checked) - len(taken), judged.refused if judged is not None else 0

    def _derive(self, derived: list[Derived]) -> None:
        """The relay's own events (a conflict said) into the view, numbered from CENTRAL_SEQ."""
        for item in derived:
            state = self.dedupe.lookup(item.run, RELAY_RANK, self)
            seq = max(state.top + 1, CENTRAL_SEQ)
            state.take(seq)
            line = encode_line(relay_event(item, seq, socket.gethostname(), time.time()))
            self._queue.add(item.run, line, 1)

    def seen(self, run: str) -> dict[int, Seen]:
        """What the view holds of a run met now (relay/journal/dedupe.py's History), its writers
        and refusals learned by the judge."""
        seen = self.journal.seen(run)
        self.sessions.recover(run, seen)
        return seen

    def _bad_line(self, line: bytes, why: str) -> None:
        self.counters.bad_lines += 1
        log.warning("partition %d: a message line is not an event, skipped (%s): %.200r",
                    self.number, why, line)

    def uncommitted(self) -> bytes:
        """The lines ``take`` kept and the view does not hold: what the caller commits centrally."""
        return b"".join([chunk for _, chunk in self._queue.lines])

    def write(self) -> None:
        """Put what ``take`` kept in the view (one write, flushed), handing the sinks what it took.
        Raises on a journal failure: the caller resets and applies the central journal again."""
        self._queue.write(self.journal, self._journaled)

    def settle(self, position: int) -> None:
        """The view holds every commit up to ``position``: say so beside it."""
        self.position = position
        kept = {"central": self._central, "position": position}
        write_atomic(self._position_path, json.dumps(kept))

    def apply(self, commits: list[tuple[int, bytes]], now: float) -> None:
        """Commits of the central journal after ``position``, in order, into the view: what another
        relay committed (or this one did, and was stopped before its view took it)."""
        if not commits:
            return
        for _, body in commits:
            self._keep(body, now, replay=True)
        self.counters.applied += self._queue.events
        self.write()
        self.settle(commits[-1][0])

    def reset(self) -> None:
        """Forget what was taken and not written (and its counts): the dedupe state is read from the
        view again."""
        self._queue = JournalQueue()
        self.dedupe = Dedupe()
        self.sessions = self.sessions.fresh()
        self.counters.messages -= self._counted[0]
        self.counters.duplicates -= self._counted[1]
        self.counters.conflict -= self._counted[2]
        self._counted = [0, 0, 0]

    def _read_position(self) -> int:
        try:
            kept = json.loads(self._position_path.read_text())
            if kept.get("central") == self._central:
                return int(kept["position"])
            log.info("partition %d: the view was of another central journal (%s): reading this one "
                     "from its start", self.number, kept.get("central"))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("partition %d: cannot read %s (%s): reading the central journal from its "
                        "start", self.number, self._position_path, exc)
        return 0

    def _journaled(self, lines: bytes, events: int, news: News) -> None:
        self.counters.written += events
        if not self.holding():
            self.counters.withheld += events
            return
        if self.sinks and not self.fan_out.workers:
            self._start_sinks()
        if self.fan_out.workers:
            self.fan_out.submit(lines, events, news)

    def forget_idle(self, before: float) -> None:
        """Drop the dedupe state of runs silent since ``before``; the journal rebuilds it if they
        return."""
        for run in self.dedupe.idle_runs(before):
            self.sessions.forget(run, self.dedupe.forget(run))
            self.journal.release(run)

    def close(self) -> None:
        """Let the sinks drain, then unlock the journal. Lines not committed are dropped: their
        messages were not acknowledged, so JetStream delivers them again."""
        self.fan_out.close(time.monotonic() + self.shutdown_timeout)
        self.fan_out = FanOut()
        self._queue = JournalQueue()
        try:
            self.journal.close()
        except OSError as exc:
            log.error("partition %d: journal close failed: %s", self.number, exc)

    def sample(self, now: float) -> None:
        """Note the sinks' lag at ``now`` (monotonic), for the stats' figures."""
        self.fan_out.sample(now)

    def stats(self) -> dict:
        lag = time.time() - self.published if self.pending and self.published is not None else 0.0
        return {"partition": self.number, **self.counters.__dict__, "position": self.position,
                "pending": self.pending, "lag_s": round(lag, 3), "sinks": self.fan_out.stats()}


def _seqs(checked: Checked) -> dict[tuple[str, int], list[int]]:
    """Per (run, rank), its seqs in the message's order."""
    seqs: dict[tuple[str, int], list[int]] = {}
    for _, (run, rank, seq) in checked:
        found = seqs.get((run, rank))
        if found is None:
            seqs[(run, rank)] = [seq]
        else:
            found.append(seq)
    return seqs


def node_of(msg: Any) -> str:
    """The node relay that published a message (its ``Relay-Node``, relay/fleet/chunks.py)."""
    return (msg.headers or {}).get("Relay-Node", "")
