"""``relay runs``: each run of a journal in one line, the same from a directory of run files and
from one file of interleaved runs, checked against a whole read of every line; the real command's
table fits the terminal and --json is for scripts."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relay.cli.runs import summarize
from relay.wire.lines import encode_line
from watch_helpers import RELAY_RANK, cli_env, event, relay_cmd, training_journal, write_journal


def naive(lines: list[bytes], now: float) -> dict[str, dict]:
    """What ``relay runs`` should say, from every line parsed."""
    runs: dict[str, dict] = {}
    for line in lines:
        ev = json.loads(line)
        run = runs.setdefault(ev["run"], {"start": ev["ts"], "attempts": 0, "stragglers": 0, "lost_ranks": 0,
                                          "status": None, "last_step": None, "last_loss": None})
        run["end"], run["ranks"] = ev["ts"], ev["world_size"]
        data = ev["data"]
        if ev["type"] == "lifecycle":
            event_name = data.get("event")
            run["attempts"] += event_name == "train_begin"
            run["stragglers"] += event_name == "straggler"
            run["lost_ranks"] += event_name == "rank_lost"
            if event_name in ("train_begin", "train_end"):
                run["status"] = data.get("status") if event_name == "train_end" else None
        elif ev["type"] == "metrics" and type(ev["step"]) is int:
            run["last_step"] = ev["step"]
            if ev["stage"] == "train" and "loss" in data:
                run["last_loss"] = data["loss"]
    for run in runs.values():
        run["status"] = run["status"] or ("running" if now - run["end"] < 300 else "unfinished")
    return runs


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """Runs that completed (with stragglers), failed (a rank lost), were resumed, are running, and
    stopped without an end: as a directory of run files, and as one file of their lines interleaved
    by time."""
    root = tmp_path_factory.mktemp("runs")
    folder = root / "logs"
    folder.mkdir()
    now = time.time()
    training_journal(folder / "done.jsonl", "done", 120, t0=now - 9000, straggler_every=40)
    failed = folder / "failed.jsonl"
    training_journal(failed, "failed", 30, t0=now - 8000, ranks=3)
    kept = failed.read_bytes().splitlines(keepends=True)[:-1]  # its completed train_end dropped
    kept += [encode_line(event("failed", RELAY_RANK, 0, now - 7980, "lifecycle",
                               {"event": "rank_lost", "rank": 2, "silent_s": 61.0}, step=30, stage="cluster", world_size=3)),
             encode_line(event("failed", 0, 999, now - 7979, "lifecycle",
                               {"event": "train_end", "status": "failed", "error": "RuntimeError: boom"}, step=30,
                               world_size=3))]
    failed.write_bytes(b"".join(kept))
    resumed = folder / "resumed.jsonl"
    training_journal(resumed, "resumed", 20, t0=now - 7000)
    first = resumed.read_bytes().splitlines(keepends=True)[:-1]  # the first attempt died: no train_end
    training_journal(resumed, "resumed", 25, t0=now - 6000)
    resumed.write_bytes(b"".join(first) + resumed.read_bytes())
    training_journal(folder / "live.jsonl", "live", 10, t0=now - 60)
    live = (folder / "live.jsonl").read_bytes().splitlines(keepends=True)[:-1]
    (folder / "live.jsonl").write_bytes(b"".join(live))  # still going: no train_end yet
    write_journal(folder / "stalled.jsonl", [event("stalled", 0, i, now - 5000 + i, "metrics", {"loss": 9.0 - i},
                                                   step=i, stage="train", world_size=1) for i in range(5)])
    (folder / "_relay_stats.json").write_text("{}")  # a sidecar, not a run
    lines = [line for file in sorted(folder.glob("*.jsonl")) for line in file.read_bytes().splitlines(keepends=True)]
    single = root / "all.jsonl"
    single.write_bytes(b"".join(sorted(lines, key=lambda line: json.loads(line)["ts"])))
    return folder, single, now


def test_each_run_as_a_whole_read_says(journals: tuple[Path, Path, float]) -> None:
    folder, single, now = journals
    lines = single.read_bytes().splitlines()
    expected = naive(lines, now)
    assert {run: r["status"] for run, r in expected.items()} == {
        "done": "completed", "failed": "failed", "resumed": "completed", "live": "running", "stalled": "unfinished"}
    assert expected["resumed"]["attempts"] == 2 and expected["failed"]["lost_ranks"] == 1
    assert expected["done"]["stragglers"] == 3
    for path in (folder, single):  # run files counted by their bytes; one shared file line by line
        found = {s.run: s for s in summarize(path, now)}
        assert list(found) == ["done", "failed", "resumed", "stalled", "live"], "oldest first"
        for run, want in expected.items():
            got = found[run]
            assert {k: getattr(got, k) for k in want} == want, (path.name, run)
            assert got.file == str(path if path == single else folder / f"{run}.jsonl")


def test_the_command_fits_the_terminal_and_says_json(journals: tuple[Path, Path, float]) -> None:
    folder, _, _ = journals
    table = relay_cmd("runs", str(folder), env=cli_env(COLUMNS="80"))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and len(lines) == 6
    assert lines[0].split() == ["run", "status", "step", "loss", "strag", "lost"]  # (no last straggler)
    assert lines[2].split() == ["failed", "failed", "30", lines[2].split()[3], "0", "1"]
    wide = relay_cmd("runs", str(folder)).stdout.splitlines()
    assert wide[0].split() == ["run", "start", "status", "attempts", "ranks", "step", "loss", "stragglers", "lost",
                               "last", "straggler"]
    done = next(line for line in wide if line.startswith("done "))
    assert done.rstrip().endswith(" 3     0  r1 60% 0.30 s/step"), wide  # what the last one named cost the job
    as_json = relay_cmd("runs", str(folder), "--json")
    assert [r["run"] for r in json.loads(as_json.stdout)] == ["done", "failed", "resumed", "stalled", "live"]
    missing = relay_cmd("runs", str(folder / "nothing"))
    assert missing.returncode == 2 and missing.stderr.startswith("relay: error: ") and "does not exist" in missing.stderr


def test_thousands_of_runs(tmp_path: Path) -> None:
    """2,000 run files of a few steps: every one listed (docs/benchmarks.md has how long it takes)."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(2000):
        write_journal(folder / f"run-{i:04d}.jsonl", [
            event(f"run-{i:04d}", 0, s, 1.7e9 + i + s, "metrics", {"loss": 1.0 / (s + 1)}, step=s, stage="train")
            for s in range(3)])
    found = summarize(folder)
    assert [s.run for s in found] == [f"run-{i:04d}" for i in range(2000)]
    assert {(s.last_step, s.last_loss, s.status) for s in found} == {(2, 1 / 3, "unfinished")}


@pytest.mark.parametrize("chunk", [19, 64, 257])
def test_counts_do_not_depend_on_where_the_chunks_end(journals: tuple[Path, Path, float], chunk: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings and run heads cut by a chunk's end are counted once (relay/cli/runs.py reads 8 MiB at a time)."""
    from relay.cli import runs

    folder, _, now = journals
    whole = summarize(folder, now)
    monkeypatch.setattr(runs, "_CHUNK", chunk)
    assert summarize(folder, now) == whole
