"""A relay's sink processes die with it, and a kill never breaks a tracker's store (issue 25 §2).

relay/sinkhost/lifeline.py: a sink process, and the processes its tool started, end within a second of
the relay's death however the relay died (a supervisor kills their process group, told by the kernel's
parent-death signal or by a pipe only the relay holds, each shown on its own), and a new relay's sink
process waits for the old one's lock. sinks/store_setup.py: MLflow's and Aim's one-time
set-up, killed midway, leaves the store as it was, and the next process finishes it; a store that an
older relay's interrupted set-up broke is mended. A sink killed with its relay while the journal
holds a finished run it never wrote has it from the journal once the next relay starts (catch-up's
first pass, relay/sinkhost/catch_up.py). The slow test SIGKILLs a relay with MLflow (SQLite),
Aim and TensorBoard sinks at 50 random moments of its first seconds while one publisher goes on, then
reads every store back through its own client: every value once, and no sink process outlived a relay
by more than a second."""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, finish, plugin_env, start_publisher, wait_for
from relay.journal.reader import read_events

#: What "dies with its relay" allows: seconds from the relay's death until its sink processes are gone.
GONE_WITHIN = 1.0

#: A sink for the tests, a module the supervisor can run: it starts a process of its own (as Aim starts its
#: schema migration), says both pids, and waits.
TIED_CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(os.getpid(), helper.pid, flush=True)
    time.sleep(600)
""")
#: A stand-in relay that starts that sink through relay.sinkhost.lifeline.spawn and prints "SUPERVISOR SINK
#: HELPER KEEPER". "launched": asked for from a thread that ends once the sink is up, as the relay's opener
#: thread ends (the parent-death signal follows the thread that started a process). "kernel": a keeper
#: process holds the pipe's write end too, so only the kernel's signal can tell. "pipe": its end of the
#: pipe is closed (as the kernel does when the relay dies) when the test says, the relay living on.
STAND_IN = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    from relay.sinkhost import lifeline
    mode, said = sys.argv[1], []

    def ask():
        proc = lifeline.spawn("test", "tied_child", [], stdout=subprocess.PIPE, text=True)
        said.append(f"{proc.pid} {proc.stdout.readline().strip()}")

    if mode == "launched":
        asker = threading.Thread(target=ask)
        asker.start()
        asker.join()
    else:
        ask()
    keeper = 0
    if mode == "kernel":
        keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  pass_fds=(lifeline._pipe[2],)).pid
    print(said[0], keeper, flush=True)
    if mode == "pipe":
        sys.stdin.readline()
        os.close(lifeline._pipe[2])
        print("closed", flush=True)
    time.sleep(600)
""")


def _sink_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tied_child.py").write_text(TIED_CHILD)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))


def _kill_all(pids: list[int]) -> None:
    """What a test started and a failure may have left running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead; its adopter has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def _children(pid: int) -> list[int]:
    """The process's descendants."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def seconds_until_gone(pids: list[int], limit: float = 30.0, since: float | None = None) -> float:
    """How long until every process of ``pids`` is gone (dead), from ``since`` (monotonic; default now);
    ``limit`` when some outlive it (so a failure says how long they lived, not only that they did)."""
    started = time.monotonic() if since is None else since
    while not all(_gone(pid) for pid in pids):
        if time.monotonic() - started > limit:
            return limit
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("mode", ["launched", "kernel", "pipe"])
def test_a_sink_and_its_tools_processes_die_with_the_relay_not_with_the_thread_that_started_it(mode, tmp_path):
    relay = subprocess.Popen([sys.executable, "-c", STAND_IN, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env=_sink_env(tmp_path))
    pids, keeper = [], 0
    try:
        *pids, keeper = [int(pid) for pid in relay.stdout.readline().split()]
        wait_for(lambda: len(psutil.Process(relay.pid).threads()) == 1, 30, "the asking thread gone")
        assert not any(_gone(pid) for pid in pids), pids
        assert psutil.Process(pids[0]).ppid() == relay.pid and psutil.Process(pids[2]).ppid() == pids[1]
        if mode == "pipe":
            relay.stdin.write("\n")
            relay.stdin.flush()
            assert relay.stdout.readline() == "closed\n"
        else:
            relay.kill()
            relay.wait(10)
        lived = seconds_until_gone(pids)
        assert lived <= GONE_WITHIN, f"{mode}: the supervisor, sink and helper outlived the relay by {lived:.2f} s"
    finally:
        relay.kill()
        relay.wait(10)
        _kill_all([*pids, keeper] if keeper else pids)


def test_a_supervisor_whose_relay_died_before_it_was_tied_ends_at_once(tmp_path):
    """The kernel's signal comes only for a death after it was asked for: the supervisor checks its
    parent before it starts the sink."""
    read_end, write_end = os.pipe()
    try:
        done = subprocess.run([sys.executable, "-m", "relay.sinkhost.lifeline", "1", str(read_end), "test", "tied_child"],
                              pass_fds=(read_end,), capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env=_sink_env(tmp_path), start_new_session=True)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert done.returncode == -signal.SIGKILL and not done.stdout, done
    assert "the relay that started it is gone" in done.stderr, done.stderr


def test_a_new_sink_process_waits_for_the_one_of_the_dead_relay(tmp_path):
    """A new relay's sink process does not open while the previous one holds the journal's sink lock; it
    says so in the log and opens once that one is gone."""
    lock = tmp_path / "j_sink_mlflow.lock"
    code = textwrap.dedent("""
        import logging, sys, time
        from pathlib import Path
        from relay.sinkhost.lifeline import hold_sink_lock
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        hold_sink_lock(Path(sys.argv[1]), "mlflow")
        print("held", flush=True)
        time.sleep(600)
    """)
    old = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    new = None
    try:
        assert old.stdout.readline() == "held\n"
        new = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        said = new.stdout.readline()  # its log line and its "held" share the pipe: which comes first
        assert f"waiting for the sink process of an earlier relay (pid {old.pid}) to stop" in said, said
        assert new.poll() is None
        old.kill()
        assert "the earlier sink process stopped after" in new.stdout.readline()
        assert new.stdout.readline() == "held\n"
        assert lock.read_text() == f"{new.pid}\n"
    finally:
        for proc in (old, new):
            if proc is not None:
                proc.kill()
                proc.wait(10)


def test_a_killed_relays_sink_processes_are_gone_within_a_second(relays, tmp_path):
    """Through a real relay: a sink process still opening its sink (not reading from the relay, as an
    MLflow sink creating its database for minutes) and one open and idle both end with it."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--sink", "collect", "--sink", "hangopen", "--path", str(journal),
                    "--collect-file", str(tmp_path / "c.jsonl"), "--hangopen-file", str(tmp_path / "never")],
                   env=plugin_env(tmp_path))
    wait_for(lambda: "sink collect open (pid" in relay.log.read_text(), 60, "the collect sink open")
    opening = tmp_path / "j_sink_hangopen.lock"  # its process writes its pid there just before it opens the sink
    wait_for(lambda: opening.exists() and opening.read_text().strip().isdigit(), 60, "hangopen opening")
    children = _children(relay.proc.pid)
    assert len(children) == 4 and int(opening.read_text()) in children  # each sink and its supervisor
    relay.kill()
    lived = seconds_until_gone(children)
    assert lived <= GONE_WITHIN, f"sink processes outlived their relay by {lived:.2f} s"


#: A tracker sink cheap to start (tests/fence_sink.py), named by module and class.
LEDGER = "fence_sink:LedgerSink"


def _caught_up(relay, journal: Path) -> bool:
    """The relay's ledger sink open, its first catch-up pass done, nothing queued."""
    stats = relay.sink_stats(journal, "ledger")
    return bool(stats.get("open")) and stats["catch_up_passes"] >= 1 and stats["queued"] == 0


def test_a_sink_killed_with_events_only_the_journal_holds_has_them_when_restarted(relays, tmp_path):
    """Catch-up's first pass (relay/sinkhost/catch_up.py): a relay and its tracker sink's process
    are SIGKILLed while the journal holds a whole run the sink never wrote, a run that is over (its
    publisher was acknowledged: the live feed never sends it again, and the sink has no hole to
    name). The next relay's sink process reads the run from the journal: the tracker holds every
    step (the ledger keeps a value once, so doubles are the 50-kill test's to catch)."""
    from fence_sink import rows

    run, count, journal, ledger = "killed", 200, tmp_path / "j.jsonl", tmp_path / "ledger.db"
    args = ["--path", str(journal), "--stats-interval", "0.3", "--sink", LEDGER,
            "--ledger-db", str(ledger)]
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    relay = relays(args, env=env)
    wait_for(lambda: relay.sink_stats(journal, "ledger").get("open"), 120, "the ledger sink open",
             relay.log_tail)
    (sink,) = relay.sink_processes()
    sink.suspend()  # it writes nothing more: the journal gets ahead of it
    sent = finish(start_publisher(relay.address, run, 0, count))
    assert sent["left"] == 0 and sent["dropped"] == 0, sent
    journaled = [e for e in read_events(journal) if e["run"] == run and e["type"] == "metrics"]
    assert len(journaled) == count, "the relay acknowledged what it had not journaled"
    assert not [key for key in rows(str(ledger)) if key[0] == run], "the sink wrote the run"
    relay.kill()
    assert seconds_until_gone([sink.pid]) <= GONE_WITHIN, "the sink process outlived its relay"

    restarted = relays(args, address=relay.address, env=env)  # nothing is published to it
    wait_for(lambda: _caught_up(restarted, journal), 120, "the first catch-up pass done",
             restarted.log_tail)
    assert restarted.stop() == 0
    held = {key[2]: n for key, n in rows(str(ledger)).items() if key[0] == run}  # step: its values
    assert held == dict.fromkeys(range(count), 2), f"the tracker holds {len(held)} of {count} steps"


# -- a store's one-time set-up, killed midway ----------------------------------------------------------

SET_UP = {  # a process that sets the store at argv[1] up as the sink's open() does
    "mlflow": "from sinks.mlflow_store import ready_sqlite; ready_sqlite(Path(sys.argv[1]))",
    "aim": "from aim.sdk.repo import Repo; from sinks.aim_repo import open_local; open_local(Repo, Path(sys.argv[1]))",
}


def _store(tool: str, tmp_path: Path) -> tuple[Path, str]:
    """Where the tool's store goes in ``tmp_path``, and what a set-up in progress has made by then."""
    if tool == "mlflow":
        pytest.importorskip("mlflow")
        return tmp_path / "mlflow.db", ".mlflow.db.relay-setup-*.tmp"  # a SQLite file with some tables
    pytest.importorskip("aim")
    return tmp_path / ".aim", ".aim.relay-setup-*.tmp/.aim/run_metadata.sqlite"


def _opens(tool: str, store: Path) -> None:
    """The store opens with the tool's own client and holds what a new store holds."""
    if tool == "mlflow":
        from mlflow import MlflowClient

        assert [e.name for e in MlflowClient(f"sqlite:///{store}").search_experiments()] == ["Default"]
    else:
        from sink_readback import read_repo

        assert read_repo(str(store.parent)) == {}


@pytest.mark.slow  # each tool's real set-up twice (MLflow's: 6 s on an idle machine, 30 s at load 20)
@pytest.mark.parametrize("tool", ["mlflow", "aim"])
def test_a_set_up_killed_midway_leaves_no_store_and_the_next_one_makes_it(tool, tmp_path):
    store, in_progress = _store(tool, tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from pathlib import Path; {SET_UP[tool]}",
                             str(store if tool == "mlflow" else store.parent)], cwd=ROOT, start_new_session=True)
    try:
        wait_for(lambda: list(tmp_path.glob(in_progress)) or proc.poll() is not None, 120, "the set-up under way")
        os.killpg(proc.pid, signal.SIGKILL)  # as a sink's supervisor does: Aim migrates in a process of its own
    finally:
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL, "the set-up ended before it was killed"
    assert not store.exists(), "a store half made under its own name"
    if tool == "mlflow":  # the next set-up, here (the tool may be imported already)
        from sinks.mlflow_store import ready_sqlite

        ready_sqlite(store)
    else:
        from aim.sdk.repo import Repo

        from sinks.aim_repo import open_local

        open_local(Repo, tmp_path)
    _opens(tool, store)
    assert not list(tmp_path.glob(".*.relay-setup-*.tmp*")), "the killed set-up's temporary is left"


@pytest.mark.slow  # one real set-up of each tool
@pytest.mark.parametrize("tool", ["mlflow", "aim"])
def test_a_store_that_an_older_set_up_left_half_made_is_mended(tool, tmp_path):
    """What a kill in the tool's own set-up left before: MLflow's initial tables with a batch migration's
    table made and the schema never recorded (the issue's "table _alembic_tmp_latest_metrics already
    exists", for good); an Aim repository whose VERSION, which Aim rewrites at every set-up, was cut to
    nothing. The tool itself cannot open either; the sink's set-up mends them."""
    store, _ = _store(tool, tmp_path)
    if tool == "mlflow":
        import sqlalchemy
        from mlflow import MlflowClient
        from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        from sinks.mlflow_store import ready_sqlite

        engine = sqlalchemy.create_engine(f"sqlite:///{store}")
        InitialBase.metadata.create_all(engine)
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("CREATE TABLE _alembic_tmp_latest_metrics (id INTEGER)"))
        engine.dispose()
        with pytest.raises(Exception, match="_alembic_tmp_latest_metrics already exists"):
            MlflowClient(f"sqlite:///{store}").search_experiments()
        SqlAlchemyStore._engine_map.pop(f"sqlite:///{store}").dispose()  # as a new process: nothing cached
        ready_sqlite(store)
        assert [p.name.split(".half-made-")[0] for p in tmp_path.glob("mlflow.db.half-made-*")] == ["mlflow.db"]
    else:
        from aim.sdk.repo import Repo

        from sinks.aim_repo import open_local

        Repo(str(tmp_path), init=True)
        (store / "VERSION").write_text("")
        with pytest.raises(ValueError):
            Repo(str(tmp_path), init=True)
        open_local(Repo, tmp_path)
    _opens(tool, store)


# -- the relay SIGKILLed again and again in its first seconds, three tracker sinks ----------------------

KILLS = 50
#: Each relay is killed at a random moment of its sinks' first seconds, counted from when its three sink
#: processes started: most within SHORT s (importing their tool, setting its store up), and one in
#: BUSY_EVERY within a second after one of them began setting its store up or writing events, if that
#: comes within FIRST s.
SHORT, FIRST, BUSY_EVERY = 1.5, 10.0, 10
TRACKERS = ("mlflow", "aim", "tensorboard")
#: One publisher across the kills: about 100 s of events at RATE, the rest sent at once after them.
RUN, EVENTS, RATE = "storm", 1000, 10.0


def _busy(relay_pid: int, journal: Path, stores: list[Path]) -> str | None:
    """What one of this relay's tracker sinks is doing, if anything yet: setting its store up (a
    temporary named for one of its processes is there) or writing (its stats, written every 0.5 s,
    count events written)."""
    from relay.journal.journal import Journal

    temporaries = [p.name for store in stores for p in store.parent.glob(f".{store.name.lstrip('.')}.relay-setup-*.tmp")]
    if {int(name.rsplit("-", 1)[1].split(".")[0]) for name in temporaries} & set(_children(relay_pid)):
        return "set-up"
    try:
        stats = json.loads(Journal(journal).sidecar("_stats.json").read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return None
    sinks = stats.get("sinks", {}) if stats.get("pid") == relay_pid else {}
    written = sum(sinks.get(name, {}).get("written", 0) + sinks.get(name, {}).get("caught_up", 0) for name in TRACKERS)
    return "writing" if written else None


def _sink_processes(relay_pid: int, tmp_path: Path) -> list[int]:
    """The relay's descendants, and any sink process of this test's stores (its spec names tmp_path)."""
    found = set(_children(relay_pid))
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "relay.sinkhost.child" in cmdline and str(tmp_path) in " ".join(cmdline) and not _gone(proc.pid):
            found.add(proc.pid)
    return sorted(found)


def _settled(stats: dict, relay_pid: int) -> bool:
    """The relay's every tracker sink open, its first catch-up pass done, nothing queued or unconfirmed."""
    sinks = [stats.get("sinks", {}).get(name, {}) for name in TRACKERS]
    return stats.get("pid") == relay_pid and all(s.get("open") and s["catch_up_passes"] >= 1 and s["queued"] == 0
                                                 for s in sinks)


@pytest.mark.slow  # ~3 min at load 20 (50 relays started and killed, then three trackers caught up)
def test_relay_sigkilled_50_times_in_its_first_seconds_every_store_holds_every_value_once(relays, tmp_path):
    """One publisher sends 1,000 metrics over about 100 s; meanwhile the relay (MLflow on SQLite, Aim,
    TensorBoard) is started and SIGKILLed 50 times, each at a random moment of its first seconds. No
    sink process outlives a relay by more than a second; then a last relay lives, and each store opens
    with its own client and holds every value exactly once (the sinks killed mid-write lost nothing:
    the next relay's caught up from the journal)."""
    for tool in TRACKERS:
        pytest.importorskip(tool)
    from sink_readback import EXPERIMENT, f32, read_logdir, read_repo, read_run

    seed = int(os.environ.get("SINK_DEATH_SEED") or time.time_ns() % 2 ** 32)
    rng = random.Random(seed)
    db, repo, logdir, journal = tmp_path / "ml" / "mlflow.db", tmp_path / "aim", tmp_path / "tb", tmp_path / "j.jsonl"
    args = ["--path", str(journal), "--stats-interval", "0.5",
            "--sink", "mlflow", "--mlflow-tracking-uri", f"sqlite:///{db}", "--mlflow-experiment", EXPERIMENT,
            "--sink", "aim", "--repo", str(repo), "--sink", "tensorboard", "--logdir", str(logdir)]
    stores = [db, repo / ".aim"]
    address = f"ipc://{tmp_path}/relay.sock"  # the same address for every relay: the publisher reconnects
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    publisher = start_publisher(address, RUN, 0, EVENTS, rate=RATE, flush_timeout=600)
    kills = []
    for k in range(KILLS):
        relay = relays(args, address=address, start=False, env=env)
        relay.start(wait=False)
        launched = time.monotonic()
        # each with its supervisor
        wait_for(lambda relay=relay: len(_children(relay.proc.pid)) >= 2 * len(TRACKERS), 120,
                 "the relay's sink processes started")
        started, at = time.monotonic(), rng.uniform(0, SHORT)
        if k % BUSY_EVERY == BUSY_EVERY - 1:  # wait until a sink is busy (a condition), then a random moment
            while not _busy(relay.proc.pid, journal, stores) and time.monotonic() - started < FIRST:
                time.sleep(0.05)
            at = min(FIRST, time.monotonic() - started + rng.uniform(0, 1.0))
        time.sleep(max(0.0, started + at - time.monotonic()))  # the kill moment, at random: it decides no outcome
        before, doing = _sink_processes(relay.proc.pid, tmp_path), _busy(relay.proc.pid, journal, stores)
        relay.proc.send_signal(signal.SIGKILL)
        relay.proc.wait(30)
        died = time.monotonic()
        sinks = sorted({*before, *_sink_processes(relay.proc.pid, tmp_path)})  # one started meanwhile too
        kills.append({"at": round(at, 2), "sinks": len(sinks), "gone_s": round(seconds_until_gone(sinks, since=died), 3),
                      "busy": doing, "spawn_s": round(started - launched, 2)})
        relay.kill()
    summary = f"seed {seed} (SINK_DEATH_SEED reruns it); kills: {kills}"
    (tmp_path / "kills.json").write_text(json.dumps({"seed": seed, "kills": kills}))
    assert max(k["gone_s"] for k in kills) <= GONE_WITHIN, summary

    last = time.monotonic()
    relay = relays(args, address=address, env=env)  # the last one lives
    if publisher.poll() is None:  # the kills are over: the rest without its pauses
        publisher.send_signal(signal.SIGUSR1)
    sent = finish(publisher, timeout=600)
    assert sent["left"] == 0 and sent["dropped"] == 0, sent
    wait_for(lambda: _settled(relay.stats(journal), relay.proc.pid), 300, "every sink caught up")
    assert relay.stop() == 0
    (tmp_path / "kills.json").write_text(json.dumps({"seed": seed, "kills": kills, "last_s": time.monotonic() - last}))
    expected = {i: 1.0 / (i + 1) for i in range(EVENTS)}
    seqs = [e["seq"] for e in read_events(journal) if e["run"] == RUN and e["type"] == "metrics"]
    assert sorted(seqs) == sorted(set(seqs)) and len(seqs) == EVENTS, "the journal: every event once"

    ml = read_run(f"sqlite:///{db}", RUN)
    assert ml.series("loss") == expected and len(ml.history["loss"]) == EVENTS, summary
    aim = read_repo(str(repo))[RUN]
    assert aim.series("loss") == expected, summary
    board = read_logdir(logdir)[RUN]
    assert board.series("train/loss") == {i: f32(v) for i, v in expected.items()}, summary
    assert len(board.points["train/loss"]) == EVENTS, summary
    left = [p.name for p in (db.parent, repo) for p in p.iterdir() if ".relay-setup-" in p.name or "half-made" in p.name]
    assert not left, f"set-ups left {left}"
