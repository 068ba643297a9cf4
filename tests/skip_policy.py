"""The suite never gets smaller in silence: at the end of a run, how many tests ran, were skipped and
xfailed, each skip with its reason; with ``--strict-skips`` (``make test``, so CI) or ``CI`` set in
the environment, a skip that is not on ALLOWED fails the run. A test module that
``importorskip``s a tracker whose extra did not install is such a skip: in CI it is a failure that
names the extra to install, not a green run with a module fewer.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

import pytest

#: Skips that are fine where they happen: (node id pattern, reason pattern, why), fnmatch patterns,
#: the reason as pytest reports it. A new entry says why the suite may be smaller there.
ALLOWED: list[tuple[str, str, str]] = [
    ("tests/test_relay_core.py::*", "cannot mount a tmpfs here (not root?)",
     "mounting the small file system a full disk needs takes root"),
    ("tests/*::*", "cannot mount a small tmpfs here (needs root)",
     "mounting the small file system a full disk needs takes root"),
    ("tests/hostile/test_local_peer.py::*", "needs root to act as another user",
     "a peer of another uid takes root to create"),
    ("tests/test_tail.py::*", "jq is not installed", "jq is a system tool the docs pipe into, not a Python extra"),
    ("tests/test_aim_sink.py::*", "this environment still has pkg_resources",
     "the test is about an environment without setuptools' pkg_resources"),
    ("tests/test_trainer.py::*", "only a machine without an accelerator implies --use_cpu",
     "a machine with a GPU trains on it"),
    ("tests/test_trainer.py::*", "only a machine without an accelerator runs --fsdp as DDP",
     "a machine with an accelerator shards with FSDP on it: there is no DDP fallback to say"),
    ("tests/test_relay_cli.py::*", "this machine has no IPv6 loopback to bind: *",
     "a host or container with IPv6 off has no ::1 to serve on; the same commands run on IPv4 loopback"),
    ("tests/test_relay_core.py::*", "cannot bind-mount a file here",
     "a bind mount takes root (CAP_SYS_ADMIN); make test runs as root in CI"),
    ("tests/test_prometheus_torchrun.py::*", "Debian's prometheus and prometheus-alertmanager are not installed*",
     "system packages: make test installs them as root (its test-servers step fails if apt-get does), so only a "
     "machine where they cannot be installed skips"),
]

#: The module each extra of pyproject.toml brings, for the message of a missing one.
EXTRAS = {"aim": "aim", "mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb", "clearml": "clearml",
          "nats": "nats", "torch": "train", "transformers": "train", "trl": "train", "peft": "train",
          "matplotlib": "plot", "hypothesis": "test", "prometheus_client": "prometheus"}
_MISSING = re.compile(r"could not import '([\w.]+)'")


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str

    def allowed(self) -> str | None:
        """Why this skip is allowed, or None."""
        for nodes, reason, why in ALLOWED:
            if fnmatch.fnmatchcase(self.nodeid, nodes) and fnmatch.fnmatchcase(self.reason, reason):
                return why
        return None

    def advice(self) -> str:
        found = _MISSING.search(self.reason)
        if found:
            extra = EXTRAS.get(found.group(1).split(".")[0])
            if extra:
                return f"an extra is missing: make setup, or pip install -e '.[{extra}]'"
        return "fix what it needs, or add it to tests/skip_policy.py ALLOWED with the reason it is fine"


def reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipPolicy:
    """Counts every outcome where the reports arrive (the xdist controller, or the one process)."""

    def __init__(self, config: pytest.Config) -> None:
        self.strict = config.getoption("strict_skips") or os.environ.get("CI", "").lower() in ("1", "true", "yes")
        self.controller = not hasattr(config, "workerinput")
        self.outcomes: dict[str, int] = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0,
                                         "xpassed": 0}
        self.skips: list[Skip] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a whole module (importorskip at its top)
            self.skips.append(Skip(report.nodeid, reason_of(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "wasxfail"):
            if report.when == "call" or report.skipped:
                self.outcomes["xfailed" if report.skipped else "xpassed"] += 1
        elif report.skipped:
            self.outcomes["skipped"] += 1
            self.skips.append(Skip(report.nodeid, reason_of(report)))
        elif report.failed:
            self.outcomes["failed" if report.when == "call" else "error"] += 1
        elif report.when == "call":
            self.outcomes["passed"] += 1

    def refused(self) -> list[Skip]:
        return [skip for skip in self.skips if skip.allowed() is None]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.controller and self.strict and self.refused() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.controller:
            return
        write = terminalreporter.write_line
        terminalreporter.section("tests run, skipped, xfailed")
        counts = self.outcomes
        ran = counts["passed"] + counts["failed"]
        write(f"ran {ran} ({counts['passed']} passed, {counts['failed']} failed), {counts['error']} errors, "
              f"skipped {len(self.skips)} ({len(self.refused())} not allowed), xfailed {counts['xfailed']}, "
              f"xpassed {counts['xpassed']}")
        for skip in self.skips:
            why = skip.allowed()
            if why is not None:
                write(f"allowed skip: {skip.nodeid}: {skip.reason} ({why})")
            else:
                write(f"{'SKIP NOT ALLOWED' if self.strict else 'skip not on the allow-list'}: {skip.nodeid}: "
                      f"{skip.reason}; {skip.advice()}", red=self.strict, bold=self.strict)
        if self.strict and self.refused():
            write("the run fails: a skip not on tests/skip_policy.py ALLOWED (--strict-skips, or CI set)",
                  red=True, bold=True)


def add_options(parser: pytest.Parser) -> None:
    parser.getgroup("skips", "the skip policy (tests/skip_policy.py)").addoption(
        "--strict-skips", action="store_true",
        help="fail the run on a skip not on the allow-list (the default where CI is set)")
