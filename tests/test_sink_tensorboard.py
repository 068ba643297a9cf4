"""The TensorBoard sink against real event files, read back with TensorBoard's own EventAccumulator:
called directly with constructed events (what every sink must do, through real relay processes too, is
tests/test_sink_contract.py)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from conftest import free_port
from relay.wire.lines import encode_line
from sink_helpers import Events, drive, training_events
from sink_readback import check_tensorboard as check_training_run, read_logdir
from sinks.base import PermanentError, SinkContext, SinkError
from sinks.tensorboard import STATE_NAME, TensorBoardSink, _tag

ROOT = Path(__file__).resolve().parents[1]


def run_sink(logdir: Path, batches: list[list[dict]], journal: Path | None = None) -> TensorBoardSink:
    return drive(TensorBoardSink(logdir=str(logdir)), batches, journal)


# -- the sink called directly ---------------------------------------------------------------------


def test_mapping_of_a_two_rank_run(tmp_path: Path) -> None:
    events = training_events("job-1", output_dir=str(tmp_path / "job"), experiment="sft-demo")
    for i, event in enumerate(events):
        event["ts"] = 1_700_000_000.0 + i
    sink = run_sink(tmp_path / "tb", [events[:9], events[9:]])
    boards = read_logdir(tmp_path / "tb")
    assert list(boards) == ["job-1"]
    board = boards["job-1"]
    check_training_run(board)
    assert board.hparams["run.experiment"] == "sft-demo" and board.hparams["max_grad_norm"] == math.inf
    assert board.group == "job-1" and board.status == "STATUS_SUCCESS"
    assert all(1_700_000_000 <= wall < 1_700_000_100 for _, _, wall in board.points["train/loss"])  # event time
    assert len(board.files) == 1 and sink.counters["skipped_values"] == 0


def test_writes_with_tensorboard_alone(tmp_path: Path) -> None:
    code = ("import sys; sys.path.insert(0, 'tests'); from sink_helpers import training_events; "
            "from sinks.tensorboard import TensorBoardSink; from sinks.base import SinkContext; "
            f"s = TensorBoardSink(logdir={str(tmp_path)!r}); s.open(SinkContext()); "
            "s.write(training_events('job-lean')); s.close(); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'tensorboardX') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_trainer_names_as_transformers_rewrite_logs() -> None:
    assert _tag(None, {}, "loss") == "train/loss"
    assert _tag(None, {"subset": "eval"}, "loss") == "eval/loss"
    assert _tag(None, {"subset": "test"}, "runtime") == "test/runtime"
    assert _tag(None, {"subset": "train"}, "runtime") == "train/train_runtime"
    assert _tag(None, {"subset": "eval", "sub_dataset": "ds1"}, "loss") == "eval/ds1_loss"
    assert _tag(1, {"system": "rank", "rank": 1}, "rank_step_time_s") == "workers/rank_step_time_s/rank_1"
    assert _tag(None, {"system": "cluster"}, "cluster_step_time_max_s") == "workers/cluster_step_time_max_s"
    assert _tag(0, {"subset": "additional_metrics", "rank": 0}, "model_load_time") == "train/model_load_time"
    assert _tag(1, {"subset": "additional_metrics", "rank": 1}, "step_time") == "workers/additional_metrics/step_time/rank_1"
    assert _tag(0, {"subset": "data", "rank": 0}, "tokens") == "train/data/tokens"


def test_a_restarted_sink_resumes_the_run(tmp_path: Path) -> None:
    events = training_events("job-r")
    run_sink(tmp_path / "tb", [events[:15]])
    more = run_sink(tmp_path / "tb", [events[10:]])
    assert more.counters["runs_resumed"] == 1 and more.counters["duplicates"] == 5
    board = read_logdir(tmp_path / "tb")["job-r"]
    check_training_run(board)
    assert len(board.files) == 2  # one event file per process that wrote to the run


def test_stepless_custom_metrics_are_numbered_and_not_doubled_by_a_retry(tmp_path: Path) -> None:
    ev = Events("job-auto", world_size=1)
    batch = [ev(0, "metrics", {"tokens_seen": float(i)}, stage="additional_metrics") for i in range(3)]
    run_sink(tmp_path / "tb", [batch, batch, batch[1:]])
    assert read_logdir(tmp_path / "tb")["job-auto"].series("train/tokens_seen") == {0: 0.0, 1: 1.0, 2: 2.0}


def test_a_failed_commit_then_a_crash_leave_every_point_once(tmp_path: Path) -> None:
    """The records of a batch are appended, then the state file fails to save (here: a directory
    where its temporary file goes). The relay's retry, and a process that died right there, both
    end with each point once."""
    logdir, events = tmp_path / "tb", training_events("job-f", steps=12)
    run_sink(logdir, [events[:10]])
    blocker = logdir / "job-f" / f".{STATE_NAME}.{os.getpid()}.tmp"  # sinks/files.py's temporary file
    blocker.mkdir()
    sink = TensorBoardSink(logdir=str(logdir))
    sink.open(SinkContext())
    with pytest.raises(OSError):
        sink.write(events[10:30])
    blocker.rmdir()
    sink.write(events[10:30])  # the relay's retry of the same batch
    sink.close()
    assert sink.counters["discarded_batches"] == 1

    # Now a sink process dies between appending a batch and saving its state.
    code = ("import sys, os; sys.path.insert(0, 'tests'); from sink_helpers import training_events; "
            "from sinks.tensorboard import TensorBoardSink; from sinks.base import SinkContext; "
            f"s = TensorBoardSink(logdir={str(logdir)!r}); s.open(SinkContext()); "
            f"events = training_events('job-f', steps=12); s.write(events[30:35]); "
            f"blocker = {str(blocker.parent)!r} + f'/.{STATE_NAME}.{{os.getpid()}}.tmp'; os.mkdir(blocker)\n"
            "try: s.write(events[35:50])\nexcept OSError: os._exit(9)")
    died = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert died.returncode == 9, died.stderr[-2000:]
    next((logdir / "job-f").glob(f".{STATE_NAME}.*.tmp")).rmdir()
    after = run_sink(logdir, [events[30:]])
    assert after.counters["uncommitted_bytes_cut"] > 0
    check_training_run(read_logdir(logdir)["job-f"], steps=12)


def test_gaps_are_filled_from_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "logs"
    journal.mkdir()
    events = training_events("job-gap")
    (journal / "job-gap.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    sink = run_sink(tmp_path / "tb", [events[:10] + events[25:]], journal=journal)
    # the run read back once (all of it), and each of the 15 it lacked applied once
    assert (sink.counters["events"], sink.counters["duplicates"]) == (len(events), len(events) - 15)
    assert not sink.holes([])
    check_training_run(read_logdir(tmp_path / "tb")["job-gap"])


def test_params_after_the_session_go_to_text_only(tmp_path: Path) -> None:
    ev = Events("job-late", world_size=1)
    batch = [ev(0, "params", {"lr": 0.1}, stage="hparams"),
             ev(0, "metrics", {"loss": 1.0}, step=1, stage="train"),
             ev(0, "params", {"note": "later"}, stage="experiment_metadata")]
    sink = run_sink(tmp_path / "tb", [batch])
    board = read_logdir(tmp_path / "tb")["job-late"]
    assert board.hparams == {"lr": 0.1} and board.text("experiment_metadata") == {"note": "later"}
    assert sink.counters["late_hparams"] == 1


def test_a_name_tensorboard_cannot_encode_is_permanent(tmp_path: Path) -> None:
    ev = Events("job-bad", world_size=1)
    sink = TensorBoardSink(logdir=str(tmp_path / "tb"))
    sink.open(SinkContext())
    try:
        for bad in (ev(0, "metrics", {"bad\ud800": 1.0}, step=1, stage="train"),
                    ev(0, "params", {"bad\ud800": 1.0}, stage="hparams")):
            with pytest.raises(PermanentError):
                sink.write([bad])
        sink.write([ev(0, "params", {"lr": 0.5}, stage="hparams"),  # what the relay writes next
                    ev(0, "metrics", {"good": 1.0}, step=2, stage="train")])
    finally:
        sink.close()
    board = read_logdir(tmp_path / "tb")["job-bad"]
    assert board.series("train/good") == {2: 1.0} and board.hparams == {"lr": 0.5}


def test_a_second_writer_of_a_run_waits(tmp_path: Path) -> None:
    events = training_events("job-busy")
    first = TensorBoardSink(logdir=str(tmp_path / "tb"))
    first.open(SinkContext())
    second = TensorBoardSink(logdir=str(tmp_path / "tb"))
    second.open(SinkContext())
    try:
        first.write(events[:10])
        with pytest.raises(Exception, match="being written by another process"):
            second.write(events[:10])
    finally:
        first.close()
    second.write(events)  # the relay's retry, once the other one is done
    second.close()
    check_training_run(read_logdir(tmp_path / "tb")["job-busy"])


def test_config_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="--logdir"):
        TensorBoardSink()
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(SinkError, match="not usable"):
        TensorBoardSink(logdir=str(tmp_path / "file" / "tb")).open(SinkContext())


def serve(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_cli_refuses_an_unusable_tensorboard_sink(tmp_path: Path) -> None:
    done = serve(tmp_path, "--sink", "tensorboard")
    assert done.returncode == 2 and "--sink tensorboard needs --logdir" in done.stderr, done.stderr[-2000:]
    (tmp_path / "file").write_text("in the way")
    done = serve(tmp_path, "--sink", "tensorboard", "--logdir", str(tmp_path / "file" / "tb"))
    assert done.returncode == 2 and "not usable" in done.stderr, done.stderr[-2000:]
    shadow = tmp_path / "no-tb" / "tensorboard"
    shadow.mkdir(parents=True)
    (shadow.parent / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")  # not installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    done = serve(tmp_path, "--sink", "tensorboard", "--logdir", str(tmp_path / "tb"), env=env)
    assert done.returncode == 2 and "pip install './[tensorboard]' in the metrics-relay checkout" in done.stderr, done.stderr[-2000:]
