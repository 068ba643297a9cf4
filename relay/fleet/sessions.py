"""A consuming relay's judge of second writers: each stream of a partition held to one session by a
node relay's rules (relay/journal/writers.py), the publishing node standing for the connection
(docs/protocol.md, "One writer per stream").

``live`` is not judged: a clock-told "still writing" would let two holders, or a replay of the
central journal, judge one message two ways. The conflict events it writes into the view are its
memory (``recover``). No socket, no file.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

from relay.journal.dedupe import RankState
from relay.journal.journal import WRITER_EVENTS
from relay.journal.writers import (
    REFUSED_REPORT_EVERY,
    Conflict,
    Key,
    Writer,
    Writers,
    judge,
    named_session,
    writer_of,
)
from relay.wire.lines import Derived, parse_line
from sinks.events import RELAY_RANK, RESTART_SEQ_BITS, starts_session

log = logging.getLogger("relay.fleet")

HELLO = b'"type":"hello"'  # in a hello's line as the relay writes it (and in few others)
SAID = b'"event":"conflict'  # in the relay's conflict and conflict_ended events' lines
#: The consuming relay numbers its own events from here, above any seq a node relay gives its own
#: rank (from 0), so the two never collide in the view; a session's first seq, so no sink waits for
#: the gap below it.
CENTRAL_SEQ = 1 << 52

Checked = list[tuple[bytes, tuple[str, int, int]]]  # lines as ChunkCheck.keys gives them


def free(state: RankState, seq: int) -> bool:
    """Whether the view holds no seq of the session a hello at ``seq`` opens: up to the next
    session's first seq (sinks/events.py ``session_base``), or none above it for a hello that is
    not at a session's first seq. An earlier attempt whose node published late (its relay cut off
    from NATS while the job was resumed on another node) is no conflict: its seqs are its own."""
    if not starts_session(seq):
        return seq > state.top
    end = seq + (1 << RESTART_SEQ_BITS)
    return seq >= state.floor and not any(seq <= held < end for held in state.above)


class Hello(NamedTuple):
    """A hello that passed: its session writes the stream once the view takes ``line``."""

    key: Key
    seq: int
    writer: Writer
    line: bytes


class Judged(NamedTuple):
    """A message's lines judged: those to dedupe, the hellos among them, the relay's own events to
    write, and how many lines were refused."""

    kept: Checked
    hellos: list[Hello]
    derived: list[Derived]
    refused: int


class FleetWriters:
    """One partition's streams: who writes each, and which nodes are refused which."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.writers = Writers()
        self.hello_seq: dict[Key, int] = {}  # the seq of the hello whose session writes each stream
        self.logged: set[tuple[Key, str]] = set()  # conflicts logged (kept by ``fresh``: said once)
        self._summed_at: float | None = None  # when refused lines were last summed up in the log
        self._since = 0  # lines refused, not logged, since then

    def fresh(self) -> FleetWriters:
        """A judge that learns the view anew (after ``Partition.reset``), knowing what it logged."""
        judge_ = FleetWriters(self.number)
        judge_.logged, judge_._summed_at, judge_._since = self.logged, self._summed_at, self._since
        return judge_

    def concerned(self, node: str, body: bytes) -> bool:
        """Whether a message of ``node`` needs judging: it holds a hello, or the node is refused a
        stream (the other nodes' messages go on at full speed)."""
        if HELLO in body:
            return True
        peer = node.encode()
        return any(peer in peers for peers in self.writers.refused.values())

    def recover(self, run: str, seen: dict[int, Any]) -> None:
        """What the view holds of ``run``, met now (``Journal.seen``): each stream's writer, from
        its latest hello, and the refusals said in it, in order."""
        for rank, held in seen.items():
            if held.hello is not None:
                data, host, seq = held.hello
                self.writers.recovered((run, rank), writer_of(data, host, named_session(data)))
                self.hello_seq.setdefault((run, rank), seq)
            for said in held.said:
                self._replay(run, said)

    def _replay(self, run: str, said: dict[str, Any]) -> None:
        node, rank = said.get("node"), said.get("rank")
        if not isinstance(node, str) or type(rank) is not int:  # a node relay's own: not ours
            return
        key, peer = (run, rank), node.encode()
        if said.get("event") == "conflict_ended":
            self.writers.passed(key, peer)
            return
        by = writer_of({"pid": said.get("refused_pid")}, said.get("refused_host"),
                       said.get("session"))
        writer = writer_of({"pid": said.get("writer_pid")}, said.get("writer_host"), None)
        conflict = Conflict(key, str(said.get("why")), writer, by, said.get("seq") or 0)
        self.writers.refuse(key, peer, conflict)
        self.writers.first_time(conflict)
        self.logged.add((key, conflict.session))

    def learn(self, body: bytes, checked: Checked) -> Judged:
        """Lines of the central journal (a view caught up, relay/fleet/partition.py ``apply``):
        judged when committed, so only learned from: its hellos, and the refusals said in it."""
        hellos: list[Hello] = []
        if HELLO not in body and SAID not in body:
            return Judged(checked, hellos, [], 0)
        for line, (run, rank, seq) in checked:
            if HELLO not in line and (rank != RELAY_RANK or SAID not in line):
                continue
            event = parse_line(line)
            data = event.get("data") if event is not None else None
            if event is None or not isinstance(data, dict):
                continue
            if event.get("type") == "hello":
                writer = writer_of(data, event.get("host"), named_session(data))
                hellos.append(Hello((run, rank), seq, writer, line))
            elif event.get("type") == "lifecycle" and data.get("event") in WRITER_EVENTS:
                self._replay(run, data)
        return Judged(checked, hellos, [], 0)

    def judge(self, node: str, checked: Checked, states: dict[Key, RankState],
              now: float) -> Judged:
        """The lines of one message of ``node`` (``states``: the view's dedupe state of each of
        their streams), in order: a hello judged, a line of a refused stream refused."""
        peer, writers = node.encode(), self.writers
        kept: Checked = []
        hellos: list[Hello] = []
        derived: list[Derived] = []
        refused: list[Key] = []
        for item in checked:
            line, (run, rank, seq) = item
            key = (run, rank)
            if HELLO in line:
                event = parse_line(line)
                if event is not None and event.get("type") == "hello":
                    passed = self._hello(node, key, seq, event, free(states[key], seq), derived)
                    if passed is not None:
                        hellos.append(passed._replace(line=line))
            if writers.refused and writers.refusal(key, peer) is not None:
                refused.append(key)
            else:
                kept.append(item)
        if refused:
            self._sum_up(node, refused, now, said=bool(derived))
        return Judged(kept, hellos, derived, len(refused))

    def _hello(self, node: str, key: Key, seq: int, event: dict[str, Any], above: bool,
               derived: list[Derived]) -> Hello | None:
        """A hello of ``node`` judged (``above``: the view holds nothing of its session's seqs): the
        Hello if it passes, else None (the node is refused the stream, the conflict said once)."""
        data, peer = event.get("data"), node.encode()
        session = named_session(data)
        writer = self.writers.of.get(key)
        by = writer_of(data, event.get("host"), session)
        world = event.get("world_size")
        world = world if type(world) is int else 1
        why = None if session is None else judge(writer, session, live=False, above=above)
        if why is None:
            if self.writers.refusal(key, peer) is not None:
                self.writers.passed(key, peer)
                derived.append(Derived(key[0], world, "lifecycle", None, None, {
                    "event": "conflict_ended", "rank": key[1], "node": node, "session": session,
                    "seq": seq}))
            return Hello(key, seq, by, b"")
        assert writer is not None
        conflict = Conflict(key, why, writer, by, seq)
        self.writers.refuse(key, peer, conflict)
        if self.writers.first_time(conflict):
            derived.append(Derived(key[0], world, "lifecycle", None, None, {
                "event": "conflict", "rank": key[1], "why": why, "seq": seq,
                "writer_pid": writer.pid, "writer_host": writer.host, "refused_pid": by.pid,
                "refused_host": by.host, "node": node, "session": conflict.session}))
            if (key, conflict.session) not in self.logged:
                self.logged.add((key, conflict.session))
                log.error("partition %d: refused a second writer of run %s rank %d: node %s "
                          "publishes a process (%s, session %s) that starts at seq %d, among seqs "
                          "the stream holds already, written by %s (session %s); its events are "
                          "not put in the view (they stay in node %s's journal): give each job its "
                          "own run id", self.number, key[0], key[1], node, by.who(),
                          conflict.session, seq, writer.who(), writer.session, node)
        return None

    def _sum_up(self, node: str, refused: list[Key], now: float, said: bool) -> None:
        """Refused lines summed up in the log at most every REFUSED_REPORT_EVERY seconds."""
        self._since += len(refused)
        if said:  # a conflict just said: the summary counts from here
            self._summed_at, self._since = now, 0
        elif self._summed_at is None or now - self._summed_at >= REFUSED_REPORT_EVERY:
            run, rank = refused[-1]
            log.warning("partition %d: %d more events refused as second writers'; the last: run %s "
                        "rank %d from node %s", self.number, self._since, run, rank, node)
            self._summed_at, self._since = now, 0

    def wrote(self, hello: Hello) -> None:
        """A hello that passed is in the view: its session writes the stream if it is the latest."""
        if hello.seq > self.hello_seq.get(hello.key, -1):
            self.writers.wrote(hello.key, hello.writer)
            self.hello_seq[hello.key] = hello.seq

    def forget(self, run: str, ranks: list[int]) -> None:
        """``run`` is forgotten (idle): learned again from the view if it returns."""
        for rank in ranks:
            self.writers.forget((run, rank))
            self.hello_seq.pop((run, rank), None)
