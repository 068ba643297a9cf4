"""Every tracker read back through its own library's API (no private state of a sink), and what
each must show of ``sink_helpers.training_events()``: one place, shared by each sink's own tests and
the sink contract test (tests/test_sink_contract.py). The trackers are imported only when read."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

WANDB = str(Path(sys.executable).parent / "wandb")
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
SUMMARY = -(2 ** 31)  # the step ClearML's summary values are reported at
EXPERIMENT = "sft"  # the MLflow experiment the tests write to


def f32(value: float) -> float:
    """What TensorBoard keeps of a scalar: a float32, as torch's SummaryWriter.add_scalar writes it."""
    import numpy as np

    return float(np.float32(value))




@dataclass
class AimRunView:
    """An Aim run as a plain value: params, experiment, Aim's own times (``creation_time``,
    ``end_time``, ``duration``) and every metric as {step: value}."""

    hash: str
    name: str
    experiment: str
    active: bool
    params: dict[str, Any]
    creation_time: float
    end_time: float | None
    duration: float
    metrics: dict[tuple[str, tuple], dict[int, float]] = field(default_factory=dict)
    timestamps: dict[tuple[str, tuple], list[float]] = field(default_factory=dict)

    def series(self, name: str, **context: Any) -> dict[int, float]:
        return self.metrics[(name, tuple(sorted(context.items())))]


def read_repo(path: str) -> dict[str, AimRunView]:
    """Every run of the repo at ``path``, by its relay run id, read the way the issue asks:
    ``Repo.list_all_runs()`` and ``Run(hash, read_only=True)``."""
    from aim import Repo, Run

    # Aim caches the directory listing for 0.5 s per repo path; a test reads right after writing.
    Repo._all_run_hashes.cache_clear()
    repo = Repo(path)
    runs: dict[str, AimRunView] = {}
    for run_hash in repo.list_all_runs():
        run = Run(run_hash, repo=repo, read_only=True)
        params = run.get(..., {}) or {}
        view = AimRunView(run_hash, run.name, run.experiment, run.active, params, run.creation_time, run.end_time,
                          run.duration)
        for name, context, _ in run.iter_metrics_info():
            metric = run.get_metric(name, context)
            steps, (values, _epochs, times) = metric.data.items_list()
            key = (name, tuple(sorted(context.to_dict().items())))
            assert len(set(steps)) == len(steps), f"{key}: repeated steps {steps}"
            view.metrics[key] = dict(zip(steps, values, strict=True))
            view.timestamps[key] = list(times)
        run_id = params.get("relay", {}).get("run_id", run_hash)
        assert run_id not in runs, f"two Aim runs for run id {run_id}"
        runs[run_id] = view
    return runs


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_aim(view, steps: int = 6) -> None:
    """The content every test expects from training_events(): one place, so replay compares alike."""
    loss = view.series("loss")
    assert sorted(loss) == list(range(1, steps + 1))
    assert math.isnan(loss[3]) and loss[2] == 1.0
    assert view.series("loss", subset="eval") == {s: 1 / s for s in range(3, steps + 1, 3)}
    assert view.series("loss", subset="train") == {steps: 0.9}
    assert view.series("runtime", subset="train") == {steps: 12.0}
    assert view.series("total_flos") == {steps: 1e9}
    assert sorted(view.series("epoch")) == list(range(1, steps + 1))
    for rank in (0, 1):
        step_time = view.series("__system__rank_step_time_s", rank=rank)  # the wire's step_time, named for display
        assert sorted(step_time) == list(range(1, steps + 1))
        assert step_time[2] == pytest.approx(0.1 * (rank + 1) + 0.002)
        assert set(view.series("__system__rank_steps_per_log", rank=rank).values()) == {1}
        assert view.params["relay"]["client"][f"rank{rank}"]["dropped"] == 0
    assert not [name for name, _ in view.metrics if name.startswith("relay_")], "no counter drawn while none dropped"
    assert list(view.series("model_load_time", subset="additional_metrics", rank=0).values()) == [3.25]
    assert view.params["hparams"]["learning_rate"] == 2e-5
    assert view.params["hparams"]["max_grad_norm"] == "Infinity"  # as the JSONL journal keeps it
    assert view.params["model"] == {"model_type": "llama", "hidden_size": 64}
    assert view.params["experiment_metadata"] == {"dataset": "v3", "owner": "team-a"}
    assert set(view.params["relay"]["ranks"]) == {"0", "1"}
    assert {k: c["path"] for k, c in view.params["relay"]["checkpoints"].items()} == {
        str(s): f"ckpt-{s}" for s in range(3, steps + 1, 3)}





@dataclass
class Board:
    """A TensorBoard run read back through TensorBoard's EventAccumulator."""

    points: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)  # tag -> (step, value, wall)
    texts: dict[str, list[str]] = field(default_factory=dict)
    hparams: dict[str, Any] = field(default_factory=dict)
    group: str = ""
    status: str | None = None
    files: list[str] = field(default_factory=list)

    def series(self, tag: str) -> dict[int, float]:
        steps = [s for s, _, _ in self.points[tag]]
        assert len(set(steps)) == len(steps), f"{tag}: a point written twice: {sorted(steps)}"
        return {s: v for s, v, _ in self.points[tag]}

    def text(self, tag: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for text in self.texts[tag + "/text_summary"]:
            merged.update(json.loads(text))
        return merged


def read_logdir(logdir: Path) -> dict[str, Board]:
    """Every run directory of ``logdir``, as TensorBoard reads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    boards = {}
    for folder in sorted(p for p in logdir.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        board = Board(files=sorted(p.name for p in folder.iterdir() if "tfevents" in p.name))
        tags = acc.Tags()
        for tag in tags["scalars"]:
            board.points[tag] = [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in tags["tensors"]:
            if tag.endswith("/text_summary"):
                board.texts[tag] = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)]
        content = acc.PluginTagToContent("hparams") if "_hparams_/session_start_info" in tags["tensors"] else {}
        if metadata.SESSION_START_INFO_TAG in content:
            start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
            board.hparams = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
            board.group = start.group_name
        if metadata.SESSION_END_INFO_TAG in content:
            end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
            board.status = api_pb2.Status.Name(end.status)
        boards[folder.name] = board
    return boards


def values(board: Board) -> dict[str, dict[int, str]]:
    """Every point as step -> repr(value), so NaN equals NaN."""
    return {tag: {s: repr(v) for s, v, _ in points} for tag, points in board.points.items()}


def check_tensorboard(board: Board, steps: int = 6) -> None:
    """What every test expects of training_events(), named as transformers' TensorBoardCallback does."""
    loss = board.series("train/loss")
    assert sorted(loss) == list(range(1, steps + 1))
    assert math.isnan(loss[3]) and loss[2] == 1.0 and loss[4] == 0.5
    assert board.series("train/learning_rate")[2] == f32(2e-5)
    assert board.series("eval/loss") == {s: f32(1 / s) for s in range(3, steps + 1, 3)}
    assert board.series("train/train_loss") == {steps: f32(0.9)}
    assert board.series("train/train_runtime") == {steps: 12.0}
    assert board.series("train/total_flos") == {steps: 1e9}
    # the Trainer adds the epoch to every log, eval's and the final one's too, and HF's callback writes each
    assert sorted(s for s, _, _ in board.points["train/epoch"]) == sorted([*range(1, steps + 1), *range(3, steps + 1, 3),
                                                                           steps])
    for rank in (0, 1):
        step_time = board.series(f"workers/rank_step_time_s/rank_{rank}")  # the wire's step_time, named for display
        assert sorted(step_time) == list(range(1, steps + 1))
        assert step_time[2] == f32(0.1 * (rank + 1) + 0.002)
    assert board.series("train/model_load_time") == {0: 3.25}  # as the Trainer's own log of it would be named
    groups = sorted({tag.split("/")[0] for tag in board.points})
    assert groups[:2] == ["eval", "train"] and groups[2:] == ["workers"], "the Trainer's groups first"
    assert board.text("args")["learning_rate"] == 2e-5
    assert board.text("args")["max_grad_norm"] in (math.inf, "Infinity")  # direct / through the journal
    assert board.text("model_config") == {"model_type": "llama", "hidden_size": 64}
    assert board.text("experiment_metadata") == {"dataset": "v3", "owner": "team-a"}
    assert set(board.text("relay.ranks")) == {"0", "1"}
    assert {rank: c["dropped"] for rank, c in board.text("relay.client").items()} == {"rank0": 0, "rank1": 0}
    assert not [tag for tag in board.points if "relay_" in tag], "client counters are text, none dropped"
    assert {k: c["path"] for k, c in board.text("relay.checkpoints").items()} == {
        str(s): f"ckpt-{s}" for s in range(3, steps + 1, 3)}
    assert board.hparams["learning_rate"] == 2e-5 and board.hparams["seed"] == 42
    assert board.hparams["model.model_type"] == "llama" and board.hparams["experiment_metadata.dataset"] == "v3"
    assert not any(k.startswith("relay") for k in board.hparams)




@dataclass
class WandbView:
    """One W&B run id as ``wandb sync`` would upload it: its directories (resumed instances) in
    start order, a rewind (``resume_from``) dropping the rows of earlier instances past its ``_step``,
    as W&B's server does; its name, merged config and summary, every history series as {x: value}
    (x = ``train/global_step``), and the system stats records' items as [(time, value)]."""

    instances: list[dict[str, Any]] = field(default_factory=list)
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    series: dict[str, dict[Any, float]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)  # the history as uploaded, in _step order
    system: dict[str, list[tuple[datetime, float]]] = field(default_factory=dict)

    def points(self) -> set[tuple[str, Any]]:
        return {(k, x) for k, s in self.series.items() for x in s}


def instant(text: str) -> datetime:
    """A time as wandb-core writes it (protobuf's JSON: 0, 3, 6 or 9 decimals), as an instant:
    as text, a whole millisecond ("...40.277Z") sorts after a later time ("...40.277011Z")."""
    return datetime.fromisoformat(text)


def inspect(path: Path) -> list[dict[str, Any]]:
    """Every record of a .wandb file, decoded by wandb-core."""
    out = subprocess.run([WANDB, "leet", "inspect", "--json", str(path)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def read_wandb(root: Path) -> dict[str, WandbView]:
    """The runs under ``root/wandb`` that ``wandb sync root/wandb`` would find (one level down)."""
    from sinks.wandb_layout import STEP_KEY

    files = []
    for path in {p.resolve() for p in (root / "wandb").glob("*/*.wandb")}:  # latest-run is a link
        records = inspect(path)
        run = next(r["run"] for r in records if r["type"] == "run")
        files.append((instant(run["start_time"]), run["run_id"], path, records))
    views: dict[str, WandbView] = {}
    for start, run_id, path, records in sorted(files):
        view = views.setdefault(run_id, WandbView())
        instance = {"dir": path.parent.name, "start": start, "exit_code": None, "steps": [], "rewind": None}
        for record in records:
            kind, body = record["type"], record.get(record["type"], {})
            if kind == "run":
                view.config.update(body.get("config", {}).get("update", {}))
                view.name = body.get("display_name", view.name)
                branch = body.get("branch_point")
                if branch and instance["rewind"] is None:  # W&B's rewind: the rows past it are dropped
                    instance["rewind"] = int(branch.get("value", 0))
                    view.rows = [row for row in view.rows if row["_step"] <= instance["rewind"]]
            elif kind == "config":
                view.config.update(body["update"])
            elif kind == "summary":
                view.summary.update({k: v for k, v in body["update"].items() if not k.startswith("_")})
            elif kind == "history":
                instance["steps"].append(body["item"]["_step"])
                view.rows.append(body["item"])
            elif kind == "stats":
                for key, value in body["item"].items():
                    view.system.setdefault(key, []).append((instant(body["timestamp"]),
                                                            NONFINITE.get(value, value)))
            elif kind == "exit":
                instance["exit_code"] = body.get("exit_code", 0)
        view.instances.append(instance)
    for view in views.values():  # `wandb sync` appends instances in start order: _step must go on
        steps = [row["_step"] for row in view.rows]
        assert steps == sorted(set(steps)), "W&B _step not increasing across the run's directories"
        seen = set()
        for row in view.rows:
            for key, value in row.items():
                if key.startswith("_") or key == STEP_KEY:
                    continue
                point = (key, row.get(STEP_KEY), row["_timestamp"])  # the same point twice has the same time
                assert point not in seen, f"{key} at {row.get(STEP_KEY)} twice"
                seen.add(point)
                view.series.setdefault(key, {})[row.get(STEP_KEY)] = NONFINITE.get(value, value)
        view.config.pop("_wandb", None)
    return views


def check_wandb(view: WandbView, steps: int = 6) -> None:
    """What every test expects from sink_helpers.training_events(), laid out as W&B's HF callback."""
    loss = view.series["train/loss"]
    assert sorted(loss) == list(range(1, steps + 1))
    assert math.isnan(loss[3]) and loss[2] == 1.0
    assert view.series["eval/loss"] == {s: 1 / s for s in range(3, steps + 1, 3)}
    assert view.series["eval/runtime"] == dict.fromkeys(range(3, steps + 1, 3), 0.5)
    assert sorted(view.series["train/epoch"]) == list(range(1, steps + 1))
    assert view.series["train/learning_rate"][2] == pytest.approx(2e-5)
    for rank in (0, 1):  # the relay's per-rank figures: system stats at the event's time, not history rows
        step_time = [value for _, value in sorted(view.system[f"rank.{rank}.step_time_s"])]
        assert step_time == pytest.approx([0.1 * (rank + 1) + s / 1000 for s in range(1, steps + 1)])
        assert "published" in view.config[f"relay.client.rank{rank}"]  # the clients' counters
    assert not any(key.startswith(("system/", "workers/")) for key in view.series), "no relay figure in the history"
    assert all("train/global_step" in row for row in view.rows), "every row has its step"
    assert "model_load_time" not in view.series and view.summary["model_load_time"] == 3.25  # no row at step 0
    assert {k: view.summary[k] for k in ("train_loss", "train_runtime", "total_flos")} == {
        "train_loss": 0.9, "train_runtime": 12.0, "total_flos": 1e9}
    assert view.config["learning_rate"] == 2e-5 and view.config["seed"] == 42
    assert view.config["max_grad_norm"] == "Infinity"  # as the JSONL journal keeps it
    assert view.config["model_type"] == "llama" and view.config["hidden_size"] == 64  # at the top, as HF's
    assert view.config["experiment_metadata.dataset"] == "v3"
    assert all(view.config[f"relay.ranks.{r}"]["local_rank"] == r for r in (0, 1))
    assert {k for k in view.config if k.startswith("relay.checkpoints.")} == {
        f"relay.checkpoints.{s}" for s in range(3, steps + 1, 3)}


def run_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "wandb").glob("*run-*") if p.is_dir())




@dataclass
class TaskView:
    """An offline session as plain values: what an import would create on a ClearML server."""

    task_id: str
    name: str
    project: str
    tags: list[str]
    params: dict[str, Any]
    model_config: dict[str, Any] | None
    scalars: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    timestamps: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    requests: int = 0
    zip_names: set[str] = field(default_factory=set)


class _KeepRequests:
    """Stands in for the ClearML API session of an import: keeps what would be sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, request: Any) -> None:
        self.sent.append(request)


def read_sessions(cache_dir: Path, last_wins: bool = False) -> dict[str, TaskView]:
    """Every offline session under ``cache_dir``, by its relay run id, read with ClearML's code.
    ``last_wins``: a point reported again at an iteration (a resumed job's later attempt) replaces the
    earlier, as ClearML's server keeps one event per task, iteration, metric and variant (its
    apiserver/bll/event/event_bll.py: the event's id is made of those, and indexing it again overwrites)."""
    from clearml import Task
    from clearml.backend_interface.metrics import Metrics

    os.environ["CLEARML_CACHE_DIR"] = str(cache_dir)
    Task.set_offline(True)
    views: dict[str, TaskView] = {}
    for folder in sorted(p for p in (cache_dir / "offline").glob("offline-*") if p.is_dir()):
        task = Task.get_task(task_id=folder.name)
        params = task.get_parameters_as_dict()
        stored = task.get_configuration_object("Model Configuration")
        view = TaskView(task.id, task.name, task.data.project_name, task.get_tags(), params,
                        json.loads(stored) if stored else None)
        keep = _KeepRequests()
        Metrics.report_offline_session(task, str(folder), remote_url="file:///not-sent", only_with_id=task.id,
                                       session=keep)
        for batch in keep.sent:
            for point in batch.requests:
                key, step = (point["metric"], point["variant"]), point["iter"]
                series = view.scalars.setdefault(key, {})
                assert last_wins or step == SUMMARY or step not in series, f"{key} step {step} written twice"
                series[step] = point["value"]  # a single value: the last one wins, as on a server
                view.timestamps.setdefault(key, []).append(point["timestamp"])
                view.requests += 1
        archive = folder.with_name(folder.name + ".zip")
        if archive.exists():
            with zipfile.ZipFile(archive) as zf:
                view.zip_names = set(zf.namelist())
                assert zf.read("metrics.jsonl") == (folder / "metrics.jsonl").read_bytes(), "zip is stale"
        run_id = params["relay"]["run_id"]
        assert run_id not in views, f"two tasks for run {run_id}"
        views[run_id] = view
    return views


def check_clearml(view: TaskView, steps: int = 6) -> None:
    """What training_events() must look like in ClearML, named as transformers' ClearMLCallback."""
    loss = view.scalars[("train", "loss")]
    assert sorted(loss) == list(range(1, steps + 1))
    assert loss[3] == 0.0 and loss[2] == 1.0  # NaN: ClearML reports it as 0.0 (its default)
    assert view.scalars[("train", "grad_norm")] == dict.fromkeys(range(1, steps + 1), 1.5)
    assert view.scalars[("eval", "loss")] == {s: 1 / s for s in range(3, steps + 1, 3)}
    assert view.scalars[("eval", "runtime")] == dict.fromkeys(range(3, steps + 1, 3), 0.5)
    summary = {series: values[SUMMARY] for (title, series), values in view.scalars.items() if title == "Summary"}
    assert summary == {"train_loss": 0.9, "train_runtime": 12.0, "total_flos": 1e9, "epoch": 1.0,
                       "model_load_time": 3.25}
    for rank in (0, 1):
        step_time = view.scalars[(":monitor:rank_step_time_s", f"rank {rank}")]  # the wire's step_time, for display
        assert sorted(step_time) == list(range(1, steps + 1))
        assert step_time[2] == pytest.approx(0.1 * (rank + 1) + 0.002)
    assert view.params["Transformers"] == {"learning_rate": "2e-05", "max_grad_norm": "Infinity", "seed": "42"}
    assert view.model_config == {"model_type": "llama", "hidden_size": 64}
    assert view.params["experiment_metadata"] == {"dataset": "v3", "owner": "team-a"}
    relay = view.params["relay"]
    assert set(relay["ranks"]) == {"0", "1"} and relay["ranks"]["1"]["pid"].isdigit()
    assert {rank: c["dropped"] for rank, c in relay["client"].items()} == {"rank0": "0", "rank1": "0"}
    assert not [title for title, _ in view.scalars if "relay_" in title], "client counters are params, none dropped"
    checkpoints = {s: c["path"] for s, c in relay["checkpoints"].items()}
    assert checkpoints == {str(s): f"ckpt-{s}" for s in range(3, steps + 1, 3)}
    assert "completed" in view.tags and relay["lifecycle"]["train_end"]["status"] == "completed"
    assert {"task.json", "metrics.jsonl"} <= view.zip_names




@dataclass
class RunView:
    """An MLflow run as plain values: info, params, tags, and every metric's whole history."""

    info: Any
    params: dict[str, str]
    tags: dict[str, str]
    history: dict[str, list[tuple[int, Any, int]]]  # key -> sorted (step, value, timestamp ms)

    def series(self, key: str) -> dict[int, float]:
        steps = [s for s, _, _ in self.history[key]]
        assert len(set(steps)) == len(steps), f"{key}: repeated steps {steps}"
        return {s: (math.nan if v == "nan" else v) for s, v, _ in self.history[key]}


def read_run(uri: str, run: str, experiment: str = EXPERIMENT) -> RunView:
    """The one MLflow run holding relay run ``run``, read through MLflow's public client."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`relay.run_id` = '{run}'")
    assert len(found) == 1, f"{len(found)} MLflow runs for run {run}"
    r = found[0]
    history = {key: sorted((m.step, "nan" if math.isnan(m.value) else m.value, m.timestamp)
                           for m in client.get_metric_history(r.info.run_id, key)) for key in r.data.metrics}
    return RunView(r.info, r.data.params, r.data.tags, history)


def check_mlflow(view: RunView, steps: int = 6) -> None:
    """What training_events() must give, named as HF's MLflowCallback and fms-hf-tuning name it."""
    loss = view.series("loss")
    assert sorted(loss) == list(range(1, steps + 1)) and math.isnan(loss[3]) and loss[2] == 1.0
    assert view.series("eval_loss") == {s: 1 / s for s in range(3, steps + 1, 3)}
    assert view.series("train_loss") == {steps: 0.9} and view.series("train_runtime") == {steps: 12.0}
    assert view.series("total_flos") == {steps: 1e9}
    # epoch: once per logging step, again with each eval log and the final train_* figures (as HF logs it)
    assert sorted({s for s, _, _ in view.history["epoch"]}) == list(range(1, steps + 1))
    names = sorted(view.history)  # none under MLflow's own system/ (its UI lists those first), all after the Trainer's
    relay = [name for name in names if name.startswith("workers/")]
    assert relay and names[-len(relay):] == relay and not [name for name in names if name.startswith("system/")]
    for rank in (0, 1):
        step_time = view.series(f"workers/rank_step_time_s/rank_{rank}")  # the wire's step_time, named for display
        assert sorted(step_time) == list(range(1, steps + 1))
        assert step_time[2] == pytest.approx(0.1 * (rank + 1) + 0.002)
    assert list(view.series("additional_metrics.model_load_time").values()) == [3.25]
    p = view.params
    assert (p["learning_rate"], p["max_grad_norm"], p["seed"]) == ("2e-05", "Infinity", "42")
    assert (p["model_type"], p["hidden_size"], p["dataset"], p["owner"]) == ("llama", "64", "v3", "team-a")
    assert {"relay.ranks.0", "relay.ranks.1", "relay.world_size"} <= p.keys()
    assert "'dropped': 0" in p["relay.client.rank0"] and "'dropped': 0" in p["relay.client.rank1"]
    assert not [name for name in view.history if "relay_" in name], "client counters are params, none dropped"
    checkpoints = {int(k.rsplit(".", 1)[1]): v for k, v in p.items() if k.startswith("relay.checkpoints.")}
    assert sorted(checkpoints) == list(range(3, steps + 1, 3))
    assert all(f"ckpt-{s}" in checkpoints[s] for s in checkpoints)


def comparable(view: RunView) -> tuple:
    tags = {k: v for k, v in view.tags.items() if not k.startswith("mlflow.")}
    return (view.history, view.params, tags, view.info.status, view.info.start_time, view.info.end_time,
            view.info.run_name)
