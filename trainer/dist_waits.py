"""The blocking ``torch.distributed`` collectives, timed where they are called, while a job trains
(which calls they reach and which they miss: docs/trainer.md, "Per-rank metrics").

Their callers look these functions up on ``torch.distributed`` when they call them, so
:func:`install` replaces them there (and in ``torch.distributed.distributed_c10d``, where some
callers find them) with wrappers that add the call's wall time to a
:class:`~trainer.collectives.CollectiveClock`; :func:`uninstall` puts the originals back. Only
blocking calls are timed (with ``async_op=True`` the wait is in ``Work.wait()`` elsewhere), and a
collective called from inside another (``all_gather_object`` calls ``all_gather``) counts once.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: The collectives that can make a rank wait for its peers (those of this torch that exist are
#: used).
BLOCKING = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "all_gather_coalesced", "_all_gather_base",
    "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "all_gather_object", "gather_object",
    "broadcast_object_list", "scatter_object_list", "barrier", "monitored_barrier",
)

_local = threading.local()  # .busy: a timed collective is running on this thread
_lock = threading.Lock()
#: the clock's sink for seconds waited; None: not installed
_waited: Callable[[float], None] | None = None
_saved: list[tuple[ModuleType, str, Callable[..., Any]]] = []


def _timed(original: Callable[..., Any]) -> Callable[..., Any]:
    try:
        position = list(inspect.signature(original).parameters).index("async_op")
    except (ValueError, TypeError):  # (no async_op: always blocks)
        position = None

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sink = _waited
        if sink is None or getattr(_local, "busy", False) or kwargs.get("async_op") or (
                position is not None and len(args) > position and args[position]):
            return original(*args, **kwargs)
        _local.busy = True
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _local.busy = False
            sink(time.perf_counter() - started)

    return wrapper


def install(waited: Callable[[float], None]) -> None:
    """From now on every blocking collective's wall time goes to ``waited`` (a later install
    replaces the sink: one training at a time per process)."""
    global _waited
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    with _lock:
        _waited = waited
        if _saved:
            return
        wrappers: dict[int, Callable[..., Any]] = {}
        for module in (dist, distributed_c10d):
            for name in BLOCKING:
                original = getattr(module, name, None)
                if original is None:
                    continue
                if id(original) not in wrappers:
                    wrappers[id(original)] = _timed(original)
                _saved.append((module, name, original))
                setattr(module, name, wrappers[id(original)])


def uninstall() -> None:
    """The original collectives back; nothing is timed any more."""
    global _waited
    with _lock:
        _waited = None
        for module, name, original in _saved:
            setattr(module, name, original)
        _saved.clear()
