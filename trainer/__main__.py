"""``python -m trainer`` and the ``metrics-relay-train`` console script."""
from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

from trainer.stopping import STOP

if TYPE_CHECKING:
    from transformers import TrainerCallback


def main(argv: list[str] | None = None, callbacks: list[TrainerCallback] | None = None) -> int:
    """``trainer.sft.main`` in a process that ends when it returns (torchrun's ranks, job scripts).

    The job is over, flushed and closed; what is left is the interpreter's exit, whose garbage
    collections walk the half a million objects torch, transformers and trl built: 1-1.5 CPU-s a
    rank (docs/development.md, "Where the time goes"). Frozen, they are not walked; exit handlers
    (the publisher's, W&B's) still run.

    SIGTERM is taken (noted, trainer/stopping.py) before the seconds of importing torch,
    transformers and trl: torchrun stops a rank still importing when its peer stopped at a bad flag,
    and a rank that died of it there was listed as a failure of its own.
    """
    STOP.install()
    from trainer import sft

    status = sft.main(argv, callbacks)
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(main())
