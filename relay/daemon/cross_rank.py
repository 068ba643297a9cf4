"""What the relay derives across ranks from each rank's step time and own work: the ``cluster``
metrics, ``straggler``/``straggler_cleared`` and ``rank_lost``/``rank_back`` (docs/protocol.md,
"Events the relay derives"; the rules in docs/relay.md, "What the relay derives").

No sockets, files or clock of its own: ingest (relay/daemon/ingest.py) hands ``observe`` each new
``stage="rank"`` metrics event with the time it arrived, calls ``check`` about once a second, and
journals what either returns as events of rank RELAY_RANK; after a restart ``restore`` replays the
run's recent journal lines so nothing is said twice. Each rank sends in order, so a later step
completing settles every earlier one. ``end_grace`` is for a healthy end, where rank 0's
``train_end`` may arrive before a peer's last step; a run that never ended is not judged when the
relay stops (a restart mid-run must not call a rank in flight lost).
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from relay.daemon.cluster_state import ClusterRank, ClusterRun, ClusterStep
from relay.daemon.stragglers import Mark, StragglerRule, excess, period, seconds, spread
from relay.wire.lines import Derived
from sinks.events import RELAY_RANK, attempt_of

#: Reports one run may hold for steps still waiting for their other ranks; past it the oldest step
#: is settled as it stands. Memory per run stays bounded whatever its ranks send.
MAX_WAITING = 16_384


@dataclass(frozen=True)
class ClusterConfig:
    #: who is a straggler: relay/daemon/stragglers.py
    stragglers: StragglerRule = StragglerRule()
    #: seconds without a report after which a rank whose peers went on is lost
    silence: float = 60.0
    #: seconds after a run's end within which a rank behind its peers may still report its last
    #: steps
    end_grace: float = 5.0


class Standing(NamedTuple):
    """What the derivation holds of one run now: the ranks named stragglers and not cleared since,
    the ranks lost and not back, and each judged rank's cost to the job, the median over its window
    (the Prometheus endpoint reads it, relay/metrics/)."""

    stragglers: tuple[int, ...]
    lost: tuple[int, ...]
    costs: tuple[tuple[int, float], ...] = ()


class Cluster:
    """Per-run derivation state; memory per run is bounded by its reporting ranks and MAX_WAITING
    reports, and a run is dropped with ``forget`` when the relay forgets it."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.runs: dict[str, ClusterRun] = {}

    def observe(self, event: dict[str, Any], now: float) -> list[Derived]:
        """A new ``stage="rank"`` metrics event that arrived at ``now``; what it settles."""
        world_size, rank = event["world_size"], event["rank"]
        if world_size < 2 or rank >= world_size:
            return []
        run = self.runs.get(event["run"])
        attempt = attempt_of(event["seq"])
        if run is not None and attempt != run.attempt:
            if attempt < run.attempt:
                return []  # a late report of an attempt a resumed job replaced
            # a resumed job's first report: its steps go back to its checkpoint's, start afresh
            run = None
        if run is None:
            run = self.runs[event["run"]] = ClusterRun(world_size, now)
            run.attempt = attempt
        run.world_size = world_size
        run.active = now
        info = run.ranks.get(rank)
        if info is None:
            info = run.ranks[rank] = ClusterRank(now, self.config.stragglers)
        out: list[Derived] = []
        step = event["step"]
        if info.lost:
            info.lost = False
            run.lost -= 1
            out.append(self._lifecycle(event["run"], run, step, event="rank_back", rank=rank,
                                       silent_s=round(now - info.last_seen, 3)))
        info.last_seen = now
        if step is None:
            return out
        info.last_step = max(info.last_step, step)
        if event["epoch"] is not None:
            run.epoch = event["epoch"]
        if step <= run.done:
            return out
        entry = run.pending.get(step)
        if entry is None:
            entry = run.pending[step] = ClusterStep(event["epoch"], now)
            heapq.heappush(run.order, step)
        if rank in entry.times:
            return out
        entry.times[rank] = seconds(event["data"])
        data = event["data"]
        own, outside = seconds(data, "own_time"), seconds(data, "outside_time")
        span = data.get("steps")
        if own is not None:
            entry.own[rank] = own
        if outside is not None:
            entry.outside[rank] = outside
        if type(span) is int and span > entry.span:
            entry.span = span
        run.waiting += 1
        if len(entry.times) >= run.world_size - run.lost:
            out += self._settle(event["run"], run, step)
        elif run.waiting > MAX_WAITING:
            out += self._settle(event["run"], run, run.order[0])
        return out

    def ended(self, event: dict[str, Any], now: float) -> None:
        """A new ``lifecycle`` event that arrived at ``now``: a ``train_end`` (any status) ends the
        run, and its rank finished. What it means for the other ranks is said later (``check``)."""
        run = self.runs.get(event["run"])
        rank = event["rank"]
        if run is None or event["data"].get("event") != "train_end" or rank >= run.world_size:
            return  # (a run of no per-rank figures has no rank to judge)
        info = run.ranks.get(rank)
        if info is None:
            info = run.ranks[rank] = ClusterRank(now, self.config.stragglers)
        info.ended = True
        if run.ended is None:
            run.ended = now
            # a rank killed before any report of it got out: judged with the rest
            for other in range(run.world_size):
                if other not in run.ranks:
                    run.ranks[other] = ClusterRank(run.began, self.config.stragglers)
        if event["data"].get("status") == "failed":
            run.failed = True

    def check(self, now: float) -> list[Derived]:
        """The timers: ranks silent for ``silence`` seconds while a peer went on to a later step
        are lost, and so are ranks an ended run left behind (see ``ended``); steps that waited
        ``silence`` are settled as they stand."""
        silence = self.config.silence
        out: list[Derived] = []
        for name, run in self.runs.items():
            # else nobody went on: the run ended, or paused as a whole
            if now - run.active <= silence:
                out += self._find_lost(name, run, now)
            if run.ended is not None and now - run.ended > self.config.end_grace:
                out += self._left_behind(name, run, now, self.config.end_grace)
            if run.pending:
                reporting = run.world_size - run.lost
                ready = [step for step, entry in run.pending.items()
                         if len(entry.times) >= reporting or now - entry.since > silence]
                if ready:
                    out += self._settle(name, run, max(ready))
        return out

    def restore(self, events: Iterable[dict[str, Any]], now: float) -> None:
        """Rebuild the state of the runs of ``events``, a run's recent journal lines (a restarted
        relay, or a run it had forgotten), publishing nothing: the relay's own events there say what
        was settled and said already. The ranks count as heard from ``now``."""
        for event in events:
            if event["rank"] == RELAY_RANK:
                self._replay(event, now)
            elif event["type"] == "metrics" and event["stage"] == "rank":
                self.observe(event, now)
            elif event["type"] == "lifecycle":
                self.ended(event, now)

    def close(self, run: str, now: float) -> list[Derived]:
        """The relay is about to forget ``run`` or to stop: if it ended, the ranks it left behind
        are lost now, without the grace, and the steps still waiting are settled as they stand."""
        state = self.runs.get(run)
        if state is None or state.ended is None:
            return []
        out = self._left_behind(run, state, now, -math.inf)
        if state.order:
            out += self._settle(run, state, max(state.order))
        return out

    def forget(self, run: str) -> None:
        self.runs.pop(run, None)

    def standing(self, run: str) -> Standing | None:
        """``run``'s stragglers and lost ranks now (None: a run this derivation does not follow).
        The one reader of the per-rank state from outside: another thread may call it."""
        state = self.runs.get(run)
        if state is None:
            return None
        # a copy first: the ingest thread may add a rank meanwhile
        ranks = sorted(dict(state.ranks).items())
        return Standing(tuple(rank for rank, info in ranks
                              if info.named is not None and not info.lost),
                        tuple(rank for rank, info in ranks if info.lost),
                        tuple((rank, info.seen.cost) for rank, info in ranks
                              if info.seen.cost is not None and not info.lost))

    def _find_lost(self, name: str, run: ClusterRun, now: float) -> list[Derived]:
        silence = self.config.silence
        ahead = max((r.last_step for r in run.ranks.values() if now - r.last_seen <= silence),
                    default=-1)
        out = []
        for rank, info in run.ranks.items():
            if not info.lost and now - info.last_seen > silence and info.last_step < ahead:
                out += self._lost(name, run, rank, info, ahead, now, "silent")
        return out

    def _left_behind(self, name: str, run: ClusterRun, now: float, grace: float) -> list[Derived]:
        """The ranks of ended ``run`` that did not end themselves, are behind the furthest step (or
        the run failed) and have been silent ``grace`` seconds since the end: lost."""
        assert run.ended is not None
        ahead = max(r.last_step for r in run.ranks.values())
        return [derived for rank, info in run.ranks.items()
                if not (info.lost or info.ended) and (info.last_step < ahead or run.failed)
                and now - max(info.last_seen, run.ended) > grace
                for derived in self._lost(name, run, rank, info, ahead, now, "ended")]

    def _lost(self, name: str, run: ClusterRun, rank: int, info: ClusterRank, ahead: int,
              now: float, why: str) -> list[Derived]:
        """``rank`` is lost (``why``: silent while its peers went on, or the run ended without it);
        a straggler episode of it ends with it."""
        info.lost = True
        run.lost += 1
        out = [self._lifecycle(name, run, ahead, event="rank_lost", rank=rank, why=why,
                               silent_s=round(now - info.last_seen, 3),
                               last_step=info.last_step, peers_step=ahead)]
        if info.named is not None:
            out.append(self._lifecycle(name, run, ahead, event="straggler_cleared", rank=rank,
                                       why="lost", named_step=info.named))
            info.named = None
        info.seen.clear()
        return out

    def _settle(self, name: str, run: ClusterRun, upto: int) -> list[Derived]:
        """Sum up every waiting step up to ``upto``, in order."""
        out = []
        for step, entry in self._drop(run, upto):
            out += self._figures(name, run, step, entry)
        return out

    @staticmethod
    def _drop(run: ClusterRun, upto: int) -> list[tuple[int, ClusterStep]]:
        """Take the waiting steps up to ``upto`` out of ``run``, oldest first; they are settled."""
        taken = []
        order = run.order
        while order and order[0] <= upto:
            step = heapq.heappop(order)
            entry = run.pending.pop(step)
            run.waiting -= len(entry.times)
            taken.append((step, entry))
        run.done = max(run.done, upto)
        return taken

    def _figures(self, name: str, run: ClusterRun, step: int, entry: ClusterStep) -> list[Derived]:
        times = {rank: t for rank, t in sorted(entry.times.items()) if t is not None}
        if not times:
            return []
        figures = spread(times, "step_time")
        figures["slowest_rank"] = figures.pop("step_time_slowest")
        # Judged by own work only when every rank with a step time sent its own work too.
        all_sent = entry.own.keys() >= times.keys()
        own = {rank: entry.own[rank] for rank in times} if all_sent else None
        if own:
            figures.update(spread(own, "own_time"))
            figures["own_slowest_rank"] = figures.pop("own_time_slowest")
        basis, by = (own, "own_time") if own else (times, "step_time")
        if len(basis) < 2:
            figures["ranks"] = len(entry.times)
            return [Derived(name, run.world_size, "metrics", step, entry.epoch, figures)]
        job = period(times, entry.outside)
        over = {rank: (extra, extra / job if job > 0 else 0.0)
                for rank, extra in excess(basis).items()}
        costly = max(over, key=lambda rank: over[rank][0])
        figures.update(cost_rank=costly, cost_s=over[costly][0], cost=over[costly][1],
                       ranks=len(entry.times))
        out = [Derived(name, run.world_size, "metrics", step, entry.epoch, figures)]
        rule = self.config.stragglers
        for rank, (extra, share) in over.items():
            info = run.ranks[rank]
            info.seen.marks.append(Mark(extra, share, entry.span))
            decided, cost_s, cost = info.seen.judge(rule, info.named is not None)
            if not decided:
                continue
            said = {"by": by, "cost_s": cost_s, "cost": cost}
            if info.named is None:
                info.named = step
                own_time = {"own_time": basis[rank]} if own else {}
                out.append(self._lifecycle(
                    name, run, step, epoch=entry.epoch, event="straggler", rank=rank, **said,
                    **own_time,
                    step_time=times[rank], others_median=basis[rank] - extra, job_step_s=job,
                    window=rule.window))
            else:
                out.append(self._lifecycle(
                    name, run, step, epoch=entry.epoch, event="straggler_cleared", rank=rank,
                    why="recovered", named_step=info.named, **said, window=rule.window))
                info.named = None
        return out

    def _replay(self, event: dict[str, Any], now: float) -> None:
        """One of the relay's own events read back from the journal: what it settled or said."""
        run = self.runs.get(event["run"])
        if run is None:
            run = self.runs[event["run"]] = ClusterRun(event["world_size"], now)
        data, step = event["data"], event["step"]
        if event["type"] == "metrics" and type(step) is int:
            self._drop(run, step)
            return
        rank = data.get("rank")
        if event["type"] != "lifecycle" or type(rank) is not int:
            return
        info = run.ranks.get(rank)
        if info is None:
            info = run.ranks[rank] = ClusterRank(now, self.config.stragglers)
        what = data.get("event")
        if what == "straggler":  # said once: not again in this episode
            info.named = step if type(step) is int else run.done
            info.seen.cost = seconds(data, "cost") if info.seen.cost is None else info.seen.cost
        elif what == "straggler_cleared":  # (what its window held before is not what came since)
            info.named = None
            info.seen.clear()
        elif what == "rank_lost" and not info.lost:
            info.lost = True
            run.lost += 1
        elif what == "rank_back" and info.lost:
            info.lost = False
            run.lost -= 1

    def _lifecycle(self, name: str, run: ClusterRun, step: int | None, epoch: float | None = None,
                   **data: Any) -> Derived:
        epoch = run.epoch if epoch is None else epoch
        return Derived(name, run.world_size, "lifecycle", step, epoch, data)

