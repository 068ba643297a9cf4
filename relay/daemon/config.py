"""The relay daemon's settings: what ``relay serve``'s options set (relay/cli/main.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from relay.daemon.cross_rank import ClusterConfig


@dataclass
class RelayConfig:
    address: str
    flush_interval: float = 0.05
    stats_interval: float = 30.0
    sink_queue: int = 200_000
    ready_file: Path | None = None
    watch_pid: int | None = None
    curve_cert: Path | None = None
    curve_clients: Path | None = None
    #: on TCP, take events from any peer (no secret, no CURVE): relay/daemon/gate.py
    open: bool = False
    #: the relay secret's file (None: $RELAY_SECRET, $RELAY_SECRET_FILE, else the user's config
    #: folder)
    secret_file: Path | None = None
    shutdown_timeout: float = 10.0
    forget_after: float = 3600.0
    #: new run ids one connection may start per minute (and at once): a flood beyond is refused
    run_rate: float = 60.0
    #: runs whose dedupe state is kept in memory; past it the least recently active is forgotten
    max_runs: int = 10_000
    #: MiB of resident memory at which every connection is dropped
    #: (relay/daemon/memory_guard.py); 0: never
    max_memory: int = 1024
    #: seconds after its last frame a rank still counts as connected in the status
    active_window: float = 60.0
    #: cross-rank events derived from the ranks' step times (relay/daemon/cross_rank.py); None: none
    cluster: ClusterConfig | None = field(default_factory=ClusterConfig)
