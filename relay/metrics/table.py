"""Every metric the endpoint may show: name, type, labels and help, in one table (docs/monitoring.md
shows the same table and the naming conventions; tests/test_metrics.py holds the two and the
exposition to each other). A counter's name ends in ``_total``, which the client library adds to
its samples too. Families of no sample are left out of a scrape.
"""
from __future__ import annotations

from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric


class Spec(NamedTuple):
    type: str  # counter or gauge
    labels: tuple[str, ...]
    help: str


_RUN, _RANK, _STAT = ("run",), ("run", "rank"), ("run", "stat")
_SINK, _PART = ("sink",), ("partition",)

TABLE: dict[str, Spec] = {
    # -- each run (relay serve) --------------------------------------------------------------------
    "relay_run_last_step": Spec("gauge", _RUN, "The highest step any rank of the run reported."),
    "relay_run_last_step_timestamp_seconds": Spec(
        "gauge", _RUN, "Unix time at which the relay received the run's last step."),
    "relay_run_seconds_since_last_step": Spec(
        "gauge", _RUN, "Seconds since the relay received the run's last step."),
    "relay_run_step_interval_median_seconds": Spec(
        "gauge", _RUN,
        "Median seconds between the run's recent logged steps (the stall rule scales with it)."),
    "relay_run_steps_per_second": Spec(
        "gauge", _RUN, "Steps per second over the run's recent logged steps."),
    "relay_run_step_duration_seconds": Spec(
        "gauge", _RUN, "The run's last step time: the slowest rank's last reported step time."),
    "relay_run_attempt": Spec(
        "gauge", _RUN,
        "The run's attempt at its last train_begin: 0 for its first, one more for each job that "
        "resumed it from a checkpoint (docs/trainer.md)."),
    "relay_run_world_size": Spec("gauge", _RUN, "Ranks in the run."),
    "relay_run_ranks_lost": Spec(
        "gauge", _RUN, "Ranks of the run the relay named lost and that did not come back."),
    "relay_run_lost_rank": Spec("gauge", _RANK, "1 for each rank of the run now lost."),
    "relay_run_stragglers": Spec("gauge", _RUN, "Ranks of the run now named stragglers."),
    "relay_run_straggler_rank": Spec(
        "gauge", _RANK, "1 for each rank of the run now named a straggler."),
    "relay_run_rank_cost_ratio": Spec(
        "gauge", _RANK, "What the rank costs the job: its own work beyond the other "
                        "ranks' median, over the job's time per step (median over its straggler "
                        "window; per rank up to --metrics-max-ranks, else for the stragglers)."),
    "relay_run_ended": Spec("gauge", _RUN, "1 once the run sent its train_end, else 0."),
    "relay_run_loss": Spec(
        "gauge", _RUN, "The run's last training loss (rank 0's; with --metrics-loss only)."),
    "relay_run_rank_step_duration_seconds": Spec(
        "gauge", _STAT, "Min, median and max over the run's ranks of their last step time."),
    "relay_run_rank_own_duration_seconds": Spec(
        "gauge", _STAT,
        "Min, median and max over the run's ranks of their last own work (step time less waits)."),
    # -- each rank, for runs up to --metrics-max-ranks ranks ---------------------------------------
    "relay_rank_step_duration_seconds": Spec("gauge", _RANK, "The rank's last reported step time."),
    "relay_rank_own_duration_seconds": Spec(
        "gauge", _RANK, "The rank's last reported own work (step time less waits)."),
    "relay_rank_last_step": Spec("gauge", _RANK, "The last step the rank reported."),
    # -- the relay itself --------------------------------------------------------------------------
    "relay_frames_received_total": Spec("counter", (), "Frames received from clients."),
    "relay_events_received_total": Spec(
        "counter", (), "Events in the frames received and decoded."),
    "relay_events_journaled_total": Spec("counter", (), "Events written to the journal."),
    "relay_events_derived_total": Spec(
        "counter", (),
        "Events the relay derived itself (cross-rank figures, stragglers, lost ranks)."),
    "relay_events_duplicate_total": Spec(
        "counter", (), "Events dropped as duplicates of journaled ones."),
    "relay_frames_refused_total": Spec(
        "counter", ("reason",), "Frames refused, by reason (dead-lettered)."),
    "relay_client_dropped_events_total": Spec(
        "counter", (), "Events the clients reported they dropped."),
    "relay_journal_write_failures_total": Spec(
        "counter", (), "Journal writes that failed (retried)."),
    "relay_deadletter_overflow_total": Spec(
        "counter", (), "Refused frames not dead-lettered: the file was full."),
    "relay_memory_resets_total": Spec(
        "counter", (), "Times every connection was dropped to stay under --max-memory."),
    "relay_memory_limit_bytes": Spec("gauge", (), "--max-memory in bytes (0: none)."),
    "relay_runs": Spec("gauge", (), "Runs the relay keeps state for."),
    "relay_ranks": Spec("gauge", (), "Ranks the relay keeps state for."),
    "relay_sink_queued_events": Spec(
        "gauge", _SINK, "Events handed to the sink and not yet written."),
    "relay_sink_lag_seconds": Spec(
        "gauge", _SINK,
        "Seconds since the oldest event the sink still has queued was handed to it."),
    "relay_sink_written_events_total": Spec("counter", _SINK, "Events the sink wrote."),
    "relay_sink_errors_total": Spec("counter", _SINK, "Sink writes that failed (retried)."),
    "relay_sink_dropped_events_total": Spec(
        "counter", _SINK, "Events the sink's queue dropped (it catches up from the journal)."),
    "relay_sink_dead_lettered_events_total": Spec(
        "counter", _SINK, "Events the sink refused for good."),
    "relay_sink_restarts_total": Spec(
        "counter", _SINK, "Times the sink's process was started again."),
    "relay_sink_open": Spec("gauge", _SINK, "1 while the sink is open, else 0."),
    "relay_sink_caught_up_events_total": Spec(
        "counter", _SINK, "Events the sink read back from the journal to catch up."),
    "relay_sink_catch_up_passes_total": Spec(
        "counter", _SINK, "Catch-up passes the sink made over the journal."),
    "relay_sink_deadletter_overflow_total": Spec(
        "counter", _SINK,
        "Events the sink refused that were not dead-lettered: its file was full."),
    "relay_sink_incomplete_flushes_total": Spec(
        "counter", _SINK, "Flushes the sink said did not complete within their deadline."),
    "relay_sink_incomplete_closes_total": Spec(
        "counter", _SINK,
        "Closes the sink said did not complete within their deadline, or that overran it."),
    # -- the fleet tier (relay consume) ------------------------------------------------------------
    "relay_fleet_partition_holder": Spec(
        "gauge", ("partition", "holder"),
        "1 for each partition's lease holder as this relay last read it."),
    "relay_fleet_partition_held": Spec("gauge", _PART, "1 for each partition this relay consumes."),
    "relay_fleet_partition_pending_messages": Spec(
        "gauge", _PART, "Messages of the partition in the stream not yet delivered to this relay."),
    "relay_fleet_partition_lag_seconds": Spec(
        "gauge", _PART,
        "Age of the newest message this relay took from the partition, while more wait (else 0)."),
    "relay_fleet_partition_messages_total": Spec(
        "counter", _PART, "Messages this relay took from the partition."),
    "relay_fleet_partition_events_journaled_total": Spec(
        "counter", _PART, "Events journaled from the partition."),
    "relay_fleet_partition_duplicates_total": Spec(
        "counter", _PART, "Events of the partition dropped as duplicates."),
    "relay_fleet_partition_bad_lines_total": Spec(
        "counter", _PART, "Message lines that were not events, skipped."),
    "relay_fleet_partition_refused_total": Spec("counter", ("partition", "reason"),
                                                "Events of the partition refused, by reason "
                                                "(conflict: a second writer's)."),
    "relay_fleet_partition_sink_queued_events": Spec(
        "gauge", ("partition", "sink"),
        "Events handed to the partition's sink and not yet written."),
    "relay_fleet_partition_sink_lag_seconds": Spec(
        "gauge", ("partition", "sink"),
        "Seconds since the oldest event the partition's sink still has queued was handed to it."),
    "relay_fleet_partition_sink_errors_total": Spec(
        "counter", ("partition", "sink"), "The partition's sink writes that failed (retried)."),
    "relay_fleet_errors_total": Spec(
        "counter", (), "Partition tasks that failed and journal writes that failed."),
}


class Families:
    """The families of one scrape, made from TABLE as they are first used."""

    def __init__(self) -> None:
        self._made: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}

    def add(self, name: str, value: float | None, *labels: object) -> None:
        """One sample of ``name`` (a value of None adds nothing)."""
        if value is None:
            return
        family = self._made.get(name)
        if family is None:
            spec = TABLE[name]
            kind = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
            family = self._made[name] = kind(name, spec.help, labels=spec.labels)
        family.add_metric([str(label) for label in labels], float(value))

    def all(self) -> list[Metric]:
        return list(self._made.values())
