"""How long a rank waits for its peers: the waits of a job's collectives, timed where they happen.

Under synchronous data parallelism a straggler makes its peers wait, so their step times grow with
its; the relay can name it only by what each rank did itself (its *own work*), which is what is
left of its time once the waits are taken out. The waits are timed on the model the Trainer
prepared, by what wraps it:

- **DDP's gradient all-reduce, inside the step**: a DDP communication hook that is the default
  all-reduce (``allreduce_hook``) plus two timestamps. The all-reduce overlaps the backward pass:
  buckets are sent while gradients of earlier layers are still being computed, so the time from a
  bucket's launch to its completion is not all waiting. The rank stops computing when it launches
  the iteration's last bucket (``GradBucket.is_last()``: every gradient is ready); from then until
  the last of the iteration's all-reduces completes it only waits. That interval (the union of
  ``[last launch, completion]`` over the buckets completing after the last launch) is the wait.
  A rank that launches its last bucket late waits least and makes its peers wait as long as it was
  late, so the straggler is the rank with the *least* wait and the most own work.
- **every blocking ``torch.distributed`` collective** (trainer/dist_waits.py), DDP or FSDP: the
  Trainer's token-count gather before each step (a rank slow to load makes its peers wait there),
  trl's per-batch metric gathers inside the step, the loss and FLOs gathers when the Trainer logs
  (a rank slow *after* the all-reduce, in its optimizer step, makes its peers wait there when every
  step is logged), evaluation gathers and checkpoint barriers, and under FSDP (FSDP2's
  ``fully_shard``, FSDP1) every parameter all-gather before a layer's forward and backward and
  every gradient reduce-scatter after it: a rank slow anywhere in its step makes its peers wait in
  the next of these. The wait is the call's wall time (gloo blocks in it until every rank has sent);
  it counts as inside or outside the step by when it happens (``in_step``, kept by the callback).

The completion stamp of the hook is taken in a ``then`` callback that DDP waits on, so it is written
before the backward pass returns: no device synchronisation, nothing allocated per bucket but the
timestamp (and the future ``then`` returns, as the default hook's own ``then`` does).

Timed only where that is the wait: the gloo backend on the CPU. With NCCL (any accelerator) a
collective returns once it is queued on the device's stream, so its host-side time is not the wait,
and timing it there would need a device synchronisation on the hot path: such a job reports no own
work, and says why (``Timing.what``), so the relay judges it by step time and the steps view says
so. The GPU path is untested (docs/watching.md).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, NamedTuple

from trainer import dist_waits

log = logging.getLogger("trainer")


class CollectiveClock:
    """Seconds this rank spent waiting in collectives since the last ``take``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # completions arrive on the process group's threads
        self._last_launch: float | None = None  # the iteration's last bucket, once launched
        self._covered = 0.0  # up to when the wait after it was counted
        self.in_step = False  # between on_step_begin and on_step_end
        self.inside = 0.0  # seconds waited inside steps
        self.outside = 0.0  # ... and between them

    def take(self) -> tuple[float, float]:
        """(wait inside steps, wait between steps) since the previous call; both start again at 0."""
        with self._lock:
            out = (self.inside, self.outside)
            self.inside = self.outside = 0.0
        return out

    def allreduce_hook(self, state, bucket):  # type: ignore[no-untyped-def]
        """DDP's default all-reduce, with the launch of the iteration's last bucket and every
        completion after it timed (``model.register_comm_hook(None, clock.allreduce_hook)``).
        No annotations: DDP rejects a hook whose annotations are not its own types."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        fut = allreduce_hook(state, bucket)
        if bucket.index() == 0:  # buckets launch in index order: a new iteration
            with self._lock:
                self._last_launch = None
        if bucket.is_last():
            now = time.perf_counter()
            with self._lock:
                self._last_launch = self._covered = now
        return fut.then(self._completed)

    def _completed(self, fut: Any) -> Any:
        now = time.perf_counter()
        with self._lock:
            if self._last_launch is not None and now > self._covered:
                self.inside += now - self._covered
                self._covered = now
        return fut.value()

    def waited(self, seconds: float) -> None:
        """A blocking collective took ``seconds`` (trainer/dist_waits.py)."""
        with self._lock:
            if self.in_step:
                self.inside += seconds
            else:
                self.outside += seconds


class Timing(NamedTuple):
    """What :func:`attach` set up: the clock (None: own work is not measured) and, in words, what is
    timed or why nothing is (rank 0 publishes it, stage ``own_work``)."""

    clock: CollectiveClock | None
    what: str


def attach(trainer: Any, enabled: bool = True) -> Timing:
    """Time the waits of ``trainer``'s prepared model (``trainer.model_wrapped``; call after it was
    wrapped: on_train_begin): DDP or FSDP on gloo on the CPU. Nothing is timed where that cannot
    be done without synchronising the device, or for a model this does not know."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    if not enabled:
        return Timing(None, "collective timing turned off (--time_collectives false): judged by step time")
    model = getattr(trainer, "model_wrapped", None)
    if not dist.is_initialized():
        return Timing(None, "no process group: judged by step time")
    backend = dist.get_backend()  # "gloo", "nccl", or per device: "cpu:gloo,cuda:nccl"
    device = next((p.device.type for p in model.parameters()), "cpu") if model is not None else "cpu"
    if device != "cpu" or "gloo" not in backend:
        return Timing(None, f"{backend} on {device}: a collective returns before the device has done it, so its "
                            "wait cannot be timed without synchronising the device: judged by step time")
    if isinstance(model, DistributedDataParallel):
        kind = "DDP gradient all-reduce (communication hook)"
    elif isinstance(model, FSDPModule):
        kind = "FSDP2 all-gathers and reduce-scatters"
    elif isinstance(model, FullyShardedDataParallel):
        kind = "FSDP1 all-gathers and reduce-scatters"
    else:
        return Timing(None, f"a {type(model).__name__} model: not DDP or FSDP, its waits are not known here: "
                            "judged by step time")
    clock = CollectiveClock()
    if isinstance(model, DistributedDataParallel):
        try:
            model.register_comm_hook(None, clock.allreduce_hook)
        except RuntimeError as exc:  # DDP takes one hook: accelerate's comm_hook option, or a second train()
            log.warning("not timing the gradient all-reduce (own work and stragglers fall back to step time): %s", exc)
            return Timing(None, f"DDP has a communication hook already, the all-reduce is not timed ({exc}): "
                                "judged by step time")
    dist_waits.install(clock.waited)
    return Timing(clock, f"{kind}, blocking torch.distributed collectives (gathers, barriers)")


def detach() -> None:
    """Stop timing the blocking collectives (a DDP hook stays: DDP cannot drop one, and without the
    callback reading the clock it costs what the plain hook does)."""
    dist_waits.uninstall()
