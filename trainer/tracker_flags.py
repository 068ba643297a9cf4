"""``--tracker`` names and the relay sinks they stand for.

Each tracker of the seed's (and fms-hf-tuning's) command line is a sink of the embedded relay;
its options keep the names fms-hf-tuning's tracker configs use (``--mlflow_tracking_uri``,
``--wandb_project``, ``--clearml_task`` ...) and become that sink's relay options here. Defaults put
everything under ``--output_dir``, so a job needs no server and nothing leaves the machine.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from trainer.embedded import JSONL_NAME
from trainer.errors import UsageError

#: What ``--tracker`` accepts; jsonl (the journal) is always on unless ``none``.
TRACKERS = ("jsonl", "aim", "mlflow", "tensorboard", "wandb", "clearml", "nats", "none")
DEFAULT_PROJECT = "fms-hf-tuning"  # fms-hf-tuning's default experiment / project name
log = logging.getLogger(__name__)
_AIM_URL = re.compile(r"aim://([^:/\s]+):(\d+)/?")


@dataclass
class TrackingArguments:
    """Where metrics and run metadata go: an embedded relay by default, or one beside the job."""

    tracker: str = field(
        default="jsonl",
        metadata={"help": "Sinks of the embedded relay: jsonl (the journal, fms-hf-tuning's "
                          "file_logger; always on unless none), aim, mlflow, tensorboard, wandb, "
                          "clearml, nats; a list (--tracker aim mlflow), comma separated or "
                          "repeated; none disables tracking."},
    )
    aim_repo: str | None = field(
        default=None, metadata={"help": "Aim repository: a folder or aim://HOST:PORT (default: "
                                        "<output_dir>/aim)."})
    experiment: str | None = field(
        default=None, metadata={"help": "Aim experiment name (unless --aim_experiment) and "
                                        "MLflow's (unless --mlflow_experiment)."})
    aim_experiment: str | None = field(
        default=None, metadata={"help": "Aim experiment name (default: --experiment, else "
                                        "fms-hf-tuning)."})
    aim_remote_server_ip: str | None = field(
        default=None, metadata={"help": "Host of a remote `aim server`; with "
                                        "--aim_remote_server_port, Aim writes there."})
    aim_remote_server_port: int | None = field(
        default=None, metadata={"help": "Port of the remote `aim server`."})
    aim_url: str | None = field(
        default=None, metadata={"help": "Remote `aim server` as aim://HOST:PORT (what the two "
                                        "flags above make)."})
    run_uri_export_path: str | None = field(
        default=None, metadata={"help": "Folder for the trackers' <tracker>_tracker.json files "
                                        "(the Aim run hash, the MLflow run URI) (default: "
                                        "--output_dir)."})
    training_logs_filename: str = field(
        default=JSONL_NAME, metadata={"help": "File name of the JSONL journal in --output_dir."})
    mlflow_tracking_uri: str | None = field(
        default=None, metadata={"help": "MLflow tracking URI: a folder, sqlite:///path.db or "
                                        "http://host:port (default: "
                                        "sqlite:///<output_dir>/mlflow.db)."})
    mlflow_experiment: str | None = field(
        default=None, metadata={"help": "MLflow experiment (default: --experiment, else "
                                        "fms-hf-tuning)."})
    tensorboard_logdir: str | None = field(
        default=None, metadata={"help": "TensorBoard log dir (default: "
                                        "$TENSORBOARD_LOGGING_DIR, else <output_dir>/runs)."})
    wandb_project: str | None = field(
        default=None, metadata={"help": "W&B project (default: fms-hf-tuning)."})
    wandb_entity: str | None = field(
        default=None, metadata={"help": "W&B entity (team or user)."})
    wandb_mode: str = field(
        default="offline", metadata={"help": "W&B mode: offline (default; `wandb sync` uploads "
                                             "later) or online."})
    clearml_project: str | None = field(
        default=None, metadata={"help": "ClearML project (default: fms-hf-tuning)."})
    clearml_task: str | None = field(
        default=None, metadata={"help": "ClearML task name (default: SFTTrainer)."})
    nats_url: str = field(
        default="nats://127.0.0.1:4222",
        metadata={"help": "NATS servers the nats tracker publishes the journal to "
                          "(comma-separated; docs/sinks/nats.md): the fleet tier, with no node "
                          "relay."})
    nats_creds: str | None = field(
        default=None, metadata={"help": "NATS .creds file (nats tracker)."})
    nats_stream: str = field(default="RELAY", metadata={"help": "JetStream stream (nats tracker)."})
    nats_replicas: int = field(
        default=1, metadata={"help": "Replicas of the stream if the job creates it (nats "
                                     "tracker): 3 on a 3-node cluster."})
    relay_address: str | None = field(
        default=None,
        metadata={"help": "Publish to this running relay (tcp://host:port or ipc://path) instead "
                          "of starting one beside the job."},
    )
    exp_metadata: str | None = field(
        default=None,
        metadata={"help": "Run metadata: a JSON object, or the path of a JSON file holding one."},
    )
    continue_run: str | None = field(
        default=None,
        metadata={"help": "The run id a resumed job continues (default: the run recorded in the "
                          "checkpoint of --resume_from_checkpoint, else in --output_dir), as its "
                          "next attempt."},
    )
    new_run: bool = field(
        default=False,
        metadata={"help": "Track a job resumed from a checkpoint as a new run, not as the next "
                          "attempt of the run that saved the checkpoint."},
    )
    relay_exit_timeout: float = field(
        default=300.0,
        metadata={"help": "Seconds the job waits at its end, with a progress line, for the "
                          "embedded relay's trackers to apply the run; then it says which lack how "
                          "many events and the relay replay command that completes them."},
    )
    relay_flush_timeout: float = field(
        default=30.0,
        metadata={"help": "Seconds the job waits at the end for the relay to acknowledge every "
                          "event."},
    )
    relay_start_timeout: float = field(
        default=60.0, metadata={"help": "Seconds to wait for the embedded relay to come up."}
    )
    time_collectives: bool = field(
        default=True,
        metadata={"help": "Time each rank's waits in the job's collectives (DDP, FSDP; gloo on "
                          "the CPU) so the relay names a straggler by its own work; false: ranks "
                          "send step times only (docs/watching.md)."},
    )


def aim_remote(t: TrackingArguments) -> str | None:
    """``aim://HOST:PORT`` of the remote ``aim server`` fms-hf-tuning's flags name, or None; a
    UsageError for half an address, a malformed one, or two that disagree."""
    ip, port = t.aim_remote_server_ip, t.aim_remote_server_port
    if (ip is None) != (port is None):
        raise UsageError("--aim_remote_server_ip and --aim_remote_server_port go together: give "
                         "both (or --aim_url aim://HOST:PORT)")
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--aim_remote_server_port: {port} is not a port (1-65535)")
    url = None
    if t.aim_url is not None:
        found = _AIM_URL.fullmatch(t.aim_url)
        if found is None or not 0 < int(found.group(2)) < 65536:
            raise UsageError(f"--aim_url: {t.aim_url!r} is not aim://HOST:PORT")
        url = f"aim://{found.group(1)}:{int(found.group(2))}"
    if ip is not None:
        made = f"aim://{ip}:{port}"
        if url is not None and url != made:
            raise UsageError(f"--aim_url {t.aim_url} and --aim_remote_server_ip/port ({made}) "
                             "disagree: give one")
        url = made
    if url is not None and t.aim_repo is not None:
        raise UsageError(f"--aim_repo {t.aim_repo} and the remote Aim server {url} contradict each "
                         "other: give one")
    return url


def check_fms_tracking(t: TrackingArguments, trackers: list[str]) -> None:
    """UsageError for fms-hf-tuning's tracker flags given values the job cannot use; a warning for
    Aim flags without --tracker aim and a journal name no embedded relay writes."""
    remote = aim_remote(t)
    if "aim" not in trackers and (t.aim_repo or remote):
        log.warning("--aim_repo / the remote Aim server %s is unused without --tracker aim",
                    t.aim_repo or remote)
    name = t.training_logs_filename
    if not name or os.path.basename(name) != name or name in (".", ".."):
        raise UsageError(f"--training_logs_filename: {name!r} must be a file name (the journal "
                         "goes into --output_dir; elsewhere, run a relay yourself: relay --path "
                         "FILE)")
    if name != JSONL_NAME and (t.relay_address is not None or trackers == ["none"]):
        log.warning("--training_logs_filename %s is unused: %s", name,
                    "the relay at --relay_address writes its own journal" if t.relay_address
                    else "--tracker none")


def aim_experiment(t: TrackingArguments) -> str:
    """The Aim run's experiment: --aim_experiment, else --experiment, else fms-hf-tuning's
    default."""
    return t.aim_experiment or t.experiment or DEFAULT_PROJECT


def _aim(t: TrackingArguments, out: str) -> list[str]:
    return ["--repo", aim_remote(t) or t.aim_repo or os.path.join(out, "aim"),
            "--experiment", aim_experiment(t)]


def _mlflow(t: TrackingArguments, out: str) -> list[str]:
    uri = t.mlflow_tracking_uri or f"sqlite:///{os.path.abspath(os.path.join(out, 'mlflow.db'))}"
    experiment = t.mlflow_experiment or t.experiment or DEFAULT_PROJECT
    return ["--mlflow-tracking-uri", uri, "--mlflow-experiment", experiment]


def _tensorboard(t: TrackingArguments, out: str) -> list[str]:
    logdir = t.tensorboard_logdir or os.environ.get("TENSORBOARD_LOGGING_DIR")
    return ["--logdir", logdir or os.path.join(out, "runs")]


def _wandb(t: TrackingArguments, out: str) -> list[str]:
    args = ["--wandb-project", t.wandb_project or DEFAULT_PROJECT, "--wandb-mode", t.wandb_mode,
            "--wandb-dir", os.path.join(out, "wandb-relay")]
    return args + (["--wandb-entity", t.wandb_entity] if t.wandb_entity else [])


def _clearml(t: TrackingArguments, out: str) -> list[str]:
    return ["--clearml-project", t.clearml_project or DEFAULT_PROJECT,
            "--clearml-task", t.clearml_task or "SFTTrainer",
            "--clearml-dir", os.path.join(out, "clearml-relay")]


def _nats(t: TrackingArguments, out: str) -> list[str]:
    args = ["--nats-url", t.nats_url, "--nats-stream", t.nats_stream,
            "--nats-replicas", str(t.nats_replicas)]
    return args + (["--nats-creds", t.nats_creds] if t.nats_creds else [])


SINK_ARGS: dict[str, Callable[[TrackingArguments, str], list[str]]] = {
    "aim": _aim, "mlflow": _mlflow, "tensorboard": _tensorboard, "wandb": _wandb,
    "clearml": _clearml, "nats": _nats,
}


def sink_args(trackers: list[str], tracking: TrackingArguments, output_dir: str) -> list[str]:
    """The embedded relay's ``--sink NAME [options]`` for every tracker but the journal."""
    args: list[str] = []
    for name in trackers:
        if name in SINK_ARGS:
            args += ["--sink", name, *SINK_ARGS[name](tracking, output_dir)]
    return args
