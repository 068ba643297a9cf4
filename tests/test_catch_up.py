"""A sink catches up from the journal (relay/sinkhost/catch_up.py): the runs it names in ``holes()``
after a batch, in milliseconds with a sink's process's writer and a journal file; and after a relay
restart, even for a run that sends nothing more: real relay processes, real sink processes, the
trackers read back through their own API."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import wait_for
from relay.journal.deadletter import DeadLetters
from relay.sinkhost.catch_up import CatchUp
from relay.sinkhost.child import SinkWriter
from relay.wire.lines import encode_line
from sink_helpers import Events, finish_ranks as finish, start_rank
from sink_readback import check_aim as check_aim_run, read_repo
from sinks.base import PermanentError
from sinks.tracker_base import TrackerSink
from test_sink_tensorboard import check_training_run as check_tb_run, read_logdir

STEPS = 30


class Steps(TrackerSink):
    """Keeps the steps of the losses it is given, and its spans in a state file."""

    name = "steps"

    def __init__(self, state: Path) -> None:
        super().__init__()
        self.state, self.steps = state, list[int]()

    def state_path(self) -> Path:
        return self.state

    def log_metrics(self, run, rank, step, epoch, context, values, ts) -> None:
        self.steps.append(step)

    def start_run(self, run: str, params: dict) -> None: ...
    def log_params(self, run: str, name: str, params: dict) -> None: ...  # noqa: E704
    def finish_run(self, run: str, status: str) -> None: ...  # noqa: E704


class Refuses(Steps):
    """Steps that refuses step 5 for good (as W&B refuses a metric named ``_step``)."""

    def log_metrics(self, run, rank, step, epoch, context, values, ts) -> None:
        if step == 5:
            raise PermanentError("step 5: refused for good")
        super().log_metrics(run, rank, step, epoch, context, values, ts)


def fed(sink: Steps, catch_up: CatchUp, *batches: list[dict], deadletters: Path | None = None) -> dict[str, Any]:
    """``batches`` through the writer of a sink's process (its queue, driver and catch-up), drained."""
    writer = SinkWriter(sink.name, sink, 1000, DeadLetters(deadletters) if deadletters else None, catch_up)
    writer.start()
    for batch in batches:
        writer.submit(batch)
    writer.close(10.0)
    return writer.stats()


def test_a_run_the_sink_names_in_holes_is_written_from_the_journal_before_its_next_flush(tmp_path: Path) -> None:
    journal, ev = tmp_path / "logs", Events("r", world_size=1)
    journal.mkdir()
    events = [ev(0, "metrics", {"loss": 1 / s}, step=s, stage="train") for s in range(1, 15)]
    (journal / "r.jsonl").write_bytes(b"".join(encode_line(e) for e in events[:10]))
    sink, catch_up = Steps(tmp_path / "state.json"), CatchUp(f"{journal}/", "steps")
    # The relay dropped 3 of them for this sink (its queue was full): the journal holds them.
    stats = fed(sink, catch_up, events[:3], events[6:10])
    assert sorted(sink.steps) == list(range(1, 11)) and stats["caught_up"] == 10 and stats["written"] == 7
    assert sink.holes([]) == [] and not sink.catch_up_due("r")
    # Two its client dropped (claimed as such): no journal holds them, the run is caught up all the same,
    # reading only what was journaled since.
    with open(journal / "r.jsonl", "ab") as fh:
        fh.write(b"".join(encode_line(e) for e in events[12:]))
    stats = fed(sink, catch_up, events[12:])
    assert sorted(sink.steps) == list(range(1, 11)) + [13, 14] and stats["caught_up"] == 2
    assert sink.holes([]) == []
    # The sink's next process finds that hole in its saved spans: its first event of the run reads it whole.
    again = Steps(tmp_path / "state.json")
    stats = fed(again, CatchUp(f"{journal}/", "steps"), events[13:])
    assert again.steps == [] and stats["caught_up"] == 12 and again.holes([]) == []


class Buggy(Steps):
    """Steps whose ``holes()`` raises the first time, and once more the first time it is told a run
    was filled."""

    def __init__(self, state: Path) -> None:
        super().__init__(state)
        self.raised = list[str]()

    def holes(self, filled: Sequence[str]) -> list[str]:
        if not self.raised or (self.raised == ["holes"] and filled):
            self.raised.append("filled" if filled else "holes")
            raise RuntimeError("a plugin's bug in holes()")
        return super().holes(filled)


def test_a_sink_whose_holes_raises_is_counted_and_its_writer_goes_on(tmp_path: Path) -> None:
    journal, ev = tmp_path / "logs", Events("r", world_size=1)
    journal.mkdir()
    events = [ev(0, "metrics", {"loss": 1 / s}, step=s, stage="train") for s in range(1, 11)]
    (journal / "r.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    sink = Buggy(tmp_path / "state.json")
    writer = SinkWriter(sink.name, sink, 1000, None, CatchUp(f"{journal}/", "steps"))
    writer.start()
    writer.submit(events[:2])  # its flush asks for holes(): raises
    wait_for(lambda: sink.raised == ["holes"], timeout=30)
    writer.submit(events[4:6])  # a hole (3, 4): read from the journal, then holes(["r"]) raises
    wait_for(lambda: sink.raised == ["holes", "filled"], timeout=30)
    writer.submit(events[8:])  # the run is named filled again at this flush, now taken as caught up
    writer.close(10.0)
    stats = writer.stats()
    assert stats["errors"] == 2, stats
    assert sorted(set(sink.steps)) == list(range(1, 11)) and sink.holes([]) == [], sink.steps


def test_an_event_refused_in_the_middle_of_a_run_is_dead_lettered_once_whoever_reads_the_run_again(
        tmp_path: Path) -> None:
    journal, dead, ev = tmp_path / "logs", tmp_path / "dead.jsonl", Events("r", world_size=1)
    journal.mkdir()
    events = [ev(0, "metrics", {"loss": 1 / s}, step=s, stage="train") for s in range(1, 11)]
    (journal / "r.jsonl").write_bytes(b"".join(encode_line(e) for e in events[:8]))
    # Step 5 refused live leaves a hole in the sink's spans: its run is read back before the next flush.
    sink = Refuses(tmp_path / "state.json")
    stats = fed(sink, CatchUp(f"{journal}/", "steps"), events[:8], deadletters=dead)
    assert set(sink.steps) == {1, 2, 3, 4, 6, 7, 8} and sink.holes([]) == []  # (a set: a failed batch is retried)
    assert (stats["dead_lettered"], stats["written"], stats["caught_up"]) == (1, 7, 7)
    assert [json.loads(line)["event"]["step"] for line in dead.read_text().splitlines()] == [5]
    # The sink's next process finds the hole in its saved spans and reads the run whole: step 5 is in the
    # dead-letter file already, so it is not refused, kept or counted again; step 9, which the relay
    # dropped for it (neither applied nor dead-lettered), is written.
    with open(journal / "r.jsonl", "ab") as fh:
        fh.write(b"".join(encode_line(e) for e in events[8:]))
    again = Refuses(tmp_path / "state.json")
    stats = fed(again, CatchUp(f"{journal}/", "steps"), events[9:], deadletters=dead)
    assert set(again.steps) == {9, 10} and again.holes([]) == []
    assert (stats["dead_lettered"], len(dead.read_text().splitlines())) == (0, 1)


def wait_stats(journal: Path, name: str, ok: Any, timeout: float, relay: Any) -> dict[str, Any]:
    wait_for(lambda: ok(relay.sink_stats(journal, name)), timeout, f"sink {name}'s stats",
             lambda: f"{relay.sink_stats(journal, name)}\n{relay.log_tail()}")
    return relay.sink_stats(journal, name)


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
    (child,) = relay.sink_processes()
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
