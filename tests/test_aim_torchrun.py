"""The real two-rank torchrun training (CPU, gloo) on the demo model with `--tracker aim`: the
embedded relay's Aim sink, read back through Aim's own API."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("aim")

from sink_readback import read_repo
from trainer_fixtures import EXP_METADATA, aim_job, demo_model

pytestmark = pytest.mark.slow
__all__ = ["aim_job", "demo_model"]  # fixtures, used by name

STEPS = 6


def test_torchrun_with_tracker_aim(aim_job: dict) -> None:
    """The job tests/test_trainer_torchrun.py reads the journal of (trainer_fixtures.aim_job)."""
    out, repo = aim_job["out"], aim_job["aim"]
    assert aim_job["returncode"] == 0, aim_job["stderr"]
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
