"""A job's tracking options, checked the same way wherever they come from: ``python -m trainer``'s
flags (trainer/args.py), or, for a job it does not run (the one-line ``RelayCallback()``, the
accelerate tracker), the same options as keyword arguments or ``RELAY_<NAME>`` variables
(docs/trainer.md, "One line in any Trainer"); a keyword argument wins over the environment.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer import fms_flags
from trainer.errors import UsageError
from trainer.tracker_flags import TRACKERS, TrackingArguments, check_fms_tracking

log = logging.getLogger(__name__)

_FIELDS = {f.name: f for f in dataclasses.fields(TrackingArguments)}
#: Each option's type, None left out of ``X | None``: resolved here, since HfArgumentParser replaces
#: the fields' own annotations (strings) with the types it resolved, once it has parsed them.
_KINDS = {name: next((t for t in typing.get_args(hint) if t is not type(None)), hint)
          for name, hint in typing.get_type_hints(TrackingArguments).items()}
#: Keyword names that are not a field's own: the trackers, as a list, like Trainer's report_to.
_ALIASES = {"trackers": "tracker"}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def env_name(field: str) -> str:
    """``RELAY_<NAME>`` for an option (``relay_address`` -> ``RELAY_ADDRESS``, tracker ->
    RELAY_TRACKERS)."""
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
    def read(cls, given: Mapping[str, Any],
             environ: Mapping[str, str] | None = None) -> JobSettings:
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
            values[name] = (",".join(value) if name == "tracker" and not isinstance(value, str)
                            else value)
        for name in _FIELDS:
            text = environ.get(env_name(name))
            if name not in values and text is not None and text.strip():
                values[name] = _convert(env_name(name), text.strip(), _KINDS[name])
        tracking = TrackingArguments(**values)
        trackers, exp_metadata = check_tracking(tracking)
        return cls(tracking, trackers, exp_metadata)


def parse_trackers(spec: str) -> list[str]:
    """``"aim,mlflow"`` -> ``["jsonl", "aim", "mlflow"]``: jsonl is always kept, since it is the
    source of truth."""
    names = [fms_flags.tracker_name(n.strip().lower()) for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError(f"--tracker: empty; use {', '.join(TRACKERS)}")
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise UsageError(f"--tracker: unknown tracker {unknown[0]!r}; known trackers: "
                         f"{', '.join(TRACKERS)}")
    if "none" in names:
        if len(set(names)) > 1:
            raise UsageError("--tracker: 'none' cannot be combined with other trackers")
        return ["none"]
    return ["jsonl"] + [n for n in dict.fromkeys(names) if n != "jsonl"]


def load_exp_metadata(spec: str | None) -> dict[str, Any] | None:
    """--exp_metadata is inline JSON or a path to a JSON file; either way it must be an object."""
    if spec is None:
        return None
    text, where = spec, "--exp_metadata"
    if not spec.lstrip().startswith("{"):
        if not os.path.isfile(spec):
            raise UsageError(f"--exp_metadata: {spec!r} is neither a JSON object nor an existing "
                             "file")
        where = f"--exp_metadata file {spec}"
        with open(spec, encoding="utf-8") as fh:
            text = fh.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{where}: must be a JSON object, got {type(value).__name__}")
    return value


def check_tracking(tracking: TrackingArguments) -> tuple[list[str], dict[str, Any] | None]:
    """The trackers and run metadata ``tracking`` asks for; UsageError for an option that is wrong
    whatever the job (the command line's, the callback's and the accelerate tracker's alike)."""
    trackers = parse_trackers(tracking.tracker)
    exp_metadata = load_exp_metadata(tracking.exp_metadata)
    check_fms_tracking(tracking, trackers)
    if tracking.wandb_mode not in ("offline", "online"):
        raise UsageError(f"--wandb_mode: {tracking.wandb_mode!r} must be offline or online")
    if tracking.relay_address is not None:
        from relay.wire import auth
        from relay.wire.address import BadAddress, check_connect_address

        try:
            check_connect_address(tracking.relay_address)
            auth.check(tracking.relay_address)  # the relay secret, before anything trains
        except (BadAddress, ValueError) as exc:  # ValueError: secret.SecretError
            raise UsageError(f"--relay_address: {exc}") from None
    for name in ("relay_flush_timeout", "relay_start_timeout", "relay_exit_timeout"):
        if not getattr(tracking, name) > 0:
            raise UsageError(f"--{name} must be positive, got {getattr(tracking, name)}")
    return trackers, exp_metadata


def _convert(variable: str, text: str, kind: Any) -> Any:
    """An environment variable's text as its option's type."""
    try:
        if kind is bool:
            if text.lower() not in _TRUE | _FALSE:
                raise ValueError(f"not one of {', '.join(sorted(_TRUE | _FALSE))}")
            return text.lower() in _TRUE
        if kind in (float, int):
            return kind(text)
    except ValueError as exc:
        raise UsageError(f"{variable}={text!r}: {exc}") from None
    return text
