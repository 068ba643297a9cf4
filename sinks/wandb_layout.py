"""Where each relay event lands in a W&B run, as W&B's own Hugging Face callback
(``transformers.integrations.WandbCallback``) lays a run out (docs/sinks/wandb.md, "What lands
where"). No W&B call here: sinks/wandb.py makes them.
"""
from __future__ import annotations

import json
import math
from typing import Any

from sinks.base import PermanentError
from sinks.naming import system_name

STEP_KEY = "train/global_step"  # the x-axis of W&B's own Hugging Face callback
# with ``train_*``: what W&B's HF callback keeps as summary
SUMMARY_ONLY = frozenset({"total_flos"})
# W&B drops or overwrites these
RESERVED = frozenset({"", "_step", "_runtime", "_timestamp", "_wandb"})


def row_and_summary(rank: int | None, context: dict[str, Any],
                    values: dict[str, float | int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A non-system group's values as history-row keys and summary keys."""
    row, summary = {}, {}
    subset, sub_set = context.get("subset"), context.get("sub_dataset")
    for name, value in values.items():
        if name in RESERVED:
            raise PermanentError(f"W&B reserves the metric name {name!r}")
        if rank is None:  # the Trainer's series, named as W&B's HF callback's rewrite_logs does
            if subset == "train" or (subset is None and name in SUMMARY_ONLY):
                summary[name if subset is None else f"train_{name}"] = value
            elif subset is None:
                row[f"train/{name}"] = value
            else:
                row[f"{subset}/{sub_set}_{name}" if sub_set else f"{subset}/{name}"] = value
        elif rank == 0:  # custom metrics: fms-hf-tuning's plain names (``track()`` from rank 0)
            row[name if subset == "additional_metrics" else f"{subset}/{name}"] = value
        else:  # another rank's: beside its per-rank figures, never in their way
            row[f"rank/{rank}/{subset}/{name}"] = value
    return row, summary


def config_update(name: str, params: dict[str, Any], hparams: dict[str, Any]) -> dict[str, Any]:
    """A params group as config keys: ``hparams`` (the Trainer's arguments) and ``model`` at the
    top, the arguments winning a key they share (the HF callback's ``{**model_config, **args}``),
    ``peft`` as ``peft_config``, ``model_info``'s ``num_parameters`` as ``model/num_parameters``;
    any other group one flat key per value (``experiment_metadata.dataset``), so an instance never
    replaces a sibling."""
    if name == "hparams":
        return params
    if name == "model":
        return {key: value for key, value in params.items() if key not in hparams}
    if name == "peft":
        return {"peft_config": params}
    if name == "model_info" and "num_parameters" in params:
        return {"model/num_parameters": params["num_parameters"]}
    return {f"{name}.{key}": value for key, value in params.items()}


def stats_items(context: dict[str, Any], values: dict[str, float | int]) -> dict[str, str]:
    """System figures as a stats record's items (JSON values): ``rank.<n>.<figure>`` per rank,
    ``cluster.<figure>`` for the relay's cross-rank ones."""
    rank = context.get("rank")
    prefix = "cluster." if rank is None else f"rank.{rank}."
    return {prefix + system_name(name): json.dumps(value if math.isfinite(value) else str(value))
            for name, value in values.items()}
