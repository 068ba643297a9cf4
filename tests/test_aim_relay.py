"""The Aim sink behind a real relay process, fed by real publisher processes (one per rank)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aim")

from aim_server import aim_server, index_like_aim_up  # noqa: F401  (a fixture, used by name)
from conftest import free_port, wait_for
from relay.wire.lines import encode_line
from sink_helpers import drive, fill, finish_ranks as finish, small_fs, start_rank, training_events  # noqa: F401
from sink_readback import check_aim as check_training_run, read_repo, same_float
from sinks.aim import AimSink

ROOT = Path(__file__).resolve().parents[1]



def journal_lines(path: Path) -> int:
    return sum(1 for line in path.read_bytes().splitlines() if line.strip()) if path.exists() else 0


def replay(journal: Path, repo: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", "aim", "--repo", str(repo)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def assert_same_content(a, b) -> None:
    assert a.metrics.keys() == b.metrics.keys()
    for key, series in a.metrics.items():
        assert series.keys() == b.metrics[key].keys(), key
        assert all(same_float(series[s], b.metrics[key][s]) for s in series), key
    assert {k: v for k, v in a.params.items() if k != "relay"} == {k: v for k, v in b.params.items() if k != "relay"}
    assert a.experiment == b.experiment


@pytest.mark.slow  # a whole fault scenario of relay processes: the full tier
def test_two_ranks_through_the_relay_then_replay(relays, tmp_path: Path) -> None:
    repo, journal, job = tmp_path / "aim", tmp_path / "relay-logs", tmp_path / "job"
    relay = relays(["--sink", "aim", "--repo", str(repo)])  # exactly as users type it: default journal
    finish([start_rank(relay.address, "job-live", rank, 8, experiment="sft-demo", output_dir=job) for rank in (0, 1)])
    assert relay.stop() == 0
    runs = read_repo(str(repo))
    assert list(runs) == ["job-live"]
    live = runs["job-live"]
    check_training_run(live, steps=8)
    assert live.experiment == "sft-demo" and not live.active
    written_live = (job / "aim_tracker.json").read_bytes()
    assert json.loads(written_live)["run_hash"] == live.hash
    journaled = [json.loads(line)["ts"] for line in (journal / "job-live.jsonl").read_bytes().splitlines()]
    first, last = min(journaled), max(journaled)
    assert abs(live.creation_time - first) < 1 and abs(live.end_time - last) < 1

    # Rebuild from the journal into a fresh repo: the same content and times; a second replay adds
    # nothing; the live job's aim_tracker.json still names the live run.
    fresh = tmp_path / "rebuilt"
    for attempt in range(2):
        done = replay(journal / "job-live.jsonl", fresh)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "idle for" not in done.stderr, done.stderr[-2000:]
        rebuilt = read_repo(str(fresh))
        assert list(rebuilt) == ["job-live"]
        assert_same_content(live, rebuilt["job-live"])
        assert abs(rebuilt["job-live"].creation_time - first) < 1 and abs(rebuilt["job-live"].end_time - last) < 1
        assert (job / "aim_tracker.json").read_bytes() == written_live
        if attempt == 0:
            first_hash = rebuilt["job-live"].hash
    assert rebuilt["job-live"].hash == first_hash


def test_replay_keeps_the_jobs_times_and_leaves_the_jobs_files_alone(tmp_path: Path) -> None:
    """`relay replay` of a job that ran long ago, into another repo: the job's own aim_tracker.json
    (naming its live run) stays byte for byte, the rebuilt run has the job's creation and end time
    by Aim's own API, its export lies in its own repo, and a replay of seconds logs no "idle for"."""
    job = tmp_path / "job"
    job.mkdir()
    journal = job / "training_logs.jsonl"  # where the trainer's embedded relay keeps it
    events = training_events("job-old", output_dir=str(job), experiment="sft")
    for i, event in enumerate(events):
        event["ts"] = 1_700_000_000.0 + 2.0 * i  # November 2023, two seconds apart
    journal.write_bytes(b"".join(encode_line(e) for e in events))
    first, last = events[0]["ts"], events[-1]["ts"]
    drive(AimSink(repo=str(tmp_path / "live")), [events], journal)  # as the live relay's sink wrote it
    live = read_repo(str(tmp_path / "live"))["job-old"]
    assert (live.creation_time, live.end_time) == (pytest.approx(first, abs=1e-3), pytest.approx(last, abs=1e-3))
    export = job / "aim_tracker.json"
    written_live = export.read_bytes()
    assert json.loads(written_live)["run_hash"] == live.hash

    for _ in range(2):  # the second finds everything there: the run is opened, nothing applied
        done = replay(journal, tmp_path / "rebuilt")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "idle for" not in done.stderr, done.stderr[-2000:]
        assert export.read_bytes() == written_live
        rebuilt = read_repo(str(tmp_path / "rebuilt"))["job-old"]
        assert abs(rebuilt.creation_time - first) < 1 and abs(rebuilt.end_time - last) < 1
        assert rebuilt.duration == pytest.approx(last - first, abs=1) and not rebuilt.active
        assert_same_content(live, rebuilt)
        own = json.loads((tmp_path / "rebuilt" / "job-old.aim_tracker.json").read_text())
        assert own["run_hash"] == rebuilt.hash and own["repo"] == str((tmp_path / "rebuilt").resolve())


def test_cli_refuses_an_unusable_aim_sink(tmp_path: Path) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)

    done = serve("--sink", "aim")
    assert done.returncode == 2 and "--sink aim needs --repo" in done.stderr, done.stderr[-2000:]
    (tmp_path / "file").write_text("in the way")
    done = serve("--sink", "aim", "--repo", str(tmp_path / "file" / "aim"))
    assert done.returncode == 2 and "not usable" in done.stderr, done.stderr[-2000:]


def test_two_training_runs_at_once_through_one_relay(relays, tmp_path: Path) -> None:
    repo = tmp_path / "aim"
    relay = relays(["--sink", "jsonl", "--path", f"{tmp_path / 'logs'}/", "--sink", "aim", "--repo", str(repo)])
    procs = [start_rank(relay.address, run, rank, steps, experiment=f"exp-{run}")
             for run, steps in (("job-a", 6), ("job-b", 9)) for rank in (0, 1)]
    finish(procs)
    assert relay.stop() == 0
    runs = read_repo(str(repo))
    assert sorted(runs) == ["job-a", "job-b"]
    check_training_run(runs["job-a"], steps=6)
    check_training_run(runs["job-b"], steps=9)
    assert (runs["job-a"].experiment, runs["job-b"].experiment) == ("exp-job-a", "exp-job-b")


@pytest.mark.slow  # a whole fault scenario of relay processes: the full tier
def test_repo_unwritable_mid_run(relays, small_fs: Path, tmp_path: Path) -> None:
    """Root ignores permissions, so the real fault here is a full filesystem under the repo:
    ingest and the journal go on, and once there is space again the Aim run is complete, batches
    the relay dropped for the Aim sink meanwhile included."""
    repo, journal = small_fs / "aim", tmp_path / "logs"
    # A short queue for the Aim sink, so the outage also makes the relay drop batches for it:
    # the sink must then take them from the journal.
    relay = relays(["--sink", "jsonl", "--path", f"{journal}/", "--sink", "aim", "--repo", str(repo),
                    "--sink-queue", "40", "--stats-interval", "0.3"])
    gate = tmp_path / "gate"  # the ranks' second halves wait for it: the outage comes mid-run, whatever the load
    procs = [start_rank(relay.address, "job-full", rank, 300, pause=0.05, gate=gate) for rank in (0, 1)]
    # The sink opens beside a relay that already listens: the disk fills once it has written, mid-run.
    aim = lambda: relay.stats(journal)["sinks"]["aim"]  # noqa: E731
    wait_for(lambda: aim()["written"] > 0, 300, "the Aim sink writing", relay.log_tail)
    fill(small_fs / "filler")
    before = journal_lines(journal / "job-full.jsonl")
    gate.touch()
    assert any(proc.poll() is None for proc in procs), "the publishers finished before the outage"
    wait_for(lambda: journal_lines(journal / "job-full.jsonl") > before, 60, "the journal going on without Aim")
    wait_for(lambda: "sink aim failed" in relay.log.read_text(), 120, "the Aim sink failing on the full disk")
    wait_for(lambda: aim()["dropped"] > 0, 120, "the relay dropping batches for the failing Aim sink")
    (small_fs / "filler").unlink()
    finish(procs)
    assert relay.stop() == 0
    log = relay.log.read_text()
    assert "sink aim failed" in log and "caught up from" in log, log[-3000:]
    assert relay.stats(journal)["sinks"]["aim"]["dropped"] > 0
    check_training_run(read_repo(str(repo))["job-full"], steps=300)


@pytest.mark.slow  # a whole fault scenario of relay processes: the full tier
def test_remote_aim_server_down_at_start_then_up(relays, aim_server, tmp_path: Path) -> None:
    """`--repo aim://HOST:PORT` while the server is still down: the relay starts anyway, training
    goes on, the Aim sink retries, and once the server is up the Aim run is complete."""
    relay = relays(["--sink", "jsonl", "--path", f"{tmp_path / 'logs'}/", "--sink", "aim", "--repo", aim_server.url])
    procs = [start_rank(relay.address, "job-remote", rank, 40, experiment="remote-exp", pause=0.05) for rank in (0, 1)]
    # The sink opens beside a listening relay: the server comes up once the sink has met it down.
    wait_for(lambda: "not reachable yet" in relay.log.read_text(), 120, "the Aim sink finding the server down")
    aim_server.start()
    finish(procs)
    assert relay.stop() == 0
    log = relay.log.read_text()
    assert "not reachable yet" in log and "sink aim failed" in log, log[-3000:]
    # Replaying the journal through the server finds the run and adds nothing.
    done = replay(tmp_path / "logs" / "job-remote.jsonl", aim_server.url)
    assert done.returncode == 0, done.stderr[-2000:]
    aim_server.stop()
    index_like_aim_up(aim_server.path)
    runs = read_repo(str(aim_server.path))
    assert list(runs) == ["job-remote"]
    check_training_run(runs["job-remote"], steps=40)
    assert runs["job-remote"].experiment == "remote-exp"
