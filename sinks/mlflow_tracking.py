"""Where the MLflow sink's store is and how it is reached: the process's MLflow defaults, a tracking
URI's kind and local folder, its client (a SQLite file set up first), the experiment the runs go to
(created if missing), and the store as ``mlflow_tracker.json`` names it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sinks.base import SinkError
from sinks.mlflow_store import ready_sqlite, sqlite_path

#: The experiment tag MLflow 3's UI reads to open an experiment on its runs
#: (``custom_model_development``, "Machine learning") rather than on the GenAI overview.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
#: This process's defaults (the user's environment wins): no telemetry, and one HTTP attempt per
#: call, since the relay retries a failed batch itself, with backoff.
ENV_DEFAULTS = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def set_defaults(uri: str) -> None:
    """This process's MLflow defaults (ENV_DEFAULTS; the user's environment wins), and for a
    directory store the opt-in behind which MLflow 3 keeps such stores (in maintenance mode)."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if is_directory(uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def is_directory(uri: str) -> bool:
    """Whether ``uri`` names a directory store (``file:`` or a bare path)."""
    return uri.startswith("file:") or ("://" not in uri and uri != "databricks")


def store_folder(uri: str) -> Path | None:
    """The directory of a local store (a SQLite file's, or the store itself); None for a server."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).expanduser().parent
    return Path(uri.removeprefix("file://")).expanduser() if is_directory(uri) else None


def experiment_id(client: Any, name: str, uri: str) -> str:
    """The experiment's id, created if missing (with a SQLite file, its artifacts beside it)."""
    found = client.get_experiment_by_name(name)
    if found is None:  # if another process makes it meanwhile, this fails: the retry finds it
        folder = store_folder(uri) if uri.startswith("sqlite:") else None
        artifacts = folder and (folder.resolve() / "mlartifacts").as_uri()
        client.create_experiment(name, artifact_location=artifacts, tags=EXPERIMENT_KIND)
        found = client.get_experiment_by_name(name)
    if found.lifecycle_stage != "active":
        raise SinkError(f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments "
                        "restore) or pass another --mlflow-experiment")
    return found.experiment_id


def reach(uri: str, client_cls: Any) -> Any:
    """A ``client_cls`` (MlflowClient) of the store at ``uri``, a local store's folder made first
    and a SQLite file's one-time set-up done, safe against a kill at any moment."""
    folder = store_folder(uri)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    if (db := sqlite_path(uri)) is not None:
        ready_sqlite(db)
    return client_cls(tracking_uri=uri)


def tracker_record(uri: str, run_name: str, experiment: str,
                   run_id: str | None) -> dict[str, Any]:
    """``mlflow_tracker.json`` as fms-hf-tuning writes it: the run's name and URL (a server's host,
    else fms-hf-tuning's placeholder), its ids, and the tracking URI, a local store's as an absolute
    path, for readers elsewhere than the relay's cwd."""
    host = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "<host_url>"
    where = uri
    if uri.startswith("sqlite:///"):
        where = f"sqlite:///{Path(uri[len('sqlite:///'):]).expanduser().resolve()}"
    elif is_directory(uri) and (folder := store_folder(uri)) is not None:
        where = str(folder.resolve())
    return {"run_name": run_name, "run_uri": f"{host}/#/experiments/{experiment}/runs/{run_id}",
            "run_id": run_id, "experiment_id": experiment, "tracking_uri": where}
