"""The Prometheus endpoint's options (docs/monitoring.md), for ``relay serve`` (all of them) and
``relay consume`` (where to listen: it keeps no per-run health)."""
from __future__ import annotations

from typing import Any, Callable

import click

from sinks.base import SinkError

BIND = click.option(
    "--metrics-bind", metavar="[HOST:]PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (a bare port: 127.0.0.1). Off by default; needs "
         "the [prometheus] extra. Another host than loopback shows every run and rank to whoever reaches it "
         "(docs/security.md).")
RUN_OPTIONS = [
    click.option("--metrics-loss", is_flag=True, help="Also show each run's last training loss (rank 0's)."),
    click.option("--metrics-max-ranks", type=click.IntRange(1), default=64, show_default=True,
                 help="Per-rank series only for runs of up to this many ranks; bigger runs get min/median/max."),
    click.option("--metrics-max-runs", type=click.IntRange(1), default=500, show_default=True,
                 help="Runs shown, those with the most recent steps first."),
    click.option("--metrics-keep-ended", type=click.FloatRange(0.0), default=300.0, show_default=True,
                 metavar="SECONDS", help="Seconds a run that ended is still shown."),
]


def metrics_options(per_run: bool) -> Callable[[Any], Any]:
    """The options as one decorator: ``per_run`` adds those of each run's health (serve)."""
    def apply(command: Any) -> Any:
        for option in reversed([BIND, *(RUN_OPTIONS if per_run else [])]):
            command = option(command)
        return command
    return apply


def take_metrics_options(params: dict[str, Any]) -> Any:
    """Pop the endpoint's options out of ``params``: its MetricsOptions, or None when it is off.
    SinkError (a usage error) if the endpoint is asked for and prometheus-client is not installed."""
    values = {key[len("metrics_"):]: params.pop(key) for key in list(params) if key.startswith("metrics_")}
    if values.get("bind") is None:
        return None
    try:
        from relay.metrics.endpoint import MetricsOptions
        from relay.metrics.server import parse_bind
    except ImportError as exc:
        raise SinkError(f"--metrics-bind needs the prometheus-client package ({exc}); "
                        "pip install 'metrics-relay[prometheus]'") from None
    try:
        parse_bind(values["bind"])
    except ValueError as exc:  # BadAddress
        raise SinkError(str(exc)) from None
    return MetricsOptions(**values)
