"""Same names and points as Hugging Face's own callbacks: one real two-rank job runs transformers'
``MLflowCallback``, ``TensorBoardCallback`` and ``WandbCallback`` beside the relay's mlflow, tensorboard
and wandb sinks (tests/hf_callbacks_job.py), and the stores are read back through their own libraries (the job
is trainer_fixtures.tracked_job, which tests/test_trainer_torchrun.py and tests/test_aim_torchrun.py read too). What the
relay adds (its system figures, custom metrics, run metadata) is named and listed; every
remaining difference is in docs/sinks/mlflow.md, docs/sinks/tensorboard.md and docs/sinks/wandb.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_fixtures import EXP_METADATA, demo_model, tracked_job

pytestmark = pytest.mark.slow
__all__ = ["demo_model", "tracked_job"]  # fixtures, used by name

#: What the relay adds beside the Trainer's series: its system figures, and fms-hf-tuning's custom metrics.
RELAY_SERIES = ("workers/", "additional_metrics.", "model_load_time", "train/model_load_time")
#: Param groups the relay adds beside HF's (TrainingArguments and the model config, under their bare names),
#: each listed in docs/sinks/mlflow.md: the job's identity, the relay's records (ranks, attempts, checkpoints,
#: lifecycle, client counters), library versions, the PEFT config, W&B's num_parameters, and what the job's
#: collective timing measures (rank 0's ``own_work``); --exp_metadata's keys are bare, as fms-hf-tuning logs them.
RELAY_PARAM_GROUPS = {"run", "relay", "versions", "peft", "model_info", "own_work"}


@pytest.fixture
def job(tracked_job: dict) -> Path:
    """The shared job's folder (trainer_fixtures.tracked_job: the relay's sinks and HF's callbacks in one job)."""
    assert tracked_job["returncode"] == 0, tracked_job["stderr"]
    return tracked_job["out"]


def _mlflow_run(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    history = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
               for key in run.data.metrics}
    return run, history


def test_mlflow_names_points_params_and_run_name_equal_hf(job: Path) -> None:
    hf, hf_history = _mlflow_run(f"sqlite:///{job / 'hf.db'}", "hf")
    relay, relay_history = _mlflow_run(f"sqlite:///{job / 'relay.db'}", "relay")
    assert relay.info.run_name == hf.info.run_name == "j1single"
    trainer = {key: points for key, points in relay_history.items() if not key.startswith(RELAY_SERIES)}
    assert sorted(trainer) == sorted(hf_history)
    assert {"loss", "eval_loss", "epoch", "grad_norm", "learning_rate", "train_runtime"} <= set(trainer)
    assert trainer == hf_history  # every (step, value), epoch's eval-time points included
    assert any(key.startswith("workers/rank_step_time_s/rank_1") for key in relay_history)
    params, hf_params = relay.data.params, hf.data.params
    assert {key: params.get(key) for key in hf_params} == hf_params  # id2label's int keys too
    extra = [key for key in params if key not in hf_params]
    assert {key.split(".")[0] for key in extra if "." in key} == RELAY_PARAM_GROUPS, sorted(extra)
    assert {key for key in extra if "." not in key} == set(EXP_METADATA)
    assert {key: params[key] for key in EXP_METADATA} == EXP_METADATA
    for tag in ("mlflow.user", "mlflow.source.name", "mlflow.source.type"):
        assert relay.data.tags[tag] == hf.data.tags[tag], tag
    assert relay.info.status == hf.info.status == "FINISHED"


def _board(path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _text(acc, tag: str) -> str:
    from tensorboard.util import tensor_util

    (event,) = acc.Tensors(tag)
    return tensor_util.make_ndarray(event.tensor_proto).item().decode()


def test_tensorboard_tags_points_and_args_equal_hf(job: Path) -> None:
    hf = _board(job / "hf-runs")
    run_id = json.loads((job / "tracking_run.json").read_text())["run"]
    relay = _board(job / "relay-runs" / run_id)
    trainer = [tag for tag in relay.Tags()["scalars"] if not tag.startswith(RELAY_SERIES)]
    assert sorted(trainer) == sorted(hf.Tags()["scalars"])
    assert {"train/loss", "eval/loss", "train/epoch", "train/train_runtime"} <= set(trainer)
    for tag in trainer:
        assert [(e.step, e.value) for e in relay.Scalars(tag)] == [(e.step, e.value) for e in hf.Scalars(tag)], tag
    assert _text(relay, "args/text_summary") == _text(hf, "args/text_summary")
    hf_config = json.loads(_text(hf, "model_config/text_summary"))
    relay_config = json.loads(_text(relay, "model_config/text_summary"))
    # HF writes the config's diff from PretrainedConfig's defaults; the relay gets the full config
    # (what HF's MLflowCallback logs as params), so it holds HF's keys plus those defaults.
    assert {key: relay_config[key] for key in hf_config} == hf_config


def test_tensorboard_opens_on_the_trainers_groups_as_hf(job: Path) -> None:
    """TensorBoard lists a run's groups (a tag's first part) by name and opens the first two: the
    relay's own figures and custom metrics never come before the Trainer's eval and train."""
    hf = _board(job / "hf-runs")
    run_id = json.loads((job / "tracking_run.json").read_text())["run"]
    relay = _board(job / "relay-runs" / run_id)

    def groups(acc) -> list[str]:
        return sorted({tag.split("/")[0] for tag in acc.Tags()["scalars"]})

    assert groups(hf) == ["eval", "train"]
    assert groups(relay) == ["eval", "train", "workers"]
    assert "train/model_load_time" in relay.Tags()["scalars"]  # a custom metric as the Trainer would log it


def test_wandb_run_name_config_and_history_rows_as_hf(job: Path) -> None:
    from sink_readback import read_wandb

    (hf,) = read_wandb(job / "hf-wandb").values()
    (relay,) = read_wandb(job / "wandb-relay").values()
    assert relay.name == hf.name == "j1single"
    for key in ("model/num_parameters", "peft_config", "learning_rate", "vocab_size", "hidden_size", "model_type"):
        assert key in hf.config and key in relay.config, key  # at the top, as HF's
    assert relay.config["model/num_parameters"] == hf.config["model/num_parameters"]
    same = {key: value for key, value in hf.config.items() if key != "peft_config"}
    assert {key: relay.config.get(key) for key in same} == same  # every value HF sets, equal
    hf_peft = {k: v for k, v in hf.config["peft_config"]["default"].items() if k != "runtime_config"}
    relay_peft = dict(relay.config["peft_config"]["default"])
    # PEFT holds target_modules as a set: each process lists it in its own string-hash order
    hf_peft["target_modules"], relay_peft["target_modules"] = (sorted(p["target_modules"]) for p in (hf_peft, relay_peft))
    assert relay_peft == hf_peft  # PeftConfig.to_dict() leaves its runtime_config out
    hf_keys = {key for row in hf.rows for key in row if not key.startswith("_")}
    relay_keys = {key for row in relay.rows for key in row if not key.startswith("_")}
    assert relay_keys == hf_keys, "the relay's figures and model_load_time are out of the history"
    assert len(relay.rows) == len(hf.rows), "one row per Trainer log, as HF's, none more"
    assert relay.summary["model_load_time"] > 0  # track() before training: a scalar of the run
    assert all("train/global_step" in row for row in relay.rows)
    assert relay.series["train/loss"] == hf.series["train/loss"]
    assert {key for key in relay.system if key.startswith("rank.1.")} >= {"rank.1.step_time_s", "rank.1.cpu_percent"}
