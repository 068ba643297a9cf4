"""relay/fleet/chunks.py without a server: chunks are one run's complete journal lines, the journal's
bytes, bounded by lines and bytes, with positions that resume exactly; lines of another run or not
events are never sent as a run's."""
from __future__ import annotations

from pathlib import Path

from relay.fleet.chunks import ChunkReader, Positions


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
    assert all(a.end == b.start for a, b in zip(chunks, chunks[1:])) and chunks[0].start == 0
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
    state = Positions(journal, {"node": "n"})
    state.save({"": ("all.jsonl", chunks[0].end)})
    assert Positions(journal, {"node": "n"}).load() == {"": ("all.jsonl", chunks[0].end)}
    assert Positions(journal, {"node": "other"}).load() == {}


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
