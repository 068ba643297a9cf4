"""The W&B sink against real offline W&B runs, read back with W&B's own transaction-log reader
(``wandb leet inspect --json``, wandb-core's reader of ``.wandb`` files): directly with constructed
events, through real relays with real publishers (SIGKILL and restart mid-run), and replayed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from conftest import free_port, wait_for
from relay.wire.lines import encode_line
from sink_helpers import Events, drive, fill, small_fs, start_rank, training_events  # noqa: F401
from sink_readback import check_wandb as check_training_run, read_wandb, run_dirs
from sinks.base import PermanentError, SinkContext
from sinks.wandb import WandbSink

ROOT = Path(__file__).resolve().parents[1]
HELPERS = Path(__file__).resolve().parent / "sink_helpers.py"




def run_sink(root: Path, batches: list[list[dict]], journal: Path | None = None) -> WandbSink:
    return drive(WandbSink(wandb_project="relay-tests", wandb_dir=str(root)), batches, journal)


def test_mapping_replay_and_resume(tmp_path: Path) -> None:
    """Names as W&B's HF callback, a second process resuming the run as a new instance with the
    next _steps, and a replay of everything adding nothing (not even a directory)."""
    events = training_events("job-1", output_dir=str(tmp_path / "job"))
    events[-1]["data"]["dropped"] = 2  # rank 1's client dropped some: the one counter drawn, by seq
    first = run_sink(tmp_path, [events[:9], events[9:25]])
    assert first.counters["wandb_runs_opened"] == 1
    second = run_sink(tmp_path, [events[20:]])  # a restarted relay: some events come again
    assert second.counters["duplicates"] == 5 and second.counters["events"] == len(events) - 25
    dirs = run_dirs(tmp_path)
    again = run_sink(tmp_path, [events])
    assert again.counters["events"] == 0 and again.counters["duplicates"] == len(events)
    assert run_dirs(tmp_path) == dirs and len(dirs) == 2
    view = read_wandb(tmp_path)["job-1"]
    check_training_run(view)
    assert [v for _, v in view.system["rank.1.relay_dropped"]] == [2] and "rank.0.relay_dropped" not in view.system
    assert [i["exit_code"] for i in view.instances] == [1, 0]  # cut short, then train_end "completed"
    state = json.loads((tmp_path / "wandb" / "relay-applied" / "job-1.json").read_text())
    assert state["open"] is None and state["spans"] == {"0": [[0, 25]], "1": [[0, 8]]}


def test_a_retried_batch_adds_nothing_and_a_refused_name_is_permanent(tmp_path: Path) -> None:
    ev = Events("job-retry", world_size=1)
    batch = [ev(0, "metrics", {"loss": 1.0 / s}, step=s, stage="train") for s in range(1, 5)]
    bad = ev(0, "metrics", {"_step": 1.0}, step=5, stage="additional_metrics")
    tail = [ev(0, "metrics", {"loss": 0.1}, step=6, stage="train")]
    sink = WandbSink(wandb_project="relay-tests", wandb_dir=str(tmp_path))
    sink.open(SinkContext())
    try:
        with pytest.raises(PermanentError, match="reserves"):
            sink.write(batch + [bad] + tail)  # the first four rows reached W&B before the refusal
        sink.write(batch)  # what the relay does next: halves, down to the event that fails alone
        with pytest.raises(PermanentError):
            sink.write([bad])
        sink.write(tail)
    finally:
        sink.close()
    view = read_wandb(tmp_path)["job-retry"]
    assert view.series["train/loss"] == {1: 1.0, 2: 0.5, 3: 1 / 3, 4: 0.25, 6: 0.1}


def test_an_ended_run_is_finished_when_quiet_and_late_events_resume_it(tmp_path: Path) -> None:
    """A long-lived relay finishes a run soon after train_end, so `wandb sync` finds it complete;
    the clients' last counters, arriving later, go to a resumed instance that keeps the status."""
    events = training_events("job-late")
    sink = WandbSink(wandb_project="relay-tests", wandb_dir=str(tmp_path))
    sink.open(SinkContext())
    sink.ended_close_s = 0.0
    try:
        sink.write(events[:-2])  # up to train_end
        deadline = time.monotonic() + 20
        while sink.counters["wandb_runs_finished"] < 1:
            assert time.monotonic() < deadline, "the run was not finished after train_end"
            time.sleep(0.1)
        sink.write(events[-2:])  # the clients' stats, after the job ended
    finally:
        sink.close()
    view = read_wandb(tmp_path)["job-late"]
    assert [i["exit_code"] for i in view.instances] == [0, 0]
    check_training_run(view)


def test_system_figures_at_a_whole_millisecond_read_back_in_time_order(tmp_path: Path) -> None:
    """wandb-core writes a figure at a whole millisecond as "...40.277Z" and one 4 us later as
    "...40.277004Z", which sorts first as text: the reader orders the instants (a CI run failed on
    it, where one of the twelve per-rank figures fell on a whole millisecond)."""
    events = training_events("job-ms")
    first = next(i for i, e in enumerate(events) if e["stage"] == "rank")
    for i, event in enumerate(events):
        event["ts"] = (1_796_683_000_277_000 + (i - first) * 4) / 1_000_000
    run_sink(tmp_path, [events])
    view = read_wandb(tmp_path)["job-ms"]
    assert view.system["rank.0.step_time_s"][0][0].microsecond == 277_000
    check_training_run(view)


CRASH = """
import os, sys
sys.path[:0] = [{root!r}, {tests!r}]
from sink_helpers import training_events
from sinks.base import SinkContext
from sinks.wandb import WandbSink
sink = WandbSink(wandb_project="relay-tests", wandb_dir={dir!r})
sink.open(SinkContext())
sink.write(training_events("job-crash")[:20])
os._exit(9)  # the sink's process dies with its W&B run open
"""


@pytest.mark.parametrize("recorded", [True, False], ids=["dir-recorded", "died-in-wandb-init"])
def test_a_directory_left_open_by_a_dead_process_is_rebuilt_from_the_journal(tmp_path: Path, recorded: bool) -> None:
    journal = tmp_path / "logs"
    journal.mkdir()
    events = training_events("job-crash")
    (journal / "job-crash.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    script = CRASH.format(root=str(ROOT), tests=str(HELPERS.parent), dir=str(tmp_path))
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 9
    (dead,) = run_dirs(tmp_path)
    if not recorded:  # what a process that died inside wandb.init leaves: its directory, not its name
        state_file = tmp_path / "wandb" / "relay-applied" / "job-crash.json"
        state = json.loads(state_file.read_text())
        state["open"].update({"dir": None, "before": []})
        state_file.write_text(json.dumps(state))
    sink = run_sink(tmp_path, [events[30:]], journal=journal)  # the restarted sink's next events
    assert sink.counters["discarded_dirs"] == 1 and sink.counters["events"] == len(events), sink.counters
    assert (tmp_path / "wandb" / "relay-discarded" / dead).is_dir()
    views = read_wandb(tmp_path)  # the discarded directory is out of `wandb sync wandb/`'s way
    assert len(views["job-crash"].instances) == 1
    check_training_run(views["job-crash"])


@pytest.mark.slow  # a whole fault scenario of relay processes: the full tier
def test_full_disk_mid_run_loses_nothing(relays, small_fs: Path, tmp_path: Path) -> None:
    """The W&B directory's filesystem fills up mid-run. wandb-core would drop records silently; the
    sink notices, exits, and each new sink process the relay starts moves the suspect directory
    aside; once there is space again, the run is complete, every point once."""
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/", "--sink", "wandb", "--wandb-project", "relay-tests",
                    "--wandb-dir", str(small_fs)])
    # The sink's process opens beside a listening relay (under load, that can outlast a short job):
    # the ranks' second halves wait for the gate, opened once the W&B run is open and the disk full.
    gate = tmp_path / "gate"
    procs = [start_rank(relay.address, "job-full", rank, 60, pause=0.05, gate=gate) for rank in (0, 1)]
    wait_for(lambda: "W&B run job-full opened" in relay.log.read_text(), 300, "the W&B run open")
    fill(small_fs / "filler")
    gate.touch()
    assert any(proc.poll() is None for proc in procs), "the publishers finished before the disk filled"
    # Full until the sink has seen it (under load wandb-core may not write for seconds), then space again.
    wait_for(lambda: "exiting, so that the relay starts this sink again" in relay.log.read_text(), 180,
             "the W&B sink noticing the full disk")
    (small_fs / "filler").unlink()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    lines = [json.loads(line) for line in (journal / "job-full.jsonl").read_text().splitlines()]
    ranks = {e["rank"] for e in lines}  # 0, 1 and the relay's own (its cluster figures)
    assert len(ranks) == 3
    everything = {str(r): [[0, sum(e["rank"] == r for e in lines)]] for r in ranks}
    state = small_fs / "wandb" / "relay-applied" / "job-full.json"
    # the last restarted sink catches up from the journal
    wait_for(lambda: state.exists() and json.loads(state.read_text())["spans"] == everything, 180,
             "the W&B sink caught up", relay.log_tail)
    assert relay.stop() == 0
    log = relay.log.read_text()
    assert "exiting, so that the relay starts this sink again" in log, log[-3000:]
    view = read_wandb(small_fs)["job-full"]
    check_training_run(view, steps=60)
    assert list((small_fs / "wandb" / "relay-discarded").iterdir())


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_cli_says_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    done = serve(tmp_path, "--sink", "wandb", env=env)
    assert done.returncode == 2 and "--sink wandb needs --wandb-project" in done.stderr, done.stderr[-2000:]
    home = tmp_path / "home"  # no ~/.netrc, no WANDB_API_KEY: no credentials for online mode
    home.mkdir()
    done = serve(tmp_path, "--sink", "wandb", "--wandb-project", "p", "--wandb-mode", "online",
                 env={**env, "HOME": str(home)})
    assert done.returncode == 2 and "wandb login" in done.stderr, done.stderr[-2000:]
    # Where `import wandb` fails, as without the [wandb] extra.
    shadow = tmp_path / "no-wandb" / "wandb"
    shadow.mkdir(parents=True)
    (shadow.parent / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None\n")  # not installed
    done = serve(tmp_path, "--sink", "wandb", "--wandb-project", "p",
                 env={**env, "PYTHONPATH": os.pathsep.join([str(shadow.parent), env.get("PYTHONPATH", "")])})
    assert done.returncode == 2 and "pip install './[wandb]' in the metrics-relay checkout" in done.stderr, done.stderr[-2000:]
