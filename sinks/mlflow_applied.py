"""Where the MLflow sink (sinks/mlflow.py) keeps its applied spans: in the MLflow run's own tags;
for a directory store, in a file of the run's folder, with the sizes of the run's metric files.

A directory store appends points and rewrites a tag by truncating its file, so a kill there would
double points; why and how the saved sizes cut it back: docs/sinks/mlflow.md, "Replay, restarts,
failures".
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from sinks.files import write_atomic
from sinks.mlflow_rules import MAX_TAG
from sinks.mlflow_run import MlRun
from sinks.tracker_base import Spans

log = logging.getLogger(__name__)

#: Number of parts; the JSON is in mlflow.relay.applied.0, .1, ... Under MLflow's own ``mlflow.``
#: prefix, which its UI leaves out of a run's tags: bookkeeping, not for people.
APPLIED_TAG = "mlflow.relay.applied"
OLD_APPLIED_TAG = "relay.applied"  # where runs written before kept them: still read on resume
STATE_NAME = "relay_applied.json"  # in a directory store's run folder, beside MLflow's own
Sizes = dict[str, int]  # a metric key's file -> its size in bytes


def applied_tags(spans: Spans) -> list[tuple[str, str]]:
    """The tags, as (key, value), that hold ``spans``; the number of parts last."""
    text = json.dumps(spans, separators=(",", ":"))
    parts = [(f"{APPLIED_TAG}.{i // MAX_TAG}", text[i:i + MAX_TAG])
             for i in range(0, len(text), MAX_TAG)]
    return [*parts, (APPLIED_TAG, str(len(parts)))]


def read_applied(tags: dict[str, str]) -> Spans | None:
    """The spans a run's tags hold; None where none were saved; ValueError where torn."""
    prefix = APPLIED_TAG if APPLIED_TAG in tags else OLD_APPLIED_TAG
    if prefix not in tags:
        return None
    text = "".join(tags.get(f"{prefix}.{i}", "") for i in range(int(tags[prefix] or 0)))
    return {int(rank): spans for rank, spans in json.loads(text).items()}


def save_state(folder: Path, spans: Spans) -> None:
    """A directory store's run ``folder``: its spans, with its metric files' sizes now."""
    write_atomic(folder / STATE_NAME, json.dumps({"spans": spans, "sizes": metric_sizes(folder)}))


def resume(folder: Path, tags: dict[str, str]) -> tuple[Spans, int]:
    """A directory store's run ``folder`` resumed: its spans, its metric files cut back to what
    they cover (bytes cut). A run an older relay saved in tags only is taken as it is."""
    path = folder / STATE_NAME
    if path.exists():
        state = json.loads(path.read_text())
        spans, sizes = {int(r): s for r, s in state["spans"].items()}, state["sizes"]
    else:
        saved = read_applied(tags)
        if saved is not None:
            return saved, 0
        spans, sizes = {}, {}  # none saved yet: no point is covered
    return spans, cut_back(folder, sizes)


def run_dir(uri: str, r: MlRun) -> Path:
    """A directory store's folder of the run (as MLflow's FileStore lays it out)."""
    return Path(uri.removeprefix("file://")).expanduser() / r.experiment_id / str(r.run_id)


def metric_sizes(run_dir: Path) -> Sizes:
    """Each metric file's size in a directory store's run, by key (``/`` in a key: a folder)."""
    folder = run_dir / "metrics"
    return {path.relative_to(folder).as_posix(): path.stat().st_size
            for path in folder.rglob("*") if path.is_file()}


def cut_back(run_dir: Path, sizes: Sizes) -> int:
    """Cut the run's metric files back to ``sizes``, removing those it does not name; bytes cut."""
    cut = 0
    for key, size in metric_sizes(run_dir).items():
        keep = sizes.get(key, 0)
        if size > keep:
            path = run_dir / "metrics" / key
            if keep:
                os.truncate(path, keep)
            else:
                path.unlink()
            cut += size - keep
            log.info("mlflow sink: %s: cut %d bytes of points no saved span covers", path,
                     size - keep)
    return cut
