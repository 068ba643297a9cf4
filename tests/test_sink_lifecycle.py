"""One open and one close per run per relay lifetime, in every tracker sink: the late events of a
finished job (each client's closing counters, after rank 0's train_end) reach the run while it is
still open, so nothing is reopened and closed again (the Aim run, ClearML's "Offline session
stored" zip). Real stores, read through the sinks' own counters."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sink_helpers import training_events
from sinks.base import SinkContext


def _aim(tmp: Path) -> Any:
    from sinks.aim import AimSink

    return AimSink(repo=str(tmp / "aim"))


def _mlflow(tmp: Path) -> Any:
    from sinks.mlflow import MlflowSink

    return MlflowSink(mlflow_tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")


def _tensorboard(tmp: Path) -> Any:
    from sinks.tensorboard import TensorBoardSink

    return TensorBoardSink(logdir=str(tmp / "runs"))


def _wandb(tmp: Path) -> Any:
    from sinks.wandb import WandbSink

    return WandbSink(wandb_project="lifecycle", wandb_dir=str(tmp))


def _clearml(tmp: Path) -> Any:
    from sinks.clearml import ClearmlSink

    return ClearmlSink(clearml_project="lifecycle", clearml_dir=str(tmp / "clearml"))


#: Per sink: how it is made, and its counters for one run opened and closed once.
CASES: dict[str, tuple[Callable[[Path], Any], dict[str, int]]] = {
    "aim": (_aim, {"runs_created": 1, "runs_opened": 0, "runs_closed": 1}),
    "mlflow": (_mlflow, {"runs_created": 1, "runs_resumed": 0}),
    "tensorboard": (_tensorboard, {"runs_created": 1, "runs_resumed": 0, "files_created": 1}),
    "wandb": (_wandb, {"wandb_runs_opened": 1, "wandb_runs_finished": 1}),
    "clearml": (_clearml, {"runs_created": 1, "runs_resumed": 0, "tasks_closed": 1}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_open_and_one_close_per_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml-default"))
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    make, expected = CASES[name]
    events = training_events(f"job-{name}")
    end = next(i for i, e in enumerate(events) if e["data"].get("event") == "train_end")
    sink = make(tmp_path)
    sink.open(SinkContext(journal=tmp_path / "journal.jsonl"))
    try:
        sink.write(events[:end + 1])  # up to rank 0's train_end
        sink.flush()
        for late in events[end + 1:]:  # each client's closing counters, one batch each, as they come
            sink.write([late])
            sink.flush()
        if name in ("aim", "clearml"):  # settled: closed now, not at shutdown
            closed = "runs_closed" if name == "aim" else "tasks_closed"
            assert sink.counters[closed] == 1, dict(sink.counters)
    finally:
        sink.close()
    assert {key: sink.counters[key] for key in expected} == expected, dict(sink.counters)
