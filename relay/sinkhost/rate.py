"""A growing count's rate over the last N seconds, for the relay's counters and each sink's
queue."""
from __future__ import annotations

import collections
import time

SAMPLES = 600  # per-second samples a Rate keeps: rates over up to ten minutes


class Rate:
    """Per-second samples of a growing count, for "per second over the last N seconds"."""

    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=SAMPLES)
        self.sample(time.monotonic(), 0)  # counting starts now

    def sample(self, now: float, count: int) -> None:
        self.samples.append((now, count))

    def per_s(self, now: float, count: int, window: float) -> float:
        """The rate from the newest sample at least ``window`` old (else the oldest) until now."""
        since = None
        for t, c in reversed(self.samples):
            since = (t, c)
            if now - t >= window:
                break
        if since is None or now <= since[0]:
            return 0.0
        return (count - since[1]) / (now - since[0])

    def since(self, count: int) -> float | None:
        """When the count first passed ``count`` (the monotonic time of the first sample above it);
        None if no sample is above it yet."""
        for t, c in self.samples:
            if c > count:
                return t
        return None
