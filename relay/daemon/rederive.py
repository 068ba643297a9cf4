"""The relay's own events for a spool replayed into a journal (``relay replay SPOOL --sink jsonl``;
docs/trainer.md says how it differs from a live relay): the live relay's derivation
(relay/daemon/cross_rank.py), restored first from the journal's last lines, so nothing the live
relay said is said again. No clock of its own: each event counts as heard at its own ``ts``, and
the timers are not run, since files are read in their order, not the order the ranks sent in."""
from __future__ import annotations

from typing import Any

from relay.daemon.cross_rank import Cluster, ClusterConfig
from relay.wire.lines import Derived


class SpoolDerivation:
    """A ``relay.sinkhost.replay.Derivation`` made of the relay's cross-rank derivation."""

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.cluster = Cluster(config or ClusterConfig())
        self.last = 0.0  # the latest ts read: the replay's "now"

    def meet(self, run: str, recent: list[dict[str, Any]]) -> None:
        self.last = max([self.last] + [e["ts"] for e in recent])
        self.cluster.restore(recent, self.last)

    def take(self, events: list[dict[str, Any]]) -> list[Derived]:
        out: list[Derived] = []
        cluster = self.cluster
        for event in events:
            self.last = max(self.last, event["ts"])
            if event["type"] == "metrics" and event["stage"] == "rank":
                out += cluster.observe(event, event["ts"])
            elif event["type"] == "lifecycle":
                cluster.ended(event, event["ts"])
        return out

    def finish(self) -> list[Derived]:
        cluster = self.cluster
        out: list[Derived] = []
        # an ended run: the ranks it left behind are lost, its steps settled
        for run in list(cluster.runs):
            out += cluster.close(run, self.last)
        # any other run's waiting steps
        return out + cluster.check(self.last + cluster.config.silence + 1)
