"""Who writes a stream (relay/journal/writers.py), in milliseconds: the pure judgment, then ingest
(no socket, no clock) judging hellos of sessions, telling the refused, and a relay started again on
the journal judging the same way. The same cases with real processes: tests/test_one_writer.py."""
from __future__ import annotations

from typing import Any

from relay.journal.writers import (
    MAX_REFUSED,
    SAID_PER_STREAM,
    Conflict,
    Writer,
    Writers,
    judge,
    session_of,
)
from relay.wire import encoding
from sinks.events import RELAY_RANK, attempt_base, session_base, starts_session
from test_ingest import compact, event, ingest, journaled

__all__ = ["ingest"]  # the fixture, used by name

A, B = "aaaa", "bbbb"


def hello(seq: int, session: str | None, pid: int = 1, host: str = "h", rank: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = {"pid": pid}
    if session is not None:
        data["session"] = session
    return {**event(seq, rank=rank, type="hello"), "host": host, "data": data}


def frame(*events: dict[str, Any]) -> bytes:
    return encoding.encode_frame(list(events))


def test_another_session_is_refused_while_the_writer_is_live_or_below_its_history() -> None:
    writer = Writer(A, 42, "vm")
    assert judge(None, B, live=True, above=False) is None, "no writer: the first takes it"
    assert judge(Writer(None), B, live=True, above=False) is None, "a writer of no known session: as before"
    assert judge(writer, A, live=True, above=False) is None, "its own session"
    assert judge(writer, B, live=True, above=True) == "live"
    assert judge(writer, B, live=False, above=False) == "history"
    assert judge(writer, B, live=False, above=True) is None, "the writer gone, above its seqs: the next session"


def test_the_refused_line_names_the_writer_as_far_as_known() -> None:
    line = Conflict(("r", 1), "live", Writer(A, 42, "vm"), Writer(B), 0).line()
    assert line == "run r rank 1 is written by another process (pid 42 on host vm); use another --run_name"
    assert "(on host vm)" in Conflict(("r", 1), "history", Writer(A, None, "vm"), Writer(B), 0).line()
    assert "(pid and host unknown)" in Conflict(("r", 1), "history", Writer(A), Writer(B), 0).line()


def test_a_hello_names_its_session_else_its_connection_does() -> None:
    assert session_of({"session": "ab12"}, b"\x01") == "ab12"
    assert session_of({"session": "x" * 65}, b"\x01") == "01" and session_of({}, b"\x01\x02") == "0102"
    assert session_of({"session": 7}, b"\x01") == "01"


def test_refusals_are_per_connection_said_once_and_forgotten_when_it_goes() -> None:
    writers = Writers()
    conflict = Conflict(("r", 0), "live", Writer(A), Writer(B), 0)
    writers.refuse(("r", 0), b"b", conflict)
    assert writers.refusal(("r", 0), b"b") is conflict and writers.refusal(("r", 0), b"c") is None
    assert writers.first_time(conflict) and not writers.first_time(conflict)
    writers.gone(b"b")
    assert writers.refusal(("r", 0), b"b") is None and not writers.refused
    others = [Conflict(("r", 0), "history", Writer(A), Writer(f"s{n}"), 0) for n in range(20)]
    assert sum(map(writers.first_time, others)) == SAID_PER_STREAM - 1, "a flood of sessions is summed up"
    for n in range(MAX_REFUSED + 5):
        writers.refuse(("r", 0), bytes([n + 1]), conflict)
    assert len(writers.refused[("r", 0)]) == MAX_REFUSED and writers.refusal(("r", 0), b"\x01") is None


def test_session_bases_of_restarts_lie_within_the_attempt_and_start_sessions() -> None:
    assert session_base(0, 0) == 0 and session_base(2, 0) == attempt_base(2)
    assert attempt_base(1) > session_base(0, 255) > session_base(0, 1) == 1 << 24
    assert session_base(0, 10_000) == session_base(0, 255), "past the last range: shares it"
    assert starts_session(session_base(3, 7)) and not starts_session(session_base(3, 7) + 1)


def test_a_second_session_is_refused_while_the_first_is_connected_and_told_why(ingest) -> None:
    live = {b"a", b"b"}
    told: dict[bytes, list] = {}
    relay, acks = ingest(connected=live.__contains__, tell=lambda peer, why: told.setdefault(peer, []).extend(why))
    relay.take_frame(b"a", frame(hello(0, A, pid=11, host="node1"), event(1)), now=1.0)
    relay.take_frame(b"b", frame(hello(0, B, pid=22, host="node2"), event(1)), now=1.1)
    relay.take_frame(b"b", compact("run", 0, range(2, 5)), now=1.2)  # its next frame, no hello: refused too
    relay.commit(now=1.3)
    assert acks == {b"a": [[("run", 0, 2)]]}, "b is never acknowledged"
    assert relay.counters.rejected == {"conflict": 2}
    line = "run run rank 0 is written by another process (pid 11 on host node1); use another --run_name"
    assert told == {b"b": [("run", 0, line), ("run", 0, line)]}
    assert sum(rank == RELAY_RANK for _, rank, _ in journaled(relay)) == 1, "the conflict journaled once"


def test_the_forger_that_left_keeps_the_real_rank_from_being_acknowledged(ingest) -> None:
    """Seqs 0-99 from a connection that then leaves; the real rank's hello at 0 is refused (its
    seqs would be taken for duplicates of the forger's), also after a restart on the journal."""
    live = {b"f", b"r"}
    relay, acks = ingest(connected=live.__contains__)
    relay.take_frame(b"f", compact("run", 0, range(100)), now=1.0)
    live.discard(b"f")
    relay.peer_gone(b"f")
    relay.take_frame(b"r", frame(hello(0, A), *[event(s) for s in range(1, 150)]), now=2.0)
    relay.commit(now=2.1)
    assert b"r" not in acks and relay.counters.rejected == {"conflict": 1}
    assert relay.counters.duplicates == 0


def test_a_new_session_above_the_history_continues_once_the_writer_has_gone(ingest) -> None:
    """An elastic restart (a session_base of the attempt) and a resumed attempt: taken, and the floor
    moves up to them, so acks go on."""
    live = {b"a", b"b", b"c"}
    relay, acks = ingest(connected=live.__contains__)
    relay.take_frame(b"a", frame(hello(0, A), event(1), event(2)), now=1.0)
    live.discard(b"a")  # killed: its connection is gone
    restart = session_base(0, 1)
    relay.take_frame(b"b", frame(hello(restart, B), event(restart + 1)), now=2.0)
    live.discard(b"b")  # ended
    relay.take_frame(b"c", frame(hello(attempt_base(1), "cccc"), event(attempt_base(1) + 1)), now=3.0)
    relay.commit(now=3.1)
    assert relay.counters.rejected == {}
    assert acks[b"c"] == [[("run", 0, attempt_base(1) + 2)]]
    assert [seq for _, _, seq in journaled(relay)] == [0, 1, 2, restart, restart + 1, attempt_base(1),
                                                       attempt_base(1) + 1]


def test_a_relay_started_again_knows_the_writer_from_the_journal(ingest) -> None:
    relay, _ = ingest()
    relay.take_frame(b"a", frame(hello(0, A, pid=11), event(1)), now=1.0)
    relay.commit(now=1.1)
    relay.journal.close()
    again, acks = ingest()  # on the same journal: meets the run again
    again.take_frame(b"a", compact("run", 0, range(2, 4)), now=5.0)  # the writer's next events: taken
    again.take_frame(b"x", frame(hello(0, B, pid=99)), now=5.1)  # another session at seq 0: refused
    again.commit(now=5.2)
    assert acks == {b"a": [[("run", 0, 4)]]} and again.counters.rejected == {"conflict": 1}


def test_old_clients_and_old_journals_without_a_session_are_judged_as_before(ingest) -> None:
    """A hello without ``session`` (an old client): its connection names it while the relay runs;
    a journal of such hellos names no session, so after a restart the first sender takes the stream."""
    relay, _ = ingest()
    relay.take_frame(b"a", frame(hello(0, None), event(1)), now=1.0)
    relay.commit(now=1.1)
    relay.journal.close()
    again, acks = ingest()
    again.take_frame(b"b", frame(hello(2, None), event(3)), now=5.0)
    again.commit(now=5.1)
    assert again.counters.rejected == {} and acks == {b"b": [[("run", 0, 4)]]}


def test_a_flood_of_other_refusals_never_hides_a_second_writer_or_another_reason(ingest, caplog) -> None:
    """Each refusal reason has its own log limit, and second writers one of their own: after a
    thousand refused frames of one reason, a not_owner refusal and a new conflict are still logged."""
    live = {b"a", b"b", b"c"}
    relay, _ = ingest(connected=live.__contains__)
    for _ in range(1000):
        relay.take_frame(b"x", b"\xc1", now=1.0)  # undecodable
    relay.take_frame(b"a", frame(hello(0, A), event(1)), now=1.0)
    relay.take_frame(b"b", compact("run", 0, range(2, 4)), now=1.1)  # a's stream, a connected: not_owner
    relay.take_frame(b"c", frame(hello(0, B)), now=1.2)  # another session: conflict
    logged = [r.getMessage() for r in caplog.records]
    assert sum("undecodable" in m for m in logged) == 11, "the first ten, then the thousandth"
    assert any("not_owner" in m for m in logged) and any("refused a second writer" in m for m in logged)


def test_a_refused_rank_spools_its_events_without_telling_to_replay_them_into_the_run() -> None:
    """Replayed into the run, a second writer's events would be taken for its writer's."""
    from relay.client.spool import told

    said = told("ipc:///r", 12, "run", 1, "/o/run.rank1.spool.jsonl", "/o/j.jsonl", "run run rank 1 is written by x")
    assert said.endswith("were never acknowledged: run run rank 1 is written by x; spooled in /o/run.rank1.spool.jsonl")
    assert "relay replay /o/run.rank1.spool.jsonl --sink jsonl --path /o/j.jsonl" in told(
        "ipc:///r", 12, "run", 1, "/o/run.rank1.spool.jsonl", "/o/j.jsonl", None)
