"""What a tracker shows for each relay series: its name and context, the same for every tracker
sink (sinks/tracker_base.py applies them; docs/plugins.md lists them)."""
from __future__ import annotations

from typing import Any

_SUBSET_PREFIXES = ("train_", "eval_", "test_")

#: Display names of the per-rank figures (stage ``rank``): unit-suffixed and prefixed ``rank_`` so
#: none shares a name (and so a chart) with a Trainer series; other names get ``rank_`` only.
RANK_NAMES = {
    "step_time": "rank_step_time_s", "step_time_max": "rank_step_time_max_s",
    "samples_per_second": "rank_samples_per_s", "steps": "rank_steps_per_log",
    "rss_peak_mb": "rank_rss_peak_mb",
    "own_time": "rank_own_time_s", "outside_time": "rank_outside_time_s",
    "collective_wait": "rank_collective_wait_s", "outside_wait": "rank_outside_wait_s",
    "cpu_percent": "rank_cpu_percent", "memory_percent": "rank_memory_percent",
}
#: Display names of the relay's cross-rank figures (stage ``cluster``); other names get
#: ``cluster_``.
CLUSTER_NAMES = {
    "step_time_min": "cluster_step_time_min_s", "step_time_median": "cluster_step_time_median_s",
    "step_time_max": "cluster_step_time_max_s", "step_time_spread": "cluster_step_time_spread",
    "slowest_rank": "cluster_slowest_rank", "ranks": "cluster_ranks_reporting",
    "own_time_min": "cluster_own_time_min_s", "own_time_median": "cluster_own_time_median_s",
    "own_time_max": "cluster_own_time_max_s", "own_time_spread": "cluster_own_time_spread",
    "own_slowest_rank": "cluster_own_slowest_rank",
}


#: Context key that marks the relay's system figures: ``"rank"`` (one rank's own, with ``rank``) or
#: ``"cluster"`` (the relay's cross-rank figures). Each tracker sink puts them where its UI keeps
#: system figures, away from the Trainer's curves (docs/plugins.md).
SYSTEM = "system"


#: The prefix of the relay's figures in the trackers that group charts by ``/`` prefixes. Not
#: ``system/``: MLflow takes that for its own system metrics and lists them before the Trainer's
#: (issue 44: "System metrics (33)" above the loss on the run page); ``workers/`` is no tracker's
#: own, and sorts after the Trainer's names in every alphabetical list.
WORKERS = "workers"


def system_key(context: dict[str, Any], name: str) -> str:
    """A system figure's path for the trackers that group charts by ``/`` prefixes (MLflow,
    TensorBoard): ``workers/<name>/rank_<n>`` per rank, so the ranks of one figure sit side by side
    in one group, and ``workers/<name>`` for the relay's cross-rank figures."""
    rank = context.get("rank")
    return f"{WORKERS}/{name}" if rank is None else f"{WORKERS}/{name}/rank_{rank}"


def system_name(name: str) -> str:
    """A system figure's display name without its ``rank_``/``cluster_`` prefix, for a tracker whose
    key already says it (W&B's ``rank.<n>.step_time_s``, as its own ``gpu.<i>.<metric>``)."""
    return name.removeprefix("rank_").removeprefix("cluster_")


def display_names(data: dict[str, Any], names: dict[str, str], prefix: str) -> dict[str, Any]:
    """``data`` under the names a tracker shows: ``names``' own, else ``prefix`` + the wire name."""
    return {names.get(key) or prefix + key: value for key, value in data.items()}


def trainer_groups(stage: str, data: dict[str, Any]) -> dict[tuple, tuple[dict, dict]]:
    """Name and context as the trackers' own Hugging Face callbacks would.

    ``train_``/``eval_``/``test_`` prefixes (or the stage itself, for a trainer that already
    split them off) become ``{"subset": ...}``; plain training metrics keep ``{}``. With several
    eval sets (``eval_<set>_loss`` and no ``eval_loss``), ``<set>`` becomes ``sub_dataset``.
    """
    named: list[tuple[str | None, str, Any]] = []
    for key, value in data.items():
        subset = None if stage == "train" else stage
        for prefix in _SUBSET_PREFIXES:
            if key.startswith(prefix):
                subset, key = prefix[:-1], key[len(prefix):]
                break
        named.append((subset, key, value))
    sub_sets: dict[str, str] = {}
    for subset in {s for s, _, _ in named if s is not None}:
        names = {n for s, n, _ in named if s == subset}
        tagged = [n[:-len("_loss")] for n in names if n.endswith("_loss") and len(n) > len("_loss")]
        if "loss" not in names and len(tagged) == 1:
            sub_sets[subset] = tagged[0]
    groups: dict[tuple, tuple[dict, dict]] = {}
    for subset, name, value in named:
        context: dict[str, str] = {}
        if subset is not None:
            context["subset"] = subset
            tag = sub_sets.get(subset)
            if tag is not None and name.startswith(tag + "_"):
                context["sub_dataset"] = tag
                name = name[len(tag) + 1:]
        group = tuple(sorted(context.items()))
        groups.setdefault(group, (context, {}))[1][name] = value
    return groups
