"""``relay tail``'s first look read from the end (relay/cli/backlog.py, relay/cli/backward.py): it
shows what a whole forward read would end with, events and steps, in both journal layouts, and
it reads about what it shows, not the journal; ``-f`` goes on from there."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from conftest import wait_for
from relay.cli.backward import lines_backwards
from relay.cli.filters import Selection, selection
from relay.cli.tail import Tail
from relay.wire.lines import encode_line
from watch_helpers import LiveCommand, event, training_journal, write_journal

EVERYTHING = Selection()  # no filter (frozen: one shared default is safe)


def shown(path: Path, last: int | None, chosen: Selection = EVERYTHING, **kw) -> str:
    """What ``relay tail`` prints (without following), run in this process."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with contextlib.redirect_stdout(out):
        Tail(path, chosen, **kw).run(follow=False, last=last)
        out.flush()
        return out.buffer.getvalue().decode()


def tail_of(text: str, n: int) -> list[str]:
    lines = text.splitlines()
    return lines[len(lines) - n:] if n else []


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A single file holding two runs whose lines interleave, and a directory of three run files
    whose times interleave; some lines no relay would write, a last line without its newline. Each
    under 4096 lines: a forward read of a longer one shows its steps in pieces, which may order the
    lines of two runs otherwise at the seams."""
    root = tmp_path_factory.mktemp("backlog")
    single = root / "single.jsonl"
    training_journal(root / "a", "run-a", 300, t0=1.7e9, straggler_every=40)
    training_journal(root / "b", "run-b", 200, t0=1.7e9 + 7, ranks=3, straggler_every=25)
    lines = [line for part in ("a", "b") for line in (root / part).read_bytes().splitlines(keepends=True)]
    single.write_bytes(b"".join(sorted(lines, key=lambda line: json.loads(line)["ts"])))  # as two jobs write it
    with open(single, "ab") as fh:
        fh.write(b"not json at all\n\n" + encode_line(event("run-a", 0, 9999, float("nan"), "metrics", {"x": 1},
                                                          step=301, stage="train")))
        fh.write(encode_line(event("run-b", 0, 9999, 1.7e9 + 500, "metrics", {"y": 2}, step=201, stage="train"))[:-1])
    folder = root / "dir"
    folder.mkdir()
    for i, run in enumerate(("run-c", "run-d", "run-e")):  # run-e: 7 ranks, 9 events a step
        training_journal(folder / f"{run}.jsonl", run, 150 + 40 * i, t0=1.7e9 + 3 * i, ranks=(2, 4, 7)[i],
                         straggler_every=30)
    (folder / "_relay_stats.json").write_text("{}")  # a sidecar: not a run file
    return {"single": single, "directory": folder}


@pytest.mark.parametrize("layout", ["single", "directory"])
@pytest.mark.parametrize("view, as_json", [("events", False), ("events", True), ("steps", False)])
def test_the_last_lines_are_the_end_of_everything(journals: dict[str, Path], layout: str, view: str,
                                                  as_json: bool) -> None:
    path = journals[layout]
    everything = shown(path, None, view=view, as_json=as_json)
    rows = [line for line in everything.splitlines() if not line.startswith(("run ", "time "))]
    assert len(rows) > 400
    for last in (0, 1, 7, 25, 60, 400, 10**6):  # 25: run-e's window first cuts a step shown (its certainty)
        text = shown(path, last, view=view, as_json=as_json)
        assert [line for line in text.splitlines() if not line.startswith(("run ", "time "))] == tail_of(
            "\n".join(rows), last), (last, text[-2000:])


def test_filters_apply_before_the_last_lines_are_counted(journals: dict[str, Path]) -> None:
    path = journals["single"]
    for chosen in (selection(runs=("run-a",)), selection(types=("lifecycle",)), selection(metrics=("loss",)),
                   selection(ranks=(2,), stages=("rank",))):
        for view in ("events", "steps"):
            whole = shown(path, None, chosen, view=view)
            assert shown(path, 5, chosen, view=view).splitlines()[-5:] == whole.splitlines()[-5:], (chosen, view)


def test_lines_backwards_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    lines = [b"x" * n for n in (0, 1, 8191, 8192, 8193, 70000, 3, 0, 5)]
    data = b"\n".join(lines)
    path.write_bytes(data)
    for end in (None, 0, 1, 3, 8195, 8194 + 8192, 8195 + 8192, len(data) - 9, len(data)):
        expected = [line for line in reversed(data[:end].split(b"\n")) if line]
        assert list(lines_backwards(path, end=end)) == expected, end
    assert list(lines_backwards(tmp_path / "missing.jsonl")) == []


def test_the_first_look_reads_what_it_shows_not_the_journal(tmp_path: Path) -> None:
    """About 30 MB of journal; the read counter of this process (read_chars: every byte any read
    call returned) says how much each look read."""
    path = tmp_path / "big.jsonl"
    training_journal(path, "big", 20_000, t0=1.7e9, straggler_every=500)
    size = path.stat().st_size
    me = psutil.Process()

    def read_for(**kw) -> int:
        before = me.io_counters().read_chars
        shown(path, **kw)
        return me.io_counters().read_chars - before

    assert size > 25e6
    assert read_for(last=None) >= size  # the counter sees a whole read
    for kw in ({"last": 20}, {"last": 20, "as_json": True}, {"last": 20, "view": "steps"}):
        assert read_for(**kw) < 200_000, kw


def test_a_directory_of_many_old_runs_costs_a_look_at_each_files_time(tmp_path: Path) -> None:
    """500 runs of last week beside a live one: only the live one's end is read (each old file's
    last write says it holds nothing newer), and what is shown is what a whole read ends with."""
    logs = tmp_path / "logs"
    logs.mkdir()
    week_ago = time.time() - 7 * 86400
    for i in range(500):
        old = logs / f"old-{i:03d}.jsonl"
        write_journal(old, [event(f"old-{i:03d}", 0, s, week_ago + i + s, "metrics", {"loss": 1.0}, step=s,
                                  stage="train") for s in range(20)])
        os.utime(old, (week_ago + i + 20, week_ago + i + 20))
    training_journal(logs / "live.jsonl", "live", 200, t0=time.time() - 100)
    me = psutil.Process()
    for view in ("events", "steps"):
        before = me.io_counters().read_chars
        text = shown(logs, 20, view=view)
        assert me.io_counters().read_chars - before < 200_000, view  # the old files hold 1.4 MB
        assert text.splitlines()[-20:] == shown(logs, None, view=view).splitlines()[-20:]


def test_follow_starts_at_the_end_and_waits_for_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    lines = [encode_line(event("f", 0, i, 1.7e9 + i, "metrics", {"i": i}, step=i, stage="train")) for i in range(60)]
    path.write_bytes(b"".join(lines[:50]) + lines[50][:20])  # the relay is writing line 50
    tail = LiveCommand("tail", "-f", "--json", "-n", "3", str(path))
    try:
        wait_for(lambda: len(tail.lines) == 3, 30, "the last 3 complete lines")
        with open(path, "ab") as fh:
            fh.write(lines[50][20:] + b"".join(lines[51:55]))
        wait_for(lambda: len(tail.lines) == 8, 30, "the line that was being written, and those after it")
        os.rename(path, path.with_suffix(".old"))  # rotated: the new file from its start
        with open(path, "ab") as fh:
            fh.write(b"".join(lines[55:60]))
        wait_for(lambda: len(tail.lines) == 13, 30, "the new file's lines")
        code, stderr = tail.stop(signal.SIGINT)
    finally:
        tail.kill()
    assert code == 0 and "Traceback" not in stderr, stderr
    assert b"".join(tail.lines) == b"".join(lines[47:60])


def test_follow_a_directory_starts_at_each_files_end(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for i, run in enumerate(("a", "b")):
        training_journal(logs / f"{run}.jsonl", run, 50, t0=time.time() - 100 + i)
    tail = LiveCommand("tail", "-f", "--view", "steps", "-n", "4", str(logs))
    try:
        wait_for(lambda: tail.text().count("\n") >= 6, 30, "the last 4 rows under their runs' names")
        first = tail.text()
        with open(logs / "c.jsonl", "ab") as fh:  # a new run appears
            fh.write(encode_line(event("c", 0, 0, time.time(), "metrics", {"loss": 0.25}, step=1, stage="train")))
        wait_for(lambda: "run c" in tail.text(), 30, "the new run's step, once it settled")
        code, _ = tail.stop(signal.SIGINT)
    finally:
        tail.kill()
    assert code == 0
    assert [line.split()[1] for line in first.splitlines() if line[:2].isdigit()][-2:] == ["50", "50"]
    assert "0.25" in tail.text().split("run c", 1)[1]
