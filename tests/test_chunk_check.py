"""The chunk-level check of journal lines (relay.wire.lines.ChunkCheck, which the forward sink and the
consuming relays read lines with) accepts exactly the lines ``parse_event`` accepts, as the same
events, and reports every other line once; and a consuming relay's partition journals the very
bytes, and counts the very lines, that a line-by-line reading would, a failed write included."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from line_helpers import event as _event, lines as _lines
from relay.fleet.partition import Partition
from relay.journal.journal import JournalError
from relay.wire.lines import ChunkCheck, encode_line, parse_event, parse_line
from sinks.events import ENVELOPE, FIELDS, ROW_FIELDS


def test_a_chunk_check_accepts_exactly_what_parse_event_accepts() -> None:
    rng = random.Random(1818)
    for _ in range(400):
        lines = _lines(rng, rng.randrange(1, 40), rng.choice([0.0, 0.02, 0.2, 0.6]))
        run = rng.choice([None, None, "run-a"])
        heard: list[bytes] = []
        check = ChunkCheck(lambda line, why, heard=heard: heard.append(line))
        got = check.events(lines, run)
        expected = [(line, event) for line in lines if (event := parse_event(line)) is not None
                    and (run is None or event["run"] == run)]
        assert [(line, envelope + row) for line, envelope, row in got] == \
            [(line, tuple(event[k] for k in FIELDS)) for line, event in expected]
        grouped: dict[tuple, list[tuple]] = {}
        for _, event in expected:
            grouped.setdefault(tuple(event[k] for k in ENVELOPE), []).append(tuple(event[k] for k in ROW_FIELDS))
        assert ChunkCheck(lambda *_: None).rows(lines, run) == grouped
        keys = ChunkCheck(lambda *_: None).keys(lines)
        assert [(line, key) for line, key in keys if run is None or key[0] == run] == \
            [(line, (event["run"], event["rank"], event["seq"])) for line, event in expected]
        refused = [line for line in lines if parse_event(line) is None]
        if run is None:
            assert sorted(heard) == sorted(refused)  # each once
        else:  # a line of another run is skipped, checked or not; one of this run's never is
            assert Counter(heard) <= Counter(refused)
            assert Counter(line for line in refused if (parse_line(line) or {}).get("run") == run) <= Counter(heard)


def _journal(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("p0/*.jsonl"))}


def _random_bodies(rng: random.Random) -> list[bytes]:
    bodies = []
    for _ in range(60):
        lines = _lines(rng, rng.randrange(1, 30), rng.choice([0.0, 0.0, 0.1]))
        if rng.random() < 0.3:  # a message sent again: its lines are duplicates now
            bodies.append(rng.choice(bodies) if bodies else b"")
            continue
        body = b"\n".join(lines) + rng.choice([b"\n", b"", b"\n\n"])
        bodies.append(body)
    return bodies


def _stream_bodies(rng: random.Random) -> list[bytes]:
    """Messages as a node relay's nats sink publishes them (each rank's next seqs of one run, ranks
    interleaved), and as they come again, overlap, skip a seq, or come bent: the relay's fast path
    and every way out of it."""
    following: Counter = Counter({("run-a", 0): 1, ("run-b", 1): 1})
    bodies = [b"".join(encode_line(dict(_event(rng, 0), run=run, rank=rank)) for run, rank in following)]
    late: list[tuple[tuple[str, int], int]] = []  # seqs skipped, to come in a later message
    for _ in range(120):
        if bodies and rng.random() < 0.1:
            bodies.append(rng.choice(bodies))
            continue
        runs = rng.choice([["run-a"], ["run-b"], ["run-a"], ["run-a", "run-b"]])
        keys = [(rng.choice(runs), rng.randrange(3)) for _ in range(rng.randrange(1, 40))]
        odd = rng.randrange(len(keys)) if rng.random() < 0.2 else -1  # a seq the relay has, or one after a gap
        lines = []
        for i, key in enumerate(keys):
            seq = following[key] + (rng.choice([-2, -1, 1]) if i == odd else 0)
            if seq > following[key]:
                late.append((key, following[key]))
            following[key] = max(following[key], seq + 1)
            lines.append(encode_line(dict(_event(rng, max(0, seq)), run=key[0], rank=key[1])).rstrip(b"\n"))
        if rng.random() < 0.1:  # a bent line beside the event, which comes too
            i = rng.randrange(len(lines))
            lines[i:i + 1] = rng.choice([[b"not json", lines[i]], [lines[i], b""], [lines[i][:-1], lines[i]],
                                         [lines[i], lines[i]]])
        if late and rng.random() < 0.5:
            (run, rank), seq = late.pop(0)
            lines.insert(rng.randrange(len(lines) + 1), encode_line(dict(_event(rng, seq), run=run, rank=rank)).rstrip(b"\n"))
        if rng.random() < 0.05:
            rng.shuffle(lines)
        bodies.append(b"\n".join(lines) + rng.choice([b"\n", b"\n", b""]))
    return bodies


@pytest.mark.parametrize("make", [_random_bodies, _stream_bodies])
def test_a_partition_journals_the_same_bytes_as_a_line_by_line_reading(tmp_path: Path, make) -> None:
    bodies = make(random.Random(18))
    part = Partition(0, tmp_path / "fast", [])
    part.open("central")
    for i in range(0, len(bodies), 7):
        part.take_all(bodies[i:i + 7], 0.0)
        part.write()
    part.close()
    expected: dict[str, bytearray] = {}
    seen: set[tuple] = set()
    bad = duplicates = written = 0
    for body in bodies:
        for line in filter(None, body.split(b"\n")):
            event = parse_event(line)
            if event is None:
                bad += 1
            elif (key := (event["run"], event["rank"], event["seq"])) in seen:
                duplicates += 1
            else:
                seen.add(key)
                written += 1
                expected.setdefault(f"{event['run']}.jsonl", bytearray()).extend(line + b"\n")
    assert _journal(tmp_path / "fast") == {name: bytes(lines) for name, lines in sorted(expected.items())}
    assert (part.counters.bad_lines, part.counters.duplicates, part.counters.written) == (bad, duplicates, written)
    assert part.counters.messages == len(bodies)


def test_a_partitions_failed_write_counts_what_went_in_once_and_retries_only_the_rest(tmp_path: Path) -> None:
    """The JournalQueue (relay/journal/) serves the partition as the daemon's commit step: a real
    fault, run-b's file cannot be opened (a directory in its place), leaves run-a's lines written
    and counted once."""
    part = Partition(0, tmp_path / "fail", [])
    part.open("central")
    lines = [encode_line(dict(_event(random.Random(seq), seq), run=run, rank=0))
             for run in ("run-a", "run-b") for seq in range(5)]
    part.take(b"".join(lines), 0.0)
    blocker = tmp_path / "fail" / "p0" / "run-b.jsonl"
    blocker.mkdir()
    with pytest.raises(JournalError, match="Is a directory"):
        part.write()
    assert part.counters.written == 5 and len((tmp_path / "fail" / "p0" / "run-a.jsonl").read_bytes().splitlines()) == 5
    blocker.rmdir()
    part.write()
    part.close()
    assert part.counters.written == 10
    assert _journal(tmp_path / "fail") == {"run-a.jsonl": b"".join(lines[:5]), "run-b.jsonl": b"".join(lines[5:])}
