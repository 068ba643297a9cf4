"""Sinks other than the journal run in their own processes (relay/sinkproc.py): a real plugin that
kills its own process is started again, counted, and costs the journal nothing."""
from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import finish, plugin_env, read_jsonl, start_publisher


def _after_run(path: Path) -> int:
    """Events of run "after" among the complete lines the sink has written so far."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return sum(json.loads(line)["run"] == "after" for line in lines if line.endswith("\n"))


def test_a_sink_process_that_dies_is_started_again_and_counted(relays, tmp_path):
    journal, collected = tmp_path / "crash.jsonl", tmp_path / "crash-sink.jsonl"
    relay = relays(["--sink", "crashonce", "--path", str(journal), "--crash-file", str(collected),
                    "--stats-interval", "0.2"], env=plugin_env(tmp_path))
    finish(start_publisher(relay.address, "before", 0, 1000))  # the sink dies at its first batch
    deadline = time.monotonic() + 20
    while "started again" not in relay.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    finish(start_publisher(relay.address, "after", 0, 1000))
    deadline = time.monotonic() + 20
    while _after_run(collected) < 1000 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert {e["run"] for e in events} == {"before", "after"}
    assert _after_run(collected) >= 1000  # written after the restart
    sink = relay.stats(journal)["sinks"]["crashonce"]
    assert sink["restarts"] == 1 and sink["errors"] >= 1, sink
    assert 0 < sink["dropped"] and sink["written"] + sink["dropped"] == len(events), sink  # none unaccounted
    log = relay.log.read_text()
    assert "exited unexpectedly (code 7)" in log and "they are in the journal" in log, log[-3000:]
