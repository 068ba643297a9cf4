"""When a relay stops, its sinks are complete or it says what is missing: it waits for them (bounded
by --shutdown-timeout, a progress line meanwhile), and names each sink it had to stop with the events
it lacks and the one ``relay replay`` command that completes it, which does. The embedded relay's job
passes the same on to its user (trainer/embedded.py). Real relay processes and real sink processes:
``hangopen`` stands for a tracker whose first set-up takes minutes (MLflow's under load)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, finish, plugin_env, read_jsonl, start_publisher, wait_for
from relay.client.publisher import Publisher
from relay.journal.journal import Journal
from relay.sinkhost import behind
from trainer import embedded
from trainer.embedded import EmbeddedRelay


def _replay(command: list[str], env: dict[str, str]) -> None:
    """Run a command the relay printed (``relay replay ...``) with this checkout's relay."""
    assert command[0].endswith("relay") and command[1] == "replay", command
    subprocess.run([sys.executable, "-m", "relay", *command[1:]], cwd=ROOT, env=env, check=True, timeout=120,
                   capture_output=True)


def test_a_sink_still_opening_at_shutdown_is_named_with_what_it_lacks_and_the_command_completes_it(relays, tmp_path):
    env = plugin_env(tmp_path)
    journal, gate = tmp_path / "j.jsonl", tmp_path / "gate"
    relay = relays(["--sink", "collect", "--sink", "hangopen", "--path", str(journal), "--collect-file",
                    str(tmp_path / "c.jsonl"), "--hangopen-file", str(gate), "--shutdown-timeout", "6"], env=env)
    finish(start_publisher(relay.address, "late", 0, 500))
    wait_for(lambda: "sink collect open (pid" in relay.log.read_text(), 120, "the collect sink open")
    started = time.monotonic()
    assert relay.stop() == 0
    assert time.monotonic() - started < 60, "waited for the opening sink past --shutdown-timeout"
    events = read_jsonl(journal)
    stats = json.loads(Journal(journal).sidecar("_stats.json").read_text())
    assert stats["final"] and stats["sinks"]["collect"]["complete"] and not stats["sinks"]["hangopen"]["complete"]
    assert stats["behind"] == {"hangopen": len(events)}
    command = ["relay", "replay", str(journal), "--sink", "hangopen", "--hangopen-file", str(gate)]
    assert stats["replay"] == command
    log = relay.log.read_text()
    assert "waiting for sinks to apply what the journal took: collect " in log
    assert f"hangopen {len(events):,} events to go (opening) (" in log
    assert (f"sinks not complete at shutdown: hangopen lacks {len(events):,} events; the journal has every event: "
            f"complete them with: relay replay {journal} --sink hangopen --hangopen-file {gate}") in log
    gate.touch()  # the tool is set up now: the command gives it every event, once
    _replay(command, env)
    _replay(command, env)
    assert len(read_jsonl(gate)) == 2 * len(events), "hangopen, a plain sink, takes what it is given"


def test_a_sink_whose_close_did_not_complete_is_named_at_shutdown_and_counted(relays, tmp_path):
    journal, out = tmp_path / "j.jsonl", tmp_path / "u.jsonl"
    relay = relays(["--sink", "unclosed", "--path", str(journal), "--unclosed-file", str(out)],
                   env=plugin_env(tmp_path))
    finish(start_publisher(relay.address, "shut", 0, 50))
    wait_for(lambda: "sink unclosed open (pid" in relay.log.read_text(), 120, "the unclosed sink open")
    assert relay.stop() == 0
    stats = json.loads(Journal(journal).sidecar("_stats.json").read_text())
    sink = stats["sinks"]["unclosed"]
    assert (sink["complete"], sink["incomplete_closes"], sink["dropped"]) == (False, 1, 0), sink
    assert stats["behind"] == {"unclosed": 0} and len(read_jsonl(out)) == len(read_jsonl(journal))
    assert (f"sinks not complete at shutdown: unclosed's close did not complete; the journal has every event: "
            f"complete them with: relay replay {journal} --sink unclosed --unclosed-file {out}") in relay.log.read_text()


def test_the_job_says_what_a_tracker_lacks_in_the_relays_words() -> None:
    for count, stats in ((1234, {}), (0, {"incomplete_closes": 1}), (1234, {"incomplete_closes": 1}), (0, {})):
        assert embedded._shortfall("aim", count, stats) == behind.shortfall("aim", count, stats)
    assert behind.shortfall("aim", 1234, {"incomplete_closes": 1}) == "aim lacks 1,234 events and its close did not complete"


def test_the_job_waits_for_its_trackers_and_says_which_lack_what_and_how_to_complete_them(tmp_path, monkeypatch,
                                                                                        caplog):
    env = plugin_env(tmp_path)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the embedded relay finds the throwaway sinks
    gate = tmp_path / "gate"
    lines = []
    for sink, out in ((["--sink", "collect", "--collect-file", str(tmp_path / "c.jsonl")], tmp_path / "done"),
                      (["--sink", "hangopen", "--hangopen-file", str(gate)], tmp_path / "behind")):
        relay = EmbeddedRelay.start(str(out), sink_args=sink, exit_timeout=6)
        relay.run = "exitjob"
        pub = Publisher("exitjob", 0, address=relay.address)
        for step in range(100):
            pub.publish("metrics", {"loss": 1.0 / (step + 1)}, step=step, stage="train")
        assert pub.close(30) == 0
        if out.name == "done":  # (a sink process's start took over 10 s at load 30)
            log = Path(relay.log_path)
            wait_for(lambda log=log: "sink collect open (pid" in log.read_text(), 120,
                     "collect open")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trainer.embedded"):
            assert relay.stop() == 0
        lines.append([r.getMessage() for r in caplog.records])
    assert any(line.startswith("trackers complete: collect applied the run") for line in lines[0]), lines[0]
    events = len(read_jsonl(tmp_path / "behind" / "training_logs.jsonl"))
    assert any(line.startswith("waiting for sinks to apply what the journal took: hangopen") and
               line.endswith("(--relay_exit_timeout)") for line in lines[1]), lines[1]
    (report,) = [line for line in lines[1] if line.startswith("trackers not complete")]
    journal = tmp_path / "behind" / "training_logs.jsonl"
    assert f": hangopen lacks {events:,} events; the journal has every event: complete them with: " in report
    command = report.split("complete them with: ")[1].split()
    assert command[1:] == ["replay", str(journal), "--run", "exitjob", "--sink", "hangopen", "--hangopen-file",
                           str(gate)]
    gate.touch()
    _replay(command, env)
    assert len(read_jsonl(gate)) == events
