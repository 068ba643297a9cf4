"""A dead relay looks dead (issue 44 §2), with real relay processes: ``relay status DIR`` of a killed
relay says so first and shows no rate, each run's state (running, failed, completed, stale) is in the
line, and a SIGTERM at any moment of the relay's start, its sinks still opening, ends it with exit 0
within 5 s."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, free_port, plugin_env, wait_for
from relay.client.publisher import Publisher
from relay.daemon.liveness import lock_held
from relay.daemon.status import STALE_S, run_state
from watch_helpers import cli_env


def relay_status(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = cli_env() if columns is None else cli_env(COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "relay", "status", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)


def publish(address: str, run: str, end: str | None) -> None:
    """A run's hello and three steps, then its train_end with status ``end`` (none: it goes on)."""
    with Publisher(run, 0, world_size=1, address=address) as pub:
        for step in range(1, 4):
            pub.publish("metrics", {"loss": 1.0 / step}, step=step, stage="train")
        if end is not None:
            pub.publish("lifecycle", {"event": "train_end", "status": end}, step=3)
        assert pub.flush(30) == 0


def test_relay_status_says_each_runs_state_and_that_a_killed_relay_is_not_running(relays, tmp_path):
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/", "--stats-interval", "0.2"])
    for run, end in (("run-done", "completed"), ("run-failed", "failed"), ("run-on", None)):
        publish(relay.address, run, end)

    live = relay_status(relay.address)
    assert live.returncode == 0, live.stderr
    assert re.match(r"\d+ ev/s \| 3 runs: run-done 1/1 completed, run-failed 1/1 failed, run-on 1/1 running \| ",
                    live.stdout), live.stdout
    wait_for(lambda: "run-on" in json.loads((journal / "_relay_stats.json").read_text())["per_run"], 30,
             "the stats file names every run")
    from_file = relay_status(str(journal))
    assert from_file.returncode == 0 and "run-on 1/1 running" in from_file.stdout, from_file.stdout
    assert re.search(r"\(stats file written \d+ s ago\)$", from_file.stdout.strip()), from_file.stdout
    assert lock_held(journal / "_relay.lock") is True

    relay.kill()  # SIGKILL: no final stats, the lock file stays, but nobody holds its lock
    assert (journal / "_relay.lock").exists() and lock_held(journal / "_relay.lock") is False
    dead = relay_status(str(journal))
    assert dead.returncode == 0, dead.stderr
    assert re.match(r"relay not running \(killed\?\) since (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d \| 3 runs: run-done 0/1 "
                    r"completed, run-failed 0/1 failed, run-on 0/1 stale \| \d+ events in", dead.stdout), dead.stdout
    assert "ev/s" not in dead.stdout and "stats file written" not in dead.stdout
    narrow = relay_status(str(journal), columns=80)
    assert narrow.stdout.startswith("relay not running (killed?) since ")
    assert len(narrow.stdout.rstrip("\n")) <= 80 and narrow.stdout.rstrip("\n").endswith("…"), narrow.stdout
    as_json = json.loads(relay_status(str(journal), "--json").stdout)
    assert as_json["relay_state"] == "killed" and as_json["relay_since"] >= as_json["ts"]
    assert as_json["per_run"]["run-failed"]["state"] == "failed"

    again = relays(["--path", f"{journal}/", "--stats-interval", "60"])  # a new relay: not dead any more
    restarted = relay_status(str(journal))
    assert "killed" not in restarted.stdout and "another relay serves this journal" in restarted.stdout
    assert again.stop() == 0
    stopped = relay_status(str(journal))
    assert re.match(r"relay stopped at (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d \| 0 runs \| 0 events", stopped.stdout), stopped.stdout


def test_a_run_silent_for_long_is_stale_and_ended_runs_keep_their_state():
    assert run_state({"state": "running", "idle_s": 1.0}) == "running"
    assert run_state({"state": "running", "idle_s": 1.0}, age=STALE_S) == "stale"
    assert run_state({"state": "running", "idle_s": STALE_S}) == "stale"
    assert run_state({"state": "running", "idle_s": 1.0}, alive=False) == "stale"
    assert run_state({"state": "failed", "idle_s": STALE_S * 2}, alive=False) == "failed"
    assert run_state({"connected": 1}) == ""  # an older relay's stats say no state


@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5, 3.0, "listening"])
def test_sigterm_at_any_moment_of_start_exits_0_within_5_s_with_a_sink_still_opening(tmp_path, delay):
    """``hangopen`` never opens here (its gate file is never made): a tracker's first set-up that takes
    minutes. Before the relay listens it stops leaving nothing behind; once it listens, the sink it had
    handed nothing is stopped at once and the final stats say the relay stopped."""
    journal, ready = tmp_path / "logs", tmp_path / "ready.json"
    env = plugin_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}",
                             "--path", f"{journal}/", "--sink", "hangopen", "--hangopen-file",
                             str(tmp_path / "never"), "--ready-file", str(ready)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        if delay == "listening":
            wait_for(ready.exists, 60, "the relay listens")
        else:
            time.sleep(delay)  # the moment of start the signal comes at (the outcome is the same for all)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - signalled
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 0 and took < 5.0, (code, took, err[-2000:])
    assert "Traceback" not in err, err
    assert not (journal / "_relay.lock").exists()
    stats = journal / "_relay_stats.json"
    if stats.exists():  # it listened: the final stats are there, and hangopen lacks nothing it was given
        snap = json.loads(stats.read_text())
        assert snap["final"] and snap["behind"] == {}, snap
    else:
        assert not journal.exists() or list(journal.iterdir()) == [], list(journal.iterdir())
