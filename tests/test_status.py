"""The relay's status, with real relays and real publisher processes: the live line on a
pseudo-terminal, the periodic log line off one, ``relay status`` against a live relay and against
the stats file a stopped one left, its errors, and a flood of status requests beside a publisher."""
from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import zmq

from conftest import (
    ROOT,
    finish,
    free_port,
    line_count,
    plugin_env,
    raw_socket,
    read_jsonl,
    start_publisher,
    wait_for,
)
from relay.daemon.status import ANSWER_RATE, STATUS_REQUEST
from watch_helpers import cli_env

CLEAR = "\r\x1b[K"
EVENTS = re.compile(r"\| (\d+) events")


def relay_status(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """``relay status ARGS``, its width unlimited (no $COLUMNS) unless ``env`` says otherwise."""
    return subprocess.run([sys.executable, "-m", "relay", "status", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or cli_env(), cwd=ROOT)


class PtyRelay:
    """A relay whose stderr is the slave side of a pseudo-terminal (200 columns wide until
    ``resize``); ``text()`` is everything it has written there so far."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict) -> None:
        master, slave = os.openpty()
        ready = tmp_path / "ready.json"
        self.proc = subprocess.Popen([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}",
                                      "--ready-file", str(ready), *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=slave, env=dict(env, TERM="xterm"),
                                     cwd=tmp_path)
        os.close(slave)
        self._master = master
        self.resize(200)
        self._out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(lambda: ready.exists() or self.proc.poll() is not None, 30, "relay ready")
        assert self.proc.poll() is None, self.text()
        self.address = json.loads(ready.read_text())["address"]

    def resize(self, columns: int) -> None:
        fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every slave end is closed (the relay and its sinks exited)
                return
            if not data:
                return
            self._out.extend(data)

    def text(self) -> str:
        return bytes(self._out).decode("utf-8", "replace")

    def draws(self) -> list[str]:
        """What followed each clear-to-end-of-line: a status line, or a log record and the line after it."""
        return self.text().split(CLEAR)[1:]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(30)
        self._reader.join(10)
        os.close(self._master)
        return code


def test_live_line_on_a_terminal_is_redrawn_in_place_and_logs_pass_above_it(tmp_path):
    relay = PtyRelay(tmp_path, ["--path", str(tmp_path / "logs") + "/", "--sink", "collect",
                                "--collect-file", str(tmp_path / "collected.jsonl"), "--sink", "flaky",
                                "--flaky-file", str(tmp_path / "flaky.jsonl"), "--flaky-failures", "1"],
                     plugin_env(tmp_path))
    try:
        wait_for(relay.draws, 30, "the first live line")  # before any event: the flaky sink logs above it
        pubs = [start_publisher(relay.address, "run-a", rank, 1500, world_size=2, rate=400) for rank in (0, 1)]

        def counts() -> list[int]:
            return [int(m.group(1)) for d in relay.draws() if (m := EVENTS.search(d)) and "run-a 2/2" in d]

        wait_for(lambda: len(set(counts())) >= 3, 60, "three live lines showing run-a 2/2 with new counts")
        relay.resize(80)  # a line that wrapped could not be redrawn in place: it says less, the sinks' queues kept
        wait_for(lambda: re.fullmatch(r"\d+ ev/s \| sinks: jsonl \d+q, collect \d+q, flaky \d+q[^|]* \| 1 run \| "
                                      r"\d+ ev", relay.draws()[-1]) and len(relay.draws()[-1]) <= 79, 30,
                 "a short line with every sink's queue")
        relay.resize(50)  # and what does not fit even so is cut to the width
        wait_for(lambda: relay.draws()[-1].endswith("…") and len(relay.draws()[-1]) == 49, 30, "a cut line")
        relay.resize(200)
        raw = raw_socket(zmq.Context.instance(), relay.address)
        raw.send(b"\xc1 not msgpack")  # a rejected frame: the relay logs a warning while the line is up
        wait_for(lambda: "rejected frame" in relay.text(), 30, "the warning")
        raw.close(0)
        for pub in pubs:
            finish(pub)
        wait_for(lambda: any("| 3004 events" in d for d in relay.draws()), 30, "every event counted")
        # the flaky sink's process logs its failure while the line is up (its start alone can take
        # seconds on a busy machine: waited for, not assumed)
        wait_for(lambda: "sink flaky failed" in relay.text(), 60, "the flaky sink's failure logged")
    finally:
        code = relay.stop()
    assert code == 0, relay.text()[-3000:]
    seen = counts()
    assert seen == sorted(seen) and seen[-1] == 3004, seen
    draws = relay.draws()
    lines = [d for d in draws if " ev/s | " in d.split("\n")[0]]
    assert len(lines) >= 4
    assert all("\n" not in d for d in lines[:-1]), "a status update scrolled the terminal"
    assert all("sinks: jsonl " in d and "collect " in d for d in lines if "run-a" in d and "..." not in d)
    # the last line stays, ended by a newline, and what is logged after it starts on a line of its own
    assert re.match(r"[^\n]* ev/s \| [^\n]*\r\n\S+ \S+ INFO relay: shutting down", lines[-1]), lines[-1]
    # the warning went above the line: cleared, written whole on its own line, the line drawn after it
    warning = next(d for d in draws if "rejected frame" in d)
    assert re.fullmatch(r"\S+ \S+ WARNING relay: rejected frame [^\n]*\r\n[^\n]* ev/s \| [^\n]*", warning), warning
    # so did the flaky sink's own process's log
    error = next(d for d in draws if "sink flaky failed" in d)
    assert re.fullmatch(r"\S+ \S+ ERROR \S+ \[sink flaky \d+\]: sink flaky failed [^\n]*\r\n[^\n]* ev/s \| [^\n]*",
                        error), error


def test_off_a_terminal_the_status_is_logged_every_stats_interval(relays, tmp_path):
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.5"])
    pubs = [start_publisher(relay.address, "run-b", rank, 400, world_size=2, rate=200) for rank in (0, 1)]
    for pub in pubs:
        finish(pub)
    wait_for(lambda: "run-b 2/2 running | 804 events" in relay.log.read_text(), 30, "a stats line with every event")
    assert relay.stop() == 0
    log = relay.log.read_text()
    assert "\x1b[" not in log and "\r" not in log
    periodic = [line for line in log.splitlines() if " ev/s | " in line]
    assert len(periodic) >= 3 and all(" INFO relay.daemon.counters: stats: " in line for line in periodic[:-1])
    assert " INFO relay.daemon.counters: final: " in periodic[-1]
    line = next(line for line in periodic if "run-b 2/2 running | 804 events" in line)
    assert re.search(r"stats: \d+ ev/s \| 1 run: run-b 2/2 running \| 804 events in \d+ frames, \d+ written, "
                     r"0 duplicates, 0 rejected, 0 client drops \| sinks: jsonl \d+ queued", line), line


def test_relay_status_asks_a_live_relay_and_reads_the_stats_file_a_stopped_one_left(relays, tmp_path):
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/"])
    stats = [finish(start_publisher(relay.address, "run-s", rank, 300, world_size=2)) for rank in (0, 1)]
    assert all(s["left"] == 0 and s["dropped"] == 0 for s in stats)
    lines = line_count(journal / "run-s.jsonl")
    assert lines >= 602  # each rank's hello and 300 metrics (and its closing stats event, if any)

    as_json = relay_status(relay.address, "--json")
    assert as_json.returncode == 0, as_json.stderr
    snap = json.loads(as_json.stdout)
    assert snap["events"] == snap["written"] == lines and snap["duplicates"] == snap["rejected_total"] == 0
    assert snap["per_run"] == {"run-s": {"connected": 2, "ranks": 2, "world_size": 2, "idle_s": snap["per_run"]
                                         ["run-s"]["idle_s"], "state": "running"}}
    assert snap["runs"] == 1 and snap["address"] == relay.address and snap["final"] is False
    assert snap["sinks"]["jsonl"]["queued"] == 0 and snap["sinks"]["jsonl"]["lag_s"] == 0
    assert abs(snap["ts"] - time.time()) < 30 and "events_per_s" in snap

    # the plain line; with no argument, $RELAY_ADDRESS
    text = relay_status(env=cli_env(RELAY_ADDRESS=relay.address))
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("\n") == 1
    assert re.match(rf"\d+ ev/s \| 1 run: run-s 2/2 running \| {lines} events in \d+ frames, {lines} written, 0 duplicates, "
                    r"0 rejected, 0 client drops \| sinks: jsonl 0 queued", text.stdout), text.stdout

    assert relay.stop() == 0
    for target in (journal, journal / "_relay_stats.json", journal / "run-s.jsonl"):  # a run file: its folder's
        text = relay_status(str(target))
        assert text.returncode == 0, text.stderr
        assert text.stdout.startswith("relay stopped at ") and f"run-s 0/2 stale | {lines} events" in text.stdout
    final = json.loads(relay_status(str(journal), "--json").stdout)
    assert final["final"] is True and final["written"] == lines and final["status_answered"] == 2


def test_relay_status_errors_are_one_line_with_their_exit_code(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = relay_status(address, "--timeout", "1")
    assert proc.returncode == 1 and time.monotonic() - started < 15
    assert proc.stderr.strip() == (f"relay: error: no relay answered at {address} within 1 s; is it running? start "
                                   f"one (relay --bind {address}), or give the stats file beside its journal "
                                   "(relay status relay-logs/)")
    bad = tmp_path / "bad_stats.json"
    bad.write_text("{not json")
    for target, says in ((bad, "cannot read"), (tmp_path / "nothing.jsonl", "no stats file at"),
                         (tmp_path, "no stats file at")):
        proc = relay_status(str(target))
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("relay: error: ") and says in proc.stderr
    bad.write_text(json.dumps({"events": "many", "sinks": {}, "events_per_s": "fast"}))
    proc = relay_status(str(bad))
    assert proc.returncode == 2 and "holds counters a relay does not write" in proc.stderr


@pytest.mark.slow  # a whole fault scenario through relay processes: the full tier
def test_a_flood_of_status_requests_costs_a_publisher_nothing_and_rejects_nothing(relays, tmp_path):
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    flood = raw_socket(zmq.Context.instance(), relay.address, SNDHWM=0)
    requests = 20_000
    pub = start_publisher(relay.address, "steady", 0, 5000, rate=2000)
    started = time.monotonic()
    for _ in range(requests):  # as fast as one socket can send, while the publisher sends; no reply is read
        flood.send(STATUS_REQUEST)
    stats = finish(pub)
    assert stats["left"] == 0 and stats["dropped"] == 0, stats

    def counters() -> dict:
        return relay.stats(journal)

    wait_for(lambda: counters()["status_answered"] + counters()["status_unanswered"] == requests, 120,
             "every request answered or counted")
    elapsed = time.monotonic() - started  # the relay answered them all within this time
    flood.close(0)
    assert relay.stop() == 0
    final = counters()
    events = read_jsonl(journal)
    assert [e["seq"] for e in events if e["type"] == "metrics"] == list(range(1, 5001))  # once each, in order
    assert final["rejected_total"] == 0 and final["duplicates"] == 0 and final["frames"] < requests
    assert 1 <= final["status_answered"] <= ANSWER_RATE * elapsed + ANSWER_RATE
    assert final["events"] == final["written"] == len(events)

