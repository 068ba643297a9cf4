"""What a stream's own hello and stats events tell ingest about its dedupe state: a later
session's first seq moves the rank's floor, a client's loss report moves it past the gap (or is
counted as bad), and a run id another process reused is said loudly (no socket, no clock).
"""
from __future__ import annotations

import logging
from typing import Any

from relay.daemon.counters import Counters
from relay.daemon.runs import Key
from relay.journal.dedupe import RankState, claimed_drop
from sinks.events import attempt_of, starts_session

log = logging.getLogger("relay")


def session_begins(key: Key, state: RankState, seq: int, peer: bytes) -> None:
    """A hello at the first seq of a later session of its stream (a resumed job's attempt, an
    elastic restart; sinks/events.py): its client numbers nothing below it, so the rank's floor
    moves up to it, as for a drop report of that connection (the earlier session's seqs it never
    delivered were lost with its process)."""
    if seq > state.floor and starts_session(seq):
        log.info("run %s rank %d: a new session begins at seq %d (attempt %d)", key[0], key[1],
                 seq, attempt_of(seq))
        state.skip_to(seq, peer)


def reused_run(counters: Counters, key: Key) -> None:
    """Another process started publishing under a (run, rank) that already has events: its
    events look like duplicates, so say so loudly instead of dropping them quietly."""
    counters.reused_run_ids += 1
    log.error("run %s rank %d was started again by another process (a new hello at a seq already "
              "journaled): its events repeat seqs already journaled and are dropped as "
              "duplicates; give every job its own run id (a job resumed from a checkpoint "
              "continues its run as a new attempt, whose seqs start above the last one's: "
              "docs/trainer.md)", key[0], key[1])


def client_drops(counters: Counters, key: Key, state: RankState, event: dict[str, Any],
                 peer: bytes) -> None:
    """A client's own loss report. Its ``dropped_upto`` moves the rank's floor past the gap, but
    only for seqs below this very event (a client drops only what it numbered before) and as a
    claim of this connection alone (see relay/journal/dedupe.py)."""
    data = event["data"]
    dropped = data.get("dropped")
    if type(dropped) is int and counters.client_reported(key, dropped):
        log.warning("run %s rank %d reports %d events dropped in the client", key[0], key[1],
                    dropped)
    skip, upto = claimed_drop(event), data.get("dropped_upto")
    if skip is not None:
        state.skip_to(skip, peer)
    elif upto is not None and upto != -1:
        counters.bad_drop_reports += 1
