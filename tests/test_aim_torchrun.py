"""The real two-rank torchrun training (CPU, gloo) on the demo model with `--tracker aim`: the
embedded relay's Aim sink, read back through Aim's own API."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("aim")

from sink_readback import read_repo  # noqa: E402
from conftest import free_port  # noqa: E402
from trainer_fixtures import EXP_METADATA, demo_model, run_trainer, seed_flags, torchrun  # noqa: E402

pytestmark = pytest.mark.slow
__all__ = ["demo_model"]  # a fixture, used by name

STEPS = 6


def test_torchrun_with_tracker_aim(demo_model: Path, tmp_path: Path) -> None:
    out, repo = tmp_path / "out", tmp_path / "aim"
    done = run_trainer(torchrun(free_port()) + seed_flags(demo_model, out, steps=STEPS, eval_steps=3)
                       + ["--tracker", "aim", "--aim_repo", str(repo), "--experiment", "sft-demo"])
    assert done.returncode == 0, done.stderr[-3000:]
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
