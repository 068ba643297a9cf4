"""The consuming relays' partition leases (relay/fleet/ownership.py), without clocks or sockets: a
simulated KV bucket with compare-and-set, relays that claim, renew, die, are cut off and come back."""
from __future__ import annotations

from relay.fleet.ownership import Claim, Ownership, Renew, Start, Stop

P = 8


class Bucket:
    """A KV bucket as the rules see it: key -> (holder, revision, written at); entries expire ``ttl`` after their write."""

    def __init__(self, ttl: float = 6.0) -> None:
        self.ttl = ttl
        self.keys: dict[str, tuple[str, int, float]] = {}
        self.revision = 0

    def live(self, now: float) -> dict[str, tuple[str, int, float]]:
        self.keys = {k: v for k, v in self.keys.items() if now - v[2] < self.ttl}
        return self.keys

    def write(self, key: str, who: str, last: int | None, now: float) -> int | None:
        """create (last None) or update(last); None where compare-and-set fails."""
        current = self.live(now).get(key)
        if (last is None and current is not None) or (last is not None and (current is None or current[1] != last)):
            return None
        self.revision += 1
        self.keys[key] = (who, self.revision, now)
        return self.revision


class Relay:
    """One relay's rules driven against the bucket, as relay/fleet/consumer.py drives them."""

    def __init__(self, name: str, bucket: Bucket) -> None:
        self.own = Ownership(name, P, ttl=6.0, renew=2.0, margin=1.5)
        self.bucket = bucket
        self.alive = True
        self.reachable = True
        self.consuming: set[int] = set()

    def tick(self, now: float) -> None:
        if not self.alive:
            return
        if self.reachable and self.own.leaving:
            self.bucket.keys.pop(f"m.{self.own.me}", None)
            live = self.bucket.live(now)
            members = {k[2:] for k in live if k.startswith("m.")}
            leases = {p: live[f"p{p}"][0] if f"p{p}" in live else None for p in range(P)}
        elif self.reachable:
            self.bucket.write(f"m.{self.own.me}", self.own.me, None if f"m.{self.own.me}" not in self.bucket.live(now)
                              else self.bucket.keys[f"m.{self.own.me}"][1], now)
            live = self.bucket.live(now)
            members = {k[2:] for k in live if k.startswith("m.")}
            leases = {p: live[f"p{p}"][0] if f"p{p}" in live else None for p in range(P)}
        else:
            members, leases = {self.own.me}, dict.fromkeys(range(P), "?")
        for action in self.own.plan(now, leases, members):
            self.do(action, now)

    def do(self, action, now: float) -> None:
        key = f"p{action.partition}"
        if isinstance(action, Claim):
            revision = self.bucket.write(key, self.own.me, None, now) if self.reachable else None
            if revision is not None:
                self.own.claimed(action.partition, revision, now)
        elif isinstance(action, Renew):
            if not self.reachable:
                self.own.unanswered(action.partition)
                return
            revision = self.bucket.write(key, self.own.me, action.revision, now)
            if revision is None:
                for stop in self.own.lost(action.partition):
                    self.do(stop, now)
            else:
                self.own.renewed(action.partition, revision, now)
        elif isinstance(action, Start):
            self.consuming.add(action.partition)
        elif isinstance(action, Stop):
            self.consuming.discard(action.partition)
            if action.release:
                revision = self.own.held[action.partition].revision
                if self.own.stopped(action.partition) and self.reachable:
                    current = self.bucket.live(now).get(key)
                    if current and current[1] == revision:
                        del self.bucket.keys[key]


def run(relays: list[Relay], start: float, end: float, check=None) -> float:
    now = start
    while now < end:
        for relay in relays:
            relay.tick(now)
        if check is not None:
            check(now)
        now = round(now + 0.5, 3)
    return now


def never_shared(relays: list[Relay]):
    def check(now: float) -> None:
        for p in range(P):
            holders = [r.own.me for r in relays if p in r.consuming]
            assert len(holders) <= 1, f"partition {p} consumed by {holders} at {now}"
    return check


def test_one_relay_takes_every_partition_and_a_second_gets_half():
    bucket = Bucket()
    a, b = Relay("a", bucket), Relay("b", bucket)
    now = run([a], 0, 3)
    assert a.consuming == set(range(P))
    run([a, b], now, now + 10, never_shared([a, b]))
    assert len(a.consuming) == len(b.consuming) == 4
    assert a.consuming | b.consuming == set(range(P))


def test_a_killed_relays_partitions_move_after_the_lease_runs_out_never_before():
    bucket = Bucket()
    a, b = Relay("a", bucket), Relay("b", bucket)
    now = run([a, b], 0, 10)
    theirs = set(a.consuming)
    a.alive = False  # kill -9: no more renewals, its keys expire
    seen: dict[int, float] = {}

    def check(t: float) -> None:
        for p in theirs & b.consuming:
            seen.setdefault(p, t)
    run([a, b], now, now + 12, check)
    assert b.consuming == set(range(P))
    assert min(seen.values()) >= now + 6.0 - 2.0, "taken over before the dead relay's lease could have run out"
    assert max(seen.values()) <= now + 6.0 + 1.0


def test_three_relays_share_eight_partitions_fairly():
    bucket = Bucket()
    relays = [Relay(n, bucket) for n in "abc"]
    run(relays, 0, 15, never_shared(relays))
    counts = sorted(len(r.consuming) for r in relays)
    assert counts == [2, 3, 3]


def test_a_relay_cut_off_from_nats_stops_before_anyone_else_may_start():
    bucket = Bucket()
    a, b = Relay("a", bucket), Relay("b", bucket)
    now = run([a, b], 0, 10)
    a.reachable = False  # alive, consuming, but its renewals get no answer
    stopped_at: dict[int, float] = {}
    started_at: dict[int, float] = {}
    theirs = set(a.consuming)

    def check(t: float) -> None:
        for p in theirs:
            if p not in a.consuming:
                stopped_at.setdefault(p, t)
            if p in b.consuming:
                started_at.setdefault(p, t)
        never_shared([a, b])(t)
    now = run([a, b], now, now + 12, check)
    assert set(started_at) == theirs
    assert all(stopped_at[p] < started_at[p] for p in theirs)
    a.reachable = True  # back: it joins again and gets its share back
    run([a, b], now, now + 15, never_shared([a, b]))
    assert len(a.consuming) == len(b.consuming) == 4


def test_a_lease_renewed_by_someone_else_is_lost_at_once():
    own = Ownership("a", 2, ttl=6.0, renew=2.0, margin=1.5)
    assert own.plan(0.0, {0: None, 1: "b"}, {"a", "b"}) == []  # the others' member keys first
    assert own.plan(2.0, {0: None, 1: "b"}, {"a", "b"}) == [Claim(0)]
    own.claimed(0, 7, 2.0)
    assert own.plan(2.5, {1: "b"}, {"a", "b"}) == [Start(0)]
    assert own.plan(4.0, {1: "b"}, {"a", "b"}) == [Renew(0, 7)]
    assert own.lost(0) == [Stop(0)]
    assert own.consuming() == set()


def test_an_unanswered_renewal_is_tried_again_and_the_lease_ends_at_ttl_less_margin():
    own = Ownership("a", 1, ttl=6.0, renew=2.0, margin=1.5)
    own.claimed(0, 1, 0.0)
    assert own.plan(0.1, {}, set()) == [Start(0)]
    assert own.plan(2.0, {}, set()) == [Renew(0, 1)]
    assert own.plan(2.5, {}, set()) == []  # in flight
    own.unanswered(0)
    assert own.plan(3.0, {}, set()) == [Renew(0, 1)]
    own.unanswered(0)
    assert own.valid(0, 4.4) and not own.valid(0, 4.5)
    assert own.plan(4.5, {0: None}, set()) == [Stop(0)]
    assert own.plan(5.0, {0: None}, set()) == [Claim(0)]  # forgotten: free to claim once the key is gone


def test_giving_back_waits_for_the_partition_to_stop():
    own = Ownership("a", 2, ttl=6.0, renew=2.0, margin=1.5)
    own.claimed(0, 1, 0.0)
    own.claimed(1, 2, 0.0)
    own.plan(0.1, {}, {"a"})
    assert own.plan(0.5, {}, {"a", "b"}) == [Stop(1, release=True)]
    assert own.plan(1.0, {}, {"a", "b"}) == []  # not claimed again, not started while stopping
    assert own.plan(2.0, {}, {"a", "b"}) == [Renew(0, 1), Renew(1, 2)]  # still ours until it is deleted
    own.renewed(0, 3, 2.0)
    own.renewed(1, 4, 2.0)
    assert own.stopped(1) is True
    assert 1 not in own.held and own.consuming() == {0}


def test_relays_started_together_split_the_partitions_without_handing_any_over():
    bucket = Bucket()
    a, b = Relay("a", bucket), Relay("b", bucket)
    starts: list[int] = []
    for relay in (a, b):
        do = relay.do
        relay.do = lambda action, now, do=do: (starts.append(action.partition) if isinstance(action, Start) else None,
                                              do(action, now))
    run([a, b], 0, 6, never_shared([a, b]))
    assert len(a.consuming) == len(b.consuming) == 4
    assert sorted(starts) == list(range(P)), "a partition was started twice (handed over)"


def test_a_leaving_relay_stops_renews_until_stopped_then_gives_everything_back():
    bucket = Bucket()
    a, b = Relay("a", bucket), Relay("b", bucket)
    now = run([a, b], 0, 10)
    a.own.leaving = True
    now = run([a, b], now, now + 0.5)
    assert not a.consuming and a.own.done()
    run([a, b], now, now + 3, never_shared([a, b]))
    assert b.consuming == set(range(P)), "given back, not left to expire"


def test_a_partition_that_ended_by_itself_is_started_again_while_the_lease_is_ours():
    own = Ownership("a", 1, ttl=6.0, renew=2.0, margin=1.5)
    own.claimed(0, 1, 0.0)
    assert own.plan(0.1, {}, set()) == [Start(0)]
    own.ended(0)  # its task saw the lease expire at a late check, and the renewal then came through
    own.renewed(0, 2, 0.5)
    assert own.plan(1.0, {}, set()) == [Start(0)]
