"""The Aim sink called directly with constructed events, against real Aim repositories."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aim")

from relay.wire.lines import encode_line
from sink_helpers import Events, aim_repo, drive, fill, small_fs, training_events  # noqa: F401
from sink_readback import check_aim as check_training_run, read_repo
from sinks.aim import AimSink
from sinks.base import SinkContext, SinkError
from sinks.events import RELAY_RANK
from sinks.naming import trainer_groups as _trainer_groups
from sinks.spans import SeqSpans

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_sink(repo: Path, batches: list[list[dict]], journal: Path | None = None, **options) -> AimSink:
    return drive(AimSink(repo=str(repo), **options), batches, journal)


def write_journal(path: Path, events: list[dict]) -> None:
    with open(path, "ab") as fh:
        fh.write(b"".join(encode_line(e) for e in events))


def test_mapping_of_a_two_rank_run(tmp_path: Path) -> None:
    out = tmp_path / "job"
    events = training_events("job-1", output_dir=str(out), experiment="sft-demo")
    sink = run_sink(tmp_path / "aim", [events[:9], events[9:]])
    runs = read_repo(str(tmp_path / "aim"))
    assert list(runs) == ["job-1"]
    view = runs["job-1"]
    check_training_run(view)
    assert view.experiment == "sft-demo" and view.name == "job-1"
    assert not view.active  # closed on train_end
    assert view.params["relay"]["client"]["rank0"]["published"] == sum(e["rank"] == 0 for e in events)
    export = json.loads((out / "aim_tracker.json").read_text())
    assert export["run_hash"] == view.hash and export["run_id"] == "job-1"
    assert sink.counters["runs_created"] == 1 and sink.counters["skipped_values"] == 0


def test_points_keep_the_event_time(aim_repo: Path) -> None:
    events = training_events("job-ts")
    for i, event in enumerate(events):
        event["ts"] = 1_700_000_000.0 + i
    run_sink(aim_repo, [events])
    view = read_repo(str(aim_repo))["job-ts"]
    assert all(1_700_000_000 <= t < 1_700_000_100 for t in view.timestamps[("loss", ())])


def test_trainer_metrics_are_taken_once_per_step_from_rank_0(aim_repo: Path) -> None:
    ev = Events("job-dup")
    batch = [ev(rank, "metrics", {"loss": 1.0 + rank}, step=1, stage="train") for rank in (0, 1)]
    sink = run_sink(aim_repo, [batch])
    assert read_repo(str(aim_repo))["job-dup"].series("loss") == {1: 1.0}
    assert sink.counters["nonzero_rank_trainer_metrics"] == 1


def test_names_and_contexts_match_aims_callback() -> None:
    # Raw Trainer logs (as Aim's AimCallback sees them) and logs the trainer already split.
    raw = _trainer_groups("train", {"eval_loss": 1, "eval_runtime": 2, "loss": 3, "train_loss": 4})
    assert raw[(("subset", "eval"),)] == ({"subset": "eval"}, {"loss": 1, "runtime": 2})
    assert raw[()] == ({}, {"loss": 3})
    assert raw[(("subset", "train"),)][1] == {"loss": 4}
    several = _trainer_groups("eval", {"ds1_loss": 1, "ds1_runtime": 2})
    assert several == {(("sub_dataset", "ds1"), ("subset", "eval")):
                       ({"subset": "eval", "sub_dataset": "ds1"}, {"loss": 1, "runtime": 2})}
    assert _trainer_groups("eval", {"loss": 1, "aux_loss": 2})[(("subset", "eval"),)][1] == {"loss": 1, "aux_loss": 2}


def test_custom_metrics_without_step_are_not_doubled_by_a_retry(aim_repo: Path) -> None:
    ev = Events("job-auto", world_size=1)
    batch = [ev(0, "metrics", {"tokens_seen": float(i)}, stage="additional_metrics") for i in range(3)]
    run_sink(aim_repo, [batch, batch, batch[1:]])
    view = read_repo(str(aim_repo))["job-auto"]
    assert view.series("tokens_seen", subset="additional_metrics", rank=0) == {0: 0.0, 1: 1.0, 2: 2.0}


def test_two_runs_at_once_stay_apart(aim_repo: Path) -> None:
    a = training_events("job-a", experiment="exp-a")
    b = training_events("job-b", experiment="exp-b", steps=4)
    mixed = [e for pair in zip(a, b, strict=False) for e in pair] + a[len(b):]
    run_sink(aim_repo, [mixed[i:i + 7] for i in range(0, len(mixed), 7)])
    runs = read_repo(str(aim_repo))
    assert sorted(runs) == ["job-a", "job-b"]
    check_training_run(runs["job-a"])
    check_training_run(runs["job-b"], steps=4)
    assert (runs["job-a"].experiment, runs["job-b"].experiment) == ("exp-a", "exp-b")


def test_experiment_option_applies_to_runs_that_name_none(aim_repo: Path) -> None:
    run_sink(aim_repo, [training_events("job-e")], experiment="from-option")
    assert read_repo(str(aim_repo))["job-e"].experiment == "from-option"


def test_gaps_are_filled_from_the_journal(tmp_path: Path, aim_repo: Path) -> None:
    """Batches the relay dropped for this sink (queue overflow during an outage) are still in the
    journal; the sink names the run with the hole in its seqs, and its process writes it them."""
    journal = tmp_path / "logs"
    journal.mkdir()
    events = training_events("job-gap", output_dir=str(tmp_path / "job"))
    write_journal(journal / "job-gap.jsonl", events)
    delivered = events[:10] + events[25:]  # events 10..24 never reached the sink
    sink = run_sink(aim_repo, [delivered], journal=journal)
    # the run read back once (all of it), and each of the 15 it lacked applied once
    assert (sink.counters["events"], sink.counters["duplicates"]) == (len(events), len(events) - 15)
    assert not sink.holes([])
    check_training_run(read_repo(str(aim_repo))["job-gap"])


def test_export_goes_next_to_the_journal_without_output_dir(tmp_path: Path, aim_repo: Path) -> None:
    journal = tmp_path / "logs"
    journal.mkdir()
    run_sink(aim_repo, [training_events("job-x")], journal=journal)
    export = json.loads((journal / "job-x.aim_tracker.json").read_text())
    assert export["run_hash"] == read_repo(str(aim_repo))["job-x"].hash
    single = tmp_path / "one" / "training_logs.jsonl"
    single.parent.mkdir()
    single.touch()
    run_sink(tmp_path / "aim2", [training_events("job-y")], journal=single)
    assert json.loads((single.parent / "aim_tracker.json").read_text())["run_id"] == "job-y"


def test_a_restarted_relay_resumes_the_same_aim_run(aim_repo: Path) -> None:
    events = training_events("job-r", end=False)
    run_sink(aim_repo, [events[:15]])
    more = run_sink(aim_repo, [events[10:]])
    assert more.counters["runs_opened"] == 1 and more.counters["duplicates"] == 5
    run_sink(aim_repo, [events[:5]])  # older events only (a partial replay): the end stays
    runs = read_repo(str(aim_repo))
    assert list(runs) == ["job-r"]
    check_training_run(runs["job-r"])
    assert runs["job-r"].creation_time == pytest.approx(events[0]["ts"], abs=1e-3)
    assert runs["job-r"].end_time == pytest.approx(events[-1]["ts"], abs=1e-3)


def test_seq_spans() -> None:
    spans = SeqSpans()
    assert spans.add(0) is False and spans.add(1) is False
    assert spans.add(5) is True  # a hole: 2..4
    assert spans.spans == [[0, 2], [5, 6]] and spans.holes
    for seq in (3, 2, 4):
        assert spans.add(seq) is False
    assert spans.spans == [[0, 6]] and not spans.holes
    assert 5 in spans and 6 not in spans and -1 not in spans
    late = SeqSpans()
    assert late.add(7) is True and late.holes


def test_config_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="--repo"):
        AimSink()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SinkError, match="not usable"):
        AimSink(repo=str(blocker / "aim")).open(SinkContext())
    with pytest.raises(SinkError, match="aim://HOST:PORT"):
        AimSink(repo="aim://nohost").open(SinkContext())


def test_missing_aim_says_how_to_install(tmp_path: Path) -> None:
    # The relay (and the Aim sink's own process) where `import aim` fails, as without the [aim] extra.
    shadow = tmp_path / "no-aim" / "aim"
    shadow.mkdir(parents=True)
    (shadow.parent / "sitecustomize.py").write_text("import sys\nsys.modules['aim'] = None\n")  # not installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "relay", "--bind", "tcp://127.0.0.1:0", "--sink", "aim",
                          "--repo", str(tmp_path / "aim")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "pip install './[aim]' in the metrics-relay checkout" in out.stderr, out.stderr[-2000:]


def test_a_run_gone_quiet_is_closed_and_reopened_by_a_late_event(aim_repo: Path) -> None:
    events = training_events("job-quiet", end=False)
    sink = AimSink(repo=str(aim_repo))
    sink.open(SinkContext())
    sink.idle_close_s = 0.0  # every run is idle by the end of a batch
    try:
        sink.write(events[:10])
        assert sink.counters["runs_closed"] == 1
        sink.write(events[10:])
        assert sink.counters["runs_opened"] == 1 and sink.counters["runs_closed"] == 2
    finally:
        sink.close()
    view = read_repo(str(aim_repo))["job-quiet"]
    assert not view.active and view.end_time == pytest.approx(events[-1]["ts"], abs=1e-3)  # not when closed
    check_training_run(view)


def test_works_without_pkg_resources(aim_repo: Path) -> None:
    """setuptools >= 81 ships no pkg_resources, which Aim's default run setup imports."""
    probe = subprocess.run([sys.executable, "-c", "import pkg_resources"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("this environment still has pkg_resources")
    run_sink(aim_repo, [training_events("job-p")])
    assert "job-p" in read_repo(str(aim_repo))


def test_full_disk_mid_run_then_recovery(small_fs: Path, tmp_path: Path) -> None:
    """The repo becomes unwritable (no space left) mid-run: writes fail and are retried like the
    relay does, and once space is back the Aim run is complete, with nothing doubled."""
    repo = small_fs / "aim"
    events = training_events("job-full", steps=40)
    sink = AimSink(repo=str(repo))
    sink.open(SinkContext())
    sink.write(events[:30])
    filler = small_fs / "filler"
    fill(filler)
    failures = 0
    for _ in range(3):
        try:
            sink.write(events[30:])
            break
        except Exception:
            failures += 1
    assert failures == 3
    filler.unlink()
    sink.write(events[30:])  # the relay's retry, once the repo is writable again
    sink.flush()
    sink.close()
    del sink  # with it the handles dropped after the failure, before the filesystem goes
    check_training_run(read_repo(str(repo))["job-full"], steps=40)


def relay_event(ev: Events, type_: str, data: dict, step: int | None = None) -> dict:
    """An event as the relay derives it: rank RELAY_RANK, local rank 0, stage "cluster"."""
    event = ev(RELAY_RANK, type_, data, step=step, stage="cluster")
    event["local_rank"] = 0
    return event


def test_per_rank_series_never_share_a_name_with_the_trainers(aim_repo: Path) -> None:
    """Each rank's samples/s is not drawn in the chart of the Trainer's eval samples_per_second
    (it flattened it): per-rank figures have names of their own, the context keeps the rank."""
    ev = Events("job-names")
    batch = [ev(0, "metrics", {"loss": 1.0, "samples_per_second": 900.0}, step=5, stage="eval")]
    batch += [ev(rank, "metrics", {"step_time": 0.1 + rank, "step_time_max": 0.2 + rank, "samples_per_second": 40.0,
                                   "steps": 5, "rss_peak_mb": 500.0, "cuda_peak_allocated_mb": 100.0},
                 step=5, stage="rank") for rank in (0, 1)]
    run_sink(aim_repo, [batch])
    view = read_repo(str(aim_repo))["job-names"]
    eval_only = [("samples_per_second", (("subset", "eval"),))]
    assert [key for key in view.metrics if key[0] == "samples_per_second"] == eval_only
    assert view.series("samples_per_second", subset="eval") == {5: 900.0}
    for rank in (0, 1):
        assert view.series("__system__rank_samples_per_s", rank=rank) == {5: 40.0}
        assert view.series("__system__rank_step_time_s", rank=rank) == {5: 0.1 + rank}
        assert view.series("__system__rank_step_time_max_s", rank=rank) == {5: 0.2 + rank}
        assert view.series("__system__rank_steps_per_log", rank=rank) == {5: 5}
        assert view.series("__system__rank_rss_peak_mb", rank=rank) == {5: 500.0}
        assert view.series("__system__rank_cuda_peak_allocated_mb", rank=rank) == {5: 100.0}
    assert {name for name, _ in view.metrics} == {"loss", "samples_per_second"} | {  # Aim's system-metric names
        "__system__" + name for name in ("rank_samples_per_s", "rank_step_time_s", "rank_step_time_max_s",
                                         "rank_steps_per_log", "rank_rss_peak_mb", "rank_cuda_peak_allocated_mb")}


def test_relay_derived_figures_are_run_level_series_and_no_finding_hides_another(aim_repo: Path) -> None:
    ev = Events("job-cluster", world_size=3)
    batch = [ev(rank, "metrics", {"step_time": 0.1}, step=1, stage="rank") for rank in range(3)]
    batch += [relay_event(ev, "metrics", {"step_time_min": 0.1, "step_time_median": 0.11, "step_time_max": 0.3 + step,
                                          "step_time_spread": 2.7, "slowest_rank": 2, "ranks": 3}, step)
              for step in (1, 2, 3)]
    straggler = {"event": "straggler", "step_time": 0.31, "median": 0.11, "ratio": 2.8, "steps": 3}
    batch += [relay_event(ev, "lifecycle", {**straggler, "rank": r}, step) for r, step in ((2, 3), (2, 4), (1, 4))]
    batch += [relay_event(ev, "lifecycle", {"event": "rank_lost", "rank": 1, "silent_s": 30.0, "last_step": 4}),
              relay_event(ev, "lifecycle", {"event": "rank_back", "rank": 1, "silent_s": 42.0}),
              relay_event(ev, "lifecycle", {"event": "rank_lost", "rank": 2, "silent_s": 30.0, "last_step": 5}),
              relay_event(ev, "lifecycle", {"event": "straggler_cleared", "rank": 2, "why": "recovered",
                                            "named_step": 3, "by": "own_time", "ratio": 1.1, "steps": 3}, 7)]
    run_sink(aim_repo, [batch[:5], batch[5:]])
    view = read_repo(str(aim_repo))["job-cluster"]
    assert view.series("__system__cluster_step_time_max_s") == {1: 1.3, 2: 2.3, 3: 3.3}  # context {}: one series per run
    for name, value in (("cluster_step_time_min_s", 0.1), ("cluster_step_time_median_s", 0.11),
                        ("cluster_step_time_spread", 2.7), ("cluster_slowest_rank", 2), ("cluster_ranks_reporting", 3)):
        assert view.series("__system__" + name) == {1: value, 2: value, 3: value}, name
    assert {dict(context).get("rank") for _, context in view.metrics} == {None, 0, 1, 2}  # RELAY_RANK is no rank
    found = view.params["relay"]["cluster"]
    assert {key: r["ratio"] for key, r in found["straggler"].items()} == {
        "rank2_step3": 2.8, "rank2_step4": 2.8, "rank1_step4": 2.8}
    assert {key: r["silent_s"] for key, r in found["rank_lost"].items()} == {"rank1_step4": 30.0, "rank2_step5": 30.0}
    assert [r["rank"] for r in found["rank_back"].values()] == [1]
    assert {key: (r["named_step"], r["why"]) for key, r in found["straggler_cleared"].items()} == {
        "rank2_step7": (3, "recovered")}  # the episode's end, beside its start
    assert "straggler" not in view.params["relay"].get("lifecycle", {})


def test_client_counters_are_params_and_only_drops_are_drawn(aim_repo: Path) -> None:
    ev = Events("job-drops")
    counters = {"dropped": 0, "dropped_full": 0, "dropped_upto": -1, "published": 10, "resent": 0}
    batch = [ev(0, "metrics", {"loss": 1.0}, step=1, stage="train"), ev(1, "stats", counters, stage="client")]
    later = [ev(0, "stats", {**counters, "dropped": 3, "dropped_full": 3, "published": 20}, stage="client"),
             ev(0, "stats", {**counters, "dropped": 7, "dropped_full": 7, "published": 40}, stage="client")]
    run_sink(aim_repo, [batch, later])
    view = read_repo(str(aim_repo))["job-drops"]
    assert {name for name, _ in view.metrics} == {"loss", "__system__relay_dropped"}
    assert view.series("__system__relay_dropped", rank=0) == {later[0]["seq"]: 3, later[1]["seq"]: 7}  # stepped by seq
    assert ("__system__relay_dropped", (("rank", 1),)) not in view.metrics  # rank 1 dropped nothing
    assert view.params["relay"]["client"] == {"rank0": {**counters, "dropped": 7, "dropped_full": 7, "published": 40},
                                              "rank1": counters}
