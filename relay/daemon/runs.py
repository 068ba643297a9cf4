"""The run table: every (run, rank) the relay knows, who sends it, when it last did, and the
budget of new runs each connection may start.

Beside each stream's dedupe state (relay/journal/dedupe.py) and owner (relay/daemon/owners.py) it
keeps what the status shows (each rank's last frame, each run's world size) and each rank's hello,
to spot a run id used again by another job. What to forget and when is ingest's call
(relay/daemon/ingest.py): a run's last events must be journaled before the state that
deduplicated them goes. No socket, no clock.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relay.daemon.bounds import RunBudget
from relay.daemon.counters import run_view
from relay.daemon.owners import Owners
from relay.journal.dedupe import Dedupe, RankState
from relay.journal.journal import Journal
from relay.journal.writers import Writers, named_session, writer_of
from sinks.events import RELAY_RANK

Key = tuple[str, int]


class Runs:
    """The table; ``dedupe`` is its core, the rest is per (run, rank) or per run beside it. Its
    callers ask it, not its core: what they need of the dedupe state is a method here."""

    def __init__(self, journal: Journal, run_rate: float, max_runs: int, owners: Owners,
                 writers: Writers) -> None:
        self.journal = journal  # what a run met again already has (Dedupe.lookup)
        self.dedupe = Dedupe()
        self.owners = owners  # which connection sends each stream
        self.writers = writers  # which session writes each stream (relay/journal/writers.py)
        self.budget = RunBudget(run_rate)  # new runs each connection may start
        self.max_runs = max_runs
        self.hellos: dict[Key, float] = {}  # ts of each rank's hello, to spot reused run ids
        self.active: dict[Key, float] = {}  # each rank's last frame, for "ranks connected"
        self.world: dict[str, int] = {}  # each run's world size
        # each ended run's train_end status (completed, failed, ...)
        self.ended: dict[str, str] = {}
        #: what the clients of ranks met again had reported dropped, per the journal (ingest counts
        #: it)
        self.reported: dict[Key, int] = {}

    @property
    def ranks(self) -> dict[Key, RankState]:
        """Each known stream's dedupe state (journal/dedupe.py): its floor, its drop claims."""
        return self.dedupe.ranks

    def count(self) -> int:
        """Runs known."""
        return len(self.dedupe.run_ranks)

    def known(self, run: str) -> bool:
        return run in self.dedupe.run_ranks

    def new_runs(self, runs: Iterable[str]) -> set[str]:
        return set(runs).difference(self.dedupe.run_ranks)

    @property
    def full(self) -> bool:
        """As many runs as ``max_runs`` are tracked: one must be forgotten before a new one."""
        return len(self.dedupe.run_ranks) >= self.max_runs

    def admit(self, peer: bytes, runs: int, now: float) -> bool:
        """Take ``runs`` new runs from ``peer``'s budget; False (none taken) if it has too few."""
        return self.budget.admit(peer, runs, now)

    def lookup(self, run: str, rank: int) -> RankState:
        """(run, rank)'s state, learned first from the journal for a run not met before."""
        return self.dedupe.lookup(run, rank, self)

    def seen(self, run: str) -> dict[int, Any]:
        """The journal's word on a run met again (relay/journal/dedupe.py's History), noting what
        its ranks' clients reported dropped there, so that a restarted relay counts it at once."""
        seen = self.journal.seen(run)
        for rank, held in seen.items():
            if held.hello is not None:  # its session, if its hello named one (an old client's not)
                data, host, _ = held.hello
                self.writers.recovered((run, rank), writer_of(data, host, named_session(data)))
            if held.reported:
                self.reported[(run, rank)] = held.reported
        return seen

    def met_again(self, run: str, state: RankState) -> bool:
        """Whether a run just looked up had a past: events journaled, or other ranks known."""
        return bool(state.floor or state.above or len(self.dedupe.run_ranks[run]) > 1)

    def claim(self, key: Key, peer: bytes, now: float) -> None:
        """``peer`` sends ``key`` at ``now``: it owns it (ingest refused it if another one does)."""
        self.owners.claim(key, peer, now)
        self.active[key] = now
        self.dedupe.touch(key[0], now)

    def note_world(self, run: str, world_size: int) -> None:
        """A known run's world size (for the status), from its first accepted frame."""
        if run not in self.world and run in self.dedupe.run_ranks:
            self.world[run] = world_size

    def lifecycle(self, run: str, data: dict[str, Any]) -> None:
        """A run's train_begin (it runs, again) or its first train_end (how it ended), for the
        status."""
        what = data.get("event")
        if what == "train_begin":
            self.ended.pop(run, None)
        elif what == "train_end" and run not in self.ended and run in self.dedupe.run_ranks:
            status = data.get("status")
            self.ended[run] = status[:32] if isinstance(status, str) and status else "completed"

    def hello(self, key: Key, ts: float) -> None:
        self.hellos[key] = ts

    def reused(self, key: Key, ts: float) -> bool:
        """A duplicate hello with another ts: another process publishes under this (run, rank)."""
        return self.hellos.get(key, ts) != ts

    def release(self, peer: bytes) -> int:
        """``peer``'s connection is gone: the streams it owned are free. Returns how many."""
        self.writers.gone(peer)
        return self.owners.release(peer)

    def release_all(self) -> None:
        """Every connection is gone: every stream is free."""
        self.owners.release_all()
        self.writers.all_gone()

    def least_recent(self) -> str | None:
        """The run active least recently (the first forgotten to make room), None if none."""
        return self.dedupe.least_recent()

    def idle_runs(self, before: float) -> list[str]:
        """Runs silent since ``before``."""
        return self.dedupe.idle_runs(before)

    def forget(self, run: str) -> list[int]:
        """Drop ``run``'s state (the journal can rebuild it); returns the ranks it had."""
        ranks = self.dedupe.forget(run)
        for rank in ranks:
            self.owners.forget((run, rank))
            self.writers.forget((run, rank))
            self.hellos.pop((run, rank), None)
            self.active.pop((run, rank), None)
        self.journal.release(run)
        self.world.pop(run, None)
        self.ended.pop(run, None)
        return ranks

    def ranks_of(self, run: str) -> list[int]:
        return self.dedupe.run_ranks.get(run, [])

    def client_ranks(self) -> int:
        """Ranks known, the relay's own (RELAY_RANK) not counted."""
        ranks = self.dedupe.ranks
        return len(ranks) - sum((run, RELAY_RANK) in ranks for run in self.dedupe.run_ranks)

    def view(self, now: float, window: float) -> dict[str, dict[str, Any]]:
        """The most recently active runs first, as the status lists them (counters.run_view)."""
        dedupe = self.dedupe
        return run_view(reversed(dedupe.last_seen), dedupe.run_ranks, self.active, self.world,
                        self.ended, now, window)
