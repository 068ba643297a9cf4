"""``relay serve``'s options of the cross-rank derivation (relay/daemon/cross_rank.py): on or off,
the straggler rule's bars (relay/daemon/stragglers.py, docs/watching.md) and when a rank is lost."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from relay.daemon.cross_rank import ClusterConfig

_OPTIONS = [
    click.option("--cluster/--no-cluster", default=True, show_default=True,
                 help="Derive cross-rank events from the ranks' step times (stage 'rank'): per "
                      "logged step the min/median/max step time and slowest rank (stage "
                      "'cluster'), stragglers, lost ranks."),
    click.option("--straggler-cost", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.10,
                 show_default=True, metavar="FRACTION",
                 help="A rank's logged step is slow when its own work beyond the other ranks' "
                      "median costs the job this fraction of its time per step; named a straggler "
                      "when over half of its window is slow, cleared when over half costs under "
                      "half of this (docs/watching.md)."),
    click.option("--straggler-min", type=click.FloatRange(0.0), default=0.020, show_default=True,
                 metavar="SECONDS",
                 help="... and that excess is at least this many seconds a step."),
    click.option("--straggler-window", type=click.IntRange(1), default=15, show_default=True,
                 metavar="STEPS",
                 help="The training steps a straggler verdict spans (at least 3 logged steps)."),
    click.option("--rank-silence", type=click.FloatRange(1.0), default=60.0, show_default=True,
                 metavar="SECONDS",
                 help="A rank silent this long while its peers went on to later steps gets "
                      "'rank_lost' ('rank_back' when it reports again); a step also waits at most "
                      "this long for its ranks. Keep it above the time between logged steps."),
]


def cluster_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options, in the order ``--help`` lists them."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def cluster_config(cluster: bool, straggler_cost: float, straggler_min: float,
                   straggler_window: int, rank_silence: float) -> ClusterConfig | None:
    """What the options ask for (None: ``--no-cluster``)."""
    from relay.daemon.cross_rank import ClusterConfig
    from relay.daemon.stragglers import StragglerRule

    if not cluster:
        return None
    return ClusterConfig(StragglerRule(straggler_cost, straggler_min, straggler_window),
                         rank_silence)
