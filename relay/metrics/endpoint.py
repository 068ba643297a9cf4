"""The endpoint put together for ``relay serve`` and ``relay consume``: a registry of this relay's
collector and the process's own figures (memory, CPU, open files: prometheus_client's process
collector), served by relay/metrics/server.py."""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector

from relay.daemon.loop import Relay
from relay.daemon.run_health import RunHealth
from relay.fleet.consumer import Consumer
from relay.metrics.fleet_collector import FleetCollector
from relay.metrics.relay_collector import RelayCollector
from relay.metrics.server import MetricsServer


@dataclass(frozen=True)
class MetricsOptions:
    bind: str
    loss: bool = False  # each run's last loss
    max_ranks: int = 64  # per-rank series only for runs of up to this many ranks
    max_runs: int = 200  # runs shown, the most recent steps first
    keep_ended: float = 300.0  # seconds an ended run is still shown


def _registry(collector: object) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return registry


def serve_relay(relay: Relay, options: MetricsOptions) -> MetricsServer:
    """Keep each run's health, hand the collector a snapshot every second, and listen (AddressInUse,
    BadAddress); before ``relay.serve()``."""
    health = RunHealth(options.keep_ended, options.loss)
    cluster = relay.follow_health(health)
    collector = RelayCollector(relay.snapshot, health, cluster,
                               max_memory_mib=relay.config.max_memory,
                               max_runs=options.max_runs, max_ranks=options.max_ranks)
    relay.each_second.append(collector.take)
    server = MetricsServer(options.bind, _registry(collector))
    server.start()
    return server


def serve_consumer(consumer: Consumer, options: MetricsOptions) -> MetricsServer:
    server = MetricsServer(options.bind, _registry(FleetCollector(consumer)))
    server.start()
    return server
