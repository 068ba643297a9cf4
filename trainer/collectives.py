"""How long a rank waits for its peers: the waits of a job's collectives, timed where they happen,
so the relay can name a straggler by its own work. What is timed where, and why it names the
straggler: docs/trainer.md, "Per-rank metrics (`stage: rank`)"; the cost: docs/benchmarks.md.

No communication hook: DDP keeps its C++ all-reduce (a Python hook cost about 9% more CPU per
step than the built-in one on a small model, bench/bench_collectives.py), and a hook of the job's
own (accelerate's ``comm_hook``) is left alone. Only gloo on the CPU is timed: with NCCL a
collective returns once queued on the device's stream, so its host-side time is not the wait
(``Timing.what`` says so). The GPU path is untested (docs/watching.md).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from trainer import dist_waits

log = logging.getLogger("trainer")


class CollectiveClock:
    """Seconds this rank spent waiting in collectives since the last ``take``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # blocking collectives may be called from any thread
        self._ready: float | None = None  # when the latest gradient of the backward pass was ready
        self._hooks: list[Any] = []
        self.in_step = False  # between on_step_begin and on_step_end
        self.inside = 0.0  # seconds waited inside steps
        self.outside = 0.0  # ... and between them

    def take(self) -> tuple[float, float]:
        """(wait inside steps, wait between steps) since the previous call; both restart at 0."""
        with self._lock:
            out = (self.inside, self.outside)
            self.inside = self.outside = 0.0
        return out

    def watch(self, model: Any) -> None:
        """Stamp each gradient of ``model``'s trainable parameters as it is ready (a post-accumulate
        hook: one clock read per parameter tensor and backward pass, DDP's all-reduce untouched)."""
        for param in model.parameters():
            if param.requires_grad:
                self._hooks.append(param.register_post_accumulate_grad_hook(self._gradient_ready))

    def _gradient_ready(self, param: Any) -> None:
        self._ready = time.perf_counter()

    def timed_backward(self, backward: Callable[..., Any]) -> Callable[..., Any]:
        """``backward`` (the accelerator's) with the wait after the last gradient counted: DDP
        returns from the backward pass only once every bucket's all-reduce has completed."""
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._ready = None
            try:
                return backward(*args, **kwargs)
            finally:
                ready = self._ready
                if ready is not None:
                    self.waited(time.perf_counter() - ready)

        wrapper.__wrapped__ = backward  # type: ignore[attr-defined]
        return wrapper

    def unwatch(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def step_begins(self) -> None:
        """The Trainer's step begins (``on_step_begin``): waits count as inside it."""
        self.in_step = True

    def step_ends(self) -> None:
        """The step ended (``on_step_end``): waits until the next one count as outside a step."""
        self.in_step = False

    def waited(self, seconds: float) -> None:
        """A blocking collective took ``seconds`` (trainer/dist_waits.py), or the all-reduce after
        the last gradient did."""
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
        return Timing(None, "collective timing turned off (--time_collectives false): judged by "
                            "step time")
    model = getattr(trainer, "model_wrapped", None)
    if not dist.is_initialized():
        return Timing(None, "no process group: judged by step time")
    backend = dist.get_backend()  # "gloo", "nccl", or per device: "cpu:gloo,cuda:nccl"
    device = "cpu" if model is None else next((p.device.type for p in model.parameters()), "cpu")
    if device != "cpu" or "gloo" not in backend:
        return Timing(None, f"{backend} on {device}: a collective returns before the device has "
                            "done it, so its wait cannot be timed without synchronising the "
                            "device: judged by step time")
    if isinstance(model, DistributedDataParallel):
        kind = "DDP gradient all-reduce (after the last gradient)"
    elif isinstance(model, FSDPModule):
        kind = "FSDP2 all-gathers and reduce-scatters"
    elif isinstance(model, FullyShardedDataParallel):
        kind = "FSDP1 all-gathers and reduce-scatters"
    else:
        return Timing(None, f"a {type(model).__name__} model: not DDP or FSDP, its waits are not "
                            "known here: judged by step time")
    clock = CollectiveClock()
    if isinstance(model, DistributedDataParallel):
        clock.watch(model)
        accelerator = trainer.accelerator
        accelerator.backward = clock.timed_backward(accelerator.backward)
    dist_waits.install(clock.waited)
    return Timing(clock, f"{kind}, blocking torch.distributed collectives (gathers, barriers)")


def detach(trainer: Any, timing: Timing) -> None:
    """Stop timing: the gradient stamps off the model, the accelerator's own backward and the plain
    collectives back."""
    dist_waits.uninstall()
    if timing.clock is not None:
        timing.clock.unwatch()
    accelerator = getattr(trainer, "accelerator", None)
    wrapped = getattr(getattr(accelerator, "backward", None), "__wrapped__", None)
    if accelerator is not None and wrapped is not None:
        accelerator.backward = wrapped
