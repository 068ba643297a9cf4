"""relay/fleet/chunks.py without a server: chunks are one run's complete journal lines, the journal's
bytes, bounded by lines and bytes, with positions that resume exactly; lines of another run or not
events are never sent as a run's; a restart steps over what the stream already holds (relay/fleet/resume.py)."""
from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

from relay.fleet.chunks import ChunkReader, position_file, positions
from relay.fleet.resume import Stored, plan, stored_of


def line(run: str, seq: int, pad: int = 0) -> bytes:
    return (b'{"v":1,"run":"%s","rank":0,"seq":%d,"type":"metrics","step":%d,"ts":1.0,"stage":"train",'
            b'"data":{"loss":0.5,"x":"%s"}}\n' % (run.encode(), seq, seq, b"y" * pad))


def drain(reader: ChunkReader, source, max_lines=1000, max_bytes=1 << 20) -> list:
    out = []
    while (chunk := reader.take(source, max_lines, max_bytes)) is not None:
        out.append(chunk)
    return out


def test_chunks_are_bounded_and_resume_where_they_stopped(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    journal.mkdir()
    lines = [line("a.1", i) for i in range(25)] + [line("a.1", 25, pad=5000)]
    (journal / "a.1.jsonl").write_bytes(b"".join(lines) + b'{"v":1,"run":"a.1","seq":')  # a torn last line
    chunks = drain(ChunkReader(journal), "a.1", max_lines=10, max_bytes=4000)
    assert [c.lines for c in chunks] == [10, 10, 5, 1]  # the long line alone, whole
    assert b"".join(c.body for c in chunks) == b"".join(lines)
    assert all(a.end == b.start for a, b in pairwise(chunks)) and chunks[0].start == 0
    assert chunks[1].headers("n1") == {"Nats-Msg-Id": f"n1:a.1:a.1.jsonl:{chunks[1].start}-{chunks[1].end}",
                                       "Relay-Node": "n1", "Relay-Run": "a.1", "Relay-Lines": "10",
                                       "Relay-End": f"a.1.jsonl:{chunks[1].end}"}
    again = ChunkReader(journal)
    again.seek("a.1", chunks[1].end)
    assert [c.msg_id("n1") for c in drain(again, "a.1", 10, 4000)] == [c.msg_id("n1") for c in chunks[2:]]


def test_one_file_chunks_end_where_the_run_changes_and_odd_lines_are_skipped(tmp_path: Path) -> None:
    journal = tmp_path / "all.jsonl"
    journal.write_bytes(line("a", 0) + line("a", 1) + b"not json\n" + line("b", 0) + b"\n" + line("a", 2))
    reader = ChunkReader(journal)
    chunks = drain(reader, None)
    assert [(c.run, c.lines) for c in chunks] == [("a", 2), ("b", 1), ("a", 1)]
    assert chunks[1].body == line("b", 0) and reader.skipped == 1
    state = position_file(journal, {"node": "n"})
    state.save({"sources": {"": ("all.jsonl", chunks[0].end, 7)}})
    assert state.load(positions) == {"": ("all.jsonl", chunks[0].end, 7)}
    state.path.write_text('{"target": {"node": "n"}, "sources": {"": ["all.jsonl", 5]}}')
    assert state.load(positions) == {"": ("all.jsonl", 5, None)}  # kept before floors were
    assert position_file(journal, {"node": "other"}).load(positions) is None


def test_a_runs_file_never_sends_another_runs_line(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    journal.mkdir()
    (journal / "a.jsonl").write_bytes(line("a", 0) + line("b", 0) + line("a", 1))
    reader = ChunkReader(journal)
    chunks = drain(reader, "a")
    assert b"".join(c.body for c in chunks) == line("a", 0) + line("a", 1) and reader.skipped == 1
    grown = reader.take("a", 10, 1 << 20)
    assert grown is None
    with open(journal / "a.jsonl", "ab") as fh:
        fh.write(line("a", 2))
    more = reader.take("a", 10, 1 << 20, more=chunks[-1])
    assert more.lines == chunks[-1].lines + 1 and more.start == chunks[-1].start


def test_a_restart_steps_over_every_chunk_the_stream_holds_and_cuts_the_rest_to_fit(tmp_path: Path) -> None:
    """The chunks a killed relay had stored past its saved position, some of them past a chunk still
    being retried: each line of the file is in exactly one of the old stored chunks or the new ones."""
    journal = tmp_path / "j"
    journal.mkdir()
    (journal / "a.jsonl").write_bytes(b"".join(line("a", i) for i in range(400)))
    rng = random.Random(7)
    for _ in range(50):
        old = drain(ChunkReader(journal), "a", max_lines=rng.randint(1, 30))
        saved = rng.randrange(len(old))
        stored = [c for c in old[saved:] if rng.random() < 0.6]  # stored before the kill; the rest lost
        pieces = [Stored(c.start, c.end, seq) for seq, c in enumerate(rng.sample(stored, len(stored)), 100)]
        offset, ahead = plan(old[saved].start, pieces)
        reader = ChunkReader(journal)
        reader.seek("a", offset)
        new = []
        while True:
            if ahead and reader.position("a") == ahead[0].start:
                reader.seek("a", ahead.pop(0).end)
                continue
            chunk = reader.take("a", rng.randint(1, 50), 1 << 20, stop=ahead[0].start if ahead else None)
            if chunk is None:
                break
            new.append(chunk)
        ranges = sorted([(c.start, c.end) for c in old[:saved] + stored + new])
        assert all(a[1] == b[0] for a, b in pairwise(ranges)), ranges  # no line twice, none missing
        assert ranges[0][0] == 0 and ranges[-1][1] == (journal / "a.jsonl").stat().st_size


def test_stored_of_reads_a_chunk_of_this_file_and_run_only() -> None:
    def msg(file: str, start: int, end: int, run: str = "a") -> SimpleNamespace:
        return SimpleNamespace(seq=9, headers={"Nats-Msg-Id": f"n:{run}:{file}:{start}-{end}",
                                               "Relay-End": f"{file}:{end}", "Relay-Run": run})
    assert stored_of(msg("a.jsonl", 10, 20), "a.jsonl", "a") == Stored(10, 20, 9)
    assert stored_of(msg("a.jsonl", 10, 20, run="b"), "a.jsonl", None) == Stored(10, 20, 9)  # the one file
    assert stored_of(msg("a.jsonl", 10, 20, run="b"), "a.jsonl", "a") is None
    assert stored_of(msg("old.jsonl", 10, 20), "a.jsonl", "a") is None
    assert stored_of(SimpleNamespace(seq=1, headers=None), "a.jsonl", "a") is None
