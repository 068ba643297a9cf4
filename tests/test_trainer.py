"""The trainer's single-process behaviour: bad input, the tracking API, run ids, the demo, train()."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from conftest import once_per_run, read_jsonl
from sink_readback import read_repo
from trainer import set_params, track
from trainer.embedded import default_run_id
from trainer_fixtures import (
    DEMO_DATA,
    ROOT,
    demo_model,
    error_lines,
    run_trainer,
    start_trainer,
    trainer_env,
)

__all__ = ["demo_model"]  # a fixture, used by name
TRAIN = [sys.executable, "-m", "trainer"]
CASES = Path(__file__).resolve().parent / "trainer_cases.py"


def on_demo(model: Path, output_dir: Path, *flags: str) -> list[str]:
    """``python -m trainer`` on the demo model and data, with ``flags``."""
    return TRAIN + ["--model_name_or_path", str(model), "--data_path", str(DEMO_DATA), "--dataset_text_field",
                    "output", "--output_dir", str(output_dir), *flags]


BAD_INPUT = [
    ("unknown-flag", ["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag 1"),
    ("bad-value", ["--num_train_epochs", "many"],
     "argument --num_train_epochs/--num-train-epochs: invalid float value: 'many'"),
    ("missing-data", ["--data_path", "{tmp}/missing.jsonl"], "--data_path: {tmp}/missing.jsonl does not exist"),
    ("missing-template", ["--response_template", "\\n### Answer:"],
     "response template '\\n### Answer:' not found in 268 record(s), first in record 1"),
    ("unknown-tracker", ["--tracker", "jsonl", "--tracker", "comet"],
     "--tracker: unknown tracker 'comet'; known trackers: jsonl, aim, mlflow, tensorboard, wandb, clearml, nats, none"),
    ("bad-wandb-mode", ["--tracker", "wandb", "--wandb_mode", "disabled"],
     "--wandb_mode: 'disabled' must be offline or online"),
    ("metadata-not-json", ["--exp_metadata", "[1, 2]"],
     "--exp_metadata: '[1, 2]' is neither a JSON object nor an existing file"),
    ("metadata-file-not-object", ["--exp_metadata", "{tmp}/meta.json"],
     "--exp_metadata file {tmp}/meta.json: must be a JSON object, got list"),
    ("missing-text-field", ["--dataset_text_field", "text"], "record 1 has no field 'text' (set --dataset_text_field)"),
    ("bad-run-name", ["--run_name", "no spaces/or slashes"], "--run_name: 'no spaces/or slashes' must match"),
    ("port-past-65535", ["--relay_address", "tcp://127.0.0.1:99999"],
     "--relay_address: address 'tcp://127.0.0.1:99999': port 99999 is past 65535"),
    ("relay-secret-too-short", ["--relay_address", "tcp://127.0.0.1:5557"],
     "--relay_address: $RELAY_SECRET holds 7 characters, fewer than 16"),
]
#: What a case has in its environment beside the test run's.
CASE_ENV = {"relay-secret-too-short": {"RELAY_SECRET": "hunter2"}}


#: Command lines that stop before any model loads, beside BAD_INPUT's: name -> flags after the demo's.
STOPS_EARLY = {
    "relay-cannot-start": ["--max_steps", "1", "--relay_start_timeout", "0.001"],
    "bad-sink-option": ["--max_steps", "1", "--tracker", "tensorboard", "--tensorboard_logdir", "{tmp}/file/tb"],
}


@pytest.fixture(scope="session")
def stops_early(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Every BAD_INPUT and STOPS_EARLY command line, run once per test run and all in one process
    (tests/trainer_cases.py: each as ``python -m trainer`` runs it, its stderr its own): a process per
    case imported transformers and trl again each time. Per case, its folder and ``{"status", "stderr"}``."""
    flags = {name: ["--response_template", "\\n### Response:", *case] for name, case, _ in BAD_INPUT}
    flags.update(STOPS_EARLY)
    with once_per_run(tmp_path_factory, "stops-early") as folder:
        results = folder / "results.json"
        if not results.exists():
            cases = []
            for name, case in flags.items():
                tmp = folder / name
                tmp.mkdir(parents=True, exist_ok=True)
                (tmp / "meta.json").write_text("[1, 2]")
                (tmp / "file").write_text("in the way")
                cmd = on_demo(demo_model, tmp / "out", *[f.replace("{tmp}", str(tmp)) for f in case])
                cases.append({"argv": cmd[len(TRAIN):], "env": CASE_ENV.get(name, {})})
            (folder / "cases.json").write_text(json.dumps(cases))
            done = subprocess.run([sys.executable, str(CASES), str(folder / "cases.json"), str(results)], cwd=ROOT,
                                  env=trainer_env(), capture_output=True, text=True, timeout=540)
            assert done.returncode == 0, done.stderr[-3000:]
        ran = json.loads(results.read_text())
        return {name: (folder / name, result) for name, result in zip(flags, ran, strict=True)}


@pytest.mark.slow  # the trainer's imports: transformers' alone takes seconds
@pytest.mark.parametrize("name, message", [(name, message) for name, _, message in BAD_INPUT],
                         ids=[name for name, _, _ in BAD_INPUT])
def test_bad_input_stops_before_loading_the_model(stops_early: dict, name: str, message: str) -> None:
    tmp, done = stops_early[name]
    assert done["status"] == 2, done["stderr"][-2000:]
    errors = error_lines(done["stderr"])
    assert len(errors) == 1, done["stderr"][-2000:]
    assert message.replace("{tmp}", str(tmp)) in errors[0]
    assert "Loading weights" not in done["stderr"], "validation must come before any loading"
    assert not (tmp / "out").exists(), "validation must come before any loading"


@pytest.mark.parametrize("call, message", [
    (lambda: track(None), "metrics must be a dict of name -> number, got NoneType"),
    (lambda: track([("loss", 1.0)]), "metrics must be a dict"),
    (lambda: track({}), "metrics is empty"),
    (lambda: track({"loss": "low"}), "metric 'loss' must be a real number, got str"),
    (lambda: track({"ok": True}), "metric 'ok' must be a real number, got bool"),
    (lambda: track({3: 1.0}), "metric name must be a non-empty string, got 3"),
    (lambda: track({"loss": 1.0}, stage=None), "stage must be a non-empty string, got None"),
    (lambda: track({"loss": 1.0}, step=-1), "step must be a non-negative int or None, got -1"),
    (lambda: set_params(None), "params must be a dict, got NoneType"),
    (lambda: set_params("dataset=v3"), "params must be a dict, got str"),
    (lambda: set_params({"dataset": "v3"}, name=7), "name must be a non-empty string, got 7"),
    (lambda: set_params({"dataset": "v3"}, name=""), "name must be a non-empty string, got ''"),
    (lambda: set_params({1: "v3"}), "param name must be a non-empty string, got 1"),
])
def test_tracking_api_rejects_bad_arguments(call, message: str) -> None:
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


TRACK_SCRIPT = textwrap.dedent("""
    import sys
    from trainer import custom_metrics as tracking, track, set_params
    track({"early": 1.5, "nan": float("nan")}, step=3)
    set_params({"dataset": "v3", "nested": {"ids": {1, 2}}})
    if sys.argv[1] != "never":
        tracking.start("api-run", rank=0, address=sys.argv[1])
        track({"late": 2})
        print(tracking.stop(10))
""")


def test_events_tracked_before_the_connection_arrive_after_it(tmp_path: Path, relays) -> None:
    relay = relays(["--sink", "jsonl", "--path", str(tmp_path / "api.jsonl")])
    done = subprocess.run([sys.executable, "-c", TRACK_SCRIPT, relay.address], cwd=ROOT, env=trainer_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
    assert relay.stop() == 0
    events = [e for e in read_jsonl(tmp_path / "api.jsonl") if e["type"] != "stats"]
    assert [(e["type"], e["stage"], e["step"]) for e in events] == [
        ("hello", None, None), ("metrics", "additional_metrics", 3), ("params", "experiment_metadata", None),
        ("metrics", "additional_metrics", None)]
    assert events[1]["data"] == {"early": 1.5, "nan": "NaN"}
    assert events[2]["data"] == {"dataset": "v3", "nested": {"ids": [1, 2]}}
    assert events[3]["data"] == {"late": 2}


def test_events_never_sent_are_reported_at_exit() -> None:
    done = subprocess.run([sys.executable, "-c", TRACK_SCRIPT, "never"], cwd=ROOT, env=trainer_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "2 tracked events were never sent (0 more dropped)" in done.stderr


def test_run_id_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv_id
    first, second = default_run_id(), default_run_id()
    assert first != second and first.startswith("sft-")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "0f8fad5b-d9cb-469f-a165-70867728950e")  # what plain torchrun makes up
    assert re.fullmatch(r"sft-\d{8}-\d{6}-[0-9a-f]{6}", default_run_id())
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job/42")
    assert re.fullmatch(r"job-42-[0-9a-f]{6}", default_run_id())
    mine = default_run_id("mine")
    assert re.fullmatch(r"mine-[0-9a-f]{6}", mine)
    assert default_run_id("mine") != mine, "two jobs reusing a --run_name must not share a run id"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert re.fullmatch(r"mine-[0-9a-f]{6}-r2", default_run_id("mine")), "a restarted worker gets a new life"


def test_trainer_logs_split_by_stage() -> None:
    from trainer.log_stages import split_logs

    logs = {"loss": 1.0, "eval_loss": 2.0, "eval_runtime": 0.5, "train_loss": 1.5, "epoch": 0.5, "note": "x"}
    assert split_logs(logs) == {"train": {"loss": 1.0, "train_loss": 1.5},
                                "eval": {"loss": 2.0, "runtime": 0.5}}


@pytest.mark.slow
def test_demo_builds_and_trains_offline(tmp_path: Path) -> None:
    out = tmp_path / "demo-output"
    done = run_trainer(TRAIN + ["--demo", "--output_dir", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (out / "demo-model").iterdir()}
    assert (out / "adapter_model.safetensors").exists(), "the LoRA adapter is saved"
    events = read_jsonl(out / "training_logs.jsonl")
    losses = [e["data"]["loss"] for e in events if e["stage"] == "train" and "loss" in e["data"]]
    assert len(losses) == 6 and all(loss > 0 for loss in losses)
    assert [e["data"]["event"] for e in events if e["type"] == "lifecycle"] == ["train_begin", "train_end"]
    tail = done.stderr.rstrip().splitlines()[-3:]  # what `make demo` ends with: the journal, how to watch and plot it
    journal = out / "training_logs.jsonl"
    assert tail[0].endswith(f"metrics journal: {journal}"), tail
    near = os.path.relpath(journal, ROOT)  # relative where it lies below the job's directory
    # This environment's relay: "relay" where PATH finds that one, else its path (relative below the
    # job's directory).
    own = Path(sys.executable).parent / "relay"
    far = os.path.relpath(own, ROOT)  # a worktree beside the checkout whose .venv it uses: "../"
    relay = "relay" if shutil.which("relay") == str(own) else str(own) if far.startswith("..") else far
    assert tail[1].split() == ["watch", "it:", relay, "tail", "-f", "--view", "steps",
                               str(journal) if near.startswith("..") else near], tail
    assert tail[2].split()[:4] == ["plot", "it:", relay, "plot"], tail


@pytest.mark.slow
def test_tracker_aim_adds_the_aim_sink(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_trainer(TRAIN + ["--demo", "--output_dir", str(out), "--max_steps", "4", "--logging_steps", "1",
                                "--tracker", "aim", "--experiment", "sft-demo-test"])
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = json.loads((out / "tracking_run.json").read_text())["run"]
    runs = read_repo(str(out / "aim"))
    assert list(runs) == [run_id]
    assert runs[run_id].experiment == "sft-demo-test"
    assert sorted(runs[run_id].series("loss")) == [1, 2, 3, 4]
    assert len(read_jsonl(out / "training_logs.jsonl")) > 0, "the JSONL journal stays on beside Aim"


@pytest.mark.slow
def test_train_from_python_writes_training_logs(demo_model: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        from trl import SFTConfig
        from trainer import train
        from trainer.args import DataArguments, ModelArguments
        train(ModelArguments(model_name_or_path={str(demo_model)!r}, use_peft=True, target_modules=["all-linear"]),
              DataArguments(data_path={str(DEMO_DATA)!r}, response_template="\\n### Response:"),
              SFTConfig(output_dir={str(tmp_path / "out")!r}, max_steps=3, logging_steps=1, use_cpu=True,
                        bf16=False, dataset_text_field="output", max_length=64, save_strategy="no",
                        per_device_train_batch_size=2))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=trainer_env(), capture_output=True,
                          text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_jsonl(tmp_path / "out" / "training_logs.jsonl")
    assert [e["step"] for e in events if e["stage"] == "train" and "loss" in e["data"]] == [1, 2, 3]
    assert any("model_load_time" in e["data"] for e in events)
    peft = next(e["data"]["default"] for e in events if e["stage"] == "peft")
    adapted = {name.rsplit(".", 1)[-1] for name in peft["target_modules"]}
    assert {"q_proj", "v_proj", "down_proj"} <= adapted, "all-linear reaches every linear layer"


@pytest.mark.slow  # the trainer's imports (run with the bad-input cases)
def test_embedded_relay_that_cannot_start_is_one_clear_error(stops_early: dict) -> None:
    tmp, done = stops_early["relay-cannot-start"]
    assert done["status"] == 1, done["stderr"][-3000:]
    errors = error_lines(done["stderr"])
    assert len(errors) == 1 and "embedded relay not ready after 0.001s" in errors[0], done["stderr"][-3000:]
    assert str(tmp / "out" / "relay.log") in errors[0]
    assert "Loading weights" not in done["stderr"]


@pytest.mark.slow  # the trainer's imports (run with the bad-input cases)
def test_a_bad_sink_option_stops_the_job_before_training(stops_early: dict) -> None:
    """The embedded relay checks its sinks before it listens and exits 2; the job says why in one line
    and exits non-zero before any model loads."""
    tmp, done = stops_early["bad-sink-option"]
    assert done["status"] == 1, done["stderr"][-3000:]
    errors = error_lines(done["stderr"])
    assert len(errors) == 1, done["stderr"][-3000:]
    assert "embedded relay exited with status 2: relay: error: TensorBoard log directory" in errors[0]
    assert f"{tmp / 'file'} is not a directory; pass a writable --logdir directory" in errors[0]
    assert "Loading weights" not in done["stderr"] and "'loss'" not in done["stdout"]


@pytest.mark.slow
def test_sigterm_mid_run_reports_the_end_and_stops_the_relay(demo_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = start_trainer(on_demo(demo_model, out, "--max_steps", "100000", "--logging_steps", "1",
                                "--save_strategy", "no"), stderr_path=tmp_path / "job.err")
    try:
        for line in job.stdout:
            if "'loss'" in line:
                break
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 128 + signal.SIGTERM, (tmp_path / "job.err").read_text()[-3000:]
    events = read_jsonl(out / "training_logs.jsonl")
    ends = [e["data"] for e in events if e["type"] == "lifecycle" and e["data"]["event"] == "train_end"]
    assert len(ends) == 1 and ends[0]["status"] == "failed" and "Terminated" in ends[0]["error"]
    assert any(e["type"] == "stats" for e in events), "the publisher was closed, not abandoned"
    relay_pid = json.loads((out / "tracking_run.json").read_text())["relay_pid"]
    assert not psutil.pid_exists(relay_pid), "the embedded relay outlived the job"


@pytest.mark.slow
def test_tracker_none_starts_nothing(demo_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_trainer(on_demo(demo_model, out, "--max_steps", "2", "--save_strategy", "no", "--tracker", "none"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (out / "training_logs.jsonl").exists() and not (out / "relay.log").exists()
    assert "never sent" not in done.stderr


@pytest.mark.slow  # importing trl takes seconds
def test_sft_config_implies_the_cpu_as_the_command_line_does(tmp_path: Path) -> None:
    import torch
    from trl import SFTConfig

    from trainer.args import sft_config

    if torch.accelerator.is_available():
        pytest.skip("only a machine without an accelerator implies --use_cpu")
    with pytest.raises(ValueError, match="use_cpu"):
        SFTConfig(output_dir=str(tmp_path))  # what train()'s callers met before
    assert sft_config(output_dir=str(tmp_path)).use_cpu is True
    assert sft_config(output_dir=str(tmp_path), use_cpu=True, bf16=False).bf16 is False


@pytest.mark.slow  # importing trl takes seconds
def test_fsdp_without_an_accelerator_says_in_one_line_it_runs_as_plain_data_parallel(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from trainer.args import parse_args, validate

    if torch.accelerator.is_available():
        pytest.skip("only a machine without an accelerator runs --fsdp as DDP")
    flags = ["--model_name_or_path", str(tmp_path), "--data_path", str(DEMO_DATA), "--dataset_text_field", "output",
             "--output_dir", str(tmp_path / "out")]
    with caplog.at_level("WARNING", logger="trainer.args"):
        model, data, tracking, training = parse_args([*flags, "--fsdp", "full_shard auto_wrap",
                                                      "--time_collectives", "false"])
        validate(model, data, training, tracking)
    said = [r.getMessage() for r in caplog.records if "--fsdp" in r.getMessage()]
    assert said == ["--fsdp: no accelerator here, so accelerate runs this job as plain data parallel (DDP on gloo, "
                    "the whole model on every rank), not sharded"]
    assert tracking.time_collectives is False
    caplog.clear()
    with caplog.at_level("WARNING", logger="trainer.args"):
        model, data, tracking, training = parse_args(flags)
        validate(model, data, training, tracking)
    assert not [r for r in caplog.records if "--fsdp" in r.getMessage()] and tracking.time_collectives is True
