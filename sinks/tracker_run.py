"""What the sink-author API (sinks/tracker_base.py) keeps of one training run while it writes it:
its applied spans (as saved, and now), its params' times, rank 0's train_end and the ranks whose
closing counters are in."""
from __future__ import annotations

from sinks.spans import SeqSpans


class RunState:
    """What the shared code keeps per run: applied spans (as saved, and now) and param times."""

    __slots__ = ("run", "applied", "saved", "dirty", "param_ts", "world_size", "end_seq",
                 "stats_ranks")

    def __init__(self, run: str, saved: dict[int, list[list[int]]], world_size: int) -> None:
        self.run = run
        self.world_size = world_size
        self.end_seq: int | None = None  # of rank 0's train_end, once applied
        # ranks whose closing counters are in (rank 0's: after train_end)
        self.stats_ranks: set[int] = set()
        self.saved = saved
        self.applied = {rank: SeqSpans(s) for rank, s in saved.items()}
        self.dirty = False
        self.param_ts: dict[tuple[str, str], float] = {}
