"""Which partitions this consuming relay may consume: the lease rules, without clocks or sockets
(docs/deployment.md, "Stream, consumers and leases"); relay/fleet/consumer.py talks to NATS.

A lease is trusted until ``sent + ttl - margin``, ``sent`` being when the last good renewal was
sent, before the server started its ttl. A relay claims nothing in its first ``renew`` seconds, so
relays started together split the partitions without handing any over. Leases keep the central
journal's fence (relay/fleet/central.py) seldom met; they are not what makes a takeover exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Claim:
    """Create key ``p<partition>`` (it must not exist)."""
    partition: int


@dataclass(frozen=True)
class Renew:
    """Update key ``p<partition>`` if its revision is still ``revision``."""
    partition: int
    revision: int


@dataclass(frozen=True)
class Start:
    """Begin consuming ``partition`` (its lease is ours)."""
    partition: int


@dataclass(frozen=True)
class Stop:
    """Stop consuming ``partition`` now: its lease is lost or may be (``release``: we give it up,
    and delete the key once stopped)."""
    partition: int
    release: bool = False


Action = Claim | Renew | Start | Stop


@dataclass
class Held:
    revision: int
    sent: float  # when the last renewal that succeeded was sent
    consuming: bool = False
    releasing: bool = False
    renewing: bool = False  # a renewal is in flight


@dataclass
class Ownership:
    """One relay's view of the leases: ``plan`` says what to do, and each action's outcome comes
    back through ``claimed``, ``renewed``, ``lost``, ``started`` and ``stopped``."""

    me: str
    partitions: int
    ttl: float = 6.0
    renew: float = 2.0
    margin: float = 1.5
    held: dict[int, Held] = field(default_factory=dict)
    #: set to stop: every partition is stopped and given back, none is claimed
    leaving: bool = False
    #: each partition's holder as the last plan was told (None: free; "?": could not be read)
    last_read: dict[int, str | None] = field(default_factory=dict)
    #: the first plan's time: claims wait ``renew`` for the others' member keys
    _first: float | None = None

    def leave(self) -> None:
        """Stop: every partition is stopped and given back, none is claimed."""
        self.leaving = True

    def share(self, members: set[str]) -> int:
        """The most partitions one relay keeps with ``members`` alive (this relay counts)."""
        if self.leaving:
            return 0
        return math.ceil(self.partitions / max(1, len(members | {self.me})))

    def holders(self) -> dict[int, str | None]:
        """Each partition's holder: this relay for those it holds, else as the last plan was
        told."""
        return {k: self.me if k in self.held else self.last_read.get(k)
                for k in range(self.partitions)}

    def valid(self, partition: int, now: float) -> bool:
        """Whether our lease on ``partition`` is certainly still ours at ``now``."""
        held = self.held.get(partition)
        return held is not None and now < held.sent + self.ttl - self.margin

    def plan(self, now: float, leases: dict[int, str | None], members: set[str]) -> list[Action]:
        """What to do at ``now``, given each partition's holder as last read (None: free) and the
        live members. Leases this relay holds are judged by its own record, not by ``leases``."""
        actions: list[Action] = []
        self.last_read = leases
        if self._first is None:
            self._first = now
        for partition, held in sorted(self.held.items()):
            if not self.valid(partition, now):
                if held.consuming:
                    actions.append(Stop(partition))
                    held.consuming = False
                elif not held.releasing:
                    del self.held[partition]
                continue
            if now >= held.sent + self.renew and not held.renewing:
                held.renewing = True
                actions.append(Renew(partition, held.revision))
            if not held.consuming and not held.releasing:
                held.consuming = True
                actions.append(Start(partition))
        share = self.share(members)
        kept = sorted(p for p, h in self.held.items() if not h.releasing)
        for partition in kept[share:]:  # more than our share: give the highest back
            held = self.held[partition]
            held.releasing = True
            held.consuming = False
            actions.append(Stop(partition, release=True))
        room = share - min(len(kept), share) if now >= self._first + self.renew else 0
        for partition in range(self.partitions):
            if room <= 0:
                break
            if partition not in self.held and leases.get(partition) is None:
                actions.append(Claim(partition))
                room -= 1
        return actions

    def claimed(self, partition: int, revision: int, sent: float) -> None:
        """The create sent at ``sent`` succeeded: the lease is ours (start consuming at the next
        plan)."""
        self.held[partition] = Held(revision, sent)

    def renewed(self, partition: int, revision: int, sent: float) -> None:
        held = self.held.get(partition)
        if held is not None:
            held.revision, held.sent, held.renewing = revision, sent, False

    def unanswered(self, partition: int) -> None:
        """A renewal got no answer (NATS away): try again at the next plan; the lease runs out
        meanwhile."""
        held = self.held.get(partition)
        if held is not None:
            held.renewing = False

    def lost(self, partition: int) -> list[Stop]:
        """A renewal found another revision: someone else holds it now. Stop at once."""
        held = self.held.pop(partition, None)
        if held is not None and held.consuming:
            return [Stop(partition)]
        return []

    def ended(self, partition: int) -> None:
        """Consuming ``partition`` ended without a Stop (its lease looked expired at a late check,
        or it failed): the next plan starts it again while the lease is still ours."""
        held = self.held.get(partition)
        if held is not None:
            held.consuming = False

    def stopped(self, partition: int) -> bool:
        """Consuming ``partition`` has stopped; True if its key should now be deleted (a release),
        after which it is no longer ours."""
        held = self.held.get(partition)
        if held is None or not held.releasing:
            return False
        del self.held[partition]
        return True

    def done(self) -> bool:
        """Whether a relay that is ``leaving`` has given every partition back."""
        return self.leaving and not self.held

    def consuming(self) -> set[int]:
        return {p for p, h in self.held.items() if h.consuming}
