"""The one sink driver (relay/sinkhost/driver.py) on its own: a fake clock and a tiny in-test sink
that fails on command (transient and permanent failures no real backend produces on cue), so each
rule runs in milliseconds without processes."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relay.journal.deadletter import DeadLetters
from relay.sinkhost.driver import BACKOFF_MAX, BACKOFF_START, SinkDriver, sleep_for
from sinks.base import CatchesUp, PermanentError, Sink


class Scripted(Sink):
    """Keeps what it is given; ``down`` transient failures first; refuses events whose data has "bad"."""

    name = "scripted"

    def __init__(self, down: int = 0, flush_down: int = 0) -> None:
        self.down, self.flush_down = down, flush_down
        self.kept: list[int] = []
        self.calls: list[str] = []

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        self.calls.append(f"write {len(events)}")
        if self.down:
            self.down -= 1
            raise ConnectionError("backend down")
        if any("bad" in e["data"] for e in events):
            raise PermanentError("refused: bad")
        self.kept.extend(e["seq"] for e in events)

    def flush(self, timeout: float = 30.0) -> bool:
        self.calls.append("flush")
        if self.flush_down:
            self.flush_down -= 1
            raise OSError("disk full")
        return True

    def close(self, timeout: float = 30.0) -> bool:
        self.calls.append("close")
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return True


def events(n: int, bad: set[int] = frozenset()) -> list[dict[str, Any]]:
    return [{"run": "r", "rank": 0, "seq": i, "data": {"bad" if i in bad else "x": 1.0}} for i in range(n)]


def test_a_transient_failure_is_retried_whole_with_doubling_backoff_then_recovers() -> None:
    clock, sink, recovered = Clock(), Scripted(down=12), []
    driver = SinkDriver("s", sink, wait=clock.wait, clock=clock, on_recovered=lambda: recovered.append(1))
    assert driver.write(events(5))
    assert sink.kept == [0, 1, 2, 3, 4] and sink.calls == ["write 5"] * 13
    backoffs = [w for w in clock.waits if w > 0]
    assert backoffs[:4] == [BACKOFF_START, BACKOFF_START * 2, BACKOFF_START * 4, BACKOFF_START * 8]
    assert max(backoffs) == BACKOFF_MAX and len(backoffs) == 12
    assert clock.waits[-1] == 0  # told a batch got through again
    assert (driver.errors, driver.retries, driver.written, recovered) == (12, 12, 5, [1])
    assert driver.last_error == "ConnectionError: backend down"


class Holed(Scripted, CatchesUp):
    """A sink that catches up: names run ``r`` until it is told the run was filled."""

    def __init__(self) -> None:
        super().__init__()
        self.named = ["r"]

    def holes(self, filled: Sequence[str]) -> list[str]:
        self.calls.append(f"holes {list(filled)}")
        self.named = [run for run in self.named if run not in filled]
        return self.named


def test_the_runs_a_sink_names_are_read_back_before_its_flush_then_named_filled() -> None:
    clock, sink, asked = Clock(), Holed(), []

    def read(run: str) -> list[list[dict[str, Any]]]:
        asked.append(run)
        return [events(2), []]

    driver = SinkDriver("s", sink, wait=clock.wait, clock=clock)
    driver.after_batch(idle=True, read=read)
    assert sink.calls == ["holes []", "write 2", "holes ['r']", "flush"] and asked == ["r"]
    assert (driver.caught_up, driver.written, sink.named) == (2, 0, [])
    driver.after_batch(idle=True, read=read)  # nothing named: nothing read
    assert sink.calls[4:] == ["holes []", "flush"] and asked == ["r"]
    plain = Scripted()  # a plain Sink is never asked
    SinkDriver("p", plain, wait=clock.wait, clock=clock).after_batch(idle=True, read=read)
    assert plain.calls == ["flush"] and asked == ["r"]


def test_giving_up_leaves_the_batch_unwritten_and_uncounted() -> None:
    sink = Scripted(down=100)
    driver = SinkDriver("s", sink, wait=lambda seconds: False)
    assert not driver.write(events(3))
    assert (driver.written, driver.errors, sink.kept) == (0, 1, [])


def test_a_permanent_error_is_narrowed_to_the_events_that_fail_alone(tmp_path: Path) -> None:
    sink = Scripted()
    driver = SinkDriver("s", sink, DeadLetters(tmp_path / "dl.jsonl"), wait=Clock().wait)
    assert driver.write(events(16, bad={5, 11}))
    driver.finish()
    assert sink.kept == [i for i in range(16) if i not in (5, 11)]  # the rest, in order
    assert (driver.written, driver.dead_lettered, driver.deadletter_overflow, driver.errors) == (14, 2, 0, 0)
    kept = [json.loads(line) for line in (tmp_path / "dl.jsonl").read_text().splitlines()]
    assert [k["reason"] for k in kept] == ["permanent", "permanent"] and all("refused: bad" in k["detail"] for k in kept)
    assert len([c for c in sink.calls if c.startswith("write")]) <= 1 + 2 * 2 * 4  # log2(16) rounds per bad event


def test_a_refusal_without_a_dead_letter_file_is_counted_as_overflow() -> None:
    driver = SinkDriver("s", Scripted(), wait=Clock().wait)
    assert driver.write(events(4, bad={0}))
    assert (driver.written, driver.dead_lettered, driver.deadletter_overflow) == (3, 1, 1)


def test_the_fault_hook_fails_batches_as_the_sink_would(tmp_path: Path) -> None:
    def poison(batch: Sequence[dict[str, Any]]) -> None:
        if any(e["seq"] == 2 for e in batch):
            raise PermanentError("poisoned")

    sink = Scripted()
    driver = SinkDriver("s", sink, DeadLetters(tmp_path / "dl.jsonl"), wait=Clock().wait, fault=poison)
    assert driver.write(events(6))
    assert sink.kept == [0, 1, 3, 4, 5] and driver.dead_lettered == 1


def test_flushed_when_idle_and_on_the_interval_under_steady_load() -> None:
    clock, sink = Clock(), Scripted()
    driver = SinkDriver("s", sink, wait=clock.wait, clock=clock, flush_every=1.0)
    for _ in range(10):  # steady load: never idle, 0.3 s per batch
        driver.write(events(1))
        clock.now += 0.3
        driver.after_batch(idle=False)
    assert driver.flushes == 2  # at 1.2 s and 2.4 s
    driver.after_batch(idle=True)
    assert driver.flushes == 3
    driver.finish()
    assert sink.calls[-2:] == ["flush", "close"] and driver.flushes == 4


def test_a_failed_flush_is_counted_and_the_next_one_tries_again() -> None:
    sink = Scripted(flush_down=1)
    driver = SinkDriver("s", sink, wait=Clock().wait)
    assert not driver.flush() and driver.errors == 1 and driver.last_error == "OSError: disk full"
    assert driver.flush() and driver.flushes == 1


def test_a_catch_up_batch_is_counted_apart_from_what_the_relay_sent() -> None:
    driver = SinkDriver("s", Scripted(), wait=Clock().wait)
    driver.write(events(3))
    driver.write(events(4), caught_up=True)
    assert driver.stats()["written"] == 3 and driver.stats()["caught_up"] == 4


def test_sleep_for_gives_up_past_its_limit_and_starts_afresh_after_a_success() -> None:
    clock = Clock()
    wait = sleep_for(0.25, clock=clock)
    assert wait(0.0) and wait(0.001)  # (sleeps for real: keep it tiny)
    clock.now += 0.2
    assert not wait(0.1)  # 0.3 s after the first failure
    assert wait(0.0)  # a success: counting starts again
    assert wait(0.001)


def test_relay_replay_drives_sinks_as_their_process_does(tmp_path: Path) -> None:
    """``relay replay`` goes through the same driver: a transient failure is retried, an event
    refused for good goes to the sink's dead-letter file beside the journal (and the replay exits
    1 saying so), the rest is written to both sinks."""
    from conftest import ROOT, plugin_env, read_jsonl
    from relay.wire.lines import encode_line
    from sink_helpers import Events

    env = plugin_env(tmp_path)
    journal = tmp_path / "logs"
    journal.mkdir()
    ev = Events("job-r", world_size=1)
    sent = [ev(0, "metrics", {"bad" if i == 3 else "loss": float(i)}, step=i, stage="train") for i in range(8)]
    (journal / "job-r.jsonl").write_bytes(b"".join(encode_line(e) for e in sent))
    done = subprocess.run([sys.executable, "-m", "relay", "replay", str(journal),
                           "--sink", "refuse", "--refuse-file", str(tmp_path / "refused.jsonl"),
                           "--sink", "flaky", "--flaky-file", str(tmp_path / "flaky.jsonl"), "--flaky-failures", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "1 refused for good" in done.stderr, done.stderr[-2000:]
    assert "sink flaky failed (2 errors so far)" in done.stderr, done.stderr[-2000:]
    (kept,) = read_jsonl(journal / "_relay_deadletter_refuse.jsonl")
    assert kept["reason"] == "permanent" and kept["event"]["seq"] == 3
    assert [e["seq"] for e in read_jsonl(tmp_path / "refused.jsonl")] == [0, 1, 2, 4, 5, 6, 7]
    assert [e["seq"] for e in read_jsonl(tmp_path / "flaky.jsonl")] == list(range(8))


class Deadlined(Sink):
    """Says whether its flush and close completed; its close can hang until ``release`` is set."""

    name = "deadlined"

    def __init__(self, complete: bool = True, hang: bool = False) -> None:
        self.complete, self.hang = complete, hang
        self.given: list[tuple[str, float]] = []
        self.release = threading.Event()

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        pass

    def flush(self, timeout: float = 30.0) -> bool:
        self.given.append(("flush", timeout))
        return self.complete

    def close(self, timeout: float = 30.0) -> bool:
        self.given.append(("close", timeout))
        if self.hang:
            self.release.wait()
        return self.complete


def test_flush_and_close_get_the_deadline_and_an_incomplete_one_is_counted() -> None:
    sink = Deadlined(complete=False)
    driver = SinkDriver("s", sink, wait=Clock().wait)
    assert not driver.flush(2.5) and not driver.close(4.0)
    assert sink.given == [("flush", 2.5), ("close", 4.0)]
    assert (driver.flushes, driver.incomplete_flushes, driver.incomplete_closes, driver.errors) == (0, 1, 1, 0)
    assert driver.stats()["incomplete_flushes"] == 1 and driver.stats()["incomplete_closes"] == 1
    done = SinkDriver("s", Deadlined(), wait=Clock().wait)
    assert done.flush() and done.finish(5.0) and (done.incomplete_flushes, done.incomplete_closes) == (0, 0)


def test_a_close_that_overruns_its_deadline_is_left_running_and_counted() -> None:
    """Aim's remote client waits without limit for a server that is gone: the caller goes on."""
    sink = Deadlined(hang=True)
    driver = SinkDriver("s", sink, wait=Clock().wait)
    try:
        assert not driver.close(0.2)
        assert driver.incomplete_closes == 1 and driver.errors == 0 and sink.given == [("close", 0.2)]
    finally:
        sink.release.set()
