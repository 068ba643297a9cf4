"""SIGTERM, the launcher's stop: an exception while the rank trains, never while it closes its run.

torchrun stops the surviving ranks of a failed job with SIGTERM and SIGKILLs them after a grace
(``--shutdown-timeout``, 30 s by default: torch/distributed/elastic/multiprocessing/api.py). Raised
as ``Terminated`` in the training loop, it unwinds training, so the rank publishes the run's failed
end and flushes (trainer/sft.py). But when a peer was killed, a survivor is usually unwinding
already (its collective failed as the peer's sockets closed) by the time SIGTERM lands, and an
exception raised in the middle of that closing cut its flush short: no ``train_end``, no final
stats and no spool (issue 25 section 3). So the handler raises once, and only until the closing
begins (``closing``, set first thing there); from then on a SIGTERM is only noted (``received``)
and the closing finishes within the grace: a flush bounded at a few seconds, then the spool.

Nor does it raise before the rank has read its flags (``arm``): when one rank stops at a bad flag,
torchrun stops its peers, and a peer still importing or parsing (a second behind, on a loaded
machine) that died there was listed by torchrun as a failure of its own (exit 143) beside the one
real error. Noted instead, the peer reaches the same bad flag, sees it was stopped and exits 0
(trainer/sft.py); a rank whose flags are fine raises at ``arm``, before any model loads.
"""
from __future__ import annotations

import signal
import time
from types import FrameType


class Terminated(SystemExit):
    """SIGTERM as an exception (exit status 128 + 15), so a stopped job still reports its end."""

    def __str__(self) -> str:
        return f"stopped by SIGTERM (exit {self.code})"


class Stopping:
    """Whether SIGTERM came, and whether it may still raise."""

    def __init__(self) -> None:
        self.armed = False  # the flags are read: a SIGTERM now raises
        self.closing = False  # the run is being closed: a SIGTERM now is noted, not raised
        self.received = False

    def install(self) -> None:
        """Take SIGTERM in this process (the main thread's handler, as Python runs them); until
        ``arm`` it is noted, not raised."""
        self.armed = False
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def arm(self) -> None:
        """From here a SIGTERM raises; one noted while the flags were read raises now."""
        self.armed = True
        if self.received and not self.closing:
            raise Terminated(128 + signal.SIGTERM)

    def close(self) -> None:
        """The run is being closed: from here a SIGTERM is noted, not raised (it must not cut the
        closing short)."""
        self.closing = True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        first = not self.received
        self.received = True
        if first and self.armed and not self.closing:
            raise Terminated(128 + signum)

    def stopped_within(self, seconds: float) -> bool:
        """Whether SIGTERM came already or comes within ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while not self.received and time.monotonic() < deadline:
                time.sleep(0.05)
        except Terminated:
            return True
        return self.received


#: The process's one state: trainer/__main__.py and trainer/sft.py's main() install it, main() arms
#: it once the flags are read, train() says when closing begins.
STOP = Stopping()
