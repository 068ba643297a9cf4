"""Recovery never cuts an acknowledged line, and no line is longer than schema.MAX_LINE_BYTES
(issue 16, item 1): real relay processes, real journal files, real sockets."""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
import zmq

from conftest import finish, raw_socket, start_publisher, wait_for
from relay.client.publisher import Publisher
from relay.journal.journal import Journal
from relay.journal.reader import read_events
from relay.wire import encoding, schema
from relay.wire.lines import encode_line

TORN = 3 << 19  # 1.5 MiB: more than the 1 MiB the old recovery looked back


def _event(seq: int, **over: object) -> dict:
    event = {"v": 1, "run": "torn", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": seq,
             "ts": time.time(), "type": "metrics", "step": seq, "epoch": None, "stage": "train", "data": {"i": seq}}
    event.update(over)
    return event


def _journal_file(path: Path, layout: str, run: str) -> Path:
    return path / f"{run}.jsonl" if layout == "dir" else path


def _path_arg(path: Path, layout: str) -> str:
    return f"{path}/" if layout == "dir" else str(path)


def _whole_valid_lines(file: Path) -> list[dict]:
    """Every line of ``file``, which must end with a newline and hold only events."""
    data = file.read_bytes()
    assert data.endswith(b"\n"), f"{file} ends in a torn line"
    bad: list[int] = []
    events = list(read_events(file, bad))
    assert not bad, f"{file}: lines {bad[:5]} are not events"
    return events


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_a_torn_tail_longer_than_a_mebibyte_cuts_only_itself(relays, tmp_path, layout):
    """The issue's reproduction: 20,000 acknowledged events, the relay stopped, 1.5 MiB without a
    newline appended (a crash in the middle of one long line), a restart, one more event: all
    20,001 are there, once each."""
    path = tmp_path / ("journal.jsonl" if layout == "file" else "logs")
    relay = relays(["--path", _path_arg(path, layout)])
    stats = finish(start_publisher(relay.address, "torn", 0, 20_000))
    assert stats["left"] == 0 and stats["acked"] >= 20_000, stats
    assert relay.stop() == 0
    file = _journal_file(path, layout, "torn")
    acked = file.stat().st_size
    with open(file, "ab") as fh:
        fh.write(b'{"v":1,"run":"torn","rank":0,"data":{"s":"' + b"\x01" * TORN)
    relay = relays(["--path", _path_arg(path, layout)], address=relay.address)
    with Publisher("torn", 1, world_size=2, address=relay.address) as pub:
        pub.publish("metrics", {"i": 0}, step=0, stage="train")
        assert pub.flush(15) == 0
    assert relay.stop() == 0
    assert file.stat().st_size > acked
    events = _whole_valid_lines(file)
    per_rank = Counter((e["rank"], e["data"]["i"]) for e in events if e["type"] == "metrics")
    assert sorted(i for rank, i in per_rank if rank == 0) == list(range(20_000))
    assert per_rank[(1, 0)] == 1 and max(per_rank.values()) == 1
    assert "cut a torn last line" in relay.log.read_text()


def _send(address: str, events: list[dict]) -> int:
    """One frame from a raw connection; the relay's ack for (run, rank) of the first event."""
    ctx = zmq.Context()
    sock = raw_socket(ctx, address)
    try:
        sock.send(encoding.encode_frame(events))
        assert sock.poll(15_000), "no ack"
        return schema.decode_ack(sock.recv())[0][2]
    finally:
        sock.close(0)
        ctx.term()


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_an_event_in_the_torn_tail_is_not_taken_as_present(relays, tmp_path, layout):
    """A whole event line that lacks only its newline was never acknowledged: the restarted relay
    cuts it and must take that event again when its client resends it, not drop it as a duplicate
    (the directory layout read the run's file before cutting it)."""
    path = tmp_path / ("journal.jsonl" if layout == "file" else "logs")
    relay = relays(["--path", _path_arg(path, layout)])
    assert _send(relay.address, [_event(s) for s in range(5)]) == 5
    assert relay.stop() == 0
    file = _journal_file(path, layout, "torn")
    with open(file, "ab") as fh:
        fh.write(encode_line(_event(5)).rstrip(b"\n"))  # the newline is what the crash did not write
    relay = relays(["--path", _path_arg(path, layout)], address=relay.address)
    assert _send(relay.address, [_event(s) for s in range(7)]) == 7
    assert relay.stop() == 0
    assert [e["seq"] for e in _whole_valid_lines(file)] == list(range(7))


def test_a_released_run_is_cut_again_before_it_is_read(tmp_path):
    """Journal.release forgets a run; when the run comes back its file is cut before ``seen`` reads
    it, whatever lies in it since, in the directory layout (where every run has its own file)."""
    journal = Journal(f"{tmp_path}/logs/")
    journal.open()
    journal.write([_event(s) for s in range(3)])
    journal.flush()
    assert _pairs(journal.seen("torn")) == [(0, 0), (0, 1), (0, 2)]
    journal.release("torn")
    with open(tmp_path / "logs" / "torn.jsonl", "ab") as fh:
        fh.write(encode_line(_event(3)).rstrip(b"\n"))
    assert _pairs(journal.seen("torn")) == [(0, 0), (0, 1), (0, 2)]
    assert (tmp_path / "logs" / "torn.jsonl").read_bytes().endswith(b"\n")
    journal.close()


@pytest.mark.parametrize("torn", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 5 << 20])
def test_recovery_keeps_every_whole_line_whatever_the_torn_length(tmp_path, torn):
    """The cut lands exactly after the last newline, also when that newline is one byte before or
    after a chunk boundary of the backwards search, or there is no newline at all."""
    file = tmp_path / "j.jsonl"
    whole = b"".join(encode_line(_event(s)) for s in range(3))
    file.write_bytes(whole + b"x" * torn)
    journal = Journal(file)
    journal.open()
    journal.close()
    assert file.read_bytes() == whole
    only = tmp_path / "only.jsonl"
    only.write_bytes(b"y" * torn)
    journal = Journal(only)
    journal.open()
    journal.close()
    assert only.read_bytes() == b""


def _frame_of(data: dict, seq: int = 0, host: str = "h") -> bytes:
    return encoding.compact_frame(encoding.compact_prefix({"v": 1, "run": "long", "rank": 0, "local_rank": 0,
                                                       "world_size": 1, "host": host}),
                                [encoding.encode_row(seq, time.time(), "metrics", seq, None, "train", data)])


def test_an_event_whose_line_would_pass_the_bound_is_refused_and_the_publisher_drops_it(relays, tmp_path, zmq_context):
    """JSON writes a control character in 6 bytes: 400 KB of them (a valid frame) would be a
    2.4 MB line. The relay refuses it (bad_value, counted); a Publisher drops it before sending
    (dropped_bad) and goes on; the same bytes of plain text, and control characters up to the
    bound, are journaled."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    raw.send(_frame_of({"s": "\x01" * 400_000}))
    fits = (schema.MAX_LINE_BYTES - 1000) // 6
    raw.send(_frame_of({"s": "\x01" * fits}))
    raw.send(_frame_of({"s": "a" * 900_000}, seq=1))
    assert raw.poll(15_000)
    with Publisher("long", 1, world_size=2, address=relay.address) as pub:
        pub.publish("params", {"s": "\x02" * 400_000})
        pub.publish("params", {"s": "\x02" * fits})
        pub.publish("metrics", {"i": 1})
        assert pub.flush(15) == 0
        assert pub.stats["dropped_bad"] == 1 and pub.stats["acked"] >= 2, pub.stats
    stats = tmp_path / "j_stats.json"  # written at the first stats interval
    wait_for(lambda: stats.exists() and relay.stats(journal)["rejected"].get("bad_value") == 1, 10,
             "the refusal counted")
    raw.close(0)
    ctx.term()
    assert relay.stop() == 0
    lines = journal.read_bytes().splitlines(keepends=True)
    assert max(map(len, lines)) <= schema.MAX_LINE_BYTES
    events = [orjson.loads(line) for line in lines]
    assert [e["seq"] for e in events if e["rank"] == 0] == [0, 1]
    assert [len(e["data"].get("s", "")) for e in events if e["type"] == "params"] == [fits]
    dead = (tmp_path / "j_deadletter.jsonl").read_text()
    assert "journal line would be" in dead


def _pairs(seen: dict) -> list[tuple[int, int]]:
    """(rank, seq) of everything ``Journal.seen`` says a run holds."""
    return sorted((rank, seq) for rank, held in seen.items() for seq in held.seqs())
