"""The relay's own cross-rank events (relay/daemon/cross_rank.py) from real relays and real rank processes
(tests/rank_proc.py): a slowed rank is a straggler, a killed rank is lost while its peers finish, a
silent rank comes back, a relay killed mid-run numbers on, and the sinks get every derived event."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from conftest import ROOT, finish, plugin_env, read_jsonl, wait_for
from relay.client.publisher import Publisher
from relay.daemon.cross_rank import ClusterConfig
from relay.daemon.ingest import Ingest
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.journal.reader import journal_files, read_events
from relay.wire import encoding
from sinks.events import RELAY_RANK
from watch_helpers import cli_env

RANK_PROC = Path(__file__).resolve().parent / "rank_proc.py"


def start_rank(address: str, run: str, rank: int, world: int, steps: int, step_seconds: float,
               pause: tuple[int, float] | None = None) -> subprocess.Popen:
    extra = [str(p) for p in pause] if pause else []
    cmd = [sys.executable, str(RANK_PROC), address, run, str(rank), str(world), str(steps), str(step_seconds), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def events_of(path: Path) -> list[dict]:
    """A journal's events (a file or a directory), also while the relay writes it."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return [e for f in files if f.exists() for e in read_jsonl(f, live=True)]


def derived(path: Path) -> list[dict]:
    return [e for e in events_of(path) if e["rank"] == RELAY_RANK]


def figures(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "metrics" and e["stage"] == "cluster"]


def said(events: list[dict], what: str) -> list[dict]:
    return [e for e in events if e["type"] == "lifecycle" and e["data"]["event"] == what]


def assert_numbered_once(events: list[dict]) -> None:
    """The relay's own seqs of each run run from 0 without a gap or a repeat."""
    for run in {e["run"] for e in events}:
        seqs = sorted(e["seq"] for e in events if e["run"] == run)
        assert seqs == list(range(len(seqs))), (run, seqs)


def test_a_slowed_rank_is_the_straggler_and_every_step_is_summed_up(relays, tmp_path: Path) -> None:
    journal, kept = tmp_path / "journal.jsonl", tmp_path / "kept.jsonl"
    relay = relays(["--path", str(journal), "--sink", "collect", "--collect-file", str(kept)], env=plugin_env(tmp_path))
    steps = 8
    ranks = [start_rank(relay.address, "slow-run", rank, 4, steps, 0.4 if rank == 2 else 0.05) for rank in range(4)]
    for proc in ranks:
        assert finish(proc)["left"] == 0
    wait_for(lambda: len(figures(derived(journal))) == steps, 30, "a cluster event for every step")
    assert relay.stop() == 0

    ours = derived(journal)
    assert {(e["world_size"], e["local_rank"], e["stage"]) for e in ours} == {(4, 0, "cluster")}
    assert_numbered_once(ours)
    summed = figures(ours)
    assert [e["step"] for e in summed] == list(range(1, steps + 1))
    for e in summed:
        data = e["data"]
        assert data["slowest_rank"] == data["own_slowest_rank"] == 2 and data["ranks"] == 4, e
        assert data["step_time_max"] >= 0.4 > data["step_time_median"] >= data["step_time_min"] >= 0.05, e
        assert data["own_time_max"] >= 0.4 > data["own_time_median"] >= data["own_time_min"] >= 0.05, e
        assert data["step_time_spread"] == pytest.approx(data["step_time_max"] / data["step_time_median"])
    (straggler,) = said(ours, "straggler")
    # named at the 8th of a window of 15 logged steps (the default); it costs the job most of each step
    assert straggler["step"] == 8 and straggler["data"]["rank"] == 2 and straggler["data"]["window"] == 15
    assert straggler["data"]["cost"] > 0.5 and straggler["data"]["cost_s"] >= 0.3
    assert straggler["data"]["step_time"] >= 0.4
    assert straggler["data"]["by"] == "own_time" and straggler["data"]["own_time"] >= 0.4
    assert not said(ours, "rank_lost")
    assert relay.stats(journal)["derived"] == len(ours)
    status = subprocess.run([sys.executable, "-m", "relay", "status", str(journal)], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env=cli_env())  # (no $COLUMNS: the whole line)
    assert f"{len(ours)} derived, " in status.stdout, status  # the status line tells them from received ones

    # The live sink got exactly these, and a replay into another journal carries them over.
    live = [e for e in read_jsonl(kept) if e["rank"] == RELAY_RANK]
    assert [(e["seq"], e["data"]) for e in live] == [(e["seq"], e["data"]) for e in ours]
    copy = tmp_path / "copy"
    done = subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", "jsonl",
                           "--path", f"{copy}/"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert derived(copy) == ours


@pytest.mark.slow  # a whole fault scenario through relay processes: the full tier
def test_a_killed_rank_is_lost_while_its_peers_finish_and_a_silent_one_comes_back(relays, tmp_path: Path) -> None:
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/", "--rank-silence", "2", "--stats-interval", "0.2"])
    steps, run = 80, "lossy"
    ranks = [start_rank(relay.address, run, rank, 4, steps, 0.1, pause=(10, 4.0) if rank == 3 else None)
             for rank in range(4)]
    victim = ranks[2]

    def victim_step() -> int:
        return max((e["step"] for e in events_of(journal) if e["rank"] == 2 and e["stage"] == "rank"), default=0)

    wait_for(lambda: victim_step() >= 5, 60, "rank 2 publishing")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    last = victim_step()
    for rank in (0, 1, 3):
        assert finish(ranks[rank])["left"] == 0
    checked_after(relay, journal, time.time() + 4)  # twice the silence: ranks that all stopped at the end are not lost
    assert relay.stop() == 0

    ours = derived(journal)
    assert_numbered_once(ours)
    lost = said(ours, "rank_lost")
    assert sorted(e["data"]["rank"] for e in lost) == [2, 3], lost
    (killed,) = [e for e in lost if e["data"]["rank"] == 2]
    assert killed["data"]["last_step"] == last and killed["data"]["silent_s"] >= 2 and killed["step"] > last
    (back,) = said(ours, "rank_back")
    assert back["data"]["rank"] == 3 and 2 <= back["data"]["silent_s"] < 30
    summed = figures(ours)
    assert sorted(e["step"] for e in summed) == list(range(1, steps + 1))  # each step once, in order
    assert [e["step"] for e in summed] == sorted(e["step"] for e in summed)
    assert summed[-1]["data"]["ranks"] == 3  # the peers' last steps, without the lost rank


def checked_after(relay, journal: Path, moment: float) -> None:
    """Until the relay has run its once-a-second silence check (relay/daemon/loop.py) at ``moment``
    (wall clock) or later, however slowly it is scheduled: a stats file it wrote a second after
    ``moment`` or later, then a later one (a pass writes its stats before its check)."""
    def written() -> float:
        try:
            snap = json.loads((journal / "_relay_stats.json").read_text())
        except (FileNotFoundError, ValueError):
            return 0.0
        return snap["ts"] if snap["pid"] == relay.proc.pid else 0.0
    wait_for(lambda: written() >= moment + 1, 60, "the relay's stats a second after the moment", relay.log_tail)
    first = written()
    wait_for(lambda: written() > first, 60, "the relay's next stats", relay.log_tail)


@pytest.mark.slow  # a whole fault scenario through relay processes: the full tier
def test_a_relay_killed_mid_run_numbers_its_events_on(relays, tmp_path: Path) -> None:
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/"])
    steps, run = 60, "restarted"
    ranks = [start_rank(relay.address, run, rank, 3, steps, 0.1) for rank in range(3)]
    wait_for(lambda: len(figures(derived(journal))) >= 15, 60, "15 steps summed up")
    relay.kill()
    before = derived(journal)
    time.sleep(0.5)
    relay.start()
    for proc in ranks:
        assert finish(proc)["left"] == 0
    wait_for(lambda: len(figures(derived(journal))) >= steps, 30, "every step summed up")
    assert relay.stop() == 0

    ours = derived(journal)
    assert ours[:len(before)] == before and len(ours) > len(before)
    assert_numbered_once(ours)
    assert [e["step"] for e in figures(ours)] == list(range(1, steps + 1))
    # Every step has all three ranks: those a rank sent before the kill were read back from the journal.
    assert {e["data"]["ranks"] for e in figures(ours)} == {3}
    assert "already in" in relay.log.read_text()  # the restarted relay did meet the journal


def test_no_cluster_events_when_turned_off_or_for_one_rank(relays, tmp_path: Path) -> None:
    for args, run, world in ((["--no-cluster"], "off", 2), ([], "alone", 1)):
        journal = tmp_path / run
        relay = relays(["--path", f"{journal}/", *args])
        pubs = [Publisher(run, rank, world_size=world, address=relay.address) for rank in range(world)]
        for step in range(1, 6):
            for pub in pubs:
                pub.publish("metrics", {"step_time": 0.1 * (pub.rank + 1)}, step=step, stage="rank")
        assert all(pub.close(20) == 0 for pub in pubs)
        assert relay.stop() == 0
        assert sum(e["stage"] == "rank" for e in events_of(journal)) == 5 * world and derived(journal) == []
    with pytest.raises(ValueError, match="relay's own rank"):
        Publisher("r", RELAY_RANK)


@pytest.mark.parametrize("option", ["--straggler-cost=0", "--straggler-cost=x", "--straggler-cost=1.5",
                                    "--straggler-min=-1", "--straggler-window=0", "--rank-silence=0.5"])
def test_bad_cluster_options_are_one_line_errors(option: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "relay", option, "--path", str(tmp_path / "j.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    name = option.split("=")[0]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"relay: error: Invalid value for '{name}'")
    assert not (tmp_path / "j.jsonl").exists()


def test_the_derived_events_read_as_documented(relays, tmp_path: Path) -> None:
    """docs/protocol.md's example lines are the shape a relay writes (keys, types)."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)])
    pubs = [Publisher("doc", rank, world_size=2, address=relay.address) for rank in (0, 1)]
    for pub in pubs:  # under DDP rank 0 waited for rank 1 inside its step: the longer step, the less own work
        pub.publish("metrics", {"step_time": 0.2 - 0.1 * pub.rank, "own_time": 0.1 + 0.2 * pub.rank}, step=10,
                    epoch=0.5, stage="rank")
    assert all(pub.close(20) == 0 for pub in pubs)
    assert relay.stop() == 0
    (line,) = derived(journal)
    text = (ROOT / "docs" / "protocol.md").read_text()
    documented = [json.loads(row) for row in map(str.strip, text.splitlines())
                  if row.startswith('{"v":1') and '"stage":"cluster"' in row]
    assert all(e.keys() == line.keys() and e["rank"] == RELAY_RANK for e in documented)
    events = [e["data"].get("event") for e in documented]
    assert events == [None, "straggler", "straggler_cleared", "rank_lost", "rank_back"], events
    (doc_figures,) = [e for e in documented if e["type"] == "metrics"]
    assert doc_figures["data"].keys() == line["data"].keys()
    assert line["data"] == {"step_time_min": 0.1, "step_time_median": pytest.approx(0.15), "step_time_max": 0.2,
                            "step_time_spread": pytest.approx(0.2 / 0.15), "slowest_rank": 0,
                            "own_time_min": 0.1, "own_time_median": pytest.approx(0.2),
                            "own_time_max": pytest.approx(0.3), "own_time_spread": pytest.approx(1.5),
                            "own_slowest_rank": 1, "cost_rank": 1, "cost_s": pytest.approx(0.2),
                            "cost": pytest.approx(1.0), "ranks": 2}
    assert (line["rank"], line["seq"], line["step"], line["epoch"]) == (RELAY_RANK, 0, 10, 0.5)


def _rank_frame(rank: int, world: int, reports: list[tuple[int, int, float]]) -> bytes:
    prefix = encoding.compact_prefix({"v": 1, "run": "run", "rank": rank, "local_rank": rank, "world_size": world,
                                    "host": "h"})
    return encoding.compact_frame(prefix, [encoding.encode_row(seq, 1.0, "metrics", step, None, "rank", {"step_time": took})
                                         for seq, step, took in reports])


def test_a_relay_killed_at_any_point_sums_each_step_once(tmp_path: Path) -> None:
    """Ranks' reports (some steps dropped, frames interleaved at random) into an ingest that is
    killed after a random frame, losing what it had not journaled, then restarted on the same
    journal with every frame sent again: the relay's seqs stay gapless and every reported step is
    summed up exactly once. (Ingest without a socket, relay/daemon/ingest.py, as the fuzzer drives it.)"""
    for trial in range(120):
        rng = random.Random(trial)
        world, steps = rng.choice([2, 3, 4]), rng.randint(3, 30)
        queues: list[list[bytes]] = []
        for rank in range(world):
            kept = [s for s in range(1, steps + 1) if rank or rng.random() > 0.2]  # rank 0 drops some
            reports = [(seq, step, rng.choice([0.1, 0.5])) for seq, step in enumerate(kept)]
            cuts = sorted(rng.sample(range(1, len(reports)), min(len(reports) - 1, 4))) if len(reports) > 1 else []
            bounds = pairwise([0, *cuts, len(reports)])
            queues.append([_rank_frame(rank, world, reports[a:b]) for a, b in bounds])
        order = []
        while any(queues):
            order.append(rng.choice([q for q in queues if q]).pop(0))
        path = f"{tmp_path}/t{trial}" + ("/" if trial % 2 else ".jsonl")
        for session, frames in enumerate((order[:rng.randint(0, len(order))], order)):
            journal = Journal(path)
            journal.open()
            ingest = Ingest(journal, DeadLetters(journal.sidecar("_deadletter.jsonl")), 0.0, cluster=ClusterConfig(),
                            send_acks=lambda peer, acks: None)  # no clients here to acknowledge
            for i, frame in enumerate(frames):
                ingest.take_frame(b"peer%d" % i, frame, now=100.0 * session + i)
                if rng.random() < 0.5:
                    ingest.commit(100.0 * session + i)
            if session:
                ingest.check(1000.0)  # steps rank 0 dropped: settled after the silence
                ingest.commit(1000.0)
            journal.close()
            ingest.deadletters.close()
        events = [e for f in journal_files(Path(path)) for e in read_events(f)]
        ours = [e for e in events if e["rank"] == RELAY_RANK]
        assert [e["seq"] for e in ours] == list(range(len(ours))), trial
        summed = [e["step"] for e in ours if e["type"] == "metrics"]
        assert summed == sorted({e["step"] for e in events if e["stage"] == "rank"}), trial
