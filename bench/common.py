"""Shared measurement helpers: alternate contenders, take medians, report spread and ratios."""
from __future__ import annotations

import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Sample:
    """Repeated measurements of one contender, in one unit."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.values), max(self.values)

    def row(self, baseline: "Sample | None" = None) -> dict:
        lo, hi = self.spread
        out = {"name": self.name, "unit": self.unit, "median": self.median, "min": lo, "max": hi, "n": len(self.values)}
        if baseline is not None:
            out["ratio"] = self.median / baseline.median
            out["vs"] = baseline.name
        return out


def alternate(contenders: dict[str, Callable[[], float]], rounds: int, unit: str) -> dict[str, Sample]:
    """Run each contender once per round, in rotating order, so drift hits them all alike."""
    samples = {name: Sample(name, unit) for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            samples[name].values.append(contenders[name]())
    return samples


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        for scale, suffix in ((1e-6, "us"), (1e-3, "ms"), (1.0, "s")):
            if value < scale * 1000:
                return f"{value / scale:.2f} {suffix}"
    if unit == "events/s":
        return f"{value:,.0f} ev/s"
    return f"{value:.4g} {unit}"


def table(rows: list[dict], title: str) -> str:
    """A Markdown table: contender, median, spread, ratio to its baseline."""
    lines = [f"### {title}", "", "| contender | median | min .. max | n | ratio |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x {r['vs']}" if "ratio" in r else "baseline"
        lines.append(f"| {r['name']} | {fmt(r['median'], r['unit'])} | {fmt(r['min'], r['unit'])} .. "
                     f"{fmt(r['max'], r['unit'])} | {r['n']} | {ratio} |")
    return "\n".join(lines)


def machine() -> dict:
    import msgpack
    import zmq
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(), "msgpack": ".".join(map(str, msgpack.version))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RelayRun:
    """A real relay subprocess for benchmarks (the same program users run)."""

    def __init__(self, workdir: Path, args: list[str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready = workdir / "ready.json"
        self.ready.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}",
                                      "--ready-file", str(self.ready), "--log-level", "warning", *args],
                                     cwd=workdir, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("relay did not start")
            time.sleep(0.02)
        self.address = json.loads(self.ready.read_text())["address"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
