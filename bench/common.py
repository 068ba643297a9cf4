"""Shared measurement helpers: alternate contenders, take medians, report spread and ratios."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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

    def row(self, baseline: Sample | None = None) -> dict:
        lo, hi = self.spread
        out = {"name": self.name, "unit": self.unit, "median": self.median, "min": lo, "max": hi, "n": len(self.values)}
        if baseline is not None:
            out["ratio"] = self.median / baseline.median
            out["vs"] = baseline.name
        return out


def alternate(contenders: dict[str, Callable[[], float]], rounds: int, unit: str) -> dict[str, Sample]:
    """Run each contender once per round, in rotating order, so drift hits them all alike."""
    many = alternate_many({name: (lambda f=f: {unit: f()}) for name, f in contenders.items()}, rounds)
    return {name: Sample(name, unit, metrics[unit].values) for name, metrics in many.items()}


def alternate_many(contenders: dict[str, Callable[[], dict[str, float]]], rounds: int) -> dict[str, dict[str, Sample]]:
    """Like alternate() for contenders that measure several things at once ({unit: value} per round)."""
    samples: dict[str, dict[str, Sample]] = {name: {} for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            for unit, value in contenders[name]().items():
                samples[name].setdefault(unit, Sample(name, unit)).values.append(value)
    return samples


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


@dataclass
class Section:
    """One benchmark's results: tables of Sample rows, other Markdown, targets checked against the
    figures, notes, and the raw figures for the JSON file and the plots."""

    key: str
    title: str
    tables: list[tuple[str, list[dict]]] = field(default_factory=list)
    markdown: list[str] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def add_table(self, title: str, rows: list[dict]) -> None:
        """A table of Sample rows (median, spread, ratio)."""
        self.tables.append((title, rows))

    def target(self, what: str, value: float, bound: float, higher_is_better: bool, shown: str) -> None:
        """Record a target: ``shown`` is the figure as people read it (e.g. "1.21x")."""
        met = value >= bound if higher_is_better else value <= bound
        self.targets.append({"target": what, "value": value, "bound": bound, "shown": shown, "met": met})

    def render(self) -> str:
        """The section as Markdown: its tables, then targets, then notes."""
        parts = [f"## {self.title}", *(table(rows, title) for title, rows in self.tables), *self.markdown]
        if self.targets:
            parts.append("\n".join(["| target | measured | met |", "|---|---|---|"] + [
                f"| {t['target']} | {t['shown']} | {'yes' if t['met'] else '**no**'} |" for t in self.targets]))
        if self.notes:
            parts.append("\n".join(f"- {n}" for n in self.notes))
        return "\n\n".join(parts)


def cli(run: Callable[[bool], Section], doc: str | None, argv: list[str] | None) -> Section:
    """The ``python -m bench.bench_X [--quick]`` entry point every section module shares."""
    import argparse
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    section = run(parser.parse_args(argv).quick)
    print(section.render())
    return section


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        for scale, suffix in ((1e-6, "us"), (1e-3, "ms"), (1.0, "s")):
            if value < scale * 1000:
                return f"{value / scale:.2f} {suffix}"
    if unit == "events/s":
        return f"{value:,.0f} ev/s"
    if unit == "values/s":
        return f"{value:,.0f} values/s"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "%core":
        return f"{value:.1f}% of a core"
    return f"{value:.4g} {unit}"


def table(rows: list[dict], title: str) -> str:
    """A Markdown table: contender, median, spread, ratio to its baseline."""
    lines = [f"**{title}**", "", "| contender | median | min .. max | n | ratio |", "|---|---|---|---|---|"]
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
    """A real relay subprocess for benchmarks (the same program users run), in its own session so
    stop() can always take it down."""

    def __init__(self, workdir: Path, args: list[str], timeout: float = 60, bind: str | None = None,
                 root: Path | None = None) -> None:
        """``root``: the checkout whose relay runs (another commit's, for a before/after); default this one."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready = workdir / "ready.json"
        self.ready.unlink(missing_ok=True)
        self.log = workdir / "relay.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "relay", "--bind", bind or f"tcp://127.0.0.1:{free_port()}",
                                          "--ready-file", str(self.ready), "--log-level", "warning", *args],
                                         cwd=workdir, stderr=log, start_new_session=True,
                                         env=None if root is None else {**os.environ, "PYTHONPATH": str(root)})
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(0)
                raise RuntimeError(f"relay did not start: {self.log_tail()}")
            time.sleep(0.02)
        self.address = json.loads(self.ready.read_text())["address"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        """The end of the relay's stderr, for error messages."""
        return self.log.read_text(errors="replace")[-1500:]

    def check_alive(self) -> None:
        """Raise (with its log) if the relay exited while a benchmark was waiting on it."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"relay exited {self.proc.returncode} mid-benchmark: {self.log_tail()}")

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (a clean flush), then SIGKILL to the whole group if it takes longer than ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        kill_group(self.proc)


def spawn(cmd: list[str], **kwargs: object) -> subprocess.Popen:
    """A benchmark helper process in its own session (killed as a group by kill_group)."""
    return subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, **kwargs)


def kill_group(proc: subprocess.Popen) -> None:
    """Make sure ``proc`` and anything it started are gone (finally blocks call this)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
