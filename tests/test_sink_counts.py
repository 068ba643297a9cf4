"""The counters a sink's process reports, summed over its restarts (relay/sinkhost/counts.py)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from relay.sinkhost.child import SinkWriter
from relay.sinkhost.counts import ChildCounts
from sinks.base import Sink
from sinks.events import Event


class Idle(Sink):
    name = "idle"

    def write(self, events: Sequence[Event]) -> None:
        """Never called: only the child's report of its counters is read."""


def test_a_childs_message_becomes_its_counts_and_the_rest_of_it_is_left_out() -> None:
    message = {"written": 5, "dropped": 2, "dead_lettered": 1, "caught_up": 7, "sink": {"runs": 1}, "open": True}
    counts = ChildCounts.of(message)
    assert counts == ChildCounts(written=5, dropped=2, dead_lettered=1, caught_up=7)
    assert counts.resolved == 8  # caught-up events were not handed over: not in flight either way


def test_counts_add_field_by_field_over_restarts() -> None:
    first = ChildCounts(written=3, errors=1, catch_up_passes=2, incomplete_closes=1)
    second = ChildCounts(written=4, deadletter_overflow=1, incomplete_flushes=2)
    assert (first + second).as_dict() == {"written": 7, "errors": 1, "dropped": 0, "dead_lettered": 0,
                                          "deadletter_overflow": 1, "caught_up": 0, "catch_up_passes": 2,
                                          "incomplete_flushes": 2, "incomplete_closes": 1}


def test_every_count_the_relay_sums_is_one_a_child_reports() -> None:
    """A field added here but not to the child's stats (or a counter the child renamed) would read 0 forever."""
    report = SinkWriter("idle", Idle(), 10, None).stats()
    assert {field.name for field in dataclasses.fields(ChildCounts)} <= set(report), report
