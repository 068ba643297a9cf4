"""``Accelerator(log_with=[RelayTracker()])``: an accelerate loop's run through the relay, from
every rank, tracked as ``python -m trainer`` tracks a job (trainer/job_tracking.py).

accelerate calls ``log_with``'s trackers on its main process only, so the first RelayTracker made
wraps ``init_trackers`` and ``log`` once, for every rank's figures to count (docs/trainer.md,
"accelerate").
"""
from __future__ import annotations

import functools
import logging
import numbers
import os
import time
from collections.abc import Mapping
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.tracking import GeneralTracker

from relay.client.publisher import Publisher
from trainer import custom_metrics
from trainer.custom_metrics import to_wire
from trainer.job_settings import JobSettings
from trainer.job_tracking import JobPlace, JobTracking, close_at_exit, run_name_of
from trainer.log_stages import split_logs

log = logging.getLogger(__name__)

_WRAPPED = "_relay_every_rank"  # marks the Accelerator methods wrapped already


class RelayTracker(GeneralTracker):
    """accelerate's ``GeneralTracker`` for the relay (docs/trainer.md, "accelerate").

    ``run_name``: the run id's base (default: the project given to ``init_trackers``);
    ``output_dir``: the embedded relay's journal folder (default: the Accelerator's
    ``logging_dir``, which is its ``project_dir`` unless set apart, else the current directory);
    ``settings``: the tracking options of ``python -m trainer`` by their names
    (``trackers=["aim"], aim_repo=...``; each also read from ``RELAY_<NAME>`` in the environment:
    trainer/job_settings.py).
    """

    name = "relay"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str | None = None,
                 output_dir: str | os.PathLike[str] | None = None, **settings: Any) -> None:
        super().__init__()
        self._settings = JobSettings.read(settings)
        self._run_name = run_name
        self._output_dir = output_dir
        self._project: str | None = None
        self._logging_dir: str | os.PathLike[str] | None = None
        self._started = False
        self._job: JobTracking | None = None
        self._pub: Publisher | None = None
        self._begun = 0.0
        self._step: int | None = None
        self._left_out: set[str] = set()
        #: ``log`` calls so far: the wrapped ``Accelerator.log`` calls this tracker where
        #: accelerate did not.
        self.calls = 0
        _reach_every_rank()

    @property
    def tracker(self) -> Publisher | None:
        """This process's publisher while the run is open (None before ``start``, after
        ``finish``)."""
        return self._pub

    def place(self, project: str, logging_dir: str | os.PathLike[str] | None) -> None:
        """What ``init_trackers`` knows and accelerate hands no tracker made by the user: the
        project (the run id's base unless ``run_name``) and the Accelerator's ``logging_dir``."""
        self._project = project
        self._logging_dir = logging_dir

    def start(self) -> None:
        """Open the job's tracking: every rank at once (``init_trackers``), once."""
        if self._started:
            return
        self._started = True
        if not self._settings.on:  # trackers=["none"]: track() and set_params() discard too
            custom_metrics.disable()
            return
        state = PartialState()
        folder = os.fspath(self._output_dir or self._logging_dir or ".")
        place = JobPlace(folder, state.process_index, state.local_process_index,
                         state.num_processes, run_name_of(self._run_name or self._project, None))
        settings = self._settings
        job = JobTracking.open(place, settings.tracking, settings.trackers,
                               exp_metadata=settings.exp_metadata,
                               params={"project": self._project})
        close_at_exit(job)
        self._job, self._pub = job, custom_metrics.publisher()
        self._begun = time.perf_counter()
        if job.rank == 0 and self._pub is not None:
            restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
            self._pub.publish("lifecycle", {
                "event": "train_begin", "world_size": place.world_size,
                "attempt": self._pub.attempt, "resumed_from": None, "restart": restart,
            })

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """``init_trackers``' config as the run's ``hparams`` params (rank 0's: the ranks share
        one)."""
        if self._pub is not None and self._job is not None and self._job.rank == 0:
            self._pub.publish("params", to_wire(values), stage="hparams")

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Publish this rank's numbers (one-element tensors too) at ``step``; ``eval_x`` is ``x`` in
        stage ``eval``, ``epoch`` goes in the envelope, anything else is left out and said once."""
        self.calls += 1
        if kwargs:
            raise TypeError(f"RelayTracker.log takes no options (log_kwargs), got "
                            f"{', '.join(kwargs)}")
        pub = self._pub
        if pub is None:
            return
        if step is not None:
            self._step = custom_metrics.current_step = step  # track()'s default, as in a Trainer
        figures = {}
        for key, value in values.items():
            figure = _figure(value)
            if figure is not None:
                figures[key] = figure
            elif key not in self._left_out:
                self._left_out.add(key)
                log.warning("RelayTracker: %r is a %s, not a number; left out of the metrics "
                            "(set_params() records text)", key, type(value).__name__)
        epoch = figures.get("epoch")
        for stage, metrics in split_logs(figures).items():
            pub.publish("metrics", metrics, step=step, epoch=epoch, stage=stage)

    def finish(self) -> None:
        """End the run (``end_training``, on every rank): rank 0 says it completed, every rank
        flushes and waits for the others, rank 0 stops the embedded relay."""
        job, pub = self._job, self._pub
        if job is None or pub is None:
            return
        self._job = self._pub = None
        custom_metrics.current_step = None
        if job.rank == 0:
            pub.publish("lifecycle", {
                "event": "train_end", "status": "completed", "global_step": self._step,
                "wall_seconds": time.perf_counter() - self._begun,
            }, step=self._step)
        job.close(self._settings.tracking.relay_flush_timeout, completed=True)


def _figure(value: Any) -> int | float | None:
    """A logged value as a number (a one-element tensor or numpy scalar too), else None."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, numbers.Real):
        item = getattr(value, "item", None)
        try:
            value = item() if callable(item) else None
        except (RuntimeError, ValueError):  # more than one element: not a figure
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None
    return value if isinstance(value, int) else float(value)


def _ours(trackers: list[Any]) -> list[RelayTracker]:
    return [tracker for tracker in trackers if isinstance(tracker, RelayTracker)]


def _reach_every_rank() -> None:
    """Have ``Accelerator.init_trackers`` and ``Accelerator.log`` call RelayTrackers on every rank
    (see the module); once per process, whatever else they do left as it was."""
    if getattr(Accelerator.init_trackers, _WRAPPED, False):
        return
    init_trackers, log_values = Accelerator.init_trackers, Accelerator.log

    @functools.wraps(init_trackers)
    def init_every_rank(self: Accelerator, project_name: str, config: dict[str, Any] | None = None,
                        init_kwargs: dict[str, Any] | None = None) -> None:
        ours = _ours(self.log_with)
        for tracker in ours:
            tracker.place(project_name, self.logging_dir)
        init_trackers(self, project_name, config=config, init_kwargs=init_kwargs)
        for tracker in ours:
            # accelerate left it out: not its main process
            left_out = all(other is not tracker for other in self.trackers)
            if left_out:
                self.trackers.append(tracker)
            tracker.start()
            if left_out and config is not None:
                tracker.store_init_configuration(config)

    @functools.wraps(log_values)
    def log_every_rank(self: Accelerator, values: dict[str, Any], step: int | None = None,
                       log_kwargs: dict[str, Any] | None = None) -> None:
        calls = {id(tracker): tracker.calls for tracker in _ours(self.trackers)}
        log_values(self, values, step=step, log_kwargs=log_kwargs)
        for tracker in _ours(self.trackers):
            if tracker.calls == calls.get(id(tracker)):  # accelerate did not call it here
                tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    for wrapper in (init_every_rank, log_every_rank):
        setattr(wrapper, _WRAPPED, True)
    Accelerator.init_trackers = init_every_rank
    Accelerator.log = log_every_rank
