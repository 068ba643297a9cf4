"""A sink process's counters that add up over its restarts: what each child reports, as one typed
record, so the relay's side sums and confirms them by field, never by lists of key names."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChildCounts:
    """Events a sink's process wrote, dropped, dead-lettered or caught up, and its errors."""

    written: int = 0
    errors: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    deadletter_overflow: int = 0
    caught_up: int = 0
    catch_up_passes: int = 0
    incomplete_flushes: int = 0  # the sink said a flush did not complete within its deadline
    incomplete_closes: int = 0  # ... or a close; or the close overran it

    @classmethod
    def of(cls, message: dict[str, Any]) -> ChildCounts:
        """The counters of a child's stats message (relay/sinkhost/child.py); a field it lacks is
        0."""
        return cls(**{f.name: int(message.get(f.name, 0)) for f in dataclasses.fields(cls)})

    def __add__(self, other: ChildCounts) -> ChildCounts:
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)
        return ChildCounts(*(a + b for a, b in pairs))

    @property
    def resolved(self) -> int:
        """Events the child is done with, one way or another (the rest it was given are in
        flight)."""
        return self.written + self.dropped + self.dead_lettered

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
