"""Several trainer command lines in one process, for the tests of what the trainer says of bad input:

    trainer_cases.py CASES.json RESULTS.json

CASES is a list of argument lists; each is run as ``python -m trainer`` runs it (``trainer.sft.main``,
whose return value is the exit status) with file descriptor 2 sent to a file of its own, and RESULTS
gets ``[{"status": ..., "stderr": ...}]`` in the same order. A process per case imported torch,
transformers and trl again each time (about 7 CPU-seconds a case); the exit status of the real
command is tested in tests/test_trainer_cli.py and tests/hostile/test_torchrun_usage.py.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from trainer.sft import main


def run(argv: list[str]) -> dict:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as err:
        os.dup2(err.fileno(), 2)
        try:
            status = main(argv)
        except SystemExit as exc:  # as the interpreter turns it into an exit status
            status = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return {"status": status or 0, "stderr": err.read()}


if __name__ == "__main__":
    cases_path, results_path = sys.argv[1:]
    with open(cases_path, encoding="utf-8") as fh:
        cases = json.load(fh)
    with open(results_path, "w", encoding="utf-8") as fh:
        json.dump([run(argv) for argv in cases], fh)
