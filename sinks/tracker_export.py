"""The ``<tool>_tracker.json`` file a tracker sink leaves for the job's own scripts (the Aim run's
hash, the MLflow run's id and URI): where it goes and how it is written, the same for every sink
that writes one (aim, mlflow; W&B, TensorBoard and ClearML name their runs by the relay's run id).

fms-hf-tuning's own trackers write files of the same names into the same folder; a sink never
replaces one it did not write (its records carry ``written_by``): it writes ``relay_<name>``
beside it instead, and says so once."""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from sinks.files import write_atomic

log = logging.getLogger(__name__)

WRITER = "metrics-relay"  # a record's ``written_by``: the files this project may replace
_said: set[Path] = set()  # the targets whose other writer was said, once each


def export_dir(params: dict[str, Any]) -> str | None:
    """The folder a job's params ask its ``<tool>_tracker.json`` files into: fms-hf-tuning's
    ``run_uri_export_path`` when the job gave one, else its ``output_dir``."""
    for key in ("run_uri_export_path", "output_dir"):
        value = params.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def tracker_file(name: str, run: str, output_dir: str | None, journal: Path | None) -> Path | None:
    """Where ``run``'s file ``name`` goes: the job's output directory, where its scripts look (as
    fms-hf-tuning writes it); else beside the journal, as ``<run>.<name>`` in a journal folder of
    one file per run; None when neither is known."""
    if output_dir:
        return Path(output_dir).expanduser() / name
    if journal is None:
        return None
    return journal / f"{run}.{name}" if journal.is_dir() else journal.parent / name


def write_tracker_file(target: Path, record: dict[str, Any], counters: Counter[str], sink: str,
                       run: str) -> None:
    """Write ``record`` to ``target`` whole (to ``relay_<name>`` beside it where ``target`` is
    another tool's); a failure is counted (``export_errors``) and logged, never worth retrying the
    sink's batch for: the tracker holds the run either way."""
    if not _ours(target):
        own = target.with_name(f"relay_{target.name}")
        if target not in _said:
            _said.add(target)
            log.warning("%s sink: %s was written by another tool (fms-hf-tuning's %s tracker?); "
                        "the relay's is %s", sink, target, sink, own)
        target = own
    record = {**record, "written_by": WRITER}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        counters["export_errors"] += 1
        log.warning("%s sink: cannot write %s for run %s: %s", sink, target, run, exc)


def _ours(target: Path) -> bool:
    """No file there, or one this project wrote (a record without ``written_by`` but with our
    ``run_id`` is one an earlier version wrote); a file that cannot be read is not ours."""
    try:
        record = json.loads(target.read_bytes())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict):
        return False
    return record.get("written_by") == WRITER or ("written_by" not in record and "run_id" in record)
