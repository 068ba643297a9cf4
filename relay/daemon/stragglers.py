"""Who costs the job, and how much: the straggler rule (docs/watching.md, "What a straggler costs
the job"; relay/daemon/cross_rank.py settles the steps and calls it).

The verdict is taken over a window of a rank's logged steps, never step by step: under load one
rank descheduled for a step costs a balanced job 50% of that step. Also the spread of a figure
across the ranks of a step (``spread``). Pure functions of the figures given: no clock, no state
but each rank's window (``Seen``).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StragglerRule:
    #: a rank's step is slow when its excess is at least this fraction of the job's time per step
    cost: float = 0.10
    #: ... and at least this many seconds
    min_excess: float = 0.020
    #: the training steps a verdict spans (at least 3 logged steps)
    window: int = 15
    #: a rank is named only when its window's median excess is at least this many times the median
    #: distance of its excesses from that median: slow step after step, not swinging
    steadiness: float = 1.5


class Mark:
    """One logged step of a rank as the rule sees it."""

    __slots__ = ("excess", "cost", "span")

    def __init__(self, excess: float, cost: float, span: int) -> None:
        self.excess, self.cost, self.span = excess, cost, span


class Seen:
    """A rank's last logged steps, enough for any window; memory bounded by ``window``."""

    __slots__ = ("marks", "cost")

    def __init__(self, rule: StragglerRule) -> None:
        self.marks: deque[Mark] = deque(maxlen=max(3, rule.window))
        self.cost: float | None = None  # the window's median cost when last judged

    def window(self, rule: StragglerRule) -> tuple[list[Mark], int]:
        """The newest marks that span ``rule.window`` training steps (or all there are), and how
        many logged steps the window holds, counting those not logged yet (at least 3)."""
        taken: list[Mark] = []
        spanned = 0
        for mark in reversed(self.marks):
            if spanned >= rule.window and len(taken) >= 3:
                break
            taken.append(mark)
            spanned += mark.span
        newest = taken[0].span if taken else 1
        missing = max(0, math.ceil((rule.window - spanned) / max(newest, 1)))
        return taken, max(3, len(taken) + missing)

    def judge(self, rule: StragglerRule, named: bool) -> tuple[bool, float, float]:
        """Whether the window names the rank (``named`` False) or ends its episode (``named`` True),
        and its median excess and cost."""
        marks, size = self.window(rule)
        excess = statistics.median(m.excess for m in marks)
        if named:
            calm = sum(m.cost < rule.cost / 2 or m.excess < rule.min_excess / 2 for m in marks)
            verdict = 2 * calm > size
        else:
            slow = [m.cost >= rule.cost and m.excess >= rule.min_excess for m in marks]
            swing = statistics.median(abs(m.excess - excess) for m in marks)
            verdict = (2 * len(marks) >= size and 2 * sum(slow) > len(marks) and slow[0]
                       and excess >= rule.steadiness * swing)
        self.cost = statistics.median(m.cost for m in marks)
        return verdict, excess, self.cost

    def clear(self) -> None:
        self.marks.clear()
        self.cost = None


def seconds(data: dict[str, Any], name: str = "step_time") -> float | None:
    """A rank's figure ``name`` if it is usable: a finite number of seconds, not negative."""
    value: Any = data.get(name)
    # (a bool is not a figure)
    if type(value) in (int, float) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def excess(values: dict[int, float]) -> dict[int, float]:
    """Each rank's figure less the median of the other ranks' (at least two ranks): O(1) a rank
    once the figures are sorted, so a step of thousands of ranks costs what sorting them does."""
    order = sorted(values.values())
    n = len(order)
    index: dict[float, int] = {}
    for i, value in enumerate(order):
        index.setdefault(value, i)  # (equal figures: any of their places gives the same medians)
    out = {}
    low, high = (n - 2) // 2, (n - 1) // 2  # the middle of the n - 1 others
    for rank, value in values.items():
        i = index[value]
        others = [order[k] if k < i else order[k + 1] for k in (low, high)]
        out[rank] = value - (others[0] + others[1]) / 2
    return out


def period(times: dict[int, float], outside: dict[int, float]) -> float:
    """The job's time per step: the slowest rank's step time plus its time between steps."""
    return max(took + outside.get(rank, 0.0) for rank, took in times.items())


def spread(figures: dict[int, float], name: str) -> dict[str, Any]:
    """min, median, max, spread (max / median) and the slowest rank (the lowest among equals:
    ``figures`` is in rank order) of one figure across the ranks."""
    median = statistics.median(figures.values())
    slowest = max(figures, key=figures.__getitem__)
    longest = figures[slowest]
    ratio = longest / median if median > 0 else (1.0 if longest == 0 else math.inf)
    return {f"{name}_min": min(figures.values()), f"{name}_median": median, f"{name}_max": longest,
            f"{name}_spread": ratio, f"{name}_slowest": slowest}
