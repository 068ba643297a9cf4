"""One training run's ClearML task, as the ClearML sink (sinks/clearml.py) keeps it: the session it
saves and resumes, and ClearML's ``Task`` with its offline ``task.json`` written whole."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinks.files import write_atomic


@dataclass
class Session:
    """One run's ClearML task; survives its handle being closed (the zip is written on close)."""

    task_id: str
    handle: Any = None  # clearml.Task while open
    metrics_bytes: int = 0  # size of metrics.jsonl that the saved spans account for
    pending: list = field(default_factory=list)  # ScalarEvents not written yet
    ended: bool = False  # rank 0 said train_end: close (write the zip) once the run is settled
    single_ts: dict[str, float] = field(default_factory=dict)  # newest ts per single value


def whole_task_json(task_cls: Any) -> Any:
    """ClearML's Task, its offline ``task.json`` written whole (beside it, then renamed over it).
    ClearML truncates the file and writes it in place, and reads one it cannot parse back as an
    empty task: a sink killed mid-write (a relay SIGKILL) resumed a task without its parameters, and
    the spans it had saved kept them from being written again."""

    class WholeTaskJson(task_cls):
        def _save_data_to_offline_dir(self, **kwargs: Any) -> None:
            for key, value in kwargs.items():
                setattr(self.data, key, value)
            folder = self.get_offline_mode_folder()
            if not folder:
                return
            Path(folder).mkdir(parents=True, exist_ok=True)
            export = self.data.to_dict()
            export.update(project_name=self.get_project_name(), offline_folder=folder.as_posix(),
                          offline_output_models=self._offline_output_models)
            write_atomic(Path(folder) / self._offline_filename,
                         json.dumps(export, ensure_ascii=True, sort_keys=True))

    return WholeTaskJson
