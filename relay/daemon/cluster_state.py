"""What the cross-rank derivation (relay/daemon/cross_rank.py) holds of each run: its ranks, the
logged steps still waiting for some of them, and where the run stands. Plain state with slots, no
judging: ``Cluster`` reads and moves it.
"""
from __future__ import annotations

from relay.daemon.stragglers import Seen, StragglerRule


class ClusterRank:
    """One rank of a run, as its reports and its peers' say."""

    __slots__ = ("last_step", "last_seen", "seen", "named", "lost", "ended")

    def __init__(self, now: float, rule: StragglerRule) -> None:
        self.last_step = -1  # the highest step it reported
        self.last_seen = now  # when it last reported anything
        self.seen = Seen(rule)  # its last logged steps' cost to the job
        #: the step it was named a straggler at; None: not straggling now
        self.named: int | None = None
        self.lost = False
        self.ended = False  # it sent its own train_end


class ClusterStep:
    """One logged step's reports, until every rank not lost sent its own."""

    __slots__ = ("times", "own", "outside", "span", "epoch", "since")

    def __init__(self, epoch: float | None, now: float) -> None:
        #: rank -> its step time (None: reported, no usable figure)
        self.times: dict[int, float | None] = {}
        #: rank -> its own work, from the ranks that sent a usable one
        self.own: dict[int, float] = {}
        self.outside: dict[int, float] = {}  # rank -> its time between steps, where it sent one
        self.span = 1  # the training steps the logged step sums up (the ranks' ``steps``)
        self.epoch = epoch
        self.since = now


class ClusterRun:
    """One run: its ranks, its steps still waiting, and its lifecycle."""

    __slots__ = ("world_size", "ranks", "pending", "order", "waiting", "done", "lost", "epoch",
                 "began", "active", "ended", "failed", "attempt")

    def __init__(self, world_size: int, now: float) -> None:
        self.world_size = world_size
        self.ranks: dict[int, ClusterRank] = {}
        self.pending: dict[int, ClusterStep] = {}
        self.order: list[int] = []  # the steps of ``pending``, a heap: settled oldest first
        self.waiting = 0  # reports held in ``pending``
        #: steps up to here are settled: later reports of them are late, and ignored
        self.done = -1
        self.lost = 0  # ranks now lost
        self.epoch: float | None = None
        self.began = now  # when the first rank reported
        self.active = now  # when any rank last reported
        self.ended: float | None = None  # when the first train_end came
        #: of the run's ranks' reports (sinks/events.py attempt_of): a later one starts afresh
        self.attempt = 0
        #: a train_end said status "failed": each rank that lived through it sends one
        self.failed = False
