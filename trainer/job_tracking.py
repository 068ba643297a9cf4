"""One job's tracking, opened on every rank and closed at its end: the run id the ranks agree on,
the relay they publish to (the embedded one rank 0 starts, or the one given), this process's
publisher, and at the end the flush, the barrier and the relay's stop.

``python -m trainer`` (trainer/sft.py), the one-line ``RelayCallback()`` in any Trainer and the
accelerate tracker all open a job's tracking here, so a job is tracked the same way whichever of
them runs it. Rank 0 decides (run id, address, journal) and ``agree`` hands its decision to every
rank; only rank 0 starts and stops the embedded relay.
"""
from __future__ import annotations

import atexit
import getpass
import logging
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from trainer import custom_metrics
from trainer.embedded import (
    EmbeddedRelay,
    RelayStartError,
    agree,
    barrier,
    default_run_id,
    journal_name_in,
    near,
    relay_executable,
)
from trainer.run_identity import identify, write_run_file
from trainer.tracker_flags import TrackingArguments, aim_experiment, sink_args

log = logging.getLogger("trainer")

#: Where each rank writes, at the end, what the relay never acknowledged (for ``relay replay``).
SPOOL_DIR_NAME = "relay-spool"
#: The last flush when training did not complete (the end-of-training flush never ran).
CLOSE_TIMEOUT = 5.0


@dataclass
class JobPlace:
    """Where this process stands in its job, and what the job is called."""

    output_dir: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    run_name: str | None = None
    checkpoint: str | None = None


class JobTracking:
    """This process's share of a job's tracking, from ``open`` to ``close``."""

    def __init__(self, run: str, relay: EmbeddedRelay | None, journal: str | None,
                 rank: int) -> None:
        self.run = run
        self.relay = relay
        #: The embedded relay's journal (None with a relay given by address).
        self.journal = journal
        self.rank = rank
        self.closed = False

    @classmethod
    def open(cls, place: JobPlace, tracking: TrackingArguments, trackers: list[str], *,
             exp_metadata: dict[str, Any] | None = None,
             params: dict[str, Any] | None = None) -> JobTracking:
        """Agree on the run, start the embedded relay on rank 0 (unless ``tracking.relay_address``)
        and connect this process; RelayStartError (on every rank) if the relay did not start."""
        folder = place.output_dir
        address = tracking.relay_address
        relay: EmbeddedRelay | None = None
        identity = error = None
        if place.rank == 0:
            identity = identify(default_run_id(place.run_name), place.checkpoint, folder,
                                continue_run=tracking.continue_run, new_run=tracking.new_run)
            if address is None:
                relay, error = _start_relay(place, tracking, trackers)
                address = relay.address if relay is not None else None
            elif len(trackers) > 1:
                log.warning("--tracker %s adds no sink with --relay_address: the relay at %s "
                            "writes to the sinks it was started with (relay --sink NAME ...)",
                            ",".join(trackers[1:]), address)
        journal = relay.journal if relay is not None else None
        identity, address, journal, error = agree((identity, address, journal, error))
        if error:
            raise RelayStartError(error)
        run_id = identity.run
        if relay is not None:
            relay.run = run_id
        custom_metrics.start(run_id, rank=place.rank, local_rank=place.local_rank,
                             world_size=place.world_size,
                             address=address, spool_dir=os.path.join(folder, SPOOL_DIR_NAME),
                             spool_journal=journal, attempt=identity.attempt)
        job = cls(run_id, relay, journal, place.rank)
        if place.rank == 0:
            run_params = {"run_id": run_id, "run_name": place.run_name,
                          "world_size": place.world_size, "attempt": identity.attempt,
                          "resumed_from_checkpoint": identity.checkpoint,
                          "output_dir": os.path.abspath(folder),  # the relay may run elsewhere
                          "relay_address": address, "trackers": trackers,
                          "embedded_relay": relay is not None,
                          "user": _user(), "source": sys.argv[0], **(params or {})}
            if tracking.aim_experiment or tracking.experiment:  # sinks that group runs (Aim) use it
                run_params["experiment"] = aim_experiment(tracking)
            if tracking.run_uri_export_path:  # where the trackers' <tracker>_tracker.json go
                run_params["run_uri_export_path"] = os.path.abspath(tracking.run_uri_export_path)
            custom_metrics.set_params(run_params, name="run")
            if exp_metadata is not None:
                custom_metrics.set_params(exp_metadata, name="experiment_metadata")
            write_run_file(folder, {"run": run_id, "attempt": identity.attempt,
                                    "resumed_from": identity.resumed_from, "address": address,
                                    "world_size": place.world_size, "jsonl": journal,
                                    "relay_pid": relay.proc.pid if relay else None})
            log.info("tracking run %s%s through the relay at %s", run_id,
                     f" (attempt {identity.attempt}, from step {identity.resumed_from})"
                     if identity.attempt else "", address)
        return job

    def fail(self, why: str) -> None:
        """Rank 0 (or the rank that failed) says the run ended in failure, before ``close``."""
        pub = custom_metrics.publisher()
        if pub is not None:
            pub.publish("lifecycle",
                        {"event": "train_end", "status": "failed", "error": why[:2000]})

    def close(self, timeout: float | None, *, completed: bool) -> None:
        """Flush and close this process's publisher within ``timeout`` (CLOSE_TIMEOUT if None); a
        job that completed waits for every rank before rank 0 stops the embedded relay (a failed one
        cannot count on its peers reaching the barrier). Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if custom_metrics.publisher() is not None:
                custom_metrics.stop(CLOSE_TIMEOUT if timeout is None else timeout)
            if completed:
                barrier()  # every rank has flushed before the relay goes away
        finally:
            if self.relay is not None:
                self.relay.stop()
                if completed and self.journal:
                    point_at_journal(self.journal)


def _start_relay(place: JobPlace, tracking: TrackingArguments,
                 trackers: list[str]) -> tuple[EmbeddedRelay | None, str | None]:
    """Rank 0's embedded relay, or the reason it did not start."""
    folder = place.output_dir
    if place.world_size > int(os.environ.get("LOCAL_WORLD_SIZE", place.world_size)):
        log.warning("the embedded relay listens on a socket local to this node, so ranks on other "
                    "nodes cannot reach it; run a relay they can reach and pass --relay_address")
    try:
        relay = EmbeddedRelay.start(folder, sink_args=sink_args(trackers, tracking, folder),
                                    timeout=tracking.relay_start_timeout,
                                    exit_timeout=tracking.relay_exit_timeout,
                                    journal_name=journal_name_in(folder,
                                                                 tracking.training_logs_filename))
    except RelayStartError as exc:
        return None, str(exc)
    return relay, None


def close_at_exit(job: JobTracking) -> None:
    """A process that ends without closing ``job`` (training raised, and the script caught it or
    died of it) still ends its run: a failed ``train_end``, a bounded flush, the relay stopped."""
    def close() -> None:
        if not job.closed:
            job.fail("the process exited before training ended")
            job.close(None, completed=False)

    atexit.register(close)


_RUN_NAME_JUNK = re.compile(r"[^A-Za-z0-9._-]")


def run_name_of(run_name: str | None, output_dir: str | None) -> str | None:
    """A Trainer's ``run_name`` as a run id's base: None where it is only transformers 4's default
    (the output dir), else cut to the characters a run id may hold."""
    if not run_name or run_name == output_dir:
        return None
    return _RUN_NAME_JUNK.sub("-", run_name).lstrip("._-")[:110] or None


def point_at_journal(journal: str) -> None:
    """The last lines of a job whose relay ran beside it (``make demo``): where its journal is and
    how to watch and plot it (docs/watching.md)."""
    path = shlex.quote(near(journal))
    relay = shlex.quote(relay_executable())
    log.info("metrics journal: %s\n  watch it:  %s tail -f --view steps %s\n"
             "  plot it:   %s plot %s --metric loss -o loss.png", journal, relay, path, relay, path)


def _user() -> str | None:
    """The job's user, as MLflow's own logging records it (``mlflow.user``); None where the
    system knows no name for this uid (a container without a passwd entry)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None
