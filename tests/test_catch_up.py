"""A sink catches up after a relay restart, even for a run that sends nothing more (relay/sinkhost/catch_up.py):
real relay processes, real sink processes, the trackers read back through their own API."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import wait_for
from sink_helpers import finish_ranks as finish, start_rank
from sink_readback import check_aim as check_aim_run, read_repo
from test_sink_tensorboard import check_training_run as check_tb_run
from test_sink_tensorboard import read_logdir


STEPS = 30





def wait_stats(journal: Path, name: str, ok: Any, timeout: float, relay: Any) -> dict[str, Any]:
    wait_for(lambda: ok(relay.sink_stats(journal, name)), timeout, f"sink {name}'s stats",
             lambda: f"{relay.sink_stats(journal, name)}\n{relay.log_tail()}")
    return relay.sink_stats(journal, name)


def sink_children(relay: Any) -> list[psutil.Process]:
    """The relay's sink processes themselves (each runs under a supervisor, relay/sinkhost/lifeline.py)."""
    return [p for p in psutil.Process(relay.proc.pid).children(recursive=True)
            if p.cmdline()[1:3] == ["-m", "relay.sinkhost.child"]]


@pytest.mark.slow  # two relays, a sink process stopped, Aim or TensorBoard opened twice: 10-40 s
@pytest.mark.parametrize("name", ["tensorboard", "aim"])
def test_a_finished_run_the_sink_missed_is_caught_up_after_a_restart(relays, tmp_path: Path, name: str) -> None:
    """The sink's process hangs (SIGSTOP) while a whole run is journaled; then the relay and its sink
    process are SIGKILLed and the relay started again. No event of that run comes any more, yet the
    sink reads it from the journal: the tracker holds every event exactly once."""
    journal, out = tmp_path / "logs", tmp_path / name
    option = {"tensorboard": "--logdir", "aim": "--repo"}[name]
    args = ["--path", f"{journal}/", "--sink", name, option, str(out), "--stats-interval", "0.3"]
    relay = relays(args)
    wait_stats(journal, name, lambda s: s.get("open"), 120, relay)
    (child,) = sink_children(relay)
    child.suspend()
    finish([start_rank(relay.address, "job-missed", rank, STEPS) for rank in (0, 1)])
    relay.kill()
    with contextlib.suppress(psutil.NoSuchProcess):  # it goes with the relay (its supervisor kills it)
        child.kill()
    restarted = relays(args, address=relay.address)  # nothing is published to it
    stats = wait_stats(journal, name, lambda s: s.get("catch_up_passes", 0) >= 1, 300, restarted)
    assert stats["caught_up"] >= 2 * STEPS, stats
    assert restarted.stop() == 0
    if name == "tensorboard":
        check_tb_run(read_logdir(out)["job-missed"], steps=STEPS)  # each step of each series once, none missing
    else:
        check_aim_run(read_repo(str(out))["job-missed"], steps=STEPS)
    # A third start reads nothing again: the state file says how far each run file was delivered.
    again = relays(args, address=relay.address)
    wait_stats(journal, name, lambda s: s.get("open") and s.get("catch_up_passes", 0) >= 1, 300, again)
    assert again.sink_stats(journal, name)["caught_up"] == 0
    assert again.stop() == 0
