"""What ``relay consume --metrics-bind`` shows: each partition's lease holder, what this relay took
from the partitions it holds, how far behind the stream it is, and their sinks.

The consuming relay's loop writes its stats every second (relay/fleet/consumer.py, ``latest``); a
scrape reads the latest of them and the lease holders its last plan was told
(relay/fleet/ownership.py, ``last_read``), both replaced whole, never changed in place: nothing here
waits for that loop, nor it for a scrape.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.metrics_core import Metric

from relay.fleet.consumer import Consumer
from relay.metrics.table import Families

#: A partition's counters in the stats and the counter each becomes.
PARTITION_COUNTERS = {"messages": "relay_fleet_partition_messages_total",
                      "written": "relay_fleet_partition_events_journaled_total",
                      "duplicates": "relay_fleet_partition_duplicates_total",
                      "bad_lines": "relay_fleet_partition_bad_lines_total"}


class FleetCollector:
    """A prometheus_client collector over one consuming relay."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def collect(self) -> Iterable[Metric]:
        out = Families()
        own = self.consumer.own
        if own is not None:
            for k, holder in own.holders().items():
                if holder is not None:
                    out.add("relay_fleet_partition_holder", 1, k, holder)
        snap: dict[str, Any] | None = self.consumer.latest
        if snap is not None:
            out.add("relay_fleet_errors_total", snap["errors"])
            for k in snap["held"]:
                out.add("relay_fleet_partition_held", 1, k)
            for k, part in snap["partitions"].items():
                out.add("relay_fleet_partition_pending_messages", part["pending"], k)
                out.add("relay_fleet_partition_lag_seconds", part["lag_s"], k)
                for key, name in PARTITION_COUNTERS.items():
                    out.add(name, part[key], k)
                out.add("relay_fleet_partition_refused_total", part["conflict"], k, "conflict")
                for sink, figures in part["sinks"].items():
                    out.add("relay_fleet_partition_sink_queued_events", figures.get("queued"),
                            k, sink)
                    out.add("relay_fleet_partition_sink_lag_seconds", figures.get("lag_s"), k, sink)
                    out.add("relay_fleet_partition_sink_errors_total", figures.get("errors"),
                            k, sink)
        return out.all()
