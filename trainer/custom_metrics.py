"""``track`` and ``set_params``: custom metrics and run metadata from anywhere in a training script.

Both work before or after the Trainer exists. Until a connection to the relay is started (by
:func:`trainer.train`, or by :func:`start` for a hand-built Trainer) events wait in a bounded
in-process queue and are handed over, in order, the moment it starts; nothing reaches a sink
before the run it belongs to is set up, and nothing queued is lost without being counted and
reported at exit.
"""
from __future__ import annotations

import atexit
import logging
import numbers
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from relay.client.publisher import Publisher
from relay.wire.schema import MAX_DEPTH, MAX_NAME_LEN

log = logging.getLogger(__name__)

#: Events kept while no publisher exists; beyond this the oldest are dropped and counted.
MAX_QUEUED = 10_000

_lock = threading.Lock()
_publisher: Publisher | None = None
_queued: deque[tuple[str, dict[str, Any], int | None, str]] = deque()
_queue_dropped = 0
_disabled = False
#: The Trainer's global step while training runs (kept by RelayCallback): track()'s default step.
current_step: int | None = None


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_LEN:
        raise ValueError(f"{what} {value[:40]!r}... is longer than {MAX_NAME_LEN} characters")
    return value


def _number(name: str, value: Any) -> float | int:
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, numbers.Number):
        value = item()  # a one-element tensor or numpy scalar
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"metric {name!r} must be a real number, got {type(value).__name__}")
    return value if isinstance(value, int) else float(value)


def to_wire(value: Any, depth: int = 1) -> Any:
    """Make params travel: JSON-like types, string keys, bounded depth; anything else as str()."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth >= MAX_DEPTH:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k)[:MAX_NAME_LEN]: to_wire(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return [to_wire(v, depth + 1) for v in sorted(value, key=str)]
    if isinstance(value, (list, tuple)):
        return [to_wire(v, depth + 1) for v in value]
    enum_value = getattr(value, "value", None)
    if isinstance(enum_value, (str, int)):
        return enum_value
    return str(value)


def _emit(type_: str, data: dict[str, Any], step: int | None, stage: str) -> None:
    global _queue_dropped
    if _disabled:
        return
    pub = _publisher
    if pub is not None:
        pub.publish(type_, data, step=step, stage=stage)
        return
    with _lock:
        if _publisher is not None:
            _publisher.publish(type_, data, step=step, stage=stage)
            return
        if len(_queued) >= MAX_QUEUED:
            _queued.popleft()
            _queue_dropped += 1
        _queued.append((type_, data, step, stage))


def track(metrics: Mapping[str, Any], stage: str = "additional_metrics",
          step: int | None = None) -> None:
    """Record custom metrics, e.g. ``track({"model_load_time": 3.2})``.

    ``step`` defaults to the Trainer's current global step while training runs. Values must be
    real numbers (one-element tensors are accepted); NaN and infinities are kept.
    """
    if not isinstance(metrics, Mapping):
        raise ValueError(f"metrics must be a dict of name -> number, got {type(metrics).__name__}")
    if not metrics:
        raise ValueError("metrics is empty")
    _check_name(stage, "stage")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"step must be a non-negative int or None, got {step!r}")
    data = {_check_name(k, "metric name"): _number(k, v) for k, v in metrics.items()}
    _emit("metrics", data, current_step if step is None else step, stage)


def set_params(params: Mapping[str, Any], name: str = "experiment_metadata") -> None:
    """Record run metadata under ``name``, e.g. ``set_params({"dataset": "v3"})``."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a dict, got {type(params).__name__}")
    _check_name(name, "name")
    for key in params:
        _check_name(key, "param name")
    _emit("params", to_wire(params), None, name)


#: How often the publisher ships what was published. A logged training step yields a couple of
#: events; sending them in fewer, larger frames costs the relay (on the same cores) less per
#: step, and 0.1 s is still immediate for ``tail -f``.
SEND_INTERVAL = 0.1


def start(run: str, *, rank: int = 0, local_rank: int = 0, world_size: int = 1,
          address: str | None = None, send_interval: float = SEND_INTERVAL,
          spool_dir: str | None = None, spool_journal: str | None = None,
          attempt: int = 0) -> Publisher:
    """Connect this process to the relay and hand over everything queued so far.

    ``spool_dir``: where :func:`stop` writes what the relay never acknowledged, for ``relay replay``
    (None: it is only counted and logged); ``spool_journal``: the relay's journal, which the logged
    replay command names; ``attempt``: the run's attempt this job is (a resumed job's,
    trainer/run_identity.py).

    Raises ValueError for a bad run id or rank, and RuntimeError if a connection already exists.
    """
    global _publisher
    with _lock:
        if _publisher is not None:
            raise RuntimeError(f"tracking already started for run {_publisher.run!r}")
        pub = Publisher(run, rank, local_rank=local_rank, world_size=world_size, address=address,
                        send_interval=send_interval, spool_dir=spool_dir,
                        spool_journal=spool_journal, attempt=attempt)
        if _queue_dropped:
            pub.publish("metrics", {"tracking_queue_dropped": _queue_dropped},
                        stage="additional_metrics")
        while _queued:
            type_, data, step, stage = _queued.popleft()
            pub.publish(type_, data, step=step, stage=stage)
        _publisher = pub
    return pub


def disable() -> None:
    """Tracking is off for this process (``--tracker none``): drop what is queued and what comes."""
    global _disabled
    with _lock:
        _disabled = True
        _queued.clear()


def publisher() -> Publisher | None:
    """The process-wide publisher, or None before :func:`start`."""
    return _publisher


def stop(timeout: float = 30.0) -> int:
    """Flush and close the publisher; return the events the relay never acknowledged (spooled, if
    :func:`start` was given a ``spool_dir``)."""
    global _publisher, current_step
    with _lock:
        pub, _publisher = _publisher, None
        current_step = None
    return 0 if pub is None else pub.close(timeout)


@atexit.register
def _report_unsent() -> None:
    if _queued or _queue_dropped:
        log.warning("%d tracked events were never sent (%d more dropped): no relay connection was "
                    "started in this process (trainer.custom_metrics.start or trainer.train)",
                    len(_queued), _queue_dropped)
