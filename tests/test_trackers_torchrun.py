"""One real two-rank torchrun job (CPU, gloo) on the demo model with every tracker at once: the
embedded relay runs all six sinks, each gets every event of the journal, and each store reads back
through its own library with the job's run and the Trainer's loss."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import free_port, read_jsonl
from trainer.tracker_flags import TrackingArguments, sink_args
from trainer_fixtures import demo_model, run_trainer, seed_flags, torchrun

pytestmark = pytest.mark.slow
__all__ = ["demo_model"]  # a fixture, used by name

STEPS = 4
SINKS = ("aim", "mlflow", "tensorboard", "wandb", "clearml")


def test_tracker_flags_become_sink_options() -> None:
    args = sink_args(["jsonl", "mlflow", "wandb"], TrackingArguments(experiment="sft", wandb_entity="team"), "/o")
    assert args == ["--sink", "mlflow", "--mlflow-tracking-uri", "sqlite:////o/mlflow.db", "--mlflow-experiment", "sft",
                    "--sink", "wandb", "--wandb-project", "fms-hf-tuning", "--wandb-mode", "offline",
                    "--wandb-dir", "/o/wandb-relay", "--wandb-entity", "team"]


def test_torchrun_with_every_tracker(demo_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_trainer(torchrun(free_port()) + seed_flags(demo_model, out, steps=STEPS, eval_steps=None)
                       + ["--tracker", ",".join(SINKS), "--experiment", "sft-all"], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = json.loads((out / "tracking_run.json").read_text())["run"]
    journal = read_jsonl(out / "training_logs.jsonl")
    stats = json.loads((out / "training_logs_stats.json").read_text())
    for name in SINKS:
        sink = stats["sinks"][name]
        assert sink["written"] == len(journal) and sink["dropped"] == 0 and sink["errors"] == 0, (name, sink)

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("sft-all").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == list(range(1, STEPS + 1))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "runs" / run_id))
    events.Reload()
    assert [s.step for s in events.Scalars("train/loss")] == list(range(1, STEPS + 1))

    from sink_readback import read_repo

    assert sorted(read_repo(str(out / "aim"))[run_id].series("loss")) == list(range(1, STEPS + 1))
    assert list((out / "wandb-relay").rglob("*.wandb")), "an offline W&B run"
    assert list((out / "clearml-relay").rglob("metrics.jsonl")), "an offline ClearML session"
