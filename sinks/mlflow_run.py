"""What the MLflow sink keeps of one training run between saves (sinks/mlflow.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MlRun:
    """One training run's MLflow side: its run, the params it holds, and what awaits the next
    save."""

    first_ts: float
    run_id: str | None = None
    # the run's name in MLflow: the job's --run_name once known, else the relay run id
    name: str = ""
    experiment_id: str = ""
    params: dict[str, str] = field(default_factory=dict)  # as the MLflow run holds them
    # pending until the next save, as are the next four
    metrics: list[Any] = field(default_factory=list)
    new_params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    end: str | None = None  # the MLflow status rank 0's train_end asks for
    end_ts: float | None = None
    output_dir: str | None = None
    output_from_run: bool = False  # the `run` group's absolute output_dir beats hparams' own
    suspect: bool = False  # a save failed: a directory store may hold part of it already

    def attach(self, run_id: str, experiment_id: str, name: str, params: dict[str, str],
               made: bool = False) -> None:
        """The MLflow run this training run's events go to, found again or ``made`` now (which
        holds nothing yet, so none of it is suspect)."""
        self.run_id, self.experiment_id = run_id, experiment_id
        self.name, self.params = name, params
        if made:
            self.suspect = False

    def rename(self, name: str) -> None:
        """The job's own run name (its ``run`` params'), which MLflow shows."""
        self.name = name

    def export_to(self, output_dir: str, from_run: bool) -> bool:
        """The job's output dir, from the ``run`` params (``from_run``, which win) or hparams';
        False if ``run``'s had said it already."""
        if self.output_from_run and not from_run:
            return False
        self.output_dir, self.output_from_run = output_dir, from_run
        return True

    def ends(self, status: str) -> None:
        """Rank 0's train_end asks for this MLflow status."""
        self.end = status

    def ended_at(self, ts: Any) -> None:
        """When the job ended, as the relay's lifecycle params say."""
        self.end_ts = ts

    def save_failed(self, partial: bool) -> None:
        """A save failed (or its spans are unreadable): with ``partial`` (a directory store) the
        MLflow run may hold part of it already, so the next save repairs first."""
        self.suspect = partial

    def holds(self, params: dict[str, str]) -> None:
        """The params the MLflow run holds, read back from it."""
        self.params = params

    def saved(self) -> None:
        """A save went in whole: its params are held, nothing waits, nothing is suspect."""
        self.params.update(self.new_params)
        self.discard()
        self.suspect = False

    def discard(self) -> None:
        self.metrics, self.new_params, self.tags, self.artifacts, self.end = [], {}, {}, {}, None
