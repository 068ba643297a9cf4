"""What the MLflow sink keeps of one training run between saves (sinks/mlflow.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MlRun:
    """One training run's MLflow side: its run, the params it holds, and what awaits the next save."""

    first_ts: float
    run_id: str | None = None
    name: str = ""  # the run's name in MLflow: the job's --run_name once known, else the relay run id
    experiment_id: str = ""
    params: dict[str, str] = field(default_factory=dict)  # as the MLflow run holds them
    metrics: list[Any] = field(default_factory=list)  # pending until the next save, as are the next four
    new_params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    end: str | None = None  # the MLflow status rank 0's train_end asks for
    end_ts: float | None = None
    output_dir: str | None = None
    output_from_run: bool = False  # the `run` group's absolute output_dir beats hparams' own
    suspect: bool = False  # a save failed: a directory store may hold part of it already

    def discard(self) -> None:
        self.metrics, self.new_params, self.tags, self.artifacts, self.end = [], {}, {}, {}, None
