"""Run a command beside a CPU burner, the way ``make test-loaded`` runs the suite: ``--procs`` busy
loops at normal priority (each one a runnable process, so the load average stays at least that
high while they run), the command's exit status passed on, the load it saw printed at the end.

    python tests/burn.py --procs 6 -- make test

A test that passes only on an idle machine fails here first (docs/development.md, "Steady under load").
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time


def burn() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=6, help="busy loops to run beside the command (6)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --, e.g. -- make test")
    burners = [multiprocessing.get_context("fork").Process(target=burn, daemon=True) for _ in range(args.procs)]
    for proc in burners:
        proc.start()
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10):
            samples.append(os.getloadavg()[0])
    threading.Thread(target=sample, daemon=True).start()
    started = time.monotonic()
    try:
        status = subprocess.call(command)
    finally:
        done.set()
        for proc in burners:
            proc.terminate()
        for proc in burners:
            proc.join(10)
    samples = samples or [os.getloadavg()[0]]
    print(f"burn: {' '.join(command)} exited {status} after {time.monotonic() - started:.0f} s beside "
          f"{args.procs} busy loops; load average (1 min) {min(samples):.1f} / {statistics.median(samples):.1f} / "
          f"{max(samples):.1f} (min / median / max)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
