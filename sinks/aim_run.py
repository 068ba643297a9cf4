"""An Aim run that keeps the training job's own times, not the sink's.

Aim stamps a run's ``creation_time`` when the run object is made and its ``end_time`` when it is
closed. A run written late (``relay replay``, a catch-up after an outage, an idle run closed ten
minutes after its last event) would then show the sink's times and a wrong duration. Aim takes a
creation time only where it makes the run's props (``Repo.request_props(..., created_at)``, the
path its own ``copy_runs`` uses to keep a run's time) and writes the end time in its close; both are
set here from the events' own ``ts``: the first the sink met of the run, and the last.

Aim is imported only when the Aim sink opens (the ``[aim]`` extra is optional).
"""
from __future__ import annotations

import datetime
import functools
from typing import Any


@functools.cache
def relay_run_class() -> type:
    """``aim.Run``, made with ``created_at=`` (unix seconds) as its creation time when new."""
    from aim.sdk.run import Run

    class RelayRun(Run):
        def __init__(self, *args: Any, created_at: float | None = None, **kwargs: Any) -> None:
            self._created_at = created_at
            super().__init__(*args, **kwargs)

        @property
        def props(self) -> Any:
            if self._props is None:  # as Aim's own, with the creation time when the props are new
                when: Any = None  # (Aim's stub says datetime; it takes None: "no creation time")
                if self._created_at is not None:
                    when = datetime.datetime.fromtimestamp(self._created_at, tz=datetime.UTC)
                    if not self.repo.is_remote_repo:
                        when = when.replace(tzinfo=None)  # as Aim's SQL rows keep it: naive UTC
                self._props = self.repo.request_props(self.hash, self.read_only, when)
            return self._props

    return RelayRun


def close_at(run: Any, end_ts: float | None) -> None:
    """Close ``run`` with ``end_ts`` (unix seconds) as its end time instead of now."""
    resources = run._resources
    if end_ts is not None and resources is not None:
        resources.set_run_end_time = functools.partial(resources.meta_run_tree.__setitem__,
                                                       "end_time", end_ts)
    run.close()
