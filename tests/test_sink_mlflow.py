"""The MLflow sink against real MLflow stores (SQLite, a directory, a real `mlflow server`), called
directly and behind real relay processes; everything is read back through ``MlflowClient``."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("mlflow")

from conftest import free_port, line_count, wait_for
from relay.sinkhost.catch_up import CatchUp
from relay.sinkhost.driver import SinkDriver
from relay.sinkhost.replay import replay_files
from relay.wire.lines import encode_line
from sink_helpers import (  # noqa: F401
    Events,
    drive,
    fill,
    finish_ranks as finish,
    small_fs,
    start_rank,
    training_events,
)
from sink_readback import EXPERIMENT, check_mlflow as check_training_run, comparable, read_run
from sinks.base import PermanentError, SinkContext, SinkError
from sinks.mlflow import MlflowSink
from sinks.mlflow_applied import STATE_NAME, applied_tags
from sinks.mlflow_rules import MAX_PARAM, batches

ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialized, empty MLflow SQLite database: creating one takes seconds, copying it none."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def db(template_db: Path, tmp_path: Path):
    """A fresh database for one test: ``db()`` gives a new one's URI each call."""
    made = []

    def fresh() -> str:
        path = tmp_path / f"mlflow-{len(made)}.db"
        shutil.copy(template_db, path)
        made.append(path)
        return f"sqlite:///{path}"
    return fresh


def run_sink(uri: str, batches_: list[list[dict]], journal: Path | None = None,
             experiment: str = EXPERIMENT) -> MlflowSink:
    return drive(MlflowSink(uri, experiment), batches_, journal)


# -- the sink called directly ---------------------------------------------------------------------


def test_mapping_of_a_two_rank_run(db, tmp_path: Path) -> None:
    uri, job = db(), tmp_path / "job"
    events = training_events("job-1", output_dir=str(job), experiment="ignored-by-mlflow")
    sink = run_sink(uri, [events[:9], events[9:]])
    view = read_run(uri, "job-1")
    check_training_run(view)
    assert view.info.status == "FINISHED" and view.info.run_name == "job-1"
    train_end = next(e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end")
    assert view.info.start_time == int(events[0]["ts"] * 1000) and view.info.end_time == int(train_end["ts"] * 1000)
    loss_events = [e for e in events if e["stage"] == "train" and "loss" in e["data"]]
    assert [t for _, _, t in view.history["loss"]] == [int(e["ts"] * 1000) for e in loss_events]
    assert view.params["run.experiment"] == "ignored-by-mlflow"
    export = json.loads((job / "mlflow_tracker.json").read_text())
    assert export["run_name"] == "job-1" and export["run_id"] == view.info.run_id
    assert export["run_uri"] == f"<host_url>/#/experiments/{view.info.experiment_id}/runs/{view.info.run_id}"
    assert sink.counters["runs_created"] == 1 and sink.counters["skipped_values"] == 0


def test_run_uri_export_path_takes_the_export_from_the_output_dir(db, tmp_path: Path) -> None:
    """fms-hf-tuning's --run_uri_export_path (in the `run` params) is where mlflow_tracker.json goes,
    also when hparams' own output_dir comes after it."""
    uri, job, exports = db(), tmp_path / "job", tmp_path / "exports"
    events = training_events("j2-d0c381", output_dir=str(job))
    ev = Events("j2-d0c381")
    ev.seqs[0] = max(e["seq"] for e in events if e["rank"] == 0) + 1
    events.insert(3, ev(0, "params", {"run_id": "j2-d0c381", "output_dir": str(job),
                                      "run_uri_export_path": str(exports)}, stage="run"))
    run_sink(uri, [events])
    exported = json.loads((exports / "mlflow_tracker.json").read_text())
    assert exported["run_id"] == read_run(uri, "j2-d0c381").info.run_id
    assert not (job / "mlflow_tracker.json").exists()


def test_what_the_run_page_reads_is_filled_and_bookkeeping_hidden(db, tmp_path: Path) -> None:
    uri, job = db(), tmp_path / "job"
    events = training_events("j1-d0c381", output_dir=str(job))
    ev = Events("j1-d0c381")
    ev.seqs[0] = max(e["seq"] for e in events if e["rank"] == 0) + 1
    events.insert(3, ev(0, "params", {"run_id": "j1-d0c381", "run_name": "j1", "user": "ada",
                                      "source": "/src/trainer/__main__.py"}, stage="run"))
    run_sink(uri, [events])
    view = read_run(uri, "j1-d0c381")
    assert view.info.run_name == "j1"  # the user's --run_name, as HF's MLflowCallback names the run
    assert {k: view.tags[k] for k in ("mlflow.user", "mlflow.source.name", "mlflow.source.type")} == {
        "mlflow.user": "ada", "mlflow.source.name": "/src/trainer/__main__.py", "mlflow.source.type": "LOCAL"}
    shown = {k for k in view.tags if not k.startswith(("mlflow.", "_mlflow_"))}  # what MLflow's UI lists
    assert shown == {"relay.run_id"}, shown
    assert json.loads((job / "mlflow_tracker.json").read_text())["run_name"] == "j1"
    import mlflow

    experiment = mlflow.MlflowClient(tracking_uri=uri).get_experiment(view.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_restart_resumes_the_run_and_replay_adds_nothing(db) -> None:
    uri = db()
    events = training_events("job-r")
    run_sink(uri, [events[:15]])
    more = run_sink(uri, [events[10:20], events[20:]])  # a restarted relay: some events again
    assert more.counters["runs_resumed"] == 1 and more.counters["duplicates"] == 5
    first = read_run(uri, "job-r")
    check_training_run(first)
    again = run_sink(uri, [events])
    assert again.counters["events"] == 0 and again.counters["duplicates"] == len(events)
    assert comparable(read_run(uri, "job-r")) == comparable(first)


def test_params_beyond_mlflows_limits_and_changed_params(db) -> None:
    from mlflow import MlflowClient

    uri, ev = db(), Events("job-p", world_size=1)
    many = {f"p{i:03d}": i for i in range(150)}  # more than MLflow's 100 params per call
    long_key = "k" * 300
    batch = [ev(0, "params", {"seed": 42, "long": "x" * 7000, long_key: 1, **many}, stage="hparams"),
             ev(0, "params", {"dataset (v3)": "yes"}, stage="experiment_metadata"),
             ev(0, "params", {"seed": 42}, stage="hparams"),  # the same value again: fine
             ev(0, "params", {"seed": 43}, stage="hparams")]  # MLflow cannot change a param
    sink = run_sink(uri, [batch])
    assert (sink.counters["params_changed"], sink.counters["params_cut"]) == (1, 3)
    view = read_run(uri, "job-p")
    assert all(view.params[k] == str(v) for k, v in many.items())
    assert view.params["seed"] == "42" and view.tags["relay.changed.seed"] == "43"
    assert view.params["long"] == "x" * MAX_PARAM and view.params["dataset _v3_"] == "yes"
    short = next(k for k in view.params if k.startswith("kkk"))
    assert len(short) == 250
    client = MlflowClient(uri)
    folder = Path(client.download_artifacts(view.info.run_id, "relay_params"))
    assert json.loads((folder / "long.json").read_text())["value"] == "x" * 7000
    assert json.loads((folder / f"{short}.json").read_text())["key"] == long_key
    assert json.loads((folder / "dataset _v3_.json").read_text())["key"] == "dataset (v3)"
    assert run_sink(uri, [batch]).counters["params_changed"] == 0  # replayed: nothing new


def test_failed_run_and_custom_metrics_without_a_step(db) -> None:
    uri, ev = db(), Events("job-f", world_size=2)
    early = [ev(0, "metrics", {"tokens_seen": float(i)}, stage="additional_metrics") for i in range(3)]
    early.append(ev(1, "metrics", {"model_load_time": 2.5}, stage="additional_metrics"))
    end = [ev(0, "lifecycle", {"event": "train_end", "status": "failed"}, step=3)]
    run_sink(uri, [early, early, early[1:], end])  # retried batches add nothing
    view = read_run(uri, "job-f")
    assert [(s, v) for s, v, _ in view.history["additional_metrics.tokens_seen"]] == [(0, 0.0), (0, 1.0), (0, 2.0)]
    assert view.series("rank/1/additional_metrics.model_load_time") == {0: 2.5}
    assert view.info.status == "FAILED"


def test_gaps_are_filled_from_the_journal(db, tmp_path: Path) -> None:
    """Batches the relay dropped for this sink are in the journal: the hole in the seqs is noticed
    and the sink's process fills it from there before its next flush."""
    uri, journal = db(), tmp_path / "logs"
    journal.mkdir()
    events = training_events("job-gap")
    (journal / "job-gap.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    sink = run_sink(uri, [events[:10] + events[25:]], journal=journal)
    # the run read back once (all of it), and each of the 15 it lacked applied once
    assert (sink.counters["events"], sink.counters["duplicates"]) == (len(events), len(events) - 15)
    assert not sink.holes([])
    check_training_run(read_run(uri, "job-gap"))
    assert json.loads((journal / "job-gap.mlflow_tracker.json").read_text())["run_name"] == "job-gap"


def test_a_replay_leaves_the_jobs_export_alone(db, tmp_path: Path) -> None:
    """The job's mlflow_tracker.json names its live run: a replay into another store keeps it."""
    job = tmp_path / "job"
    job.mkdir()
    journal = job / "training_logs.jsonl"
    events = training_events("job-x", output_dir=str(job))
    journal.write_bytes(b"".join(encode_line(e) for e in events))
    run_sink(db(), [events], journal=journal)
    live = (job / "mlflow_tracker.json").read_bytes()
    other = db()
    replay_files([journal], [MlflowSink(mlflow_tracking_uri=other, mlflow_experiment=EXPERIMENT)])
    check_training_run(read_run(other, "job-x"))
    assert (job / "mlflow_tracker.json").read_bytes() == live


def test_a_run_deleted_meanwhile_is_made_again_and_a_refusal_is_permanent(db, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri, journal = db(), tmp_path / "logs"
    journal.mkdir()
    events = training_events("job-del")
    (journal / "job-del.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    sink = MlflowSink(uri, EXPERIMENT)
    sink.open(SinkContext(journal=journal))
    sink.write(events[:10])
    client = MlflowClient(uri)
    deleted = read_run(uri, "job-del").info.run_id
    client.delete_run(deleted)
    with pytest.raises(Exception) as failed:  # transient: the relay retries the batch...
        sink.write(events[10:20])
    assert not isinstance(failed.value, PermanentError)
    sink.write(events[10:20])  # ...which makes a new run; the hole below it is filled from the journal
    sink.write(events[20:])
    assert sink.holes([]) == ["job-del"]  # what the sink's process then writes it from the journal:
    assert SinkDriver("mlflow", sink).fill_holes(CatchUp(str(journal), "mlflow").run_batches)
    sink.flush()
    view = read_run(uri, "job-del")
    assert view.info.run_id != deleted and sink.counters["runs_deleted"] == 1
    check_training_run(view)
    client.log_param(view.info.run_id, "late", "theirs")  # another writer: MLflow now refuses ours
    late = dict(Events("job-del")(0, "params", {"late": "ours"}, stage="hparams"), seq=len(events))
    with pytest.raises(PermanentError, match="Changing param values"):  # the relay dead-letters it
        sink.write([late])
    sink.close()


def test_directory_store_full_then_recovered(small_fs: Path, tmp_path: Path) -> None:
    """A directory store appends points, one file per metric: with the disk full, a batch can add
    to the files that have room and fail on a new one. Retried, it must not double the former."""
    ev = Events("job-full", world_size=1)
    events = [ev(0, "params", {"seed": 42}, stage="hparams")]
    events += [ev(0, "metrics", {"loss": 1 / s, "grad_norm": 0.5}, step=s, stage="train") for s in range(1, 31)]
    events += [ev(0, "metrics", {"loss": 0.1, "accuracy": 0.9}, step=30, stage="eval")]  # new files
    run_sink(str(tmp_path / "reference"), [events])
    store = small_fs / "mlruns"
    sink = MlflowSink(str(store), EXPERIMENT)
    sink.open(SinkContext())
    sink.write(events[:11])
    fill(small_fs / "filler")
    failures = 0
    for _ in range(3):
        try:
            sink.write(events[11:])
            break
        except Exception:
            failures += 1
    assert failures == 3
    (small_fs / "filler").unlink()
    sink.write(events[11:])  # the relay's retry, once there is room again
    sink.close()
    view, reference = read_run(str(store), "job-full"), read_run(str(tmp_path / "reference"), "job-full")
    assert view.history == reference.history and view.params == reference.params  # nothing lost, nothing twice
    assert sorted(view.series("loss")) == list(range(1, 31)) and view.series("eval_accuracy") == {30: 0.9}


def test_a_directory_stores_run_is_resumed_cut_back_to_its_saved_spans(tmp_path: Path) -> None:
    """What a relay killed in a run's first save leaves (points, no spans) is cut and written once;
    a run whose spans an older relay kept in its tags (no metric sizes) is resumed as it is."""
    from mlflow import MlflowClient, entities

    store = str(tmp_path / "mlruns")
    events = training_events("job-old")
    run_sink(store, [events])
    client, old = MlflowClient(store), read_run(store, "job-old")
    made = client.create_run(old.info.experiment_id, tags={"relay.run_id": "job-new"})
    client.log_batch(made.info.run_id, metrics=[entities.Metric("loss", 5.0, 0, 1)])
    sink = run_sink(store, [training_events("job-new")])
    check_training_run(read_run(store, "job-new"))
    assert sink.counters["uncommitted_bytes_cut"] > 0

    state = Path(old.info.artifact_uri).parent / STATE_NAME
    for key, value in applied_tags(json.loads(state.read_text())["spans"]):
        client.set_tag(old.info.run_id, key, value)
    state.unlink()
    sink = run_sink(store, [events])
    assert sink.counters["duplicates"] == len(events) and not sink.counters["uncommitted_bytes_cut"]
    assert read_run(store, "job-old").history == old.history


def test_batches_stay_within_mlflows_limits() -> None:
    from mlflow.entities import Metric, Param, RunTag

    metrics = [Metric(f"m{i}", 1.0, 0, i) for i in range(2500)]
    params = [Param(f"p{i}", "v" * 5000) for i in range(250)]
    last = [RunTag("relay.applied", "1"), RunTag("relay.applied.0", "{}")]
    calls = batches(metrics, params, [RunTag("t", "v")], last)
    assert all(len(m) <= 1000 and len(p) <= 100 and len(t) <= 100 and len(m) + len(p) + len(t) <= 1000
               and sum(len(x.value) for x in p) < 1_000_000 for m, p, t in calls)
    assert [x for c in calls for x in c[0]] == metrics and [x for c in calls for x in c[1]] == params
    assert calls[-1][2][-2:] == last and all(x not in c[2] for c in calls[:-1] for x in last)


def test_an_unusable_store_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="--mlflow-tracking-uri"):
        MlflowSink()
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(SinkError, match="cannot be used"):
        MlflowSink(f"sqlite:///{tmp_path / 'file' / 'm.db'}").open(SinkContext())


def test_cli_says_what_is_missing(tmp_path: Path) -> None:
    def serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}",
                               "--sink", "mlflow", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env=env)

    shadow = tmp_path / "no-mlflow" / "mlflow"
    shadow.mkdir(parents=True)
    (shadow.parent / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")  # not installed
    env = dict(QUIET, PYTHONPATH=os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    done = serve("--mlflow-tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", env=env)
    assert done.returncode == 2 and "pip install './[mlflow]' in the metrics-relay checkout" in done.stderr, done.stderr[-2000:]
    env = {k: v for k, v in QUIET.items() if k != "MLFLOW_TRACKING_URI"}
    done = serve(env=env)
    assert done.returncode == 2 and "needs --mlflow-tracking-uri" in done.stderr, done.stderr[-2000:]


# -- behind a real relay ----------------------------------------------------------------------------





def replay(journal: Path, uri: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", "mlflow",
                           "--mlflow-tracking-uri", uri, "--mlflow-experiment", EXPERIMENT],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=QUIET)


@pytest.mark.slow  # a whole fault scenario of relay processes: the full tier
def test_two_ranks_relay_killed_mid_run_then_replay_twice(relays, db, tmp_path: Path) -> None:
    """Two real ranks through a real relay that is SIGKILLed mid-run, once the ranks' first halves are
    journaled and its MLflow sink has written, and started again on the same journal and address:
    every point lands once. Then `relay replay` twice into a fresh database gives the same run, and
    the second adds nothing."""
    uri, job, gate = db(), tmp_path / "job", tmp_path / "gate"
    logs = tmp_path / "relay-logs"  # the relay's default --path, in its working folder
    journal = logs / "job-live.jsonl"
    relay = relays(["--sink", "mlflow", "--mlflow-tracking-uri", uri, "--mlflow-experiment", EXPERIMENT,
                    "--stats-interval", "0.3"], env=QUIET)
    procs = [start_rank(relay.address, "job-live", rank, 40, output_dir=job, pause=0.05, gate=gate)
             for rank in (0, 1)]
    wait_for(lambda: line_count(journal) > 40 and relay.sink_stats(logs, "mlflow").get("written", 0) > 0, 300,
             "the ranks under way and the mlflow sink writing", relay.log_tail)
    gate.touch()  # the ranks' second halves: still to come when the relay dies, whatever the load
    assert all(proc.poll() is None for proc in procs), "the publishers finished before the kill"
    relay.kill()  # no flush, no goodbye: the publishers keep what was not acknowledged and resend it
    killed_at = line_count(journal)
    relay.start()
    finish(procs)
    assert relay.stop() == 0
    assert 0 < killed_at < line_count(journal), "the relay was not killed mid-run"
    live = read_run(uri, "job-live")
    check_training_run(live, steps=40)
    each_point_once(live, 40)
    assert live.info.status == "FINISHED"
    assert json.loads((job / "mlflow_tracker.json").read_text())["run_id"] == live.info.run_id

    fresh = db()
    for attempt in range(2):
        done = replay(journal, fresh)
        assert done.returncode == 0, done.stderr[-2000:]
        rebuilt = read_run(fresh, "job-live")
        assert comparable(rebuilt) == comparable(live)
        if attempt == 0:
            first_id = rebuilt.info.run_id
    assert rebuilt.info.run_id == first_id


def each_point_once(view: Any, steps: int) -> None:
    """Every series' points once (epoch: again with each eval log and the final train_* figures)."""
    evals = len(range(3, steps + 1, 3))
    for key, points in view.history.items():
        assert len(points) == len({s for s, _, _ in points}) + (evals + 1) * (key == "epoch"), key


@pytest.mark.slow  # two relays and two rank processes: the full tier
def test_a_relay_killed_after_mlflow_appended_points_before_the_sink_recorded_them(
        relays, tmp_path: Path, monkeypatch) -> None:
    """The window of a directory store, which appends: MLflow wrote a batch's points, and the relay
    died before the applied spans (saved after them) said so. Forced for real: the spans' file is
    made a directory, so their save fails right after MLflow appended the points (the sink
    retries); the relay is SIGKILLed then, the file put back, and the next relay catches the run
    up from the journal: each point once."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # read back here too
    store, logs, gate = tmp_path / "mlruns", tmp_path / "logs", tmp_path / "gate"
    relay = relays(["--path", f"{logs}/", "--sink", "mlflow", "--mlflow-tracking-uri", str(store),
                    "--mlflow-experiment", EXPERIMENT, "--stats-interval", "0.3"], env=QUIET)
    procs = [start_rank(relay.address, "job-window", r, 40, pause=0.05, gate=gate) for r in (0, 1)]

    def lines() -> int:  # the loss points MLflow holds
        return sum(len(p.read_text().splitlines()) for p in store.glob("*/*/metrics/loss"))
    wait_for(lambda: lines() == 20 and relay.sink_stats(logs, "mlflow").get("queued") == 0, 300,
             "the ranks' first halves in MLflow", relay.log_tail)
    (state,) = store.glob(f"*/*/{STATE_NAME}")
    aside = state.with_name("aside")
    while True:  # a save between the two steps writes the state again: take that one aside
        state.replace(aside)
        try:
            state.mkdir()
            break
        except FileExistsError:
            continue
    gate.touch()
    wait_for(lambda: lines() > 20 and relay.sink_stats(logs, "mlflow").get("errors", 0) > 0, 300,
             "MLflow holding points the sink failed to record", relay.log_tail)
    relay.kill()
    state.rmdir()
    aside.replace(state)
    relay.start()
    finish(procs)
    wait_for(lambda: (s := relay.sink_stats(logs, "mlflow")).get("open") and not s["queued"]
             and s["catch_up_passes"] >= 1, 300, "the restarted relay's sink caught up",
             relay.log_tail)
    assert relay.stop() == 0
    live = read_run(str(store), "job-window")
    check_training_run(live, steps=40)
    each_point_once(live, 40)
    assert "bytes of points no saved span covers" in relay.log.read_text()


@pytest.fixture
def mlflow_server(tmp_path: Path, template_db: Path):
    """A real `mlflow server` on loopback (SQLite backend), started and stopped by the test."""
    port, store = free_port(), tmp_path / "server"
    store.mkdir()
    shutil.copy(template_db, store / "mlflow.db")  # an initialized database: the first start is quicker
    exe = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    cmd = [exe, "server", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1", "--artifacts-destination", str(store / "artifacts")]
    env = dict(QUIET, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")

    class Server:
        url = f"http://127.0.0.1:{port}"
        proc: subprocess.Popen | None = None

        def start(self) -> None:
            with open(store / "server.log", "ab") as log:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
            deadline = time.monotonic() + 120
            while not self.answers():
                alive = self.proc.poll() is None and time.monotonic() < deadline
                assert alive, (store / "server.log").read_text()[-2000:]
                time.sleep(0.2)

        def answers(self) -> bool:
            import urllib.request
            try:
                return urllib.request.urlopen(f"{self.url}/health", timeout=1).status == 200
            except OSError:
                return False

        def stop(self) -> None:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # uvicorn's workers are in its group
                self.proc.wait(20)

    server = Server()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow  # a real mlflow server, started twice: tens of seconds
def test_mlflow_server_restarted_mid_run(relays, mlflow_server, tmp_path: Path) -> None:
    """The server goes away while the run is being written and comes back: the sink's failed
    batches are retried until it answers, and the run ends complete, nothing twice."""
    mlflow_server.start()
    relay = relays(["--sink", "mlflow", "--mlflow-tracking-uri", mlflow_server.url,
                    "--mlflow-experiment", EXPERIMENT], env=QUIET)
    # The ranks' second halves wait for the gate, opened once the server is gone: the sink still has
    # events to write then, however long its process took to open beside the listening relay.
    gate = tmp_path / "gate"
    procs = [start_rank(relay.address, "job-srv", rank, 40, output_dir=tmp_path / "job", pause=0.05, gate=gate)
             for rank in (0, 1)]
    wait_for(lambda: (now := server_run(mlflow_server.url, "job-srv")) is not None and "loss" in now.data.metrics,
             180, "the run's first losses on the server", relay.log_tail)
    mlflow_server.stop()
    gate.touch()
    assert any(proc.poll() is None for proc in procs), "the publishers finished before the server went away"
    wait_for(lambda: "sink mlflow failed" in relay.log.read_text(), 180, "a batch failing against the stopped server")
    mlflow_server.start()
    finish(procs)
    # the ranks' closing stats, after train_end
    wait_for(lambda: _complete(server_run(mlflow_server.url, "job-srv")), 180, "the run complete on the server",
             relay.log_tail)
    assert relay.stop() == 0
    view = read_run(mlflow_server.url, "job-srv")
    check_training_run(view, steps=40)
    export = json.loads((tmp_path / "job" / "mlflow_tracker.json").read_text())
    assert export["run_uri"] == f"{mlflow_server.url}/#/experiments/{view.info.experiment_id}/runs/{view.info.run_id}"


def server_run(url: str, run: str) -> Any:
    """The MLflow run of ``run`` as the server has it now; None while it is down or has none."""
    from mlflow import MlflowClient

    client = MlflowClient(url)
    try:
        exp = client.get_experiment_by_name(EXPERIMENT)
        found = client.search_runs([exp.experiment_id], f"tags.`relay.run_id` = '{run}'") if exp else []
    except Exception:  # down or starting: nothing to see yet
        return None
    return found[0] if found else None


def _complete(run: Any) -> bool:
    return run is not None and run.info.status == "FINISHED" and \
        {"relay.client.rank0", "relay.client.rank1"} <= run.data.params.keys()


@pytest.mark.slow  # a real mlflow server started twice, two relays: tens of seconds
def test_server_down_then_relay_killed_the_run_is_caught_up_without_a_new_event(relays, mlflow_server,
                                                                                tmp_path: Path) -> None:
    """The server dies mid-run; the job finishes (every event journaled); the relay and its sink process
    are SIGKILLed and the relay started again; then the server comes back. No event of the run comes
    any more, yet the sink catches it up from the journal: every point once."""
    mlflow_server.start()
    args = ["--sink", "mlflow", "--mlflow-tracking-uri", mlflow_server.url, "--mlflow-experiment", EXPERIMENT]
    relay = relays(args, env=QUIET)
    procs = [start_rank(relay.address, "job-gone", rank, 40, pause=0.05) for rank in (0, 1)]
    deadline = time.monotonic() + 60
    while (now := server_run(mlflow_server.url, "job-gone")) is None or "loss" not in now.data.metrics:
        assert time.monotonic() < deadline, relay.log.read_text()[-3000:]
        time.sleep(0.2)
    mlflow_server.stop()
    finish(procs)
    children = psutil.Process(relay.proc.pid).children()
    relay.kill()
    for child in children:  # the whole group dies, as in an OOM kill or a lost node
        child.kill()
    restarted = relays(args, address=relay.address, env=QUIET)  # nothing is published to it
    time.sleep(2.0)
    mlflow_server.start()
    deadline = time.monotonic() + 120
    while not _complete(server_run(mlflow_server.url, "job-gone")):
        assert time.monotonic() < deadline, restarted.log.read_text()[-3000:]
        time.sleep(0.5)
    assert restarted.stop() == 0
    assert "caught up from the journal" in restarted.log.read_text()
    view = read_run(mlflow_server.url, "job-gone")
    check_training_run(view, steps=40)
    extra_epochs = len(view.series("eval_loss")) + 1  # epoch also comes with each eval log and the final train_*
    for key, points in view.history.items():  # each point once
        assert len(points) == len({s for s, _, _ in points}) + (extra_epochs if key == "epoch" else 0), key
