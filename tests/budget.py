"""The suite's budget, made visible: CPU seconds and wall seconds per test and per tier, the tests
that cost most, and the load the run saw (``--budget``; ``make test`` and ``make test-fast`` pass it).

Wall time on this shared machine says more about the load than about a test, so each test's CPU is
counted too: the pytest process's own CPU plus that of every child it reaped during the test (relay,
publisher, trainer and torchrun processes, with the grandchildren each reaped in turn), measured
phase by phase (setup, call, teardown) where the test runs and carried to the pytest-xdist
controller on the reports. A process left running past its test, or killed before it reaped its own
children, is not counted: the figures are a floor, and close to the truth for tests that stop what
they start. A session fixture's work is counted in the first test that asks for it.

``--budget-json PATH`` also writes every test's figures, for profiling (docs/development.md).
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CPU_KEY = "cpu_s"
TIERS = ("fast", "slow")


_charged = [0.0]


def charge(seconds: float) -> None:
    """Count ``seconds`` of CPU that a process this one has not reaped yet reported as done: a
    long-lived child's work, counted in the test it did it for (tests/warm_ranks.py's jobs); when
    that child is reaped, its helper takes back what it charged (its whole CPU comes in then)."""
    _charged[0] += seconds


def cpu_seconds() -> float:
    """CPU of this process and of the children it has reaped, user and system, and what was charged."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _charged[0]


@dataclass
class Cost:
    tier: str
    wall: float = 0.0
    cpu: float = 0.0


@dataclass
class LoadSampler:
    """The 1-minute load average every ``every`` seconds while the run lasts (a daemon thread)."""

    every: float = 10.0
    samples: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.samples.append(os.getloadavg()[0])
        threading.Thread(target=self._run, name="load-sampler", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> str:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])
        low, mid, high = min(self.samples), statistics.median(self.samples), max(self.samples)
        return f"load average (1 min) {low:.1f} / {mid:.1f} / {high:.1f} (min / median / max)"


class Budget:
    """Where tests run: each report gets its phase's CPU. Where reports arrive (the controller, or
    the one process without xdist): the totals, printed at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.top = config.getoption("budget")
        self.json_path: str | None = config.getoption("budget_json")
        self.show = self.top is not None or self.json_path is not None
        self.controller = not hasattr(config, "workerinput")
        self.costs: dict[str, Cost] = {}
        self.started = time.monotonic()
        self.load = LoadSampler()
        self._mark = 0.0
        self.workers_cpu = 0.0  # the xdist workers' own CPU in all, as each reports when it ends
        self.collect_cpu = 0.0  # ... of which collecting (importing every test module)
        if self.show and self.controller:
            self.load.start()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Iterator[None]:
        started = cpu_seconds()
        yield
        self.collect_cpu = cpu_seconds() - started

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.controller:  # pytest-xdist sends workeroutput to the controller
            output = session.config.workeroutput  # type: ignore[attr-defined]
            output.update(cpu_s=cpu_seconds(), collect_cpu_s=self.collect_cpu)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        output = getattr(node, "workeroutput", {})
        self.workers_cpu += output.get("cpu_s", 0.0)
        self.collect_cpu += output.get("collect_cpu_s", 0.0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self._mark = cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item) -> Iterator[None]:
        outcome = yield
        now = cpu_seconds()
        outcome.get_result().user_properties.append((CPU_KEY, round(now - self._mark, 3)))
        self._mark = now

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cost = self.costs.setdefault(report.nodeid, Cost("slow" if "slow" in report.keywords else "fast"))
        cost.wall += report.duration
        cost.cpu += sum(value for key, value in report.user_properties if key == CPU_KEY)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not (self.show and self.controller):
            return
        write = terminalreporter.write_line
        terminalreporter.section("suite budget")
        elapsed = time.monotonic() - self.started
        in_tests = sum(c.cpu for c in self.costs.values())
        total = self.workers_cpu or cpu_seconds()
        write(f"session: {elapsed:.0f} s wall, {total:.0f} CPU-s counted ({self.collect_cpu:.0f} collecting, "
              f"{in_tests:.0f} in tests), {self.load.stop()}")
        for tier in TIERS:
            costs = [c for c in self.costs.values() if c.tier == tier]
            if costs:
                write(f"{tier:>4} tier: {len(costs)} run, {sum(c.cpu for c in costs):7.1f} CPU-s, "
                      f"{sum(c.wall for c in costs):7.1f} s of test wall time (summed over workers)")
        if self.top:
            write(f"the costliest {self.top} by CPU (CPU-s, wall s, tier):")
            ranked = sorted(self.costs.items(), key=lambda kv: kv[1].cpu, reverse=True)[:self.top]
            for nodeid, cost in ranked:
                write(f"{cost.cpu:8.1f} {cost.wall:8.1f}  {cost.tier}  {nodeid}")
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(
                {nodeid: {"tier": c.tier, "cpu_s": round(c.cpu, 3), "wall_s": round(c.wall, 3)}
                 for nodeid, c in self.costs.items()}, indent=1))
            write(f"every test's figures: {self.json_path}")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("budget", "the suite's cost (tests/budget.py)")
    group.addoption("--budget", type=int, nargs="?", const=15, default=None, metavar="N",
                    help="print CPU and wall seconds per tier, the load, and the N (15) costliest tests")
    group.addoption("--budget-json", default=None, metavar="PATH", help="write every test's CPU and wall seconds")
