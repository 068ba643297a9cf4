"""The real two-rank torchrun training (CPU, gloo) on the demo model with `--tracker aim`: the
embedded relay's Aim sink, read back through Aim's own API."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("aim")

from sink_readback import read_repo
from trainer_fixtures import EXP_METADATA, demo_model, tracked_job

pytestmark = pytest.mark.slow
__all__ = ["demo_model", "tracked_job"]  # fixtures, used by name

STEPS = 6


def test_torchrun_with_tracker_aim(tracked_job: dict) -> None:
    """The shared job (trainer_fixtures.tracked_job): tests/test_trainer_torchrun.py reads its journal."""
    out, repo = tracked_job["out"], tracked_job["aim"]
    assert tracked_job["returncode"] == 0, tracked_job["stderr"]
    run_id = json.loads((out / "tracking_run.json").read_text())["run"]
    runs = read_repo(str(repo))
    assert list(runs) == [run_id]
    view = runs[run_id]
    assert view.experiment == "sft-demo" and not view.active
    assert view.params["experiment_metadata"] == EXP_METADATA
    assert view.params["hparams"]["output_dir"] == str(out)
    assert "model_type" in view.params["model"]
    assert sorted(view.series("loss")) == list(range(1, STEPS + 1))  # once per logged step
    assert sorted(view.series("loss", subset="eval")) == [3, 6]
    assert list(view.series("model_load_time", subset="additional_metrics", rank=0).values())[0] > 0
    for rank in (0, 1):
        assert sorted(view.series("__system__rank_step_time_s", rank=rank)) == list(range(1, STEPS + 1))
    assert json.loads((out / "aim_tracker.json").read_text())["run_hash"] == view.hash
