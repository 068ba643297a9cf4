"""The tracking options of a job that ``python -m trainer`` does not run (the one-line
``RelayCallback()``, the accelerate tracker): the command line's tracking flags by their names, given
as keyword arguments or read from the environment, so a job launched by someone else's script is
configured without touching it.

Each option of ``TrackingArguments`` is read from ``RELAY_<NAME>`` (``relay_address`` from
``RELAY_ADDRESS``, ``relay_flush_timeout`` from ``RELAY_FLUSH_TIMEOUT``; the trackers from
``RELAY_TRACKERS``, comma separated); a keyword argument wins over the environment. The run's
metadata (``exp_metadata``) may also be given as a dict, as fms-hf-tuning's ``train()`` takes it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from trainer.args import check_tracking
from trainer.errors import UsageError
from trainer.tracker_flags import TrackingArguments

_FIELDS = {f.name: f for f in dataclasses.fields(TrackingArguments)}
#: Keyword names that are not a field's own: the trackers, as a list, like Trainer's report_to.
_ALIASES = {"trackers": "tracker"}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def env_name(field: str) -> str:
    """``RELAY_<NAME>`` for an option (``relay_address`` -> ``RELAY_ADDRESS``, tracker -> RELAY_TRACKERS)."""
    if field == "tracker":
        return "RELAY_TRACKERS"
    return "RELAY_" + field.removeprefix("relay_").upper()


@dataclass
class JobSettings:
    """Checked tracking options, and what they ask for."""

    tracking: TrackingArguments
    trackers: list[str]
    exp_metadata: dict[str, Any] | None

    @property
    def on(self) -> bool:
        return self.trackers != ["none"]

    @classmethod
    def read(cls, given: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> JobSettings:
        """``given`` keyword options over ``environ``'s (os.environ); UsageError (a ValueError) with
        one line for an unknown name or a bad value."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        metadata = given.get("exp_metadata")
        if isinstance(metadata, Mapping):
            given = {**given, "exp_metadata": json.dumps(metadata, default=str)}
        for key, value in given.items():
            name = _ALIASES.get(key, key)
            if name not in _FIELDS:
                raise UsageError(f"unknown tracking option {key!r}; known: trackers, "
                                 f"{', '.join(n for n in _FIELDS if n != 'tracker')}")
            values[name] = ",".join(value) if name == "tracker" and not isinstance(value, str) else value
        for name, field in _FIELDS.items():
            text = environ.get(env_name(name))
            if name not in values and text is not None and text.strip():
                values[name] = _convert(env_name(name), text.strip(), field.type)
        tracking = TrackingArguments(**values)
        trackers, exp_metadata = check_tracking(tracking)
        return cls(tracking, trackers, exp_metadata)


def _convert(variable: str, text: str, kind: Any) -> Any:
    """An environment variable's text as its option's type (the field's annotation, a string here)."""
    kind = str(kind)
    try:
        if kind.startswith("bool"):
            if text.lower() not in _TRUE | _FALSE:
                raise ValueError(f"not one of {', '.join(sorted(_TRUE | _FALSE))}")
            return text.lower() in _TRUE
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("int"):
            return int(text)
    except ValueError as exc:
        raise UsageError(f"{variable}={text!r}: {exc}") from None
    return text
