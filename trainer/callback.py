"""The thin per-rank TrainerCallback: turns Trainer events into relay events, nothing more (what
each rank publishes: docs/trainer.md, "What is recorded").

Each hook builds a small dict and calls ``publish``, which never blocks; no I/O happens here except
the bounded flush at the end of training.
"""
from __future__ import annotations

import logging
import os
import platform
import resource
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from relay.client.publisher import Publisher
from trainer import collectives, custom_metrics, ran_as
from trainer.custom_metrics import to_wire
from trainer.job_settings import JobSettings
from trainer.job_tracking import JobPlace, JobTracking, close_at_exit, run_name_of
from trainer.log_stages import split_logs
from trainer.run_identity import write_run_file

log = logging.getLogger(__name__)

_VERSIONED = ("metrics-relay", "torch", "transformers", "trl", "peft", "accelerate", "datasets",
              "pyzmq")


def library_versions() -> dict[str, str]:
    """The versions that explain a run's numbers; read once, when the callback is made."""
    found = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _usage(wall_since: float, cpu_since: float) -> dict[str, float]:
    """This process's CPU use over the window, in % of one core, and its resident memory now, in %
    of the machine's: the figures Aim's own resource tracker records per process (``cpu``,
    ``p_memory_percent``)."""
    out = {}
    wall = time.perf_counter() - wall_since
    if wall > 0:
        out["cpu_percent"] = 100.0 * (time.process_time() - cpu_since) / wall
    try:
        with open("/proc/self/statm", "rb") as fh:
            resident = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        out["memory_percent"] = 100.0 * resident / physical
    except (OSError, ValueError, IndexError):  # not Linux: the CPU figure alone
        pass
    return out


class RelayCallback(TrainerCallback):
    """Publish a Trainer's metrics and lifecycle from every rank:
    ``Trainer(callbacks=[RelayCallback()])``.

    With no publisher given and none started in this process, the callback tracks the job itself,
    as ``python -m trainer`` does (docs/trainer.md, "One line in any Trainer"). ``settings`` are
    the tracking options of ``python -m trainer`` by their names (``trackers=["aim"],
    aim_repo=...``; each also read from ``RELAY_<NAME>``: trainer/job_settings.py).
    """

    def __init__(self, publisher: Publisher | None = None, *, flush_timeout: float = 30.0,
                 run_params: Mapping[str, Mapping[str, Any]] | None = None, trainer: Any = None,
                 time_collectives: bool = True, **settings: Any) -> None:
        """``trainer``: the Trainer this callback is added to, so that under DDP or FSDP the waits
        in its collectives are timed on the model it wraps (on_train_begin gets the unwrapped one);
        ``time_collectives=False`` times nothing (ranks then send no own work)."""
        if not flush_timeout > 0:
            raise ValueError(f"flush_timeout must be positive, got {flush_timeout!r}")
        pub = publisher or custom_metrics.publisher()
        if pub is not None and settings:
            raise ValueError(f"{', '.join(settings)}: tracking settings need no publisher; this "
                             f"one is connected to run {pub.run!r} already")
        #: What the callback tracks the job with when it connects it itself (None: it was
        #: connected).
        self._settings = JobSettings.read(settings) if pub is None else None
        self._job: JobTracking | None = None
        self._pub = pub  # None until on_train_begin connects the job
        self._flush_timeout = flush_timeout
        self._run_params = {"versions": library_versions(), **(run_params or {})}
        self._samples_per_step = 1
        self._cuda = None
        self._trainer = trainer
        self._time_collectives = time_collectives
        self._clock: collectives.CollectiveClock | None = None
        self._timing: collectives.Timing | None = None
        self._reset_window()
        self._step_start = 0.0
        self._step_end = 0.0
        self._train_start = 0.0
        #: Seconds of ``flush_timeout`` the end-of-training flush left unused (None until it ran):
        #: closing the publisher gets only these, so the whole wait stays within ``flush_timeout``.
        self.flush_time_left: float | None = None

    def _reset_window(self) -> None:
        self._steps = 0
        self._busy = 0.0
        self._slowest = 0.0
        self._outside = 0.0  # between steps: from one step's end to the next one's beginning
        self._window_wall, self._window_cpu = time.perf_counter(), time.process_time()

    def _connect(self, args: TrainingArguments) -> None:
        """Track the job as ``python -m trainer`` does (see the class): every rank, once."""
        settings = self._settings
        assert settings is not None
        place = JobPlace(args.output_dir or ".", args.process_index, args.local_process_index,
                         args.world_size, run_name_of(args.run_name, args.output_dir),
                         _checkpoint_of(args))
        self._job = JobTracking.open(place, settings.tracking, settings.trackers,
                                     exp_metadata=settings.exp_metadata)
        close_at_exit(self._job)
        self._pub = custom_metrics.publisher()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, **kwargs: Any) -> None:
        if self._pub is None and self._settings is not None:
            if self._settings.on:
                self._connect(args)
            else:  # trackers=["none"]: track() and set_params() discard too
                custom_metrics.disable()
        if self._pub is None:
            return
        self._samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        torch = sys.modules.get("torch")
        self._cuda = torch.cuda if torch is not None and torch.cuda.is_available() else None
        self._train_start = self._step_end = time.perf_counter()
        if self._trainer is not None and args.world_size > 1:
            self._timing = collectives.attach(self._trainer, self._time_collectives)
            self._clock = self._timing.clock
        if not state.is_world_process_zero:
            return
        pub = self._pub
        pub.publish("lifecycle", {
            "event": "train_begin", "world_size": args.world_size, "max_steps": state.max_steps,
            "num_train_epochs": state.num_train_epochs, "train_batch_size": state.train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            # the run's attempt (a job resumed from a checkpoint is the next one:
            # trainer/run_identity.py), the step it resumed from, and torchrun's restarts of this
            # job so far
            "attempt": pub.attempt, "resumed_from": state.global_step if pub.attempt else None,
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        }, step=state.global_step, epoch=state.epoch)
        pub.publish("params", to_wire(ran_as.hparams(args.to_dict(), self._trainer)),
                    stage="hparams")
        if model is not None:
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            config = getattr(base, "config", None)
            if config is not None:
                pub.publish("params", to_wire(config.to_dict()), stage="model")
            peft_config = getattr(model, "peft_config", None)
            if peft_config:
                adapters = {name: to_wire(cfg.to_dict()) for name, cfg in peft_config.items()}
                pub.publish("params", adapters, stage="peft")
            # what W&B's HF callback adds as model/num_parameters
            if hasattr(model, "num_parameters"):
                pub.publish("params", {"num_parameters": model.num_parameters()},
                            stage="model_info")
        for name, params in self._run_params.items():
            pub.publish("params", to_wire(params), stage=name)
        if self._timing is not None:
            timing = {"measured": self._timing.clock is not None, "timed": self._timing.what}
            pub.publish("params", timing, stage="own_work")

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._step_start = now = time.perf_counter()
        self._outside += now - self._step_end
        if self._clock is not None:
            self._clock.step_begins()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._step_end = now = time.perf_counter()
        took = now - self._step_start
        if self._clock is not None:
            self._clock.step_ends()
        self._steps += 1
        self._busy += took
        self._slowest = max(self._slowest, took)
        custom_metrics.current_step = state.global_step
        if control.should_log:
            self._publish_rank_window(state)

    def _publish_rank_window(self, state: TrainerState) -> None:
        steps = self._steps
        if not steps or self._pub is None:
            return
        data = {
            "step_time": self._busy / steps,
            "step_time_max": self._slowest,
            "samples_per_second":
                self._samples_per_step * steps / self._busy if self._busy else 0.0,
            "steps": steps,
            "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "outside_time": self._outside / steps,
        }
        data.update(_usage(self._window_wall, self._window_cpu))
        if self._clock is not None:
            inside, outside = self._clock.take()
            data["collective_wait"] = inside / steps
            data["outside_wait"] = outside / steps
            data["own_time"] = (self._busy - inside + self._outside - outside) / steps
        if self._cuda is not None:
            data["cuda_peak_allocated_mb"] = self._cuda.max_memory_allocated() / 2**20
            data["cuda_peak_reserved_mb"] = self._cuda.max_memory_reserved() / 2**20
        self._pub.publish("metrics", data, step=state.global_step, epoch=state.epoch, stage="rank")
        self._reset_window()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs or self._pub is None:
            return
        for stage, metrics in split_logs(logs).items():
            self._pub.publish("metrics", metrics, step=state.global_step, epoch=state.epoch,
                              stage=stage)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        """Beside the checkpoint, the run it belongs to: a job resumed from it continues that run
        (trainer/run_identity.py). The Trainer calls this once the checkpoint is written."""
        if state.is_world_process_zero and self._pub is not None:
            path = f"{args.output_dir}/{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            try:
                if os.path.isdir(path):
                    write_run_file(path, {"run": self._pub.run, "attempt": self._pub.attempt,
                                          "step": state.global_step})
            except OSError as exc:
                # never into training: a job resumed from it starts a new run, and says so
                log.warning("cannot record run %s in %s: %s", self._pub.run, path, exc)
            self._pub.publish("lifecycle", {
                "event": "checkpoint", "path": path,
                "best_model_checkpoint": state.best_model_checkpoint,
            }, step=state.global_step, epoch=state.epoch)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._pub is None:
            return
        self._publish_rank_window(state)
        if self._timing is not None:
            collectives.detach(self._trainer, self._timing)
            self._clock = self._timing = None
        custom_metrics.current_step = None
        if state.is_world_process_zero:
            self._pub.publish("lifecycle", {
                "event": "train_end", "status": "completed", "global_step": state.global_step,
                "wall_seconds": time.perf_counter() - self._train_start,
            }, step=state.global_step, epoch=state.epoch)
        started = time.monotonic()
        self._pub.flush(self._flush_timeout)
        self.flush_time_left = max(0.0, self._flush_timeout - (time.monotonic() - started))
        if self._job is not None:  # the callback connected the job: it closes it too
            self._job.close(self.flush_time_left, completed=True)
            self._job = None
            self._pub = None


def _checkpoint_of(args: TrainingArguments) -> str | None:
    """The checkpoint a job resumes from, where its arguments say (``--resume_from_checkpoint``):
    the run that saved it goes on (trainer/run_identity.py)."""
    path = getattr(args, "resume_from_checkpoint", None)
    return path if isinstance(path, str) and os.path.isdir(path) else None
