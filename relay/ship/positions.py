"""A shipper's positions: how far its far side has acknowledged the journal, in a state file beside
the journal, written whole and atomically and only when it changed.

A file kept for another destination, or unreadable, gives no positions: resending what cannot be
told acknowledged costs only time. Each shipper's file keeps the layout it had before this store
(tests/test_ship.py reads files the old code wrote).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from relay.journal.journal import Journal
from sinks.files import write_atomic

log = logging.getLogger(__name__)

T = TypeVar("T")


class PositionFile:
    """The state file ``suffix`` beside ``journal``, for the destination ``target`` names."""

    def __init__(self, journal: Path, suffix: str, target: dict[str, Any]) -> None:
        self.path = Journal(journal).sidecar(suffix)
        self.target = target
        self._saved = ""

    def load(self, parse: Callable[[dict[str, Any]], T]) -> T | None:
        """``parse(state)`` of the file kept for this target; None when there is none, it was kept
        for another destination, or it (or what ``parse`` reads of it) is unreadable."""
        try:
            state = json.loads(self.path.read_text())
            if any(state.get(key) != value for key, value in self.target.items()):
                kept = {key: state.get(key) for key in self.target}
                log.info("%s was kept for %s: its positions are not used here", self.path, kept)
                return None
            return parse(state)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            log.warning("cannot read the state file %s (%s): its positions are not used", self.path,
                        exc)
            return None

    def save(self, positions: dict[str, Any]) -> None:
        """Write the target and ``positions`` when they changed; a failure is logged (it costs only
        sending more again after a restart)."""
        text = json.dumps({**self.target, **positions}, sort_keys=True)
        if text == self._saved:
            return
        try:
            write_atomic(self.path, text)
        except OSError as exc:
            log.warning("cannot write the state file %s: %s", self.path, exc.strerror)
            return
        self._saved = text
