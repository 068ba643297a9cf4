"""Sinks other than the journal run in their own processes (relay/sinkhost/process.py, the child's side
relay/sinkhost/child.py): a real plugin that kills its own process is started again, counted, and costs
the journal nothing; one that refuses an event for good gets it dead-lettered and the rest written;
one that fails for a while catches up; every sink is flushed on a timer under steady load; and a
shipper (relay/ship/base.py) is sent only the news of each journal write: per run, how many events
it held and where the run's journal file ended after it."""
from __future__ import annotations

import json
import time
from collections import Counter
from itertools import accumulate, pairwise
from pathlib import Path

import pytest

from conftest import finish, plugin_env, read_jsonl, start_publisher, wait_for
from relay.client.publisher import Publisher
from relay.journal.journal import Journal
from relay.sinkhost import notices
from relay.sinkhost.notices import NoticeDecoder


def _after_run(path: Path) -> int:
    """Events of run "after" among the complete lines the sink has written so far."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return sum(json.loads(line)["run"] == "after" for line in lines if line.endswith("\n"))


@pytest.mark.slow  # a whole fault scenario of relay processes: the full tier
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
    assert sink["dropped"] > 0 and sink["written"] + sink["dropped"] == len(events), sink  # none unaccounted
    log = relay.log.read_text()
    assert "exited unexpectedly (code 7)" in log and "they are in the journal" in log, log[-3000:]


def _wait_for_lines(path: Path, count: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().count("\n") if path.exists() else 0
        if lines >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_a_permanent_error_dead_letters_that_event_and_the_rest_is_written(relays, tmp_path):
    journal, written = tmp_path / "perm.jsonl", tmp_path / "refuse-sink.jsonl"
    relay = relays(["--sink", "refuse", "--path", str(journal), "--refuse-file", str(written),
                    "--stats-interval", "0.2"], env=plugin_env(tmp_path))
    pub = Publisher("perm", 0, address=relay.address)
    for i in range(2000):  # one bad event among many, in the middle of a batch
        pub.publish("metrics", {"bad": True} if i == 1234 else {"i": i}, step=i, stage="train")
    assert pub.close(30) == 0
    events = read_jsonl(journal)
    assert _wait_for_lines(written, len(events) - 1) == len(events) - 1
    assert relay.stop() == 0
    bad = [e for e in events if e["data"] == {"bad": True}]
    assert len(bad) == 1 and len(events) == 2002  # the hello, 2000 metrics, the closing stats
    assert sorted(e["seq"] for e in read_jsonl(written)) == sorted(e["seq"] for e in events if e is not bad[0])
    letters = read_jsonl(Journal(journal).sidecar("_deadletter_refuse.jsonl"))
    assert len(letters) == 1, letters
    assert letters[0]["event"] == bad[0] and letters[0]["reason"] == "permanent"
    assert letters[0]["detail"] == "this tool takes no 'bad' metric"
    sink = relay.stats(journal)["sinks"]["refuse"]
    assert sink["dead_lettered"] == 1 and sink["written"] == len(events) - 1, sink
    assert sink["dropped"] == 0 and sink["errors"] == 0 and sink["queued"] == 0, sink
    assert "refused run perm rank 0 seq" in relay.log.read_text()


def test_a_sink_failing_for_a_while_catches_up_and_loses_nothing(relays, tmp_path):
    journal, written = tmp_path / "flaky.jsonl", tmp_path / "flaky-sink.jsonl"
    relay = relays(["--sink", "flaky", "--flaky-failures", "4", "--path", str(journal), "--flaky-file", str(written),
                    "--stats-interval", "0.2"], env=plugin_env(tmp_path))
    finish(start_publisher(relay.address, "flaky", 0, 3000, rate=3000))
    events = read_jsonl(journal)
    assert _wait_for_lines(written, len(events)) == len(events)
    assert relay.stop() == 0
    assert [e["seq"] for e in read_jsonl(written)] == [e["seq"] for e in events]  # each once, in order
    sink = relay.stats(journal)["sinks"]["flaky"]
    assert sink["errors"] == 4 and sink["written"] == len(events), sink
    assert sink["dropped"] == 0 and sink["dead_lettered"] == 0 and sink["restarts"] == 0, sink
    assert "the tool is unreachable for now" in relay.log.read_text()


def test_a_busy_sink_is_flushed_on_a_timer_under_steady_load(relays, tmp_path):
    """Writes take 0.1 s and batches come every 50 ms, so the sink's queue is never empty while the
    publisher sends (3 s) nor for a while after: flush() still comes at least every second."""
    journal, record = tmp_path / "steady.jsonl", tmp_path / "slow-sink.jsonl"
    relay = relays(["--sink", "slowflush", "--path", str(journal), "--slow-file", str(record)],
                   env=plugin_env(tmp_path))
    finish(start_publisher(relay.address, "steady", 0, 3000, rate=1000))
    assert relay.stop() == 0
    calls = read_jsonl(record)
    writes = [c["write"] for c in calls if "write" in c]
    flushes = [c["flush"] for c in calls if "flush" in c]
    assert sum(c.get("events", 0) for c in calls) == len(read_jsonl(journal))
    busy = [t for t in flushes if t < writes[-1]]  # while batches were still waiting
    assert len(writes) > 3 * len(busy) and writes[-1] - writes[0] > 3, (len(writes), len(busy))
    gaps = [b - a for a, b in pairwise([writes[0], *busy, writes[-1]])]
    assert max(gaps) < 2.0, gaps  # FLUSH_EVERY (1 s) plus a write in progress, on a busy machine


def _news_events(path: Path) -> int:
    return sum(item["events"] for item in read_jsonl(path)) if path.exists() else 0


def test_a_shipper_is_sent_the_news_of_each_journal_write(relays, tmp_path):
    journal, got = tmp_path / "runs.jsonl", tmp_path / "news.jsonl"
    relay = relays(["--sink", "newsonly", "--path", str(journal), "--news-file", str(got),
                    "--stats-interval", "0.2"], env=plugin_env(tmp_path))
    assert finish(start_publisher(relay.address, "first", 0, 300))["left"] == 0
    assert finish(start_publisher(relay.address, "second", 1, 200))["left"] == 0
    events = read_jsonl(journal)
    wait_for(lambda: _news_events(got) >= len(events), 30, "the news of every journaled event")
    assert relay.stop() == 0
    news = read_jsonl(got)
    assert all(item.keys() == {"run", "events", "offset"} for item in news), news[:3]
    per_run: Counter[str] = Counter()
    for item in news:
        per_run[item["run"]] += item["events"]
    assert per_run == Counter(e["run"] for e in events) == {"first": 302, "second": 202}
    offsets = [item["offset"] for item in news]
    assert offsets == sorted(offsets) and offsets[-1] == journal.stat().st_size  # the file's end
    assert set(offsets) <= set(accumulate(map(len, journal.read_bytes().splitlines(keepends=True)))), \
        "each offset is the end of a line"
    sink = relay.stats(journal)["sinks"]["newsonly"]
    assert sink["written"] == len(events) and sink["dropped"] == 0, sink  # counted in events
    assert sink["sink"]["notices"] >= 1 and sink["queued"] == 0, sink


def test_notices_arrive_in_pieces_and_bad_ones_are_counted():
    decoder = NoticeDecoder()
    notice = notices.encode({"r1": (2, 400), "r2": (1, 90)})
    assert notice == b"r1 400 2\nr2 90 1\n"
    got = decoder.feed(notice + b"no/slash 5 1\nnot a notice\nr3 -1 x\nr1 480 3\n" + notice[:4])
    assert got == {"r1": (5, 480), "r2": (1, 90)}  # a run's events added up, its furthest end
    assert decoder.bad_lines == 3
    assert decoder.feed(notice[4:9]) == {"r1": (2, 400)}
