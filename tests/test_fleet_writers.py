"""A consuming relay judges each partition's streams by session (relay/fleet/sessions.py), over
recorded message bodies and no sockets: two node relays publishing one (run, rank) under two
sessions, the second refused, counted and said once in the view; the same judgement by a relay that
rebuilds the view from the central journal, or reopens its folder; a resumed attempt and an elastic
restart taken, on either node."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from relay.fleet.partition import Partition
from relay.fleet.sessions import CENTRAL_SEQ
from relay.wire.lines import encode_line
from sinks.events import RELAY_RANK, attempt_base, session_base

RUN = "shared"


def event(seq: int, type_: str = "metrics", data: dict | None = None,
          host: str = "h") -> dict:
    return {"v": 1, "run": RUN, "rank": 1, "local_rank": 1, "world_size": 2, "host": host,
            "seq": seq, "ts": 1.0 + seq, "type": type_, "step": seq, "epoch": None,
            "stage": "train", "data": data if data is not None else {"loss": 1.0 / (seq + 1)}}


def job(session: str, pid: int, first: int, count: int, host: str = "h") -> list[bytes]:
    """A publisher's stream as its node relay journals it: its hello at ``first``, then metrics."""
    hello = event(first, "hello", {"session": session, "pid": pid, "attempt": 0}, host)
    rest = range(first + 1, first + count)
    return [encode_line(hello)] + [encode_line(event(seq, host=host)) for seq in rest]


class Central:
    """A partition's holder: messages taken, committed to a recorded central journal, written."""

    def __init__(self, root: Path, commits: list[tuple[int, bytes]] | None = None) -> None:
        self.part = Partition(0, root, [])
        self.part.open("RELAY-journal@1")
        self.commits = commits if commits is not None else []
        self.part.apply([c for c in self.commits if c[0] > self.part.position], 0.0)

    def take(self, *messages: tuple[str, list[bytes]]) -> None:
        self.part.take_all([b"".join(lines) for _, lines in messages], 0.0,
                           [node for node, _ in messages])
        body = self.part.uncommitted()
        if body:
            self.commits.append((len(self.commits) + 1, body))
            self.part.write()
            self.part.settle(len(self.commits))

    def stream(self, rank: int = 1) -> list[bytes]:
        path = self.part.journal.path / f"{RUN}.jsonl"
        lines = path.read_bytes().splitlines()
        return [line + b"\n" for line in lines if json.loads(line)["rank"] == rank]

    def said(self) -> list[dict]:
        """The conflicts the consuming relay said in the view."""
        said = [json.loads(line)["data"] for line in self.stream(RELAY_RANK)]
        return [data for data in said if data["event"].startswith("conflict")]


def test_a_second_nodes_session_is_refused_counted_and_said_once(tmp_path, caplog):
    first, second = job("a" * 32, 11, 0, 10), job("b" * 32, 22, 0, 30, host="other")
    central = Central(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="relay.fleet"):
        central.take(("node-a", first[:5]), ("node-b", second[:12]),
                     ("node-a", first[5:]))
        central.take(("node-b", second[12:]))
    assert central.stream() == first, "the view holds the first writer's events only"
    assert central.part.counters.conflict == 30 and central.part.counters.duplicates == 0
    assert central.said() == [{"event": "conflict", "rank": 1, "why": "history", "seq": 0,
                               "writer_pid": 11, "writer_host": "h", "refused_pid": 22,
                               "refused_host": "other", "node": "node-b", "session": "b" * 32}]
    said = [json.loads(line) for line in central.stream(RELAY_RANK)]
    assert [e["seq"] for e in said] == [CENTRAL_SEQ] and said[0]["type"] == "lifecycle"
    errors = [r.getMessage() for r in caplog.records if "a second writer" in r.getMessage()]
    assert len(errors) == 1, errors
    assert "node node-b publishes a process (pid 22 on host other" in errors[0]
    stats = central.part.stats()
    assert stats["conflict"] == 30


def node_said(seq: int) -> bytes:
    """An event node a's relay derived itself (rank RELAY_RANK, numbered from 0)."""
    return encode_line({**json.loads(encode_line(event(seq))), "rank": RELAY_RANK,
                        "type": "lifecycle", "stage": "cluster", "data": {"event": "rank_lost"}})


def test_a_new_holder_and_a_reopened_view_judge_as_the_last_holder_did(tmp_path):
    """The judge's state is the view's: rebuilt from the central journal on another folder, or from
    the folder itself, it refuses the second node's next message and says nothing twice; the node
    relays' own events go on below the consuming relay's."""
    first, second = job("a" * 32, 11, 0, 10), job("b" * 32, 22, 0, 40)
    central = Central(tmp_path / "c")
    central.take(("node-a", first), ("node-b", second[:10]), ("node-a", [node_said(0)]))
    central.part.close()
    for root in (tmp_path / "c", tmp_path / "other"):
        again = Central(root, list(central.commits))
        again.take(("node-b", second[10:20]), ("node-a", first))  # no hello of node b's in it
        again.take(("node-a", [node_said(1)]))
        assert again.stream() == first and len(again.said()) == 1
        seqs = sorted(json.loads(line)["seq"] for line in again.stream(RELAY_RANK))
        assert seqs == [0, 1, CENTRAL_SEQ]
        assert again.part.counters.conflict == 10 and again.part.counters.duplicates == 10
        again.part.close()


def test_a_resumed_attempt_and_an_elastic_restart_continue_the_stream_on_either_node(tmp_path):
    """Sessions above the stream's history once the earlier ended: no conflict, whichever node; a
    node refused once is let in again by a later hello that passes, and a replay agrees."""
    first = job("a" * 32, 11, 0, 10)
    restarted = job("c" * 32, 33, session_base(0, 1), 10)  # torchrun restarted the rank on node a
    resumed = job("d" * 32, 44, attempt_base(1), 10)  # the job resumed on node b
    central = Central(tmp_path / "c")
    central.take(("node-a", first), ("node-a", restarted),
                 ("node-b", resumed))
    assert central.stream() == first + restarted + resumed and central.said() == []
    assert central.part.counters.conflict == 0
    late = job("e" * 32, 55, 0, 5)  # a second job on node b repeats attempt 0's seqs: refused
    later = job("f" * 32, 66, attempt_base(2), 5)  # then node b's next attempt: taken
    central.take(("node-b", late), ("node-b", later))
    assert central.stream() == first + restarted + resumed + later
    assert [(s["event"], s["node"], s["session"]) for s in central.said()] == [
        ("conflict", "node-b", "e" * 32), ("conflict_ended", "node-b", "f" * 32)]
    replayed = Central(tmp_path / "replayed", list(central.commits))
    replayed.take(("node-b", job("f" * 32, 66, attempt_base(2) + 5, 3)[1:]))
    assert replayed.part.counters.conflict == 0
    assert len(replayed.stream()) == len(central.stream()) + 2


def test_an_earlier_attempt_its_node_published_late_is_no_conflict(tmp_path):
    """Node a was cut off from NATS while the job was resumed on node b: attempt 0 reaches the
    central after attempt 1. Its seqs are its own, so it is taken; attempt 1 still writes."""
    first, resumed = job("a" * 32, 11, 0, 10), job("d" * 32, 44, attempt_base(1), 10)
    central = Central(tmp_path / "c")
    central.take(("node-b", resumed), ("node-a", first))
    more = job("d" * 32, 44, attempt_base(1) + 10, 3)[1:]
    central.take(("node-b", more))
    assert sorted(central.stream()) == sorted(first + resumed + more)
    assert central.said() == [] and central.part.counters.conflict == 0
    late = job("e" * 32, 55, 0, 5)  # but a job repeating attempt 0's seqs is a conflict still
    central.take(("node-c", late))
    assert [s["why"] for s in central.said()] == ["history"]
    assert central.part.counters.conflict == 5
