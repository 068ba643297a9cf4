"""Stream ownership (relay/daemon/owners.py) and drop claims (relay/journal/dedupe.py) as
socket-free state machines: the rules docs/security.md states, in milliseconds;
tests/hostile/test_local_peer.py tries them against a real relay."""
from __future__ import annotations

from relay.daemon.owners import OWNER_SILENCE, Owners
from relay.journal.dedupe import JOURNAL, Dedupe, RankState
from relay.journal.journal import Seen


def test_a_stream_belongs_to_its_sender_until_it_is_gone_or_silent():
    owners = Owners()
    key = ("run", 0)
    assert not owners.foreign(key, b"a", 0.0) and owners.claim(key, b"a", 0.0)
    assert not owners.claim(key, b"a", 1.0), "already its own: nothing new"
    assert owners.foreign(key, b"b", 1.0 + OWNER_SILENCE), "live: another connection is refused"
    assert owners.release(b"a") == 1 and owners.of(key) is None and owners.owned == {}
    assert not owners.foreign(key, b"b", 2.0) and owners.claim(key, b"b", 2.0)
    assert not owners.foreign(key, b"c", 2.0 + OWNER_SILENCE + 0.1), "silent past OWNER_SILENCE: not live"
    assert owners.claim(key, b"c", 2.0 + OWNER_SILENCE + 0.1)
    assert owners.owned == {b"c": {key}} and owners.of(key) == b"c"
    owners.refused(key, b"d")
    owners.refused(key, b"e")
    assert owners.next_in_line(key) == b"d", "the first refused is next in line"
    assert owners.claim(key, b"d", 70.0) and owners.next_in_line(key) is None
    owners.forget(key)
    assert owners.owned == {} and owners.of(key) is None


def test_a_reconnected_client_is_acknowledged_past_its_own_drop_claim():
    """Before, acks for any connection but the claimant stopped at the claim: the client that made
    it, reconnected under a new identity, never got an ack again."""
    state = RankState()
    assert all(state.take(s, b"old") for s in range(5))
    assert state.take(9, b"old")
    state.skip_to(9, b"old")  # it dropped 5..8
    assert state.take(10, b"new") and state.ack_for(b"new") == 11
    assert state.take(7, b"other") and state.ack_for(b"other") == 5, "it sent into the gap: held at what is filled"


def test_a_drop_report_recovered_from_the_journal_binds_no_connection():
    dedupe = Dedupe()

    class Journal:
        name = "j"

        def seen(self, run):
            seen = Seen()
            seen.spans, seen.dropped = [[0, 4], [7, 10]], 7  # seqs 4..6 dropped, reported at seq 9
            return {0: seen}

    state = dedupe.lookup("run", 0, Journal())
    assert state.floor == 10 and state.ack_for(b"client") == 10
    assert state.claims is not None and state.claims[0].peer == JOURNAL
    assert state.take(5, b"late") and state.ack_for(b"late") == 4, "a late 5 is still taken, acked as far as durable"
