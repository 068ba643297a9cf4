"""Slowness that load cannot undo: ``burn(seconds)`` computes until this thread has used ``seconds`` of
CPU time. A sleep takes the same wall time on an idle and on a loaded machine, while the work it is
compared with slows down with the load, so a sleeping rank looks less slow the busier the machine;
burnt CPU time stretches exactly as that work does, and the ratio between them holds."""
from __future__ import annotations

import time


def burn(seconds: float) -> None:
    import torch

    end = time.thread_time() + seconds
    x = torch.ones(64, 64)
    while time.thread_time() < end:
        x = (x @ x).clamp_(-1.0, 1.0)
