"""How long a rank waits for its peers: the waits DDP's collectives impose, timed where they happen.

Under DDP a straggler makes its peers wait, so their step times grow with its; the relay can name
it only by what each rank did itself (its *own work*), which is what is left of its time once the
waits are taken out. Two waits are timed, on the model and accelerator the Trainer prepared:

- **the gradient all-reduce, inside the step**: a DDP communication hook that is the default
  all-reduce (``allreduce_hook``) plus two timestamps. The all-reduce overlaps the backward pass:
  buckets are sent while gradients of earlier layers are still being computed, so the time from a
  bucket's launch to its completion is not all waiting. The rank stops computing when it launches
  the iteration's last bucket (``GradBucket.is_last()``: every gradient is ready); from then until
  the last of the iteration's all-reduces completes it only waits. That interval (the union of
  ``[last launch, completion]`` over the buckets completing after the last launch) is the wait.
  A rank that launches its last bucket late waits least and makes its peers wait as long as it was
  late, so the straggler is the rank with the *least* wait and the most own work.
- **the Trainer's blocking collectives**, ``accelerator.gather`` (and ``gather_for_metrics``,
  which calls it): before each step the Trainer gathers the next batches' token count across ranks
  (``average_tokens_across_devices``) right after loading them, so a rank slow to load makes its
  peers wait there, not in the all-reduce, and every rank then starts its step together; inside
  the step trl's SFTTrainer gathers its per-batch metrics (``num_tokens``, entropy, accuracy) in
  the loss, so a rank slow in the forward pass makes its peers wait there first. The wait is the
  call's wall time (gloo blocks in it until every rank has sent); it counts as inside or outside
  the step by when it happens (``in_step``, kept by the callback).

The completion stamp is taken in a ``then`` callback that DDP waits on, so it is written before the
backward pass returns: no device synchronisation, nothing allocated per bucket but the timestamp
(and the future ``then`` returns, as the default hook's own ``then`` does). With NCCL the future
completes once the collective is queued on the GPU stream, so this measures the launch, not the
wait (docs/trainer.md says what is exact where).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

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

    def timed(self, collective: Callable[..., Any]) -> Callable[..., Any]:
        """``collective`` (a blocking call every rank makes) with its wall time added to the wait."""
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return collective(*args, **kwargs)
            finally:
                took = time.perf_counter() - started
                with self._lock:
                    if self.in_step:
                        self.inside += took
                    else:
                        self.outside += took
        wrapper.__wrapped__ = collective  # type: ignore[attr-defined]
        return wrapper


def attach(trainer: Any) -> CollectiveClock | None:
    """Time the waits of ``trainer``'s DDP model (call after it was wrapped: on_train_begin); None
    when it is not a DDP job or its model already has a communication hook (logged)."""
    from torch.nn.parallel import DistributedDataParallel

    model = getattr(trainer, "model_wrapped", None)
    if not isinstance(model, DistributedDataParallel):
        return None
    clock = CollectiveClock()
    try:
        model.register_comm_hook(None, clock.allreduce_hook)
    except RuntimeError as exc:  # DDP takes one hook: accelerate's comm_hook option, or a second train()
        log.warning("not timing the gradient all-reduce (own work and stragglers fall back to step time): %s", exc)
        return None
    accelerator = trainer.accelerator
    accelerator.gather = clock.timed(accelerator.gather)
    return clock


def detach(trainer: Any) -> None:
    """Give ``trainer``'s accelerator back its own gather (the DDP hook stays: DDP cannot drop one)."""
    gather = getattr(trainer.accelerator, "gather", None)
    if hasattr(gather, "__wrapped__"):
        del trainer.accelerator.gather
