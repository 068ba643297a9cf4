"""The demo job with Aim's own in-process ``AimCallback`` in place of the relay: the third contender
of bench_training. Everything else is ``python -m trainer``, its exit included
(``trainer.__main__.main``); run it the same way (under torchrun).

    python -m bench.aim_job AIM_REPO [trainer flags, with --tracker none]
"""
from __future__ import annotations

import sys

from trainer.__main__ import main


def run(argv: list[str]) -> int:
    from aim.hugging_face import AimCallback

    # Aim's defaults but one: listing installed packages needs pkg_resources, which is absent here.
    return main(argv[1:], callbacks=[AimCallback(repo=argv[0], experiment="bench-training", log_system_params=False)])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
