"""A relay's sink processes die with it, and a kill never breaks a tracker's store (issue 25 §2).

relay/sinkhost/lifeline.py: a sink process ends within a second of its relay's death however the relay
died (the kernel's parent-death signal, and a pipe only the relay holds, each shown on its own), and a
new relay's sink process waits for the old one's lock. sinks/store_setup.py: MLflow's and Aim's one-time
set-up, killed midway, leaves the store as it was, and the next process finishes it; a store that an
older relay's interrupted set-up broke is mended. The slow test SIGKILLs a relay with MLflow (SQLite),
Aim and TensorBoard sinks at 50 random moments of its first seconds while one publisher goes on, then
reads every store back through its own client: every value once, and no sink process outlived a relay
by more than a second."""
from __future__ import annotations

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

from conftest import ROOT, plugin_env, wait_for
from relay.journal.reader import read_events

#: What "dies with its relay" allows: seconds from the relay's death until its sink processes are gone.
GONE_WITHIN = 1.0

#: A stand-in relay: asks for a tied child from a thread that waits until the child is tied (as the relay's
#: opener thread waits for its sink's ready line) and then ends: the parent-death trap. Prints the child's
#: pid and what it said, and lives on until killed.
STAND_IN = textwrap.dedent("""
    import subprocess, sys, threading, time
    from relay.sinkhost import lifeline
    child = []

    def ask():
        proc = lifeline.spawn([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
        child.append(f"{proc.pid} {proc.stdout.readline().strip()}")

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join()
    print(child[0], flush=True)
    time.sleep(600)
""")
#: The tied child: only the kernel's signal, or only the pipe, so each is shown to work on its own.
TIED = textwrap.dedent("""
    import sys, time
    from relay.sinkhost import lifeline
    mode, fd = sys.argv[1], int(sys.argv[2])
    if mode == "kernel":
        assert lifeline.die_with_parent("test")
    else:
        lifeline.watch_lifeline(fd, "test")
    print("tied", flush=True)
    time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead; its adopter has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def seconds_until_gone(pids: list[int], limit: float = 30.0) -> float:
    """How long until every process of ``pids`` is gone (dead), measured from now; ``limit`` when
    some outlive it (so a failure says how long they lived, not only that they did)."""
    started = time.monotonic()
    while not all(_gone(pid) for pid in pids):
        if time.monotonic() - started > limit:
            return limit
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("mode", ["kernel", "pipe"])
def test_a_tied_process_outlives_the_thread_that_asked_for_it_and_dies_with_its_relay(mode, tmp_path):
    relay = subprocess.Popen([sys.executable, "-c", STAND_IN, TIED, mode], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)
    try:
        pid, said = relay.stdout.readline().split()
        assert said == "tied"
        child = psutil.Process(int(pid))
        wait_for(lambda: len(psutil.Process(relay.pid).threads()) == 2, 30, "the asking thread gone")  # main, spawner
        assert not _gone(child.pid) and child.ppid() == relay.pid
        relay.kill()
        relay.wait(10)
        lived = seconds_until_gone([child.pid])
        assert lived <= GONE_WITHIN, f"{mode}: the child outlived its relay by {lived:.2f} s"
    finally:
        relay.kill()
        relay.wait(10)


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
    children = [p.pid for p in psutil.Process(relay.proc.pid).children(recursive=True)]
    opening = tmp_path / "j_sink_hangopen.lock"  # its process writes its pid there just before it opens the sink
    wait_for(lambda: opening.exists() and opening.read_text().strip().isdigit(), 60, "hangopen opening")
    assert len(children) == 2 and int(opening.read_text()) in children
    relay.kill()
    lived = seconds_until_gone(children)
    assert lived <= GONE_WITHIN, f"sink processes outlived their relay by {lived:.2f} s"

