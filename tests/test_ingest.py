"""Ingest, the run table and the commit step on their own (relay/daemon/ingest.py, runs.py, commit.py):
frames in with a peer id and the test's clock, journal lines and acks out, no socket and no relay
process. tests/test_relay_core.py and tests/hostile/ run the same rules through a real relay."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from relay.daemon.cross_rank import ClusterConfig
from relay.daemon.ingest import Ingest
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.journal.reader import journal_files, read_events
from relay.wire import encoding
from sinks.events import RELAY_RANK, attempt_base

Acks = dict[bytes, list[list[tuple[str, int, int]]]]


def event(seq: int, run: str = "run", rank: int = 0, type: str = "metrics", stage: str | None = None,
          **data: Any) -> dict[str, Any]:
    return {"v": 1, "run": run, "rank": rank, "local_rank": rank, "world_size": 2, "host": "h", "seq": seq,
            "ts": 1.0 + seq, "type": type, "step": seq, "epoch": None, "stage": stage, "data": data or {"loss": 0.5}}


def compact(run: str, rank: int, seqs: range, stage: str | None = None) -> bytes:
    """What a Publisher sends: one rank's events in a compact batch (decoded with first_seq)."""
    prefix = encoding.compact_prefix({"v": 1, "run": run, "rank": rank, "local_rank": rank, "world_size": 2,
                                    "host": "h"})
    return encoding.compact_frame(prefix, [encoding.encode_row(s, 1.0 + s, "metrics", s, None, stage,
                                                           {"step_time": 0.1} if stage else {"loss": 0.5})
                                         for s in seqs])


@pytest.fixture
def ingest(tmp_path: Path) -> Any:
    """Ingest on a directory journal, with every ack it sends kept per connection."""
    made = []

    def make(cluster: ClusterConfig | None = None, **options: Any) -> tuple[Ingest, Acks]:
        journal = Journal(str(tmp_path / "journal") + os.sep)
        journal.open()
        acks: Acks = {}
        ingest = Ingest(journal, DeadLetters(journal.sidecar("_deadletter.jsonl")), 0.0, cluster=cluster,
                        send_acks=lambda peer, sent: acks.setdefault(peer, []).append(sorted(sent)), **options)
        made.append(ingest)
        return ingest, acks

    yield make
    for ingest in made:
        ingest.journal.close()
        ingest.deadletters.close()


def journaled(ingest: Ingest) -> list[tuple[str, int, int]]:
    return [(e["run"], e["rank"], e["seq"]) for f in journal_files(ingest.journal.path) for e in read_events(f)]


def test_a_frame_is_journaled_once_and_acknowledged_only_after_the_commit(ingest) -> None:
    relay, acks = ingest()
    relay.take_frame(b"a", compact("run", 0, range(4)), now=1.0)
    assert journaled(relay) == [] and acks == {}, "nothing written or acknowledged before the commit"
    assert relay.pending == 4
    relay.take_frame(b"a", compact("run", 0, range(2, 6)), now=1.1)  # a resend overlapping the first
    relay.commit(now=1.2)
    assert journaled(relay) == [("run", 0, s) for s in range(6)]
    assert acks == {b"a": [[("run", 0, 6)]]}
    counters = relay.counters
    assert (counters.frames, counters.events, counters.written, counters.duplicates) == (2, 8, 6, 2)
    relay.take_frame(b"a", compact("run", 0, range(6)), now=1.3)
    relay.commit(now=1.4)
    assert journaled(relay) == [("run", 0, s) for s in range(6)] and counters.duplicates == 8
    assert acks[b"a"][-1] == [("run", 0, 6)], "a frame of duplicates is acknowledged again"


def test_a_frame_of_plain_metrics_with_a_nan_is_journaled_as_json_says_it(ingest) -> None:
    """Ingest writes a typed frame's lines without looking for a NaN (it can hold none); a frame
    with one is taken by the rules, and its lines say "NaN" and "Infinity", never a bare null."""
    relay, _ = ingest()
    prefix = encoding.compact_prefix({"v": 1, "run": "run", "rank": 0, "local_rank": 0, "world_size": 2, "host": "h"})
    rows = [encoding.encode_row(0, 1.0, "metrics", 0, 0.5, "train", {"loss": 0.5, "big": 1e16}),
            encoding.encode_row(1, 2.0, "metrics", 1, 0.5, "train", {"loss": float("nan"), "norm": float("inf")})]
    relay.take_frame(b"a", encoding.compact_frame(prefix, rows), now=1.0)
    relay.commit(now=1.1)
    lines = (Path(relay.journal.path) / "run.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["data"] for line in lines] == [{"loss": 0.5, "big": 1e16},
                                                              {"loss": "NaN", "norm": "Infinity"}]
    assert relay.counters.written == 2


def test_acks_go_to_each_streams_owner_one_message_per_connection(ingest) -> None:
    live = {b"a", b"b"}
    relay, acks = ingest(connected=live.__contains__)  # what the relay's socket says of each routing id
    relay.take_frame(b"a", compact("run", 0, range(3)), now=1.0)
    relay.take_frame(b"a", compact("other", 0, range(2)), now=1.0)
    relay.take_frame(b"b", compact("run", 1, range(5)), now=1.0)
    relay.take_frame(b"b", compact("run", 0, range(3, 9)), now=1.0)  # a's stream, a connected: refused
    relay.commit(now=1.1)
    assert acks == {b"a": [[("other", 0, 2), ("run", 0, 3)]], b"b": [[("run", 1, 5)]]}
    assert relay.counters.rejected == {"not_owner": 1} and relay.counters.owners_released == 0
    live.discard(b"a")  # a's connection is gone: its streams pass to the next to send for one
    relay.take_frame(b"b", compact("run", 0, range(3, 9)), now=2.0)
    relay.commit(now=2.1)
    assert acks[b"b"][-1] == [("run", 0, 9)] and relay.counters.owners_released == 2


def test_an_owner_is_asked_about_only_when_another_connection_wants_its_stream(ingest) -> None:
    """Whether an owner is connected is asked of the socket at that moment, never learned from an
    earlier report: its own frames, and other streams' frames, ask nothing."""
    asked: list[bytes] = []
    relay, acks = ingest(connected=lambda peer: asked.append(peer) or True)
    relay.take_frame(b"a", compact("run", 0, range(2)), now=1.0)
    relay.take_frame(b"a", compact("run", 0, range(2, 4)), now=1.0)
    relay.take_frame(b"b", compact("run", 1, range(2)), now=1.0)
    assert asked == []
    relay.take_frame(b"c", compact("run", 0, range(4, 6)), now=1.0)
    assert asked == [b"a"] and relay.counters.rejected == {"not_owner": 1}
    relay.commit(now=1.1)
    assert acks == {b"a": [[("run", 0, 4)]], b"b": [[("run", 1, 2)]]}


def test_a_stream_whose_owner_is_gone_passes_to_the_first_connection_refused_it_meanwhile(ingest) -> None:
    """b asked while a looked connected (the relay had not yet seen a's end): when c sends once a is
    gone, the stream is kept for b, which resends; c is refused. Frames' order decides, not when the
    relay learns that a connection ended."""
    live = {b"a", b"b", b"c"}
    relay, acks = ingest(connected=live.__contains__)
    relay.take_frame(b"a", compact("run", 0, range(1)), now=1.0)
    relay.take_frame(b"b", compact("run", 0, range(1, 2)), now=1.1)  # a connected: refused, b waits
    live.discard(b"a")
    relay.take_frame(b"c", compact("run", 0, range(2, 3)), now=1.2)  # a gone: kept for b, c refused
    relay.take_frame(b"b", compact("run", 0, range(1, 2)), now=1.3)  # b's resend is taken
    relay.commit(now=1.4)
    assert acks == {b"b": [[("run", 0, 2)]]} and relay.counters.rejected == {"not_owner": 2}
    assert journaled(relay) == [("run", 0, 0), ("run", 0, 1)]
    live.discard(b"b")
    relay.take_frame(b"c", compact("run", 0, range(2, 3)), now=2.0)  # b gone, c refused since: c's turn
    relay.commit(now=2.1)
    assert acks[b"c"] == [[("run", 0, 3)]] and relay.counters.owners_released == 2


def test_a_refused_handshake_is_counted_each_time_and_reported_once_a_minute(ingest, caplog) -> None:
    relay, _ = ingest()
    for t in (1.0, 2.0, 3.0, 62.0):
        relay.refuse_connection("a peer failed the CURVE handshake", now=t)
    assert relay.counters.rejected == {"auth_failed": 4}
    reported = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(reported) == 2 and "3 refused since the last report" in reported[1]
    letters = [orjson.loads(line) for line in relay.deadletters.path.read_bytes().splitlines()]
    assert [(letter["reason"], letter["size"]) for letter in letters] == [("auth_failed", 0)] * 2


def test_refused_frames_are_counted_dead_lettered_and_never_acknowledged(ingest) -> None:
    relay, acks = ingest(run_rate=2)
    relay.take_frame(b"a", b"\x93not a frame", now=1.0)
    relay.take_frame(b"a", encoding.encode_frame([event(0, rank=RELAY_RANK)]), now=1.0)
    for i in range(3):  # a budget of two new runs: the third is refused
        relay.take_frame(b"a", compact(f"run-{i}", 0, range(1)), now=1.0)
    relay.commit(now=1.1)
    assert relay.counters.rejected == {"undecodable": 1, "reserved_rank": 1, "run_rate": 1}
    assert journaled(relay) == [("run-0", 0, 0), ("run-1", 0, 0)]
    assert acks == {b"a": [[("run-0", 0, 1), ("run-1", 0, 1)]]}
    letters = [orjson.loads(line) for line in relay.deadletters.path.read_bytes().splitlines()]
    assert [letter["reason"] for letter in letters][1:] == ["reserved_rank", "run_rate"]
    relay.take_frame(b"a", compact("run-2", 0, range(1)), now=61.0)  # its budget grew back
    assert relay.counters.rejected["run_rate"] == 1 and relay.pending == 1


def test_a_client_drop_report_moves_the_floor_and_a_reused_run_id_is_refused(ingest) -> None:
    relay, acks = ingest()
    relay.take_frame(b"a", encoding.encode_frame([event(0, type="hello"), event(1)]), now=1.0)
    relay.take_frame(b"a", encoding.encode_frame([event(5, type="stats", dropped=3, dropped_upto=4)]), now=1.0)
    relay.commit(now=1.1)
    assert acks[b"a"] == [[("run", 0, 6)]], "seqs 2..4 were dropped in the client: acknowledged past them"
    assert relay.counters.snapshot({}, 0)["client_dropped"] == 3
    relay.take_frame(b"b", encoding.encode_frame([dict(event(0, type="hello"), ts=99.0)]), now=200.0)
    assert relay.counters.rejected == {"conflict": 1} and relay.counters.duplicates == 0


def test_a_later_attempt_of_a_run_is_taken_from_its_first_seq_and_known_again_after_a_restart(ingest) -> None:
    """A resumed job continues its run: its ranks number from attempt_base(1), above every seq of the
    first attempt, whose last events (never delivered: its process was killed) leave a gap the relay
    acknowledges past; a relay started again on the journal recognises both attempts' events."""
    base = attempt_base(1)
    relay, acks = ingest()
    relay.take_frame(b"a", encoding.encode_frame([event(0, type="hello"), event(1), event(2)]), now=1.0)
    relay.commit(now=1.1)  # seq 3 onwards of the first attempt never arrive: its process was killed
    relay.peer_gone(b"a")
    relay.take_frame(b"b", encoding.encode_frame([event(base, type="hello")]), now=2.0)
    relay.take_frame(b"b", compact("run", 0, range(base + 1, base + 4)), now=2.0)  # the fast path again
    relay.commit(now=2.1)
    assert acks[b"b"] == [[("run", 0, base + 4)]]
    assert journaled(relay) == [("run", 0, s) for s in [0, 1, 2, base, base + 1, base + 2, base + 3]]
    assert relay.counters.duplicates == 0 and relay.counters.reused_run_ids == 0
    relay.journal.close()
    again, acks = ingest()  # a new relay on the same journal (the job's embedded relay of the next attempt)
    again.take_frame(b"c", encoding.encode_frame([event(base, type="hello"), event(base + 1), event(base + 4)]),
                     now=3.0)
    again.commit(now=3.1)
    assert again.counters.duplicates == 2 and acks[b"c"] == [[("run", 0, base + 5)]]
    assert journaled(again)[-1] == ("run", 0, base + 4)


def test_the_oldest_run_is_forgotten_for_a_new_one_after_its_lines_are_journaled(ingest) -> None:
    relay, acks = ingest(max_runs=2)
    relay.take_frame(b"a", compact("one", 0, range(3)), now=1.0)
    relay.take_frame(b"a", compact("two", 0, range(3)), now=2.0)
    relay.take_frame(b"a", compact("three", 0, range(3)), now=3.0)  # "one" must go: its lines first
    assert journaled(relay) == [("one", 0, s) for s in range(3)] + [("two", 0, s) for s in range(3)]
    assert acks == {b"a": [[("one", 0, 3), ("two", 0, 3)]]}, "acknowledged before its state went"
    assert [relay.runs.known(run) for run in ("one", "two", "three")] == [False, True, True]
    assert relay.runs.count() == 2 and relay.counters.runs_evicted == 1
    relay.take_frame(b"a", compact("one", 0, range(5)), now=4.0)  # back: the journal tells what it had
    relay.commit(now=4.1)
    assert [k for k in journaled(relay) if k[0] == "one"] == [("one", 0, s) for s in range(5)]


def test_idle_runs_are_forgotten_and_rebuilt_from_the_journal(ingest) -> None:
    relay, _ = ingest()
    relay.take_frame(b"a", compact("old", 0, range(4)), now=1.0)
    relay.take_frame(b"a", compact("new", 0, range(4)), now=100.0)
    relay.forget_idle(before=50.0, now=100.0)
    assert relay.runs.count() == 1 and relay.runs.known("new") and ("old", 0) not in relay.runs.active
    relay.take_frame(b"a", compact("old", 0, range(6)), now=101.0)
    relay.commit(now=101.1)
    assert sorted(k for k in journaled(relay) if k[0] == "old") == [("old", 0, s) for s in range(6)]


def test_cross_rank_events_are_numbered_on_as_the_relays_rank(ingest) -> None:
    relay, acks = ingest(cluster=ClusterConfig(), wall_clock=lambda: 1234.5)
    for rank in (0, 1):
        relay.take_frame(b"r%d" % rank, compact("run", rank, range(3), stage="rank"), now=1.0)
    relay.check(now=2.0)
    relay.commit(now=2.0)
    ours = [e for f in journal_files(relay.journal.path) for e in read_events(f) if e["rank"] == RELAY_RANK]
    assert [(e["seq"], e["step"], e["stage"], e["ts"]) for e in ours] == [(s, s, "cluster", 1234.5) for s in range(3)]
    assert relay.counters.derived == 3 and all(RELAY_RANK not in {k[1] for ack in sent for k in ack}
                                                for sent in acks.values())


def test_a_failing_journal_keeps_every_line_and_acks_nothing_until_it_works(ingest, tmp_path: Path) -> None:
    """The fault is real: one run's journal file cannot be opened (a directory stands in its place).
    What the files before it took goes to the other sinks at once, and only the rest is retried."""
    handed: list[tuple[bytes, int]] = []
    relay, acks = ingest(fan_out=lambda lines, events, news: handed.append((lines, events)))
    relay.take_frame(b"a", compact("a", 0, range(3)), now=1.0)
    relay.take_frame(b"a", compact("b", 0, range(2)), now=1.0)
    blocker = tmp_path / "journal" / "b.jsonl"
    blocker.mkdir()
    relay.commit(now=1.0)
    batch = relay.commit_step
    assert relay.counters.journal_errors == 1 and relay.counters.written == 3, "run a's file took its part"
    assert batch.pending == 2 and batch.lines == [("b", batch.lines[0][1])] and acks == {}
    assert [(sorted(orjson.loads(line)["seq"] for line in lines.splitlines()), n) for lines, n in handed] \
        == [([0, 1, 2], 3)], "run a's lines go to the other sinks as soon as they are in the journal"
    relay.take_frame(b"a", compact("a", 0, range(3, 5)), now=1.02)  # more of run a, while b's file fails
    relay.commit(now=1.05)  # within the backoff: not even tried
    assert relay.counters.journal_errors == 1
    relay.commit(now=1.1)
    assert relay.counters.journal_errors == 2 and batch.backoff == 0.2 and relay.counters.written == 5
    assert handed[-1][1] == 2 and len(handed) == 2, "run a's new lines, not its old ones again"
    blocker.rmdir()
    relay.commit(now=1.35)
    assert relay.counters.written == 7 and batch.pending == 0 and batch.backoff == 0.0
    assert acks == {b"a": [[("a", 0, 5), ("b", 0, 2)]]}
    assert batch.journal_stats(2.0) == {"written": 7, "errors": 2, "dropped": 0, "queued": 0, "lag_s": 0.0}
    handed_lines = sorted(line for lines, _ in handed for line in lines.splitlines())
    files = b"".join(f.read_bytes() for f in journal_files(relay.journal.path))
    assert handed_lines == sorted(files.splitlines()), "every journaled line handed on, each once"
    assert sum(n for _, n in handed) == 7


def test_the_other_sinks_get_exactly_the_journaled_bytes(ingest) -> None:
    handed: list[tuple[bytes, int]] = []
    relay, _ = ingest(fan_out=lambda lines, events, news: handed.append((lines, events)))
    relay.take_frame(b"a", compact("x", 0, range(3)), now=1.0)
    relay.take_frame(b"a", encoding.encode_frame([event(0, run="y"), event(1, run="y")]), now=1.0)
    relay.commit(now=1.1)
    relay.commit(now=1.2)  # nothing new: nothing handed on
    files = b"".join(f.read_bytes() for f in journal_files(relay.journal.path))
    assert len(handed) == 1 and handed[0][1] == 5 and sorted(handed[0][0].splitlines()) == sorted(files.splitlines())


def test_the_run_table_says_what_the_status_shows(ingest) -> None:
    relay, _ = ingest()
    relay.take_frame(b"a", compact("run", 0, range(2)), now=10.0)
    relay.take_frame(b"b", compact("run", 1, range(2)), now=50.0)
    view = relay.runs.view(now=80.0, window=60.0)
    assert view == {"run": {"connected": 1, "ranks": 2, "world_size": 2, "idle_s": 30.0, "state": "running"}}
    assert relay.runs.client_ranks() == 2
    # its state: how its first train_end said it ended (issue 44 §2); a train_begin runs it again
    relay.take_frame(b"a", encoding.encode_frame([event(2, type="lifecycle", event="train_end", status="failed")]),
                     now=81.0)
    relay.take_frame(b"b", encoding.encode_frame([event(2, rank=1, type="lifecycle", event="train_end")]), now=81.0)
    assert relay.runs.view(now=82.0, window=60.0)["run"]["state"] == "failed"
    relay.take_frame(b"a", encoding.encode_frame([event(3, type="lifecycle", event="train_begin", attempt=1)]),
                     now=83.0)
    assert relay.runs.view(now=84.0, window=60.0)["run"]["state"] == "running"
