"""Helpers for the trainer tests: the demo model, real trainer processes and JSONL content checks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import free_port, once_per_run
from relay.wire.address import ADDRESS_ENV
from sinks.events import RELAY_RANK

ROOT = Path(__file__).resolve().parent.parent
DEMO_DATA = ROOT / "trainer" / "data" / "demo_instructions.jsonl"
EXP_METADATA = {"dataset": "demo-v1", "purpose": "trainer tests"}
HF_CALLBACKS_JOB = Path(__file__).resolve().parent / "hf_callbacks_job.py"


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline demo model and tokenizer, built once per test run (tens of seconds under load),
    shared by every module that imports this fixture and every pytest-xdist worker."""
    from trainer.demo import build_demo

    with once_per_run(tmp_path_factory, "demo-model") as folder:
        return Path(build_demo(str(folder)))


@pytest.fixture(scope="session")
def tracked_job(demo_model: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict:
    """One real two-rank job, launched warm (tests/warm_ranks.py), 6 steps with an eval every 3, run once per test run for every
    test that reads it: its embedded relay writes the journal and four trackers' stores
    (``--tracker aim,mlflow,tensorboard,wandb``, ``--run_name j1single``), with transformers' own
    ``MLflowCallback``, ``TensorBoardCallback`` and ``WandbCallback`` beside them (tests/hf_callbacks_job.py:
    ``trainer.sft.main`` as ``python -m trainer`` runs it, plus those callbacks). The journal and the run
    id are read in tests/test_trainer_torchrun.py, the Aim repository in tests/test_aim_torchrun.py, the
    relay's stores against HF's in tests/test_hf_fidelity.py: they share one. Its folder
    ``out`` (HF's stores in it: ``hf.db``, ``hf-runs``, ``hf-wandb``; the relay's: ``relay.db``,
    ``relay-runs``, ``wandb-relay``) and ``aim``, and how it ended (``returncode``, ``stderr``, the
    ``orphans`` of it still running once it returned)."""
    import psutil

    with once_per_run(tmp_path_factory, "tracked-job") as folder:
        result = folder / "result.json"
        if not result.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed run on another worker left
            out = folder / "out"
            (out / "hf-wandb").mkdir(parents=True)
            cmd = launch_flags(free_port())[:-2] + [str(HF_CALLBACKS_JOB)] + seed_flags(demo_model, out, steps=6,
                                                                                       eval_steps=3)
            cmd += ["--run_name", "j1single", "--tracker", "aim,mlflow,tensorboard,wandb", "--aim_repo",
                    str(folder / "aim"), "--experiment", "sft-demo", "--mlflow_tracking_uri",
                    f"sqlite:///{out / 'relay.db'}", "--mlflow_experiment", "relay", "--tensorboard_logdir",
                    str(out / "relay-runs")]
            env = trainer_env(MLFLOW_TRACKING_URI=f"sqlite:///{out / 'hf.db'}", MLFLOW_EXPERIMENT_NAME="hf",
                              TENSORBOARD_LOGGING_DIR=str(out / "hf-runs"), MLFLOW_DISABLE_TELEMETRY="true",
                              WANDB_MODE="offline", WANDB_DIR=str(out / "hf-wandb"), WANDB_PROJECT="hf",
                              WANDB_SILENT="true")
            done = request.getfixturevalue("warm_launcher").run(cmd, env, timeout=600)
            orphans = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])
                       if str(out) in " ".join(p.info["cmdline"] or [])]
            result.write_text(json.dumps({"returncode": done.returncode, "stderr": done.stderr[-3000:],
                                          "orphans": orphans}))
        return {"out": folder / "out", "aim": folder / "aim", **json.loads(result.read_text())}


def trainer_env(**extra: str) -> dict[str, str]:
    """No network, no stray relay address, one thread per rank (two cores), stdout line by line."""
    env = {k: v for k, v in os.environ.items() if k not in (ADDRESS_ENV, "TORCHELASTIC_RUN_ID")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def seed_flags(model: Path, output_dir: Path, *, steps: int = 6, eval_steps: int | None = 3) -> list[str]:
    """The seed PR's command line on the demo model, minus --fsdp (needs GPUs), kept tiny."""
    flags = [
        "--tokenizer_name_or_path", str(model), "--model_name_or_path", str(model),
        "--data_path", str(DEMO_DATA), "--use_peft", "--bf16", "True", "--output_dir", str(output_dir),
        "--num_train_epochs", "1", "--max_steps", str(steps), "--per_device_train_batch_size", "1",
        "--per_device_eval_batch_size", "1", "--gradient_accumulation_steps", "2",
        "--save_strategy", "steps", "--save_steps", "2000", "--save_total_limit", "1",
        "--learning_rate", "2e-5", "--weight_decay", "0.", "--warmup_ratio", "0.03",
        "--lr_scheduler_type", "cosine", "--logging_steps", "1",
        "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--max_seq_length", "64", "--exp_metadata", json.dumps(EXP_METADATA),
        "--ddp_find_unused_parameters", "False", "--activation_checkpointing", "False",
    ]
    if eval_steps:
        flags += ["--evaluation_strategy", "steps", "--eval_steps", str(eval_steps), "--validation_split", "0.02"]
    else:
        flags += ["--evaluation_strategy", "no"]
    return flags


def launch_flags(master_port: int) -> list[str]:
    """torchrun's flags for a two-rank job of ``-m trainer`` (the last two: replace them with a script)."""
    return ["--nnodes=1", "--nproc_per_node=2", f"--master_port={master_port}", "-m", "trainer"]


def torchrun(master_port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launch_flags(master_port)]


def start_trainer(cmd: list[str], stderr_path: Path, **env: str) -> subprocess.Popen[str]:
    """A trainer whose stdout the test reads line by line; stderr goes to a file so it cannot block."""
    with open(stderr_path, "w") as err:
        return subprocess.Popen(cmd, cwd=ROOT, env=trainer_env(**env), stdout=subprocess.PIPE, stderr=err,
                                text=True)


def run_trainer(cmd: list[str], timeout: float = 540, **env: str) -> subprocess.CompletedProcess[str]:
    """A trainer run to its end. ``timeout`` is a wait, not a limit under test (pytest-timeout's 600 s
    is): on a machine at load 20-50 even a trainer that stops at its flags took over 120 s to import."""
    return subprocess.run(cmd, cwd=ROOT, env=trainer_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def assert_complete(events: list[dict], *, world_size: int, steps: int, eval_steps: int | None) -> str:
    """Every expected event exactly once, from the right rank, one run id, no gap in any rank's seq,
    and the relay's own summary of every logged step across the ranks (relay/daemon/cross_rank.py).

    Returns the run id.
    """
    derived = [e for e in events if e["rank"] == RELAY_RANK]
    events = [e for e in events if e["rank"] != RELAY_RANK]
    summed = [e["step"] for e in derived if e["type"] == "metrics"]
    assert summed == (list(range(1, steps + 1)) if world_size > 1 else []), summed
    assert all(e["stage"] == "cluster" and e["run"] == events[0]["run"] for e in derived)
    lost = [e for e in derived if e["type"] == "lifecycle" and e["data"]["event"] == "rank_lost"]
    assert lost == [], "a job that completed lost no rank, whichever rank's train_end came first"
    runs = {e["run"] for e in events}
    assert len(runs) == 1, runs
    for rank in range(world_size):
        seqs = sorted(e["seq"] for e in events if e["rank"] == rank)
        assert seqs == list(range(len(seqs))), f"rank {rank} seqs have gaps or duplicates: {seqs}"
    assert {e["world_size"] for e in events} == {world_size}

    def keys(**match: object) -> Counter:
        return Counter((e["rank"], e["step"]) for e in events
                       if all(e[k] == v for k, v in match.items()))

    params = Counter(e["stage"] for e in events if e["type"] == "params")
    own_work = ["own_work"] if world_size > 1 else []  # what the job times (trainer/collectives.py)
    assert params == Counter(["run", "experiment_metadata", "hparams", "model", "peft", "model_info", "versions", *own_work]), params
    run_params = next(e for e in events if e["stage"] == "run")["data"]
    assert run_params["run_id"] == next(iter(runs)) and run_params["world_size"] == world_size
    meta = next(e for e in events if e["stage"] == "experiment_metadata")
    assert meta["rank"] == 0 and meta["data"] == EXP_METADATA
    hparams = next(e for e in events if e["stage"] == "hparams")
    assert hparams["rank"] == 0 and hparams["data"]["max_steps"] == steps
    assert all(e["rank"] == 0 for e in events if e["type"] == "params")

    load = [e for e in events if e["type"] == "metrics" and "model_load_time" in e["data"]]
    assert len(load) == 1 and load[0]["rank"] == 0 and load[0]["data"]["model_load_time"] > 0

    train = [e for e in events if e["stage"] == "train" and "loss" in e["data"]]
    assert Counter((e["rank"], e["step"]) for e in train) == Counter((0, s) for s in range(1, steps + 1))
    summary = [e for e in events if e["stage"] == "train" and "train_runtime" in e["data"]]
    assert len(summary) == 1 and summary[0]["rank"] == 0

    per_rank = keys(type="metrics", stage="rank")
    assert per_rank == Counter((r, s) for r in range(world_size) for s in range(1, steps + 1)), per_rank
    for e in events:
        if e["stage"] == "rank":
            assert e["data"]["step_time"] > 0 and e["data"]["samples_per_second"] > 0
            assert e["data"]["rss_peak_mb"] > 0

    expected_eval = Counter((0, s) for s in range(eval_steps, steps + 1, eval_steps)) if eval_steps else Counter()
    assert keys(type="metrics", stage="eval") == expected_eval
    for e in events:
        if e["stage"] == "eval":
            assert "loss" in e["data"] and "eval_loss" not in e["data"]

    lifecycle = Counter((e["rank"], e["data"]["event"]) for e in events if e["type"] == "lifecycle")
    # --save_steps 2000 and a run this short: the Trainer saves once, at the last step.
    assert lifecycle == Counter([(0, "train_begin"), (0, "checkpoint"), (0, "train_end")]), lifecycle
    saved = next(e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "checkpoint")
    assert saved["step"] == steps and saved["data"]["path"].endswith(f"checkpoint-{steps}")
    end = next(e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end")
    assert end["data"]["status"] == "completed" and end["step"] == steps
    return runs.pop()
