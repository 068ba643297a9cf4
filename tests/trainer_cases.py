"""Several trainer command lines in one process, for the tests of what the trainer says when it stops
before training (bad input, a relay that cannot start):

    trainer_cases.py CASES.json RESULTS.json

CASES is a list of ``{"argv": [...], "env": {...}}``; each argument list is run as ``python -m trainer``
runs it (``trainer.sft.main``, whose return value is the exit status) with file descriptors 1 and 2 sent
to files of its own and ``env`` added to the environment while it runs (what the trainer reads from the
environment, the relay secret, it reads when it checks its flags), and RESULTS gets
``[{"status": ..., "stdout": ..., "stderr": ...}]`` in the same order. A process per case
imported torch, transformers and trl again each time (about 7 CPU-seconds a case); the exit status of
the real command is tested in tests/test_trainer_cli.py and tests/hostile/test_torchrun_usage.py.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import tempfile

from trainer.sft import main


def run(argv: list[str], env: dict[str, str]) -> dict:
    saved_env = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return _run(argv)
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def _run(argv: list[str]) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            status = main(argv)
        except SystemExit as exc:  # as the interpreter turns it into an exit status
            status = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
        out.seek(0)
        err.seek(0)
        return {"status": status or 0, "stdout": out.read(), "stderr": err.read()}


if __name__ == "__main__":
    cases_path, results_path = sys.argv[1:]
    with open(cases_path, encoding="utf-8") as fh:
        cases = json.load(fh)
    with open(results_path, "w", encoding="utf-8") as fh:
        json.dump([run(case["argv"], case["env"]) for case in cases], fh)
    gc.freeze()  # as trainer/__main__.py: the exit need not walk what torch, transformers and trl built
