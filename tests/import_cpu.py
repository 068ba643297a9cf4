"""What importing costs in CPU time: ``python -m tests.import_cpu 'from trl import SFTTrainer' [--top N]``.

``python -X importtime`` reports wall time, which on a shared machine says more about the load than
about the import. This times each module's first import with ``time.process_time``, its own part
(without the modules it imported in turn) and the whole, and prints the total, the own parts summed
by top-level package, and the costliest modules as a whole: the profile in docs/development.md
("What a process costs to start and to end").
"""
from __future__ import annotations

import _frozen_importlib  # CPython's import machinery: every import not yet in sys.modules calls its _find_and_load
import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


def profile(statements: str) -> tuple[float, dict[str, tuple[float, float]]]:
    """Run ``statements``; return their CPU-seconds and, per module imported, (own, whole)."""
    original: Callable[..., Any] = _frozen_importlib._find_and_load
    children = [0.0]
    rows: dict[str, tuple[float, float]] = {}

    def timed(name: str, import_: Any) -> Any:
        started = time.process_time()
        children.append(0.0)
        try:
            return original(name, import_)
        finally:
            whole = time.process_time() - started
            inner = children.pop()
            children[-1] += whole
            rows[name] = (whole - inner, whole)

    _frozen_importlib._find_and_load = timed
    started = time.process_time()
    try:
        exec(statements, {})
    finally:
        _frozen_importlib._find_and_load = original
    return time.process_time() - started, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.import_cpu", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("statements", help="Python to run, e.g. 'import torch'")
    parser.add_argument("--top", type=int, default=15, help="how many packages and modules to list")
    args = parser.parse_args(argv)
    total, rows = profile(args.statements)
    if not rows:
        print("nothing was imported: each module named was in sys.modules already", file=sys.stderr)
        return 1
    packages: dict[str, float] = defaultdict(float)
    for name, (own, _) in rows.items():
        packages[name.split(".")[0]] += own
    print(f"{total:.2f} CPU-s, {len(rows)} modules imported")
    print("own CPU-s by top-level package:")
    for name, own in sorted(packages.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {own:6.2f}  {name}")
    print("CPU-s of a module's import, what it imported included:")
    for name, (_, whole) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"  {whole:6.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
