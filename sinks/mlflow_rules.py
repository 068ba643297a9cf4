"""MLflow's own rules for what the MLflow sink (sinks/mlflow.py) sends: the names of its series, the
keys it takes, and how many points, params and tags fit in one ``log_batch`` call."""
from __future__ import annotations

import hashlib
import posixpath
import re
from typing import Any

# MLflow's limits (mlflow.utils.validation); MAX_BYTES keeps a call under a server's 1 MB bound.
MAX_KEY, MAX_PARAM, MAX_TAG = 250, 6000, 8000
MAX_ITEMS, MAX_PARAMS_TAGS, MAX_BYTES, METRIC_BYTES = 1000, 100, 900_000, 320
_BAD_CHARS = re.compile(r"[^0-9A-Za-z_\-\.\ :/]")  # what HF's MLflowCallback replaces by "_"
#: Param groups logged under their bare keys, as HF's callback logs TrainingArguments and the model
#: config and fms-hf-tuning its --exp_metadata; any other group is ``<group>.<key>``.
PLAIN_GROUPS = frozenset({"hparams", "model", "experiment_metadata"})
#: Model-config params whose integer keys JSON turned into strings; PretrainedConfig turns them
#: back, so HF's MLflowCallback logs ``{0: 'LABEL_0'}``, and so does this sink.
LABEL_MAPS = frozenset({"id2label"})


def mlflow_key(name: str) -> tuple[str, bool]:
    """A key MLflow takes: HF's character rule, not a path that resolves elsewhere, <= 250 chars;
    and whether it had to be changed beyond the character rule (too long, or such a path)."""
    key = _BAD_CHARS.sub("_", name)
    if posixpath.normpath(key) != key or key.startswith(("/", "..")):
        key = "_" + key.replace("/", "_")
    if len(key) > MAX_KEY:
        key = f"{key[:MAX_KEY - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return key, key != _BAD_CHARS.sub("_", name)


def metric_name(rank: int | None, subset: str | None, sub_dataset: str | None, name: str) -> str:
    """A series' MLflow name (before MLflow's character rules). The Trainer's (``rank`` None): the
    key HF's MLflowCallback logs (``loss``, ``eval_loss``, ``eval_<set>_loss``, ``train_runtime``).
    Custom metrics: ``<stage>.<name>``, as fms-hf-tuning's MLflow tracker; another rank's under
    ``rank/<n>/``. (The relay's system figures are ``naming.system_key``'s.)"""
    if rank is None or subset is None:
        return "_".join(part for part in (subset, sub_dataset, name) if part)
    return f"{subset}.{name}" if rank == 0 else f"rank/{rank}/{subset}.{name}"


def batches(metrics: list[Any], params: list[Any], tags: list[Any],
            last: list[Any]) -> list[tuple[list[Any], list[Any], list[Any]]]:
    """``log_batch`` calls (metrics, params, tags) within MLflow's limits, in order, with every
    tag of ``last`` together in the final call."""
    calls: list[tuple[list[Any], list[Any], list[Any]]] = []
    call: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    count = size = 0
    for slot, items in ((1, params), (0, metrics), (2, tags)):
        for item in items:
            cost = METRIC_BYTES if slot == 0 else len(item.key) + len(item.value) + 20
            full = (count == MAX_ITEMS or (slot and len(call[slot]) == MAX_PARAMS_TAGS)
                    or size + cost > MAX_BYTES)
            if full:
                calls.append(call)
                call, count, size = ([], [], []), 0, 0
            call[slot].append(item)
            count += 1
            size += cost
    extra = sum(len(t.key) + len(t.value) + 20 for t in last)
    if last and (count + len(last) > MAX_ITEMS or len(call[2]) + len(last) > MAX_PARAMS_TAGS
                 or size + extra > MAX_BYTES):
        calls.append(call)
        call = ([], [], [])
    call[2].extend(last)
    if any(call):
        calls.append(call)
    return calls


def point(m: Any) -> tuple:
    """A point's identity, NaN equal to NaN (as MLflow's SQL stores compare them)."""
    return m.timestamp, m.step, "nan" if m.value != m.value else float(m.value)
