"""relay/cli/decimate.py: a plot's line in bounded memory that keeps every spike (no clock, no files)."""
from __future__ import annotations

import math
import random

from relay.cli.decimate import MinMax


def test_few_points_are_kept_exactly() -> None:
    line = MinMax(buckets=10)
    points = [(step, math.sin(step)) for step in range(20)]
    for point in points:
        line.add(*point)
    assert not line.decimated and line.points() == points


def test_a_million_points_keep_every_spike_in_bounded_memory() -> None:
    rng = random.Random(7)
    line = MinMax(buckets=1000)
    spikes = {123_457: 50.0, 654_321: -40.0, 999_998: 30.0}
    for step in range(1_000_000):
        value = spikes.get(step, math.sin(step / 5000) + rng.random() * 0.01)
        if step == 500_000:
            value = math.nan
        line.add(step, value)
        if step % 10_000 == 0:  # what it holds stays bounded
            assert len(line._buckets) <= 1000 and len(line._values) <= 4096 + 2001
    drawn = line.points()
    assert line.decimated and line.seen == 1_000_000
    assert 1000 <= len(drawn) <= 2 * 1000 + 1000  # two points a bucket, and a gap's NaN
    for step, value in spikes.items():
        assert (step, value) in drawn
    steps = [step for step, _ in drawn]
    assert steps == sorted(steps)
    assert [step for step, value in drawn if value != value] == [500_000]  # the NaN is a gap where it was
    finite = [value for _, value in drawn if value == value]
    assert min(finite) == -40.0 and max(finite) == 50.0
