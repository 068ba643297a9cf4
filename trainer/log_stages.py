"""A training log's figures by stage: what the Trainer's ``on_log`` and an accelerate loop's
``accelerator.log`` hand over, as the relay's ``metrics`` events carry them (``eval_loss`` is
``loss`` in stage ``eval``). Imports neither transformers nor accelerate: both trackers share it."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_LOG_PREFIXES = (("eval_", "eval"), ("test_", "test"))
#: log key -> (stage, name): a Trainer's keys repeat every step
_STAGE_OF: dict[str, tuple[str, str]] = {}


def _stage_of(key: str) -> tuple[str, str]:
    hit = _STAGE_OF.get(key)
    if hit is None:
        hit = ("train", key)
        for prefix, prefix_stage in _LOG_PREFIXES:
            if key.startswith(prefix):
                hit = (prefix_stage, key[len(prefix):])
                break
        if len(_STAGE_OF) < 4096:
            _STAGE_OF[key] = hit
    return hit


def split_logs(logs: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Trainer logs -> {stage: {name: number}}: ``eval_loss`` becomes ``loss`` in stage ``eval``.

    Training summaries (``train_runtime``, ``train_loss``) keep their names so they never
    collide with the per-step ``loss`` curve; non-numeric entries are left out. This runs on
    rank 0's training thread at every log, so the per-key work is a cached lookup.
    """
    out: dict[str, dict[str, float]] = {}
    for key, value in logs.items():
        kind = type(value)
        exact = kind is float or kind is int  # the usual case, decided without isinstance
        if not exact and (kind is bool or not isinstance(value, (int, float))):
            continue
        if key == "epoch":
            continue  # the epoch travels in the envelope
        stage, name = _STAGE_OF.get(key) or _stage_of(key)
        metrics = out.get(stage)
        if metrics is None:
            metrics = out[stage] = {}
        metrics[name] = value
    return out
