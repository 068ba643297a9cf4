"""``relay replay`` says how far it got: a bar on a terminal, a log line off one, and, stopped by
Ctrl-C, how far it got and that running it again finishes it; run again, it does, each event once."""
from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

from conftest import plugin_env, read_jsonl, wait_for
from watch_helpers import LiveCommand, cli_env, relay_cmd, training_journal

PROGRESS = re.compile(r"INFO relay\.replay: ([\d,]+) events, (\d+)% of [\d.]+ [kMG]?B, [\d,]+ ev/s(, about .* left)?$")


def test_off_a_terminal_a_log_line_says_how_far_it_got(tmp_path: Path) -> None:
    source = tmp_path / "src.jsonl"
    lines = training_journal(source, "p", 1500, t0=1.7e9)
    done = relay_cmd("replay", str(source), "--sink", "jsonl", "--path", f"{tmp_path / 'out'}/", "--progress-every", "0")
    assert done.returncode == 0, done.stderr
    said = [PROGRESS.search(line) for line in done.stderr.splitlines() if "relay.replay" in line]
    assert len(said) >= 5 and all(said), done.stderr
    counts = [int(m.group(1).replace(",", "")) for m in said]
    assert counts == sorted(counts) and counts[-1] == lines and said[-1].group(2) == "100"
    assert done.stderr.splitlines()[-1].startswith(f"read {lines} events from 1 files: {lines} new in the journal")


def test_on_a_terminal_a_bar_is_redrawn_in_place(tmp_path: Path) -> None:
    source = tmp_path / "src.jsonl"
    training_journal(source, "p", 1500, t0=1.7e9)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "relay", "replay", str(source), "--sink", "jsonl", "--path",
                             f"{tmp_path / 'out'}/"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=follower, env=cli_env(TERM="xterm"))
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: closed
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(120) == 0
    text = out.decode()
    bars = re.findall(r"\r\x1b\[K(replay \[[#.]{20}\] +\d+% [\d,]+ events [\d,]+ ev/s ETA [^\r\n]*)", text)
    assert bars and bars[-1].startswith("replay [####################] 100% 6,004 events"), text[-2000:]
    assert text.endswith("unreadable lines skipped\r\n") and "\r\n" in text.split(bars[-1], 1)[1], text[-500:]


def test_ctrl_c_says_how_far_it_got_and_running_it_again_finishes(tmp_path: Path) -> None:
    source, out = tmp_path / "src.jsonl", tmp_path / "out"
    lines = training_journal(source, "p", 5000, t0=1.7e9)  # 20 batches, 0.1 s each in the slow sink
    args = ["replay", str(source), "--sink", "jsonl", "--path", f"{out}/", "--sink", "slowflush", "--slow-file",
            str(tmp_path / "slow.jsonl"), "--progress-every", "0"]
    replay = LiveCommand(*args, env=plugin_env(tmp_path))
    try:
        wait_for(lambda: "INFO relay.replay: 2,000 events" in replay.stderr(), 60, "two batches replayed")
        code, stderr = replay.stop(signal.SIGINT)
    finally:
        replay.kill()
    assert code == 130, stderr
    last = stderr.splitlines()[-1]
    assert re.fullmatch(r"relay: error: replay stopped by Ctrl-C after [\d,]+ events \(\d+% of [\d.]+ MB\); what the "
                        r"sinks took is kept: run the same command again to finish \(what each sink already holds is "
                        r"skipped\)", last), last
    assert "Traceback" not in stderr
    taken = len(read_jsonl(out / "p.jsonl"))
    assert 2000 <= taken < lines
    again = relay_cmd("replay", str(source), "--sink", "jsonl", "--path", f"{out}/")
    assert again.returncode == 0, again.stderr
    assert f"{lines - taken} new in the journal" in again.stderr and f"{taken} it held already" in again.stderr
    assert sorted((e["rank"], e["seq"]) for e in read_jsonl(out / "p.jsonl")) == sorted(
        (e["rank"], e["seq"]) for e in read_jsonl(source))


BROKEN_SINKS = '''
from sinks.base import Sink

class NoWrite(Sink):  # an author forgot write(): abstract
    name = "nowrite"

class BadOpen(Sink):  # open() has a bug of its own
    name = "badopen"
    def open(self, context):
        raise RuntimeError("bug in open")
    def write(self, events):
        pass

class OldCatchUp(Sink):  # catch-up as the contract had it before CatchesUp
    name = "oldcatchup"
    catches_up = True
    def write(self, events):
        pass
    def holes(self):
        return []
    def caught_up(self, run):
        pass
'''


def test_a_broken_plugin_is_one_line_and_exit_2_as_relay_serve_says_it(tmp_path: Path) -> None:
    """Issue 44: replay printed a 32-line traceback and exited 1 for a sink missing a method; now it
    says what ``relay serve`` says for the same plugin (docs/plugins.md), also for a bug in ``open()``
    and for a plugin written for the catch-up contract before ``CatchesUp``."""
    source = tmp_path / "src.jsonl"
    training_journal(source, "p", 3, t0=1.7e9)
    (tmp_path / "broken_sinks.py").write_text(BROKEN_SINKS)
    env = cli_env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    expected = {"NoWrite": "relay: error: sink nowrite failed to start: TypeError: Can't instantiate abstract class "
                           "NoWrite with abstract method write",
                "BadOpen": "relay: error: sink badopen failed to start: RuntimeError: bug in open",
                "OldCatchUp": "relay: error: sink 'broken_sinks:OldCatchUp' is written for the old "
                              "catch-up contract (catches_up, holes, caught_up): derive from "
                              "sinks.base.CatchesUp and write holes(filled) instead (docs/plugins.md)"}
    for name, said in expected.items():
        replay = relay_cmd("replay", str(source), "--sink", f"broken_sinks:{name}", env=env, timeout=60)
        assert (replay.returncode, replay.stderr.splitlines()) == (2, [said]), replay.stderr
    for name in ("NoWrite", "OldCatchUp"):
        serve = relay_cmd("--sink", f"broken_sinks:{name}", "--path", str(tmp_path / "j.jsonl"),
                          "--bind", "tcp://127.0.0.1:0", env=env, timeout=60)
        assert (serve.returncode, serve.stderr.splitlines()) == (2, [expected[name]]), serve.stderr
