"""A line of a plot in bounded memory: the lowest and highest point of each of at most ``buckets``
runs of consecutive points, so every spike and dip still shows (a mean per bucket would flatten
them; every n-th point would drop them).

Points are folded into buckets of ``width`` a chunk at a time (``min``/``max`` in C); when the
buckets fill up, neighbours merge in pairs and each later bucket takes twice the points. A value
that is not finite leaves a gap where its bucket is, as it does undecimated.
"""
from __future__ import annotations

import math

#: Buckets a line keeps at most (about the width of a plot in pixels).
BUCKETS = 1000
#: Points that wait before they are folded into buckets.
CHUNK = 4096

Point = tuple[int, float]
_NONE: Point = (0, math.nan)


class MinMax:
    """``add(step, value)`` in reading order; ``points()`` to draw, in that order."""

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.limit = buckets
        self.width = 1  # points a bucket takes
        self.seen = 0
        self.decimated = False
        self._steps: list[int] = []  # the points not folded yet (all of them, while there are few)
        self._values: list[float] = []
        # (lowest, highest, step of a gap)
        self._buckets: list[tuple[Point, Point, int | None]] = []
        self._fold_at = 2 * buckets + 1  # pending points at which to fold

    def add(self, step: int, value: float) -> None:
        self._steps.append(step)
        values = self._values
        values.append(value)
        self.seen += 1
        if len(values) >= self._fold_at:
            if not self.decimated:
                self.decimated = True
                self.width = -(-len(values) // self.limit)  # ceil: the buckets fit the limit
                self._fold_at = CHUNK
            self._fold(final=False)

    def points(self) -> list[Point]:
        """The points to draw: all of them, or each bucket's lowest and highest in reading order
        (a NaN where a bucket held a non-finite value)."""
        if not self.decimated:
            return list(zip(self._steps, self._values, strict=True))
        self._fold(final=True)
        out: list[Point] = []
        for low, high, gap in self._buckets:
            kept = {low, high} if low is not _NONE else set()
            if gap is not None:
                kept.add((gap, math.nan))
            out.extend(sorted(kept, key=lambda p: p[0]))
        return out

    def _fold(self, final: bool) -> None:
        """Pending points into buckets of ``width``; a last part bucket waits unless ``final``."""
        steps, values, width = self._steps, self._values, self.width
        whole = len(values) if final else len(values) - len(values) % width
        for start in range(0, whole, width):
            self._buckets.append(_bucket(steps[start:start + width], values[start:start + width]))
        del steps[:whole], values[:whole]
        # (the points still waiting join buckets of the new width)
        while len(self._buckets) > self.limit:
            self._buckets = [_merge(self._buckets[i:i + 2])
                             for i in range(0, len(self._buckets), 2)]
            self.width *= 2


def _bucket(steps: list[int], values: list[float]) -> tuple[Point, Point, int | None]:
    if math.isfinite(sum(values)):  # every value finite (the usual case): min and max in C
        low, high = min(values), max(values)
        return (steps[values.index(low)], low), (steps[values.index(high)], high), None
    points = list(zip(steps, values, strict=True))
    finite = [(step, value) for step, value in points if math.isfinite(value)]
    gap = next((step for step, value in points if not math.isfinite(value)), None)
    if not finite:
        return _NONE, _NONE, gap
    return min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1]), gap


def _merge(pair: list[tuple[Point, Point, int | None]]) -> tuple[Point, Point, int | None]:
    kept = [b for b in pair if b[0] is not _NONE]
    gap = next((b[2] for b in pair if b[2] is not None), None)
    if not kept:
        return _NONE, _NONE, gap
    lowest = min((b[0] for b in kept), key=lambda p: p[1])
    highest = max((b[1] for b in kept), key=lambda p: p[1])
    return lowest, highest, gap
