"""Fixtures that start real relay processes and real publisher processes on loopback.

Every test runs as a user would, with the user's relay secret (relay/wire/secret.py) made on first
use, but in a config folder of the test run's own (``XDG_CONFIG_HOME``, inherited by every relay and
publisher process the tests start), never the real user's; none of the user's RELAY_SECRET,
RELAY_SECRET_FILE or RELAY_OPEN leaks in."""
from __future__ import annotations

import ast
import contextlib
import fcntl
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import budget
import ports
import skip_policy

if TYPE_CHECKING:
    import zmq

    from warm_ranks import WarmLauncher

ROOT = Path(__file__).resolve().parent.parent
PUBLISHER = Path(__file__).resolve().parent / "publisher_proc.py"
_saved_env = pytest.StashKey[dict]()
_own_config = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    budget.add_options(parser)
    skip_policy.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """The suite's cost per test and tier (tests/budget.py) and its skip policy (tests/skip_policy.py)."""
    config.pluginmanager.register(budget.Budget(config), "suite-budget")
    config.pluginmanager.register(skip_policy.SkipPolicy(config), "suite-skip-policy")
    _own_relay_secret(config)


_OWN_CONFIG_KEYS = ("RELAY_SECRET", "RELAY_SECRET_FILE", "RELAY_OPEN", "XDG_CONFIG_HOME")


def _own_relay_secret(config: pytest.Config) -> None:
    """The user's config folder, as every relay and client finds it, is the test run's own: set
    before collection, so an environment a test module copies at import time carries it too."""
    config.stash[_saved_env] = {k: os.environ.pop(k, None) for k in _OWN_CONFIG_KEYS}
    folder = tempfile.mkdtemp(prefix="relay-test-config-")
    config.stash[_own_config] = folder
    os.environ["XDG_CONFIG_HOME"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    # The run is over: the interpreter's exit need not walk the heap of every tracker, torch and
    # hypothesis the worker imported (2-3 CPU-s a pytest process; docs/development.md).
    gc.freeze()
    if _own_config not in config.stash:
        return
    shutil.rmtree(config.stash[_own_config], ignore_errors=True)
    for key, value in config.stash[_saved_env].items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value


def raw_socket(ctx: zmq.Context, address: str, kind: int | None = None, **options: int) -> zmq.Socket:
    """A raw socket (a DEALER by default) connected to the relay at ``address`` that proves itself as
    a Publisher does (relay/wire/auth.py: the user's secret on TCP), so a test plays a peer of the
    job's own user; LINGER 0, and ``options`` (zmq option names: SNDHWM=0) set before it connects."""
    import zmq

    from relay.wire import auth

    sock = ctx.socket(zmq.DEALER if kind is None else kind)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    auth.secure_client(sock, address)
    sock.connect(address)
    return sock


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context]:
    """A ZeroMQ context for a test's raw sockets, destroyed (LINGER 0) when the test ends, failed or
    not. One a failed test leaves to the garbage collector with a socket in the same cycle never goes:
    the collector clears the context's weak references to its sockets first, so Context.__del__ closes
    none and waits in term() for one whose own finalizer comes after. A loaded run's next test on that
    worker hung there for 600 s, inside the ast.parse that happened to collect it."""
    import zmq

    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def parse_python(source: str) -> ast.Module:
    """``ast.parse`` with the garbage collector off. On CPython 3.11 (gh-106905) the conversion to
    Python objects keeps its recursion depth in interpreter-wide state: a finalizer run by a collection
    inside it (or a thread switch that one allows) that parses too, as formatting any traceback does
    (its carets), makes it raise "SystemError: AST constructor recursion depth mismatch". With no
    collection no Python code runs inside it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """For pytest-xdist (Makefile: ``-n 4``): modules with slow tests first, so their long tests start
    while short ones fill the other workers, instead of one worker ending the run alone (whole
    modules move: a module's tests stay in their order)."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    with_slow = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in with_slow)


@contextlib.contextmanager
def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """``name`` in the test run's base temp dir, held under a file lock: what a fixture builds there
    once (the demo model, a training job) is built once per run, not once per module or per
    pytest-xdist worker (each worker has its own base temp dir, under the run's)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root / name


@pytest.fixture(scope="session")
def warm_launcher() -> Iterator[WarmLauncher]:
    """This pytest process's warm launcher (tests/warm_ranks.py), started by the first test that
    asks for it: one per pytest-xdist worker that runs a warm job."""
    from trainer_fixtures import trainer_env
    from warm_ranks import WarmLauncher

    launcher = WarmLauncher(trainer_env(), ROOT)
    yield launcher
    launcher.close()


def free_port() -> int:
    """A loopback port no other test takes before this test ends, nor the kernel hands out (tests/ports.py)."""
    return ports.claim()


@pytest.fixture(autouse=True)
def _ports_released() -> Iterator[None]:
    yield
    ports.release()


def read_jsonl(path: Path, live: bool = False) -> list[dict]:
    """Every line of a JSONL file. ``live``: a relay may be writing it, so a last line without its
    newline yet is left for later (at rest a journal holds only whole lines, and every one is read)."""
    text = path.read_bytes()
    if live:
        text = text[:text.rfind(b"\n") + 1]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for(condition: Callable[[], object], timeout: float, what: str = "condition",
             detail: Callable[[], str] | None = None) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` s (a fixed sleep flakes on a busy
    machine), saying ``what`` and, if given, ``detail()`` (a log's tail, the last stats)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not met within {timeout:g} s" + (f"\n{detail()}" if detail else ""))
        time.sleep(0.02)


def line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


class RelayProcess:
    """A real ``python -m relay`` subprocess; ``stop()`` is SIGTERM and returns the exit code."""

    def __init__(self, workdir: Path, args: list[str], address: str, env: dict | None = None) -> None:
        self.workdir = workdir
        self.args = args
        self.address = address
        self.env = env
        self.ready = workdir / f"ready-{time.monotonic_ns()}.json"
        self.log = workdir / "relay.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> RelayProcess:
        self.ready.unlink(missing_ok=True)
        # Its sinks may take long to set up on a loaded machine (MLflow's first set-up took over 120 s at
        # load 40): the relay waits for them at shutdown as long as stop() waits for it, unless args say less.
        cmd = [sys.executable, "-m", "relay", "--bind", self.address, "--ready-file", str(self.ready),
               "--shutdown-timeout", "280", *self.args]
        with open(self.log, "ab") as log:  # the relay writes through its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, cwd=self.workdir, stdout=log,
                                         stderr=subprocess.STDOUT, env=self.env)
        if wait:
            deadline = time.monotonic() + 120  # a wait: 2 s is usual, a machine at load 40 took ten times that
            while not self.ready.exists():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"relay exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"relay not ready: {self.log.read_text()[-2000:]}")
                time.sleep(0.02)
            self.address = json.loads(self.ready.read_text())["address"]
        return self

    def stop(self, timeout: float = 300) -> int:
        """A wait, not a limit under test: a relay's shutdown waits on its sink processes (up to its
        --shutdown-timeout), and on a loaded machine an Aim sink's close alone took over 30 s."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def sink_processes(self) -> list:
        """Its sink processes themselves, as psutil.Process (each runs under a supervisor,
        relay/sinkhost/lifeline.py)."""
        import psutil

        assert self.proc is not None
        return [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                if p.cmdline()[1:3] == ["-m", "relay.sinkhost.child"]]

    def stats(self, journal: Path) -> dict:
        """The relay's stats file (written at its first --stats-interval: waited for, up to 30 s)."""
        from relay.journal.journal import Journal
        path = Journal(journal).sidecar("_stats.json")
        wait_for(path.exists, 30, f"{path.name} written")
        return json.loads(path.read_text())

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the relay's log without its periodic stats lines: what to show when a wait fails."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines(keepends=True)
                 if "relay.daemon.counters: stats:" not in line]
        return "".join(lines)[-chars:]

    def sink_stats(self, journal: Path, name: str) -> dict:
        """Sink ``name``'s counters in the stats file as this relay (not an earlier one on the same
        journal) wrote it last; {} while there is none of its own."""
        from relay.journal.journal import Journal
        try:
            snap = json.loads(Journal(journal).sidecar("_stats.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return snap["sinks"].get(name, {}) if snap["pid"] == self.proc.pid else {}


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[callable]:
    """Factory: relays(args, address=None) -> started RelayProcess; all are killed at teardown."""
    started: list[RelayProcess] = []

    def make(args: list[str], address: str | None = None, start: bool = True, env: dict | None = None) -> RelayProcess:
        # A port claimed for this test outside the ephemeral range (tests/ports.py): no other test takes it,
        # and after a kill no reconnecting publisher is given it as its own, so the relay restarts there.
        address = address or f"tcp://127.0.0.1:{free_port()}"
        relay = RelayProcess(tmp_path, args, address, env)
        started.append(relay)
        return relay.start() if start else relay

    yield make
    for relay in started:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.proc.kill()
            relay.proc.wait(10)


def start_publisher(address: str, run: str, rank: int, count: int, *, world_size: int = 1, rate: float = 0.0,
                    flush_timeout: float = 30.0, extra: list[str] | None = None) -> subprocess.Popen:
    """A real publisher process: ``count`` metrics events, then flush; prints its stats as JSON."""
    cmd = [sys.executable, str(PUBLISHER), address, run, str(rank), str(count), str(world_size), str(rate),
           str(flush_timeout), *(extra or [])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def plugin_env(tmp_path: Path) -> dict[str, str]:
    """Environment with a throwaway distribution on PYTHONPATH that registers sinks through entry
    points: ``explode`` (every write raises), ``collect`` (appends each event it gets to --collect-file),
    ``crashonce`` (kills its own process at its first write, then appends to --crash-file),
    ``refuse`` (raises PermanentError for a batch holding an event whose data has "bad", else
    appends to --refuse-file), ``flaky`` (raises a transient error at its first --flaky-failures
    writes, then appends to --flaky-file) and ``slowflush`` (takes 0.1 s per write, and appends a
    record of every write and flush, with the time, to --slow-file) and ``newsonly`` (a shipper,
    relay/ship/base.py: appends the news of each journal write it gets to --news-file) and
    ``failopen`` (its ``open()`` raises SinkError
    while --failopen-file does not exist, then appends to it) and ``hangopen`` (its ``open()`` waits until
--hangopen-file exists, as a tracker's first set-up can take minutes) and ``unclosed`` (appends to
--unclosed-file, and its ``close()`` says it did not complete)."""
    site = tmp_path / "plugins"
    (site / "throwaway_sinks-0.1.dist-info").mkdir(parents=True)
    (site / "throwaway_sinks-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: throwaway-sinks\nVersion: 0.1\n")
    (site / "throwaway_sinks-0.1.dist-info" / "entry_points.txt").write_text(
        "[metrics_relay.sinks]\nexplode = throwaway_sinks:Explode\ncollect = throwaway_sinks:Collect\n"
        "crashonce = throwaway_sinks:CrashOnce\nrefuse = throwaway_sinks:Refuse\nflaky = throwaway_sinks:Flaky\n"
        "slowflush = throwaway_sinks:SlowFlush\nnewsonly = throwaway_sinks:NewsOnly\n"
        "failopen = throwaway_sinks:FailOpen\n"
        "hangopen = throwaway_sinks:HangOpen\nunclosed = throwaway_sinks:Unclosed\n")
    (site / "throwaway_sinks.py").write_text('''
import click, json, os, time
from relay.ship.base import Shipper
from sinks.base import PermanentError, Sink, SinkError

class Explode(Sink):
    name = "explode"
    def write(self, events):
        raise RuntimeError("this sink always fails")

class Collect(Sink):
    name = "collect"
    @classmethod
    def options(cls):
        return [click.Option(["--collect-file"], default="collected.jsonl")]
    def __init__(self, collect_file):
        self.fh = open(collect_file, "a")
    def write(self, events):
        for e in events:
            self.fh.write(json.dumps(e) + "\\n")
    def flush(self, timeout=30.0):
        self.fh.flush()
        return True
    def close(self, timeout=30.0):
        self.fh.close()
        return True

class CrashOnce(Collect):
    name = "crashonce"
    @classmethod
    def options(cls):
        return [click.Option(["--crash-file"], default="crashed.jsonl")]
    def __init__(self, crash_file):
        super().__init__(crash_file)
        self.marker = crash_file + ".crashed"
    def write(self, events):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(7)
        super().write(events)

class Refuse(Collect):
    name = "refuse"
    @classmethod
    def options(cls):
        return [click.Option(["--refuse-file"], default="refused.jsonl")]
    def __init__(self, refuse_file):
        super().__init__(refuse_file)
    def write(self, events):
        if any(isinstance(e["data"], dict) and e["data"].get("bad") for e in events):
            raise PermanentError("this tool takes no 'bad' metric")
        super().write(events)

class Flaky(Collect):
    name = "flaky"
    @classmethod
    def options(cls):
        return [click.Option(["--flaky-file"], default="flaky.jsonl"),
                click.Option(["--flaky-failures"], type=int, default=3)]
    def __init__(self, flaky_file, flaky_failures):
        super().__init__(flaky_file)
        self.failures = flaky_failures
    def write(self, events):
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("the tool is unreachable for now")
        super().write(events)

class SlowFlush(Collect):
    name = "slowflush"
    @classmethod
    def options(cls):
        return [click.Option(["--slow-file"], default="slow.jsonl")]
    def __init__(self, slow_file):
        super().__init__(slow_file)
    def write(self, events):
        time.sleep(0.1)
        self.fh.write(json.dumps({"write": time.time(), "events": len(events)}) + "\\n")
    def flush(self, timeout=30.0):
        self.fh.write(json.dumps({"flush": time.time()}) + "\\n")
        self.fh.flush()
        return True

class NewsOnly(Shipper):
    name = "newsonly"
    @classmethod
    def options(cls):
        return [click.Option(["--news-file"], default="news.jsonl")]
    def __init__(self, news_file):
        self.counters = {"notices": 0}
        self.fh = open(news_file, "a")
    def open(self, context):
        pass
    def notify(self, news):
        self.counters["notices"] += 1
        for run, (events, end) in news.items():
            self.fh.write(json.dumps({"run": run, "events": events, "offset": end}) + "\\n")
        self.fh.flush()
    def close(self, timeout=30.0):
        self.fh.close()
        return True

class FailOpen(Collect):
    name = "failopen"
    @classmethod
    def options(cls):
        return [click.Option(["--failopen-file"], default="gate")]
    def __init__(self, failopen_file):
        self.gate = failopen_file
    def open(self, context):
        if not os.path.exists(self.gate):
            raise SinkError(f"{self.gate} is missing; create it")
        self.fh = open(self.gate, "a")

class HangOpen(FailOpen):
    name = "hangopen"
    @classmethod
    def options(cls):
        return [click.Option(["--hangopen-file"], default="hang")]
    def __init__(self, hangopen_file):
        super().__init__(hangopen_file)
    def open(self, context):
        while not os.path.exists(self.gate):
            time.sleep(0.05)
        super().open(context)

class Unclosed(Collect):
    name = "unclosed"
    @classmethod
    def options(cls):
        return [click.Option(["--unclosed-file"], default="unclosed.jsonl")]
    def __init__(self, unclosed_file):
        super().__init__(unclosed_file)
    def close(self, timeout=30.0):
        super().close(timeout)
        return False
''')
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
