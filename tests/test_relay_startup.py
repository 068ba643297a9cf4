"""The relay listens at once, whatever sinks it has: every check comes before it binds (one line, exit 2),
then it is ready while its sinks' processes open beside it (relay/sinkhost/process.py)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import finish as finish_publisher, plugin_env, start_publisher, wait_for
from trainer.tracker_flags import TrackingArguments, sink_args

FIVE = ["aim", "mlflow", "tensorboard", "wandb", "clearml"]


def five_sinks(folder: Path) -> list[str]:
    """The five tracker sinks as the trainer's embedded relay gets them, writing into ``folder``."""
    return sink_args(FIVE, TrackingArguments(), str(folder))


@pytest.mark.slow  # five trackers imported in five processes: 10-30 s on a busy machine
def test_ready_before_any_sink_opens_and_every_sink_gets_the_events(relays, tmp_path: Path) -> None:
    """Ready (and acknowledging) while the five sinks are still opening; once open, each holds the
    events that arrived meanwhile (queued, or read back from the journal)."""
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/", "--stats-interval", "0.3", *five_sinks(tmp_path)],
                   env=dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true"))
    assert finish_publisher(start_publisher(relay.address, "early", 0, 200))["left"] == 0  # all journaled
    def caught_up() -> bool:
        sinks.update(relay.stats(journal)["sinks"])
        return all(sinks[name]["open"] and not sinks[name]["queued"]
                   and sinks[name]["written"] + sinks[name]["caught_up"] >= 200 for name in FIVE)

    sinks: dict = {}
    wait_for(caught_up, 300, "the five sinks open and caught up", lambda: json.dumps(sinks)[-3000:])
    assert relay.stop(timeout=120) == 0  # five sinks drain and close, on a busy machine
    log = relay.log.read_text()
    listening = log.index("relay listening on")
    for name in FIVE:  # the log's own order: the relay was ready before any sink had opened
        assert listening < log.index(f"sink {name} open (pid"), log[-3000:]
        assert sinks[name]["errors"] == 0 and sinks[name]["dropped"] == 0, sinks[name]


def _hide(tmp_path: Path, package: str) -> dict[str, str]:
    """An environment where ``package`` is not installed (found by no import, nor by find_spec)."""
    site = tmp_path / f"no-{package}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules[{package!r}] = None\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


CASES = {
    "unknown-sink": (["--sink", "nosuch"], "unknown sink 'nosuch'"),
    "bad-option": (["--sink", "forward", "--forward-window", "0"], "Invalid value for '--forward-window'"),
    "missing-option": (["--sink", "tensorboard"], "--sink tensorboard needs --logdir"),
    "missing-package": (["--sink", "tensorboard", "--logdir", "{tmp}/tb"], "not installed; pip install './[tensorboard]' in the metrics-relay checkout"),
    "unwritable-sink-path": (["--sink", "aim", "--repo", "{tmp}/file/aim"], "Aim repository {tmp}/file/aim is not usable: {tmp}/file is not a directory; pass a writable --repo"),
    "unwritable-journal": (["--path", "{tmp}/file/x.jsonl"], "cannot write the JSONL journal"),
    "plugin-check": (["--sink", "mlflow", "--mlflow-tracking-uri", "sqlite:///{tmp}/file/m.db"], "is not usable"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2_before_binding(tmp_path: Path, case: str) -> None:
    """Each refused before the relay binds: it is run on a port this test holds, and a relay that
    tried to bind would say the address is in use (exit 3) instead."""
    args, message = CASES[case]
    (tmp_path / "file").write_text("in the way")
    env = _hide(tmp_path, "tensorboard") if case == "missing-package" else None
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cmd = [sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{port}", "--path", str(tmp_path / "j.jsonl"),
               *[a.replace("{tmp}", str(tmp_path)) for a in args]]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("relay: error: "), done.stderr[-2000:]
    assert message.replace("{tmp}", str(tmp_path)) in lines[0], lines[0]


def test_a_sink_that_fails_to_open_after_ready_is_reported_counted_and_retried(relays, tmp_path: Path) -> None:
    """What only open() finds out (here: a plugin whose open raises SinkError) comes after the relay is
    ready: logged with the reason, counted in the stats, tried again with backoff; ingest goes on."""
    journal = tmp_path / "logs"
    env = plugin_env(tmp_path)
    relay = relays(["--path", f"{journal}/", "--stats-interval", "0.3", "--sink", "failopen",
                    "--failopen-file", str(tmp_path / "gate")], env=env)
    assert finish_publisher(start_publisher(relay.address, "r", 0, 20))["left"] == 0  # ingest goes on
    failopen = lambda: relay.stats(journal)["sinks"]["failopen"]  # noqa: E731
    log = lambda: relay.log.read_text()[-3000:]  # noqa: E731
    wait_for(lambda: failopen().get("open_failures", 0) >= 2, 60, "two failed opens", log)
    sink = failopen()
    assert not sink["open"] and "gate is missing" in sink["open_error"] and sink["errors"] >= 2, sink
    assert "sink failopen could not open (1 attempts; trying again in 1 s" in relay.log.read_text()
    (tmp_path / "gate").write_text("")  # what it needed is there now: the next attempt opens it
    wait_for(lambda: failopen()["open"], 60, "the sink open once its gate is there", log)
    assert "open_error" not in failopen()
    assert relay.stop() == 0
