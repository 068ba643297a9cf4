"""The Prometheus endpoint's options (docs/monitoring.md), for ``relay serve`` (all of them) and
``relay consume`` (where to listen: it keeps no per-run health)."""
from __future__ import annotations

from typing import Any

import click

from sinks.base import SinkError


def metrics_params(per_run: bool) -> list[click.Option]:
    """The options: where to listen, and with ``per_run`` those of each run's health (serve)."""
    params = [click.Option(
        ["--metrics-bind"], metavar="[HOST:]PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (a bare port: 127.0.0.1). "
             "Off by default; needs the [prometheus] extra. Another host than loopback shows every "
             "run and rank to whoever reaches it (docs/security.md).")]
    if per_run:
        params += [
            click.Option(["--metrics-loss"], is_flag=True,
                         help="Also show each run's last training loss (rank 0's)."),
            click.Option(["--metrics-max-ranks"], type=click.IntRange(1), default=64,
                         show_default=True,
                         help="Per-rank series only for runs of up to this many ranks (and 2048 "
                              "ranks in all, the most recent runs first); every run gets "
                              "min/median/max over its ranks."),
            click.Option(["--metrics-max-runs"], type=click.IntRange(1), default=200,
                         show_default=True,
                         help="Runs shown, those with the most recent steps first."),
            click.Option(["--metrics-keep-ended"], type=click.FloatRange(0.0), default=300.0,
                         show_default=True, metavar="SECONDS",
                         help="Seconds a run that ended is still shown."),
        ]
    return params


def take_metrics_options(params: dict[str, Any]) -> Any:
    """Pop the endpoint's options out of ``params``: its MetricsOptions, or None when it is off.
    SinkError (a usage error) if the endpoint is asked for and prometheus-client is not
    installed."""
    values = {key[len("metrics_"):]: params.pop(key)
              for key in list(params) if key.startswith("metrics_")}
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


def start_metrics(relay: Any, params: dict[str, Any]) -> None:
    """``relay serve``: with --metrics-bind, keep each run's health and listen, once the relay is
    bound (SinkError for a usage error; AddressInUse, BadAddress)."""
    options = take_metrics_options(params)
    if options is not None:
        from relay.metrics.endpoint import serve_relay
        serve_relay(relay, options)
