"""Every view fits (issue 44 §4): integers printed as integers in the steps view, and the steps
view's memory the same whatever ``-n`` (it was 570 MiB at ``-n 20000``). ``relay status`` at 80
columns: tests/test_relay_liveness.py; ``python -m trainer --help``: tests/test_trainer_cli.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from relay.cli.filters import MetricName
from relay.cli.step_view import StepView
from watch_helpers import cli_env, event, training_journal

#: What ``relay tail --view steps -n 20000`` may hold at most (issue 44).
STEPS_VIEW_MIB = 100


def test_integers_print_as_integers_in_the_steps_view() -> None:
    view = StepView((MetricName.parse("num_tokens"), MetricName.parse("loss")))
    view.feed(event("r", 0, 0, 10.0, "metrics", {"num_tokens": 483_800, "loss": 0.5}, step=483_800, stage="train",
                    world_size=1), 0.0)
    ended = view.feed(event("r", 0, 1, 11.0, "lifecycle", {"event": "train_end", "global_step": 483_800,
                                                            "train_loss": 0.25}, step=483_800, world_size=1), 0.0)
    rows = view.ready(1.0, final=True) + ended
    text = "\n".join(row.text for row in rows)
    assert "483800" in rows[0].text.split() and "global_step=483800 train_loss=0.25" in text, text
    assert "e+05" not in text


def test_the_steps_view_of_20000_steps_holds_under_100_mib(tmp_path: Path) -> None:
    """RSS of ``relay tail --view steps -n 20000`` on a journal of 20,500 logged steps of two ranks
    (82,000 lines, 29 MB), measured as the process's peak (getrusage of its only child)."""
    journal = tmp_path / "sft.jsonl"
    training_journal(journal, "sft", 20_500, t0=1.7e9, straggler_every=500)
    measure = ("import json, resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)\n"
               "lines = done.stdout.decode().splitlines()\n"
               "print(json.dumps({'rc': done.returncode, 'lines': len(lines), 'last': lines[-1],\n"
               "                  'kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")
    done = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "relay", "tail", "--view", "steps",
                           "-n", "20000", str(journal)], capture_output=True, text=True, timeout=300, env=cli_env(),
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["rc"] == 0 and got["lines"] == 20_002, got  # the run's line, the header, 20000 lines
    assert got["last"].endswith("train_end status=completed global_step=20500"), got["last"]
    assert got["kib"] < STEPS_VIEW_MIB * 1024, f"{got['kib'] / 1024:.0f} MiB"
