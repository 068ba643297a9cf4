"""A consuming relay's view of a partition (relay/fleet/partition.py) and the central journal's
commits cut to size (relay/fleet/central.py), without sockets: the view applies each commit after
its position once, however stale the position it kept, and rebuilds from commits alone."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from relay.fleet.central import pieces
from relay.fleet.partition import Partition
from relay.wire.lines import encode_line


def body(run: str, seqs: range, rank: int = 0) -> bytes:
    return b"".join(encode_line({"v": 1, "run": run, "rank": rank, "local_rank": 0, "world_size": 1, "host": "h",
                                 "seq": seq, "ts": 1.0 + seq, "type": "metrics", "step": seq, "epoch": None,
                                 "stage": "train", "data": {"loss": 1.0 / (seq + 1)}}) for seq in seqs)


def view(root: Path, central: str = "RELAY-journal@1", holding: Callable[[], bool] = lambda: True) -> Partition:
    part = Partition(0, root, [], holding=holding)
    part.open(central)
    return part


def lines(root: Path) -> list[bytes]:
    return sorted(line for path in (root / "p0").glob("*.jsonl") for line in path.read_bytes().splitlines())


COMMITS = [(3, body("a", range(10))), (7, body("b", range(5)) + body("a", range(10, 20))),
           (9, body("a", range(20, 25)))]


def test_a_view_applies_each_commit_after_its_position_once(tmp_path):
    part = view(tmp_path)
    part.apply(COMMITS[:2], 0.0)
    assert part.position == 7 and part.counters.applied == 25
    part.close()
    part = view(tmp_path)  # the position was kept beside the lines
    assert part.position == 7
    part.apply(COMMITS[2:], 0.0)
    part.close()
    assert lines(tmp_path) == sorted(b"".join(b for _, b in COMMITS).splitlines())


def test_a_position_older_than_the_lines_only_applies_commits_twice_and_they_are_dropped(tmp_path):
    part = view(tmp_path)
    part.apply(COMMITS, 0.0)
    part.close()
    kept = tmp_path / "p0" / "_relay_view.json"
    kept.write_text(json.dumps({"central": "RELAY-journal@1", "position": 3}))  # killed before it settled
    part = view(tmp_path)
    part.apply(COMMITS[1:], 0.0)
    assert part.counters.applied == 0 and part.position == 9
    part.close()
    assert lines(tmp_path) == sorted(b"".join(b for _, b in COMMITS).splitlines())


def test_a_view_of_another_central_journal_is_read_from_its_start_without_repeating_a_line(tmp_path):
    part = view(tmp_path)
    part.apply(COMMITS[:1], 0.0)
    part.close()
    part = view(tmp_path, "RELAY-journal@2")  # the central journal was made anew
    assert part.position == 0
    part.apply(COMMITS, 0.0)
    part.close()
    assert lines(tmp_path) == sorted(b"".join(b for _, b in COMMITS).splitlines())


def test_a_batch_taken_and_refused_by_the_fence_is_taken_again_on_top_of_what_came_in(tmp_path):
    part = view(tmp_path)
    batch = [body("a", range(12))]
    part.take_all(batch, 0.0)
    assert part.uncommitted() == batch[0]
    part.reset()  # the fence refused it: another relay committed a[0:10] meanwhile
    part.apply(COMMITS[:1], 0.0)
    part.take_all(batch, 0.0)
    assert part.uncommitted() == body("a", range(10, 12))
    assert (part.counters.messages, part.counters.duplicates) == (1, 10)  # the batch counted once
    part.write()
    part.settle(4)
    part.close()
    assert lines(tmp_path) == sorted(body("a", range(12)).splitlines())


def test_lines_written_once_the_lease_is_in_doubt_are_withheld_from_the_sinks(tmp_path):
    part = view(tmp_path, holding=lambda: False)
    part.apply(COMMITS[:1], 0.0)
    assert part.counters.withheld == 10 and not part.fan_out.workers
    part.close()


def test_a_commit_is_cut_at_line_ends_within_the_limit():
    text = b"".join(b"x" * n + b"\n" for n in (10, 30, 5, 80, 1, 1, 40))
    cut = pieces(text, 40)
    assert b"".join(cut) == text and all(p.endswith(b"\n") for p in cut)
    assert all(len(p) <= 40 for p in cut if p.count(b"\n") > 1) and max(map(len, cut)) == 81  # a longer line alone
    assert pieces(text, len(text)) == [text]
