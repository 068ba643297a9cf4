"""A SIGTERM while the ``relay`` program starts, before the relay's loop takes signals over: ``relay
serve`` stops there, leaving nothing behind, with exit 0 (docs/relay.md, "Sinks at shutdown"); every
other command dies of it as it always did.

The program's first import (relay/cli/__init__.py) calls ``defer``: a SIGTERM is noted until the
command is known (``for_command``). Imported into another program, nothing here changes its signals.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # (imported first thing by the program: nothing here may take long to import)
    from relay.journal.journal import Journal

log = logging.getLogger("relay")


class Stopped(BaseException):
    """SIGTERM before the relay listens: raised where start-up is (a BaseException, so that no
    plugin's ``except Exception`` holds it up)."""


_pending = False


def _note(*_: object) -> None:
    global _pending
    _pending = True


def stop_starting(*_: object) -> NoReturn:
    """The handler while ``relay serve`` starts."""
    raise Stopped


def _is_program() -> bool:
    """``relay ...`` (the console script) or ``python -m relay ...``."""
    path = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return path.name == "relay" or path.parts[-2:] == ("relay", "__main__.py")


def defer() -> None:
    """In the relay program, from its first import on: note a SIGTERM until ``for_command``."""
    if threading.current_thread() is threading.main_thread() and _is_program():
        signal.signal(signal.SIGTERM, _note)


def for_command(serve: bool) -> None:
    """The command is known: serve stops at a SIGTERM (now, if one came already); any other gets the
    default back (and dies of one that came)."""
    if signal.getsignal(signal.SIGTERM) is not _note:
        return  # not the relay program: its signals are its own
    if serve:
        signal.signal(signal.SIGTERM, stop_starting)
        if _pending:
            raise Stopped
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _pending:
        os.kill(os.getpid(), signal.SIGTERM)


def exit_before_listening(journal: Journal | None) -> NoReturn:
    """``relay serve`` stopped by a SIGTERM before it listened: nothing was journaled, so it leaves
    nothing behind (no lock, no empty journal folder) and exits 0 at once; a half-made socket must
    not hold the exit up."""
    if journal is not None:
        journal.abandon()
    log.info("stopped (SIGTERM) before listening")
    logging.shutdown()
    os._exit(0)
