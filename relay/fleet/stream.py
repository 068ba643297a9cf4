"""The stream the fleet tier shares: subjects, partitions and configuration, one set of functions so
the publishing sink and the consuming relays agree (docs/sinks/nats.md, "What it does").

The partition is a token of its own: a NATS mapping function must be a whole token
(``p{{partition(..)}}`` is kept literally).
"""
from __future__ import annotations

import re
from typing import Any

import click

from relay.fleet.connection import describe
from sinks.base import SinkError

DEFAULT_PREFIX = "relay.events"
DEFAULT_STREAM = "RELAY"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def run_token(run: str) -> str:
    """The run id as one subject token: every character outside [A-Za-z0-9_-] becomes ``_``."""
    return _UNSAFE.sub("_", run) or "_"


def publish_subject(prefix: str, node: str, run: str) -> str:
    return f"{prefix}.{run_token(node)}.{run_token(run)}"


def partition_filter(prefix: str, k: int) -> str:
    """The filter of a consumer that takes partition ``k``."""
    return f"{prefix}.{k}.>"


def stream_options() -> list[click.Option]:
    """The stream's options, shared by both ends (the first to come creates it; an existing one is
    used as it is)."""
    return [
        click.Option(["--nats-stream"], default=DEFAULT_STREAM, show_default=True,
                     help="The JetStream stream."),
        click.Option(["--nats-prefix"], default=DEFAULT_PREFIX, show_default=True,
                     help="Subject prefix: a relay publishes to PREFIX.NODE.RUN."),
        click.Option(["--nats-partitions"], type=click.IntRange(1, 1024), default=8,
                     show_default=True,
                     help="Partitions the stream maps runs to (when it creates the stream)."),
        click.Option(["--nats-replicas"], type=click.IntRange(1, 5), default=1, show_default=True,
                     help="Replicas of a stream this relay creates: 3 on a 3-node cluster."),
        click.Option(["--nats-duplicate-window"], default="10m", show_default=True,
                     metavar="DURATION",
                     help="How long the stream drops a message id it has seen (when it creates "
                          "the stream)."),
        click.Option(["--nats-max-age"], default="7d", show_default=True, metavar="DURATION",
                     help="How long the stream keeps messages, 0 for ever (when it creates the "
                          "stream)."),
    ]


def seconds(value: str, option: str) -> float:
    """A duration like 90, 90s, 10m, 2h, 7d in seconds; SinkError otherwise."""
    found = _DURATION.match(str(value).strip())
    if not found:
        raise SinkError(f"{option} {value!r} is not a duration; give e.g. 90s, 10m, 2h or 7d")
    return float(found.group(1)) * _UNITS[found.group(2)]


def check_prefix(prefix: str) -> str:
    tokens = prefix.split(".")
    if not prefix or any(not t or _UNSAFE.search(t) for t in tokens):
        raise SinkError(f"--nats-prefix {prefix!r} is not a subject prefix; give dot-separated "
                        "tokens of letters, digits, _ and -, as relay.events")
    return prefix


def stream_config(name: str, prefix: str, partitions: int, replicas: int, duplicate_window: float,
                  max_age: float) -> Any:
    """The StreamConfig a relay creates when the stream is missing: file storage, the partition
    transform."""
    from nats.js.api import StorageType, StreamConfig, SubjectTransform
    # PREFIX.NODE.RUN -> PREFIX.PARTITION.NODE.RUN, the partition a hash of the run
    dest = f"{prefix}.{{{{partition({partitions},2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}"
    return StreamConfig(
        name=name, subjects=[f"{prefix}.>"], storage=StorageType.FILE, num_replicas=replicas,
        duplicate_window=duplicate_window, max_age=max_age,
        subject_transform=SubjectTransform(src=f"{prefix}.*.*", dest=dest))


async def ensure_stream(js: Any, config: Any) -> tuple[Any, bool]:
    """The stream's info, creating it from ``config`` if it is missing (an existing one is used as
    it is); True when this call created it."""
    from nats.js.errors import BadRequestError, NotFoundError
    try:
        return await js.stream_info(config.name), False
    except NotFoundError:
        pass
    try:
        return await js.add_stream(config), True
    except BadRequestError as exc:  # another relay created it meanwhile
        if "already in use" not in str(exc):
            raise
        return await js.stream_info(config.name), False


#: JetStream's answers when a stream's replicas cannot be placed: more replicas than servers
#: (10005, "no suitable peers for placement"; also while a fresh cluster's peers join) or a server
#: that is not clustered (10074, "replicas > 1 not supported in non-clustered mode").
PLACEMENT_ERRORS = (10005, 10074)


def servers_seen(server_info: dict[str, Any]) -> tuple[int, str | None]:
    """(servers, cluster name) a client sees from the server's INFO: its cluster's client URLs, or 1
    server and no cluster."""
    cluster = server_info.get("cluster") or None
    return (max(1, len(server_info.get("connect_urls") or [])) if cluster else 1), cluster


def replicas_problem(stream: str, replicas: int, servers: int,
                     cluster: str | None) -> tuple[bool, str] | None:
    """What is wrong with creating ``stream`` with ``replicas`` where a client sees ``servers``
    (None: nothing): (fatal, one line). A server that is no cluster never can (fatal); a cluster
    showing fewer servers than replicas may still be joining, so that is a warning with the command
    that fixes it."""
    if replicas <= servers:
        return None
    if cluster is None:
        return True, (f"--nats-replicas {replicas}: the NATS server is a single server, not a "
                      f"cluster (1 server seen), so stream {stream} cannot have {replicas} "
                      "replicas; give --nats-replicas 1, or the servers of a cluster in --nats-url")
    return False, (f"--nats-replicas {replicas} is more than the {servers} NATS servers seen in "
                   f"cluster {cluster}: JetStream places stream {stream} only once {replicas} "
                   f"servers are up (until then it answers 'no suitable peers for placement'); "
                   f"the relay journals meanwhile. If the cluster has {servers} servers, restart "
                   f"this relay with --nats-replicas {servers}")


def not_ready(name: str, replicas: int, exc: BaseException,
              server_info: dict[str, Any] | None) -> str:
    """The line for a stream that could not be made sure of (the nats sink's, once per attempt); for
    replicas JetStream cannot place, with what fixes it."""
    said = f"nats sink: stream {name} is not ready ({describe(exc)})"
    if getattr(exc, "err_code", None) in PLACEMENT_ERRORS:
        problem = replicas_problem(name, replicas, *servers_seen(server_info or {}))
        if problem is not None:
            said += f": {problem[1]}"
    return said
