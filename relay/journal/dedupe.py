"""Per-(run, rank) memory of which sequence numbers the relay already took (docs/protocol.md,
"Dedupe" and "A drop report binds only its own connection").

Clients resend everything unacknowledged after a reconnect, so duplicates are normal; since clients
send in order the set of seqs above the floor stays tiny, and its bound keeps memory fixed per rank
whatever a client does. Which connection sends a stream is the daemon's to know
(relay/daemon/owners.py); here a connection is only a name on a drop claim, so a lying drop report
cannot make the relay discard a later owner's events, nor make a real client believe events were
journaled that were not.
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

from sinks.events import starts_session

log = logging.getLogger(__name__)

MAX_WINDOW = 65_536
MAX_CLAIMS = 16  # drop claims remembered per rank; the oldest is forgotten first
#: Who made a drop claim recovered from the journal: no connection (ZeroMQ's own routing ids are 5
#: bytes, a peer's chosen one may not start with a zero byte).
JOURNAL = b"\x00journal"


class History(Protocol):
    """What the journal (relay.journal.journal.Journal) tells of a run a relay meets again."""

    def seen(self, run: str) -> dict[int, Any]:
        """Per rank: ``spans`` of seqs already written, and how far its client said it
        ``dropped``."""


def claimed_drop(event: dict[str, Any]) -> int | None:
    """The seq a ``stats`` event says its client will never send anything below (``dropped_upto``
    + 1); None if it claims nothing or nothing valid (a client drops only what it numbered before
    the report, so ``dropped_upto`` must lie below the event's own seq)."""
    upto = event["data"].get("dropped_upto") if event["type"] == "stats" else None
    if type(upto) is int and 0 <= upto < event["seq"]:
        return upto + 1
    return None


class DropClaim:
    """Seqs ``[low, high)`` one connection said it dropped, less those the relay had taken then or
    took since from another connection (``seen``); ``filled`` is how far from ``low`` they run on
    without a gap, which is as far as a connection that sent into the range (``senders``) may be
    acknowledged. One that never did (the same client, reconnected) has nothing there to lose."""

    __slots__ = ("low", "high", "peer", "seen", "filled", "senders")

    def __init__(self, low: int, high: int, peer: bytes, seen: set[int]) -> None:
        self.low, self.high, self.peer, self.seen = low, high, peer, seen
        self.filled = low
        self.senders: set[bytes] = set()
        self._advance()

    def take(self, seq: int, peer: bytes) -> bool:
        self.senders.add(peer)
        if seq < self.filled or seq in self.seen:
            return False
        self.seen.add(seq)
        self._advance()
        return True

    def _advance(self) -> None:
        while self.filled in self.seen:
            self.seen.remove(self.filled)  # below ``filled`` the frontier stands for them
            self.filled += 1


class RankState:
    """Seen-set for one (run, rank); ``floor`` is also the cumulative ack the relay can give (but
    see ``ack_for`` once a drop claim exists)."""

    __slots__ = ("floor", "above", "claims")

    def __init__(self) -> None:
        self.floor = 0
        self.above: set[int] = set()
        self.claims: list[DropClaim] | None = None  # None: the common case pays nothing

    def take(self, seq: int, peer: bytes = b"") -> bool:
        """Record ``seq`` sent by connection ``peer``; False if it was already taken."""
        if seq == self.floor:
            self.floor += 1
            above = self.above
            if above:
                while self.floor in above:
                    above.remove(self.floor)
                    self.floor += 1
            return True
        if seq < self.floor:
            return self.claims is not None and self._rescue(seq, peer)
        if seq in self.above:
            return False
        self.above.add(seq)
        if len(self.above) > MAX_WINDOW:
            self._skip_gap()
        return True

    @property
    def top(self) -> int:
        """The highest seq taken (or skipped), -1 for none: a new session must start above it."""
        return max(self.above) if self.above else self.floor - 1

    def take_run(self, first: int, count: int) -> bool:
        """Record seqs ``first`` .. ``first + count - 1`` at once if they are exactly the next ones
        (the common case: a client's next frame); False, recording nothing, otherwise."""
        if first != self.floor or self.above:
            return False
        self.floor += count
        return True

    def skip_to(self, seq: int, peer: bytes | None = None) -> None:
        """Connection ``peer`` will never send anything below ``seq`` again (it dropped those,
        counted); ``peer=None`` is the relay's own decision and binds every connection."""
        if seq <= self.floor:
            return
        taken = {s for s in self.above if s < seq}
        if peer is not None and len(taken) < seq - self.floor:
            claims = self.claims if self.claims is not None else []
            claims.append(DropClaim(self.floor, seq, peer, taken))
            self.claims = claims[-MAX_CLAIMS:]
        self.above.difference_update(taken)
        self.floor = seq
        while self.floor in self.above:
            self.above.remove(self.floor)
            self.floor += 1

    def ack_for(self, peer: bytes) -> int:
        """The cumulative ack for ``peer``: the floor, except that a range another connection
        claimed to have dropped, and ``peer`` sent into, is durable for it only as far as the relay
        took it."""
        ack = self.floor
        if self.claims is None:
            return ack
        for claim in self.claims:
            if claim.filled < claim.high and peer in claim.senders:
                ack = min(ack, claim.filled)
        return ack

    def _rescue(self, seq: int, peer: bytes) -> bool:
        """``seq`` lies below the floor: new only if a drop claim of another connection skipped
        it."""
        for claim in self.claims or ():
            if claim.low <= seq < claim.high:
                if claim.peer == peer:
                    return False  # it said it dropped this one
                if len(claim.seen) >= MAX_WINDOW:
                    log.warning("seq %d falls in a drop claim holding %d scattered seqs; "
                                "taken as a duplicate", seq, MAX_WINDOW)
                    return False
                return claim.take(seq, peer)
        return False

    def _skip_gap(self) -> None:
        lowest = min(self.above)
        log.warning("gap below seq %d held open for %d events; treating it as lost",
                    lowest, MAX_WINDOW)
        self.skip_to(lowest)


class Dedupe:
    """All ranks of all runs. Runs idle for a while are forgotten so a long-lived relay's memory
    does not grow with every job it ever served; if one comes back, its state is rebuilt from the
    journal. ``last_seen`` is kept in order of activity (``touch``): the least recent in O(1)."""

    def __init__(self) -> None:
        self.ranks: dict[tuple[str, int], RankState] = {}
        self.last_seen: dict[str, float] = {}
        self.run_ranks: dict[str, list[int]] = {}

    def add_state(self, run: str, rank: int) -> RankState:
        state = self.ranks[(run, rank)] = RankState()
        self.run_ranks.setdefault(run, []).append(rank)
        self.last_seen.setdefault(run, 0.0)
        return state

    def touch(self, run: str, now: float) -> None:
        """Mark ``run`` active now, moving it to the end of ``last_seen``."""
        self.last_seen.pop(run, None)
        self.last_seen[run] = now

    def least_recent(self) -> str | None:
        return next(iter(self.last_seen), None)

    def lookup(self, run: str, rank: int, journal: History) -> RankState:
        """The state of (run, rank), learning first what ``journal`` already holds of a run this
        process has not met, so events written before a crash or restart are not taken twice, and
        the gaps its clients said they dropped do not hold their acks back."""
        state = self.ranks.get((run, rank))
        if state is not None:
            return state
        if run not in self.run_ranks:
            recovered = 0
            for seen_rank, seen in journal.seen(run).items():
                known = self.ranks.get((run, seen_rank)) or self.add_state(run, seen_rank)
                for start, end in seen.spans:
                    if start > known.floor and starts_session(start):
                        known.skip_to(start, JOURNAL)  # a later session (relay/daemon/ingest.py)
                    for seq in range(start, end):
                        known.take(seq)
                    recovered += end - start
                if seen.dropped:
                    known.skip_to(seen.dropped, JOURNAL)
            if recovered:
                log.info("run %s: %d events already in the journal will not be written again",
                         run, recovered)
        return self.ranks.get((run, rank)) or self.add_state(run, rank)

    def idle_runs(self, before: float) -> list[str]:
        return [run for run, seen in self.last_seen.items() if seen < before]

    def forget(self, run: str) -> list[int]:
        """Drop ``run``'s state; returns the ranks it had."""
        self.last_seen.pop(run, None)
        ranks = self.run_ranks.pop(run, [])
        for rank in ranks:
            del self.ranks[(run, rank)]
        return ranks
