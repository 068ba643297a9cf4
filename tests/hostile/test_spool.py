"""Nothing is lost when the relay never comes, or is gone at the end: each Publisher writes what was
never acknowledged to a spool in the journal's format, says so in one line with the ``relay replay``
command, and that command delivers exactly the missing events, once."""
from __future__ import annotations

import json
import logging
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, free_port, read_jsonl
from relay.client.publisher import Publisher
from sinks.events import FIELDS
from trainer_fixtures import DEMO_DATA, demo_model, run_trainer

__all__ = ["demo_model"]  # a fixture, used by name
N = 40


def spool_warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "never acknowledged" in line]


def replay_command(warning: str) -> list[str]:
    """The command the warning names, run as this interpreter's ``relay``."""
    argv = shlex.split(warning[warning.index("relay replay "):])
    assert argv[:2] == ["relay", "replay"], warning
    return [sys.executable, "-m", "relay", *argv[1:]]


def run_replay(argv: list[str]) -> None:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def publish_batch(pub: Publisher, first: int, count: int) -> None:
    for i in range(first, first + count):
        loss = math.nan if i % 10 == 3 else -math.inf if i % 10 == 7 else 1.0 / (i + 1)
        pub.publish("metrics", {"i": i, "loss": loss}, step=i + 1, epoch=i / 100, stage="train")


def test_relay_that_never_comes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool_dir, journal = tmp_path / "spool", tmp_path / "out" / "journal.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher("never-came", 3, local_rank=1, world_size=4, host="node-a", address=address,
                    spool_dir=spool_dir, spool_journal=journal)
    publish_batch(pub, 0, N - 1)
    pub.publish("params", {"nested": {"lr": 1e-4, "ids": (1, 2)}, "bad": math.nan}, stage="hparams")
    with caplog.at_level(logging.WARNING, logger="relay.client.publisher"):
        assert pub.close(0.3) == N + 2  # hello, N events, the closing stats
    stats = pub.stats
    assert (stats["spooled"], stats["unacked"], stats["dropped"], stats["acked"]) == (N + 2, 0, 0, 0), stats

    spool = spool_dir / "never-came.rank3.spool.jsonl"
    warnings = spool_warnings(caplog.text)
    assert len(warnings) == 1 and f"relay replay {spool} --sink jsonl --path {journal}" in warnings[0], caplog.text
    lines = spool.read_bytes().splitlines(keepends=True)
    events = [json.loads(line) for line in lines]
    assert [list(e) for e in events] == [list(FIELDS)] * (N + 2), "the journal's fields, in its order"
    assert [e["seq"] for e in events] == list(range(N + 2))
    assert [e["type"] for e in events] == ["hello"] + ["metrics"] * (N - 1) + ["params", "stats"]
    assert {(e["run"], e["rank"], e["local_rank"], e["world_size"], e["host"]) for e in events} == {
        ("never-came", 3, 1, 4, "node-a")}
    metrics = events[1:N]
    assert [e["data"]["loss"] for e in metrics[:8]] == [1.0, 0.5, 1 / 3, "NaN", 0.2, 1 / 6, 1 / 7, "-Infinity"]
    assert [(e["step"], e["epoch"], e["stage"]) for e in metrics] == [(i + 1, i / 100, "train") for i in range(N - 1)]
    assert events[N]["data"] == {"nested": {"lr": 1e-4, "ids": [1, 2]}, "bad": "NaN"}
    assert events[-1]["stage"] == "client" and events[-1]["data"]["published"] == N + 1

    run_replay(replay_command(warnings[0]))
    assert journal.read_bytes().splitlines(keepends=True) == lines, "replayed lines are the spool's, byte for byte"
    run_replay(replay_command(warnings[0]))
    assert len(read_jsonl(journal)) == N + 2, "replaying twice adds nothing"


def test_spooled_lines_are_what_a_live_relay_journals(tmp_path: Path, relays) -> None:
    """The same events through a live relay and through spool + replay give the same lines, but
    for the moment each was published (ts) and the client's own hello (pid, address)."""
    live, replayed = tmp_path / "live.jsonl", tmp_path / "replayed.jsonl"
    relay = relays(["--sink", "jsonl", "--path", str(live)])
    for address, spool_dir in ((relay.address, None), (f"tcp://127.0.0.1:{free_port()}", tmp_path / "spool")):
        pub = Publisher("same-run", 1, world_size=2, host="h", address=address, spool_dir=spool_dir)
        publish_batch(pub, 0, N)
        pub.publish("lifecycle", {"event": "train_end", "why": None, "big": 2**62}, step=N, epoch=1.0)
        pub.close(5.0 if spool_dir is None else 0.2)
    assert relay.stop() == 0
    run_replay([sys.executable, "-m", "relay", "replay", str(tmp_path / "spool"), "--sink", "jsonl",
                "--path", str(replayed)])

    def comparable(path: Path) -> list[dict]:
        events = read_jsonl(path)
        for event in events:
            event.pop("ts")
            if event["type"] == "hello":
                event["data"].pop("pid")
                event["data"].pop("address")
                event["data"].pop("session")  # each publisher's own nonce
        return events

    assert comparable(replayed) == comparable(live)
    assert len(read_jsonl(live)) == N + 3


def test_relay_gone_at_the_end(tmp_path: Path, relays, caplog: pytest.LogCaptureFixture) -> None:
    journal, spool_dir = tmp_path / "journal.jsonl", tmp_path / "spool"
    relay = relays(["--sink", "jsonl", "--path", str(journal)])
    pub = Publisher("gone-at-end", 0, address=relay.address, spool_dir=spool_dir, spool_journal=journal)
    publish_batch(pub, 0, N)
    assert pub.flush(30) == 0
    relay.kill()  # SIGKILL: no goodbye, nothing more acknowledged
    publish_batch(pub, N, N)
    with caplog.at_level(logging.WARNING, logger="relay.client.publisher"):
        assert pub.close(0.5) == N + 1
    assert pub.stats["acked"] == N + 1 and pub.stats["spooled"] == N + 1

    spool = spool_dir / "gone-at-end.rank0.spool.jsonl"
    spooled = read_jsonl(spool)
    assert [e["seq"] for e in spooled] == list(range(N + 1, 2 * N + 2)), "exactly what was never acknowledged"
    assert spooled[-1]["type"] == "stats"
    # A relay killed between journaling and acknowledging leaves events in both: model that too.
    with open(journal, "ab") as fh:
        fh.write(b"".join(spool.read_bytes().splitlines(keepends=True)[:5]))

    warnings = spool_warnings(caplog.text)
    assert len(warnings) == 1, caplog.text
    run_replay(replay_command(warnings[0]))
    events = read_jsonl(journal)
    assert [e["seq"] for e in events] == list(range(2 * N + 2)), "every seq once, in order"
    assert [e["data"]["i"] for e in events if e["type"] == "metrics"] == list(range(2 * N))
    assert [e["type"] for e in events].count("stats") == 1


@pytest.mark.slow
def test_training_job_whose_relay_never_comes(demo_model: Path, tmp_path: Path) -> None:
    out, journal = tmp_path / "out", tmp_path / "journal.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    done = run_trainer([sys.executable, "-m", "trainer", "--model_name_or_path", str(demo_model), "--data_path",
                        str(DEMO_DATA), "--dataset_text_field", "output", "--output_dir", str(out),
                        "--max_steps", "3", "--logging_steps", "1", "--save_strategy", "no", "--max_length", "64",
                        "--relay_address", address, "--relay_flush_timeout", "1"])
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = spool_warnings(done.stderr)
    assert len(warnings) == 1 and address in warnings[0], done.stderr[-3000:]
    run_id = json.loads((out / "tracking_run.json").read_text())["run"]
    spool = out / "relay-spool" / f"{run_id}.rank0.spool.jsonl"
    command = replay_command(warnings[0])
    assert command[3:] == ["replay", str(spool), "--sink", "jsonl", "--path", "YOUR_JOURNAL"], warnings[0]

    run_replay(command[:-1] + [str(journal)])
    events = read_jsonl(journal)
    assert {e["run"] for e in events} == {run_id}
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["step"] for e in events if e["stage"] == "train" and "loss" in e["data"]] == [1, 2, 3]
    assert [e["data"]["event"] for e in events if e["type"] == "lifecycle"] == ["train_begin", "train_end"]
    assert sorted(e["stage"] for e in events if e["type"] == "params") == ["hparams", "model", "model_info", "run", "versions"]
    assert any("model_load_time" in e["data"] for e in events if e["type"] == "metrics")
    assert events[0]["type"] == "hello" and events[-1]["type"] == "stats"
