"""Which seqs of one rank a sink already applied, as compact spans: what makes a retried batch,
a restarted relay or a second ``relay replay`` add nothing, and what shows a hole to catch up."""
from __future__ import annotations

import bisect
import math

from sinks.events import starts_session


class SeqSpans:
    """The seqs applied for one rank, as sorted disjoint ``[start, end)`` spans.

    In order, without loss, this stays a single span, so membership and insertion are O(1);
    holes (events that have not reached the sink yet) cost one span each.
    """

    __slots__ = ("spans",)

    def __init__(self, spans: list[list[int]] | None = None) -> None:
        self.spans: list[list[int]] = [[int(a), int(b)] for a, b in spans or []]

    def __contains__(self, seq: int) -> bool:
        spans = self.spans
        if spans and spans[-1][0] <= seq < spans[-1][1]:
            return True
        i = bisect.bisect_right(spans, [seq, math.inf]) - 1
        return i >= 0 and spans[i][0] <= seq < spans[i][1]

    def add(self, seq: int) -> bool:
        """Record ``seq`` (not already present); True when this opens a new hole below it (the gap
        before a session's first seq, an attempt's or a restart's, is none: the earlier one's
        numbers end where it stopped)."""
        spans = self.spans
        if spans and spans[-1][1] == seq:
            spans[-1][1] = seq + 1
            return False
        if not spans or seq > spans[-1][1]:
            spans.append([seq, seq + 1])
            return not starts_session(seq)
        i = bisect.bisect_right(spans, [seq, math.inf])
        if i > 0 and spans[i - 1][1] == seq:
            spans[i - 1][1] = seq + 1
            if i < len(spans) and spans[i][0] == seq + 1:
                spans[i - 1][1] = spans.pop(i)[1]
        elif i < len(spans) and spans[i][0] == seq + 1:
            spans[i][0] = seq
        else:
            spans.insert(i, [seq, seq + 1])
        return False

    @property
    def holes(self) -> bool:
        """Whether some seq below the highest applied one is missing (but for the gaps before the
        first seqs of its sessions: attempts, restarts)."""
        return any(not starts_session(start) for start, _ in self.spans)
