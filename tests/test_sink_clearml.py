"""The ClearML sink: offline sessions written by ClearML's own code, read back the same way (its
offline ``Task.get_task`` for task.json, and ``Metrics.report_offline_session``, the parser that
``Task.import_offline_session`` runs, with a session that keeps the requests instead of sending them)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("clearml")

from conftest import free_port
from sink_helpers import Events, drive, training_events
from sink_readback import SUMMARY, check_clearml as check_training_run, read_sessions
from sinks.base import SinkContext
from sinks.clearml import ClearmlSink

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clearml_env(monkeypatch, tmp_path: Path) -> None:
    """The sink sets these for its process; here they are put back after each test, and nothing
    lands in ~/.clearml."""
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml-default"))
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")


def run_sink(cache_dir: Path, batches: list[list[dict]], **options: Any) -> ClearmlSink:
    return drive(ClearmlSink(clearml_project=options.pop("project", "relay-tests"), clearml_dir=str(cache_dir),
                             **options), batches)


def metrics_bytes(cache_dir: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_size for p in (cache_dir / "offline").glob("offline-*/metrics.jsonl")}


# -- the sink on its own --------------------------------------------------------------------------


def test_a_training_run_reads_back_with_clearml_names(tmp_path: Path) -> None:
    events = training_events("job-1")
    sink = run_sink(tmp_path / "cml", [events[:17], events[17:]], clearml_task="SFTTrainer")
    views = read_sessions(tmp_path / "cml")
    assert list(views) == ["job-1"]
    view = views["job-1"]
    check_training_run(view)
    assert (view.name, view.project) == ("SFTTrainer", "relay-tests")
    # Every point carries the time its rank published it, not the time the sink wrote it.
    published = {int(e["ts"] * 1000) for e in events if e["type"] == "metrics" and e["stage"] == "train"}
    assert set(view.timestamps[("train", "loss")]) <= published
    assert sink.counters["nonfinite_values"] == 1 and sink.counters["runs_created"] == 1


def test_replay_and_a_new_process_add_nothing(tmp_path: Path) -> None:
    """The same journal again (relay replay, or a restarted relay) resumes the same offline task
    and skips what it holds; a run that was half written is completed, nothing doubled."""
    cache, events = tmp_path / "cml", training_events("job-r")
    run_sink(cache, [events[:12]])
    half = metrics_bytes(cache)
    again = run_sink(cache, [events])  # a new sink instance reads the state the first one saved
    assert again.counters["runs_resumed"] == 1 and again.counters["duplicates"] == 12
    full = metrics_bytes(cache)
    assert full.keys() == half.keys() and all(full[k] > half[k] for k in full)
    third = run_sink(cache, [events[i:i + 5] for i in range(0, len(events), 5)])
    assert third.counters["events"] == 0 and metrics_bytes(cache) == full
    check_training_run(read_sessions(cache)["job-r"])


def test_points_written_but_not_recorded_are_cut_and_redone(tmp_path: Path, monkeypatch) -> None:
    """A crash between appending to metrics.jsonl and saving the spans (here: the state file
    cannot be replaced) leaves points the spans do not cover; the next process cuts them off and
    applies those events again, so each point is there exactly once."""
    cache, events = tmp_path / "cml", training_events("job-c")
    sink = ClearmlSink(clearml_project="relay-tests", clearml_dir=str(cache))
    sink.open(SinkContext())
    sink.write(events[:10])
    real_replace = os.replace

    def broken_replace(src: Any, dst: Any) -> None:  # the sink's state file only: ClearML's task.json is written
        if str(dst) != str(sink.state_path()):
            return real_replace(src, dst)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        sink.write(events[10:20])
    monkeypatch.setattr(os, "replace", real_replace)
    sink._lock_fh.close()  # the process "dies": no close(), no zip
    restarted = run_sink(cache, [events])
    assert restarted.counters["truncated_bytes"] > 0 and restarted.counters["duplicates"] == 10
    check_training_run(read_sessions(cache)["job-c"])


def test_a_sink_dying_while_it_saves_the_task_leaves_the_last_whole_task(tmp_path: Path, monkeypatch) -> None:
    """A relay SIGKILL can land while the sink saves task.json; the next process must find the task
    whole, parameters and all (ClearML itself truncates the file first and reads one it cannot parse
    back as an empty task, and the spans then keep the lost parameters from being written again)."""
    import clearml.backend_interface.task.task as clearml_task

    cache, events = tmp_path / "cml", training_events("job-k")
    sink = ClearmlSink(clearml_project="relay-tests", clearml_dir=str(cache))
    sink.open(SinkContext())
    sink.write(events[:10])

    def dies(*args: Any, **kwargs: Any) -> None:  # the process dies mid-save: nothing after this runs
        raise SystemExit("killed")

    monkeypatch.setattr(clearml_task.json, "dump", dies)
    monkeypatch.setattr("sinks.clearml.json.dumps", dies)
    with pytest.raises(SystemExit):
        sink.write(events[10:20])
    monkeypatch.undo()
    sink._lock_fh.close()  # no close(), no zip
    restarted = run_sink(cache, [events])
    assert restarted.counters["runs_resumed"] == 1
    check_training_run(read_sessions(cache)["job-k"])


def test_two_runs_interleaved_in_one_process(tmp_path: Path) -> None:
    """Task.init allows one task per process; the sink keeps any number of offline tasks apart."""
    a, b = training_events("job-a"), training_events("job-b", steps=9)
    mixed = [e for pair in zip(a, b, strict=False) for e in pair] + b[len(a):]
    run_sink(tmp_path / "cml", [mixed[i:i + 7] for i in range(0, len(mixed), 7)])
    views = read_sessions(tmp_path / "cml")
    assert sorted(views) == ["job-a", "job-b"] and views["job-a"].task_id != views["job-b"].task_id
    check_training_run(views["job-a"])
    check_training_run(views["job-b"], steps=9)


def test_failed_run_and_a_late_event_after_train_end(tmp_path: Path) -> None:
    """The status is a tag (an offline task has none); events after train_end find the task still
    open (the run has not settled: no client said goodbye), and its zip is written once, at close."""
    ev = Events("job-f")
    events = [ev(0, "metrics", {"loss": 1.0}, step=1, stage="train"),
              ev(0, "lifecycle", {"event": "train_end", "status": "failed"}, step=1)]
    late = [ev(1, "metrics", {"step_time": 0.5}, step=1, stage="rank"),
            ev(1, "metrics", {"model_load_time": 2.0}, stage="additional_metrics"),
            ev(0, "metrics", {"eval_loss": 0.7}, step=1, stage="eval")]
    sink = run_sink(tmp_path / "cml", [events, late])
    view = read_sessions(tmp_path / "cml")["job-f"]
    assert "failed" in view.tags and sink.counters["tasks_closed"] == 1
    assert view.scalars[(":monitor:rank_step_time_s", "rank 1")] == {1: 0.5}
    assert view.scalars[("Summary", "model_load_time/rank 1")] == {SUMMARY: 2.0}
    assert view.scalars[("eval", "loss")] == {1: 0.7}


def test_several_eval_sets_and_custom_stages_keep_their_names(tmp_path: Path) -> None:
    ev = Events("job-n")
    events = [ev(0, "metrics", {"eval_alpaca_loss": 0.5, "eval_alpaca_runtime": 2.0}, step=4, stage="eval"),
              ev(0, "metrics", {"test_loss": 0.25}, step=4, stage="test"),
              ev(0, "metrics", {"tokens": 10.0}, step=4, stage="data"),
              ev(0, "metrics", {"train_steps_per_second": 3.0, "train_custom": 1.0}, step=4, stage="train")]
    run_sink(tmp_path / "cml", [events])
    scalars = read_sessions(tmp_path / "cml")["job-n"].scalars
    assert scalars[("eval", "alpaca_loss")] == {4: 0.5} and scalars[("eval", "alpaca_runtime")] == {4: 2.0}
    assert scalars[("test", "loss")] == {4: 0.25}
    assert scalars[("Summary", "data.tokens")] == {SUMMARY: 10.0}
    assert scalars[("Summary", "train_steps_per_second")] == {SUMMARY: 3.0}
    assert scalars[("train", "train_custom")] == {4: 1.0}


def test_nothing_tries_the_network(tmp_path: Path, monkeypatch) -> None:
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    run_sink(tmp_path / "cml", [training_events("job-offline")])
    assert attempts == []
    check_training_run(read_sessions(tmp_path / "cml")["job-offline"])


def test_one_writer_per_directory(tmp_path: Path) -> None:
    """A second process on the same sessions (a restarted relay while the old sink process still
    drains) fails its writes, as transient errors, until the first lets go."""
    cache, events = tmp_path / "cml", training_events("job-l")
    first = ClearmlSink(clearml_project="relay-tests", clearml_dir=str(cache))
    first.open(SinkContext())
    second = ClearmlSink(clearml_project="relay-tests", clearml_dir=str(cache))
    second.open(SinkContext())
    try:
        first.write(events[:10])
        with pytest.raises(RuntimeError, match="in use by another process"):
            second.write(events)
        first.close()
        second.write(events)
    finally:
        second.close()
    assert second.counters["duplicates"] == 10
    check_training_run(read_sessions(cache)["job-l"])


def test_cli_refuses_an_unusable_clearml_sink(tmp_path: Path) -> None:
    def serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}",
                               "--sink", "clearml", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env=env)

    done = serve()
    assert done.returncode == 2 and "--sink clearml needs --clearml-project" in done.stderr, done.stderr[-2000:]
    (tmp_path / "file").write_text("in the way")
    done = serve("--clearml-project", "p", "--clearml-dir", str(tmp_path / "file" / "cml"))
    assert done.returncode == 2 and "is not usable" in done.stderr, done.stderr[-2000:]
    shadow = tmp_path / "no-clearml" / "clearml"  # `import clearml` fails, as without the extra
    shadow.mkdir(parents=True)
    (shadow.parent / "sitecustomize.py").write_text("import sys\nsys.modules['clearml'] = None\n")  # not installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    done = serve("--clearml-project", "p", "--clearml-dir", str(tmp_path / "cml"), env=env)
    assert done.returncode == 2 and "pip install './[clearml]' in the metrics-relay checkout" in done.stderr, done.stderr[-2000:]
