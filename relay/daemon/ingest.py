"""Ingest: one client frame in, its new events out as journal lines waiting for the commit step
(docs/architecture.md, "One event's path"); the ranks' step times go to the cross-rank derivation
(relay/daemon/cross_rank.py), whose events are queued the same way as rank RELAY_RANK. A refused
frame is counted and dead-lettered, never acknowledged.

No socket and no clock of its own: the caller passes each frame with its connection's identity and
the time (the loop, relay/daemon/loop.py; the fuzzer and the tests directly), and what ingest calls
back (``send_acks``, ``fan_out``, ``connected``, ``tell``) is given to its constructor.
"""
from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

from relay.daemon.commit import Commit, Send
from relay.daemon.counters import Counters
from relay.daemon.cross_rank import Cluster, ClusterConfig
from relay.daemon.owners import Owners
from relay.daemon.refusals import Refusals
from relay.daemon.run_health import RunHealth
from relay.daemon.runs import Key, Runs
from relay.daemon.second_writers import SecondWriters, Tell
from relay.daemon.stream_events import client_drops, reused_run, session_begins
from relay.journal.deadletter import DeadLetters
from relay.journal.dedupe import RankState
from relay.journal.journal import Journal
from relay.journal.journal_queue import Deliver
from relay.journal.writers import Writers, session_of, writer_of
from relay.wire import encoding, schema
from relay.wire.lines import Derived, check_lines, encode_line, encode_lines, relay_event
from sinks.events import RELAY_RANK

log = logging.getLogger("relay")


class Ingest:
    """The relay without its socket: frames in, journal lines and acks out through
    ``commit_step``."""

    def __init__(self, journal: Journal, deadletters: DeadLetters, now: float, *, send_acks: Send,
                 fan_out: Deliver | None = None, connected: Callable[[bytes], bool] | None = None,
                 run_rate: float = 60.0, max_runs: int = 10_000,
                 cluster: ClusterConfig | None = None,
                 health: RunHealth | None = None, wall_clock: Callable[[], float] = time.time,
                 tell: Tell | None = None) -> None:
        self.journal = journal
        self.deadletters = deadletters
        self.counters = Counters()
        self.owners = Owners()  # which connection sends each stream (relay/daemon/owners.py)
        self.writers = Writers()  # which session writes each stream (relay/journal/writers.py)
        self.runs = Runs(journal, run_rate, max_runs, self.owners, self.writers)
        #: the lines waiting for the journal and the acks waiting for them (relay/daemon/commit.py)
        self.commit_step = Commit(journal, self.counters, self.runs.ranks, self.owners.owner, now,
                                  send=send_acks, fan_out=fan_out)
        self.cluster = Cluster(cluster) if cluster is not None else None
        self.follow_health(health)
        self.run_rate = run_rate
        #: whether a stream owner's connection is still there (None: every owner is, until silent)
        self.connected = connected
        self.refusals = Refusals(self.counters, deadletters)  # refused frames and handshakes, said
        #: second writers of streams judged and refused (relay/daemon/second_writers.py)
        self.second_writers = SecondWriters(
            self.runs, self.owners, self.writers, self.counters, deadletters, lookup=self.lookup,
            connected=connected, gone=self.peer_gone, derive=self.queue_derived, tell=tell)
        self._wall_clock = wall_clock  # the ts of the relay's own events
        self._host = socket.gethostname()

    def take_frame(self, peer: bytes, frame: bytes, now: float) -> None:
        """One client message: validated, de-duplicated and queued for the journal, or rejected
        with a counted reason. Never raises: whatever one frame does, ingest goes on; an error this
        code did not foresee is logged, counted as ``internal_error`` and the frame dead-lettered,
        and since nothing of it was acknowledged its client sends it again."""
        self.counters.frames += 1
        try:
            decoded = schema.decode(frame)
        except schema.FrameError as exc:
            self.reject(exc.reason, exc.detail, frame, peer)
            return
        if max(rank for _, rank in decoded.streams()) == RELAY_RANK:
            self.reject("reserved_rank", f"rank {RELAY_RANK} is the relay's own (the events it "
                                         "derives); no client may publish as it", frame, peer)
            return
        conflict = self.second_writers.judge(peer, decoded, now)
        if conflict is not None:
            self.second_writers.refuse(conflict, decoded.events, frame, peer, now)
            return
        taken = self._owned_elsewhere(peer, decoded.streams(), now)
        if taken is not None:
            self.reject("not_owner", f"run {taken[0]} rank {taken[1]} is being sent by another "
                                     "live connection; refused until that one disconnects",
                        frame, peer)
            return
        try:
            self._take_events(peer, decoded, now)
            self.runs.note_world(decoded.first["run"], decoded.first["world_size"])
        except schema.FrameError as exc:  # its journal lines would be too long (check_lines)
            self.reject(exc.reason, exc.detail, frame, peer)
        except Exception as exc:  # noqa: BLE001 - one frame never stops ingest: counted, said
            self.reject("internal_error", f"{type(exc).__name__}: {exc}", frame, peer)
            count = self.counters.rejected["internal_error"]
            if count <= 3 or count % 1000 == 0:  # its traceback, now and then
                log.exception("frame from peer %s raised (%d so far); dead-lettered",
                              peer.hex(), count)

    def follow_health(self, health: RunHealth | None) -> None:
        """Keep each run's health in ``health`` (for the Prometheus endpoint,
        relay/daemon/run_health.py)."""
        self.health = health
        #: each new frame's events for runs' health: steps, and with --metrics-loss rank 0's loss
        self._health_frame = health.take_frame if health is not None else None

    def _owned_elsewhere(self, peer: bytes, streams: Iterable[Key], now: float) -> Key | None:
        """The first stream of the frame that is kept for another connection, if any."""
        return next((key for key in streams if self._kept_from(key, peer, now)), None)

    def _kept_from(self, key: Key, peer: bytes, now: float) -> bool:
        """Whether ``key`` is another connection's: its owner's while that is connected (and not
        silent, relay/daemon/owners.py); once the owner is gone, the first connection refused it
        since, while that one is connected. So the order frames arrived in decides who sends a
        stream next, never when the relay learns that a connection ended (``connected``)."""
        owners = self.owners
        owner = owners.of(key)
        if owner == peer:
            return False
        if owner is not None and owners.foreign(key, peer, now):
            if self.connected is None or self.connected(owner):
                owners.refused(key, peer)
                return True
            self.peer_gone(owner)
        waiting = owners.next_in_line(key)
        if waiting is None or waiting == peer:
            return False
        owners.out_of_line(key)
        if self.connected is not None and not self.connected(waiting):
            return False
        owners.claim(key, waiting, now)  # it asked first: it resends, and is taken then
        owners.refused(key, peer)
        return True

    def commit(self, now: float, retry_now: bool = False) -> None:
        """Journal what waits, then acknowledge and fan out (relay/daemon/commit.py); with
        ``retry_now`` (at shutdown) at once, whatever the journal's backoff says."""
        if retry_now:
            self.commit_step.retry_now()
        self.commit_step.commit(now)

    @property
    def reading(self) -> bool:
        """Whether the loop may read more frames before the next commit (``Commit.reading``)."""
        return self.commit_step.reading

    @property
    def full(self) -> bool:
        """Enough waits for the journal that the loop commits now (``Commit.full``)."""
        return self.commit_step.full

    @property
    def pending(self) -> int:
        """Events the journal has not taken yet."""
        return self.commit_step.pending

    def journal_stats(self, now: float) -> dict[str, float]:
        """The journal's figures for the status, as each sink's (``Commit.journal_stats``)."""
        return self.commit_step.journal_stats(now)

    def _take_events(self, peer: bytes, decoded: schema.Frame, now: float) -> None:
        counters, commit_step = self.counters, self.commit_step
        first_seq, count = decoded.first_seq, len(decoded.records)
        if first_seq is not None:  # one rank's plain events, seqs without a gap: maybe all new
            run, rank = decoded.first["run"], decoded.first["rank"]
            # a frame of finite floats is journaled from its records; else the lines say "NaN"
            finite = decoded.finite
            chunk = encode_lines(decoded.records if finite else decoded.events, finite)
            check_lines(chunk)
            state = self._state(peer, run, rank, now)
            if state is None:
                self._refuse_runs(peer, [run], decoded.events)
                return
            counters.events += count
            if (run, rank) not in self.writers.of:
                self.writers.wrote_without_hello((run, rank), peer, decoded.first["host"])
            if state.take_run(first_seq, count):
                commit_step.add(run, chunk, count)  # (not before _state: making room may commit)
                if decoded.derive:
                    self._derive(decoded.to_derive(), now)
                if self._health_frame is not None:
                    self._health_frame(decoded.read_back, rank, now)
                return
            lines = None
        events = decoded.events
        if first_seq is None:
            lines = [encode_line(event) for event in events]
            check_lines(lines)
            new = self.runs.new_runs(e["run"] for e in events)
            if new and not self.runs.admit(peer, len(new), now):
                self._refuse_runs(peer, sorted(new), events)
                return
            counters.events += len(events)
        last_key = None
        for event, line in zip(events, lines or map(encode_line, events), strict=True):
            key = (event["run"], event["rank"])
            if key != last_key:  # a frame normally holds one rank's events: look it up once
                held = self._state(peer, key[0], key[1], now, admitted=True)
                last_key = key
                if event["type"] != "hello":
                    self.writers.wrote_without_hello(key, peer, event["host"])
            if held.take(event["seq"], peer):
                commit_step.add(key[0], line, 1)
                if event["type"] == "stats":
                    client_drops(counters, key, held, event, peer)
                elif event["type"] == "hello":
                    self.runs.hello(key, event["ts"])
                    self.writers.wrote(key, writer_of(event["data"], event["host"],
                                                           session_of(event["data"], peer)))
                    session_begins(key, held, event["seq"], peer)
                elif event["stage"] == "rank" or event["type"] == "lifecycle":
                    self._derive((event,), now)
                elif self._health_frame is not None:
                    self._health_frame((event,), key[1], now)
            else:
                counters.duplicates += 1
                if event["type"] == "hello" and self.runs.reused(key, event["ts"]):
                    reused_run(counters, key)

    @overload
    def _state(self, peer: bytes, run: str, rank: int, now: float,
               admitted: Literal[True]) -> RankState: ...

    @overload
    def _state(self, peer: bytes, run: str, rank: int, now: float,
               admitted: bool = False) -> RankState | None: ...

    def _state(self, peer: bytes, run: str, rank: int, now: float,
               admitted: bool = False) -> RankState | None:
        """(run, rank)'s dedupe state, with its ack route and activity noted; None if ``run`` is new
        and ``peer`` has used up its budget of new runs (unless already ``admitted``)."""
        state = self.lookup(peer, run, rank, now, admitted)
        if state is not None:
            self.runs.claim((run, rank), peer, now)
            self.commit_step.ack_due((run, rank))
        return state

    def lookup(self, peer: bytes, run: str, rank: int, now: float,
                admitted: bool = False) -> RankState | None:
        """(run, rank)'s dedupe state, learned from the journal for a run met again; None if ``run``
        is new and ``peer`` has used up its budget of new runs (unless already ``admitted``)."""
        runs = self.runs
        key = (run, rank)
        state = runs.ranks.get(key)
        if state is None:
            new = not runs.known(run)
            if new:
                if not admitted and not runs.admit(peer, 1, now):
                    return None
                self._make_room(now)
            state = runs.lookup(run, rank)
            if new and self.cluster is not None and runs.met_again(run, state):
                # met again: a restart, or forgotten
                self.cluster.restore(self.journal.recent(run), now)
            # the losses its clients reported before (a restart): counted from now on
            if runs.reported:
                for known, dropped in runs.reported.items():
                    self.counters.client_reported(known, dropped)
                runs.reported.clear()
        return state

    def _derive(self, events: Iterable[dict[str, Any]], now: float) -> None:
        """New per-rank figures and lifecycle events: to the cluster derivation, health and runs."""
        cluster, health = self.cluster, self.health
        for event in events:
            if event["type"] == "lifecycle":
                self.runs.lifecycle(event["run"], event["data"])
            if health is not None:
                health.observe(event, now)
            if cluster is None:
                continue
            if event["stage"] == "rank" and event["type"] == "metrics":
                self.queue_derived(cluster.observe(event, now))
            elif event["type"] == "lifecycle":
                cluster.ended(event, now)

    def check(self, now: float) -> None:
        """About once a second: what the cross-rank derivation settles by silence alone; ended runs'
        health dropped once kept long enough."""
        if self.cluster is not None:
            self.queue_derived(self.cluster.check(now))
        if self.health is not None:
            self.health.expire(now)

    def queue_derived(self, derived: list[Derived]) -> None:
        """The relay's own events go where every taken event goes, numbered on from what the journal
        holds of (run, RELAY_RANK); no one is acknowledged for them."""
        for item in derived:
            state = self.runs.lookup(item.run, RELAY_RANK)
            seq = state.floor
            state.take(seq)
            event = relay_event(item, seq, self._host, self._wall_clock())
            self.commit_step.add_derived(item.run, encode_line(event))
            self.counters.derived += 1

    def _refuse_runs(self, peer: bytes, runs: list[str], events: list[dict[str, Any]]) -> None:
        """Too many new runs from one connection: the frame is refused (counted, dead-lettered, not
        acknowledged, so a real client sends it again later, when its budget has grown back)."""
        frame = encoding.encode_frame(events[:16])
        self.reject("run_rate", f"peer started more than {self.run_rate:g} new runs a minute; "
                                f"refused {', '.join(runs[:3])}", frame, peer)

    def _make_room(self, now: float) -> None:
        """Before a new run: if ``max_runs`` are tracked, forget the least recently active one."""
        while self.runs.full:
            run = self.runs.least_recent()
            if run is None or not self.forget(run, now):
                return
            self.counters.runs_evicted += 1

    def forget_idle(self, before: float, now: float) -> None:
        """Drop per-run state of runs silent since ``before``; the journal can rebuild it."""
        for run in self.runs.idle_runs(before):
            if self.forget(run, now):
                log.info("run %s idle for %.0f s: forgot its dedupe state", run, now - before)

    def forget(self, run: str, now: float) -> bool:
        """Drop ``run``'s state; False (kept) while events it vouches for cannot be journaled."""
        if self.cluster is not None:
            self.queue_derived(self.cluster.close(run, now))  # an ended run's ranks left behind
        if self.commit_step.holds(run, self.runs.ranks_of(run)):
            # journal its last events before the state that deduplicated (or numbered) them goes
            self.commit(now)
            if self.commit_step.lines:
                return False
        for rank in self.runs.forget(run):
            self.counters.forget_client_drops((run, rank))
        if self.cluster is not None:
            self.cluster.forget(run)
        if self.health is not None:
            self.health.forget(run)
        return True

    def close_runs(self, now: float) -> None:
        """At shutdown: what the cross-rank derivation still says of each run (ranks left
        behind)."""
        if self.cluster is not None:
            for run in list(self.cluster.runs):
                self.queue_derived(self.cluster.close(run, now))

    def peer_gone(self, peer: bytes) -> None:
        """``peer``'s connection is gone: its streams pass to whichever connection sends next."""
        released = self.runs.release(peer)
        if released:
            self.counters.owners_released += released
            log.debug("peer %s disconnected: %d streams it sent are free", peer.hex(), released)

    def all_peers_gone(self) -> None:
        """Every connection was dropped (the loop's memory guard): every stream is free and no ack
        is due to anyone; each client resends, and is acknowledged then."""
        self.runs.release_all()
        self.commit_step.drop_acks()

    def refuse_connection(self, why: str, now: float) -> None:
        """A connection failed the handshake (relay/daemon/refusals.py)."""
        self.refusals.connection(why, now)

    def reject(self, reason: str, detail: str, frame: bytes, peer: bytes) -> None:
        """A refused frame: counted, logged, dead-lettered (relay/daemon/refusals.py)."""
        self.refusals.frame(reason, detail, frame, peer)
