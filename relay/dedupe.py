"""Per-(run, rank) memory of which sequence numbers the relay already took.

Clients resend everything unacknowledged after a reconnect, so duplicates are normal. State per
rank is a contiguous floor (every seq below it was taken) plus a bounded set of seqs taken above
it; since clients send in order the set stays tiny, and its bound keeps memory fixed per rank
whatever a client does.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sinks.base import Sink

log = logging.getLogger(__name__)

MAX_WINDOW = 65_536


class RankState:
    """Seen-set for one (run, rank); ``floor`` is also the cumulative ack the relay can give."""

    __slots__ = ("floor", "above")

    def __init__(self) -> None:
        self.floor = 0
        self.above: set[int] = set()

    def take(self, seq: int) -> bool:
        """Record ``seq``; False if it was already taken."""
        if seq == self.floor:
            self.floor += 1
            above = self.above
            if above:
                while self.floor in above:
                    above.remove(self.floor)
                    self.floor += 1
            return True
        if seq < self.floor or seq in self.above:
            return False
        self.above.add(seq)
        if len(self.above) > MAX_WINDOW:
            self._skip_gap()
        return True

    def take_run(self, first: int, count: int) -> bool:
        """Record seqs ``first`` .. ``first + count - 1`` at once if they are exactly the next ones
        (the common case: a client's next frame); False, recording nothing, otherwise."""
        if first != self.floor or self.above:
            return False
        self.floor += count
        return True

    def skip_to(self, seq: int) -> None:
        """The client will never send anything below ``seq`` again (it dropped those, counted)."""
        if seq > self.floor:
            self.above = {s for s in self.above if s >= seq}
            self.floor = seq
            while self.floor in self.above:
                self.above.remove(self.floor)
                self.floor += 1

    def _skip_gap(self) -> None:
        lowest = min(self.above)
        log.warning("gap below seq %d held open for %d events; treating it as lost", lowest, MAX_WINDOW)
        self.skip_to(lowest)


class Dedupe:
    """All ranks of all runs, keyed by (run, rank).

    Runs idle for a while are forgotten so a long-lived relay's memory does not grow with every
    job it ever served; if one comes back, its state is rebuilt from the journal.
    """

    def __init__(self) -> None:
        self.ranks: dict[tuple[str, int], RankState] = {}
        self.last_seen: dict[str, float] = {}

    def add_state(self, run: str, rank: int) -> RankState:
        state = self.ranks[(run, rank)] = RankState()
        self.last_seen.setdefault(run, 0.0)
        return state

    def lookup(self, run: str, rank: int, journal: "Sink") -> RankState:
        """The state of (run, rank), learning first what ``journal`` already holds of a run this
        process has not met, so events written before a crash or restart are not taken twice."""
        state = self.ranks.get((run, rank))
        if state is not None:
            return state
        if run not in self.last_seen:
            recovered = 0
            for seen_rank, seq in journal.seen(run):
                (self.ranks.get((run, seen_rank)) or self.add_state(run, seen_rank)).take(seq)
                recovered += 1
            if recovered:
                log.info("run %s: %d events already in %s will not be written again", run, recovered, journal.name)
        return self.ranks.get((run, rank)) or self.add_state(run, rank)

    def idle_runs(self, before: float) -> list[str]:
        return [run for run, seen in self.last_seen.items() if seen < before]

    def forget(self, run: str) -> None:
        del self.last_seen[run]
        for key in [k for k in self.ranks if k[0] == run]:
            del self.ranks[key]
