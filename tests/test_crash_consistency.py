"""Crash consistency (issue 16, item 1): a real relay SIGKILLed at 200 random points while real
publisher processes (2 runs x 2 ranks) write events of 100 B up to the frame limit, restarted each
time; every event it acknowledged must be in the journal exactly once, in whole valid lines.
``make soak`` runs the same for thousands of kills (bench/soak.py ``--crash-kills``).

The 200 kills are bench/crash.py's two rounds of 100 (each its own publishers, journal, relay
port and seed: 16 and 17, as ``crash.run(200, per_round=100, seed=16)`` draws them), one test
per round, so pytest-xdist runs the two side by side; each round gets every check the whole run got."""
from __future__ import annotations

import os
import signal

import pytest

from bench import crash
from bench.relay_forker import RelayForker

KILLS_PER_ROUND = 100
SEED = 16


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dir"])
@pytest.mark.parametrize("round_", [0, 1])
def test_sigkill_at_random_points_never_loses_or_repeats_an_acknowledged_event(tmp_path, layout, round_):
    figures = crash.run(KILLS_PER_ROUND, tmp_path / "crash", per_round=KILLS_PER_ROUND, runs=2, ranks=2, rate=5.0,
                        layout=layout, seed=SEED + round_)
    summary = crash.summary_line(figures)
    assert figures["kills"] == KILLS_PER_ROUND, summary
    assert figures["acked"] > 0 and figures["acked"] == figures["expected"], figures
    assert figures["lost"] == 0 and figures["duplicated"] == 0 and figures["extra"] == 0, summary
    assert figures["bad_lines"] == 0 and figures["torn_files"] == 0, summary
    assert figures["unacked_at_close"] == 0 and figures["dropped"] == 0, figures
    assert figures["ok"], figures


def test_a_forked_relay_killed_the_moment_its_pid_is_known_ends(tmp_path):
    """The crash rounds kill a relay up to 0.3 s after its start, as a group: a fork that was not yet
    run had no group then, the kill found nothing, and a round at load 8 waited on that relay for
    ever (92 kills of 100 missed so here before the forker set the group itself)."""
    forker = RelayForker()
    try:
        for i in range(20):
            relay = forker.start(["--bind", f"ipc://{tmp_path}/s{i}", "--sink", "jsonl", "--path",
                                  f"{tmp_path}/j{i}/", "--log-level", "warning"], tmp_path / "log")
            os.killpg(relay.pid, signal.SIGKILL)  # kill_group's kill: ProcessLookupError if no group yet
            assert relay.wait(30) == -signal.SIGKILL, i
    finally:
        forker.close()
