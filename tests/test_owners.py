"""Stream ownership and drop claims as socket-free state machines (relay/journal/dedupe.py):
the rules docs/security.md states, in milliseconds; tests/hostile/test_local_peer.py tries them
against a real relay."""
from __future__ import annotations

from relay.journal.dedupe import JOURNAL, OWNER_SILENCE, Dedupe, RankState
from relay.journal.journal import Seen


def test_a_stream_belongs_to_its_sender_until_it_is_gone_or_silent():
    dedupe = Dedupe()
    key = ("run", 0)
    state = dedupe.add_state(*key)
    assert not state.foreign(b"a", 0.0) and dedupe.claim(key, state, b"a", 0.0)
    assert not dedupe.claim(key, state, b"a", 1.0), "already its own: nothing new"
    assert state.foreign(b"b", 1.0 + OWNER_SILENCE), "live: another connection is refused"
    assert dedupe.release(b"a") == 1 and state.owner is None and dedupe.owned == {}
    assert not state.foreign(b"b", 2.0) and dedupe.claim(key, state, b"b", 2.0)
    assert not state.foreign(b"c", 2.0 + OWNER_SILENCE + 0.1), "silent past OWNER_SILENCE: not live"
    assert dedupe.claim(key, state, b"c", 2.0 + OWNER_SILENCE + 0.1)
    assert dedupe.owned == {b"c": {key}} and state.owner == b"c"
    dedupe.forget("run")
    assert dedupe.owned == {}


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
