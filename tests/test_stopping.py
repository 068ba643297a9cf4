"""trainer/stopping.py with real SIGTERMs sent to this process: noted while a rank reads its flags
(torchrun stops a peer that is a second behind when one rank stops at a bad flag), raised once armed,
noted again while the run closes."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from trainer.stopping import Stopping, Terminated


@pytest.fixture
def stop() -> Iterator[Stopping]:
    """A fresh state whose handler is this process's until the test ends."""
    before = signal.getsignal(signal.SIGTERM)
    state = Stopping()
    state.install()
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, before)


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs in this (the main) thread as the call returns


def test_a_sigterm_while_the_flags_are_read_is_noted_then_raised_when_armed(stop: Stopping) -> None:
    sigterm()
    assert stop.received
    with pytest.raises(Terminated) as raised:
        stop.arm()
    assert raised.value.code == 143
    sigterm()  # a second one is only noted: the first already unwinds the run


def test_once_armed_a_sigterm_raises_once_and_not_while_the_run_closes(stop: Stopping) -> None:
    stop.arm()
    with pytest.raises(Terminated):
        sigterm()
    sigterm()
    assert stop.received


def test_a_sigterm_while_closing_is_noted_and_arming_then_raises_nothing(stop: Stopping) -> None:
    stop.closing = True
    stop.arm()
    sigterm()
    assert stop.received
    stop.arm()


def test_installing_again_disarms_but_keeps_what_was_received(stop: Stopping) -> None:
    """trainer/__main__.py installs before its imports, trainer.sft.main again: a SIGTERM between counts."""
    stop.arm()
    stop.closing = True
    sigterm()
    stop.closing = False
    stop.install()
    assert stop.received and not stop.armed
    sigterm()  # noted
