"""The --tracker flags as the embedded relay's sink options. The two-rank torchrun job with every
tracker at once, read back through each tracker's own library, is tests/test_resume.py's (a job
killed after a checkpoint and resumed)."""
from __future__ import annotations

from trainer.tracker_flags import TrackingArguments, sink_args


def test_tracker_flags_become_sink_options() -> None:
    args = sink_args(["jsonl", "mlflow", "wandb"], TrackingArguments(experiment="sft", wandb_entity="team"), "/o")
    assert args == ["--sink", "mlflow", "--mlflow-tracking-uri", "sqlite:////o/mlflow.db", "--mlflow-experiment", "sft",
                    "--sink", "wandb", "--wandb-project", "fms-hf-tuning", "--wandb-mode", "offline",
                    "--wandb-dir", "/o/wandb-relay", "--wandb-entity", "team"]
