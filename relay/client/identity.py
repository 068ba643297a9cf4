"""Which stream a Publisher (relay/client/publisher.py) writes: its arguments checked, the restart
count it numbers from, the envelope its frames carry and its spool file's path; no sockets."""
from __future__ import annotations

import os
import socket
from typing import Any

from relay.wire import schema
from relay.wire.lines import SPOOL_SUFFIX
from sinks.events import MAX_ATTEMPT, RELAY_RANK


def check(run: str, rank: int, world_size: int, max_events: int, attempt: int) -> None:
    """ValueError for what no Publisher may be given: a run id the relay refuses, a negative count,
    the relay's own rank, an attempt out of range."""
    if not schema.valid_run_id(run):
        raise ValueError(f"run id {run!r} must match {schema.RUN_ID_RE.pattern}")
    for name, val in (("rank", rank), ("world_size", world_size), ("max_events", max_events)):
        if not isinstance(val, int) or val < 0:
            raise ValueError(f"{name} must be a non-negative int, got {val!r}")
    if rank >= RELAY_RANK:
        raise ValueError(f"rank must be below {RELAY_RANK} (the relay's own rank), got {rank}")
    if not isinstance(attempt, int) or not 0 <= attempt < MAX_ATTEMPT:
        raise ValueError(f"attempt must be an int in [0, {MAX_ATTEMPT}), got {attempt!r}")


def restart_count(restart: int | None) -> int:
    """How often torchrun restarted this rank: ``restart``, else ``TORCHELASTIC_RESTART_COUNT``."""
    if restart is not None:
        return restart
    env = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return int(env) if env.isdigit() else 0


def envelope(run: str, rank: int, local_rank: int | None, world_size: int,
             host: str | None) -> dict[str, Any]:
    """The fields every event of the stream shares. Frames are compact batches: this envelope once,
    then one row per event (docs/protocol.md). The spool adds it to every row again, as the relay
    does."""
    return {
        "v": schema.SCHEMA_VERSION, "run": run, "rank": rank,
        "local_rank": rank if local_rank is None else local_rank,
        "world_size": max(world_size, 1),
        "host": (host or socket.gethostname())[: schema.MAX_NAME_LEN],
    }


def spool_path(spool_dir: str | os.PathLike[str] | None, run: str, rank: int) -> str | None:
    """The file close() spools the stream's unacknowledged events to (None: no spool)."""
    if spool_dir is None:
        return None
    return os.path.join(os.fspath(spool_dir), f"{run}.rank{rank}{SPOOL_SUFFIX}")
