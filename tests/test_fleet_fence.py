"""Exactly once without shared storage (issue 27, section 2): two consuming relays, each on a folder
of its own, one of them killed or stopped (SIGSTOP, then SIGCONT once the other took over and
committed on top) at every step of a commit in turn, while runs keep arriving; a real 3-node
JetStream cluster, started once for the module.

The faults come from inside the relay at the chosen step (tests/fence_consumer_proc.py: the real
``relay consume``, which sends itself the signal there): before the central journal's fence, between
it and the view's write, between write and flush, before the view's position moves, before and after
the acknowledgements. Each is a takeover: the other relay's lease claim, its view brought up to date
from the central journal, and its commits on top. At the end every event is in the central journal
exactly once, no folder holds an event twice, the ledger sink (tests/fence_sink.py, shared like a
tracker server) holds each once, and a third relay started on an empty folder rebuilds every run
whole from the central journal; the viewers, given the three relays' folders, show each run whole and
in order (tests/fleet_read_helpers.py).
"""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("nats")

from conftest import ROOT, wait_for
from fence_sink import rows
from fleet_helpers import (
    ConsumerProcess,
    central_journal,
    central_lines,
    create_stream,
    stop_all,
    wait_acknowledged,
    wait_held,
)
from fleet_read_helpers import check_viewers, in_rank_order
from nats_helpers import JS_TIMEOUT, NatsCluster
from relay.wire.lines import encode_line
from watch_helpers import relay_cmd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STREAM, PREFIX, PARTITIONS = "S_fence", "fence.events", 4
STEPS = ("fence", "write", "flush", "settle", "ack", "acked")
#: Issue 27 asks for 20 takeovers at least: each (step, signal) once, then the first eight again.
#: Two whole rounds (24) cost four lease waits more (about 28 s and 10 CPU-s) and fault no step and
#: signal that these 20 do not.
FAULTS = ([(step, sig) for sig in ("STOP", "KILL") for step in STEPS] * 2)[:20]
RUNS, RANKS, CHUNK, EVERY = 8, 2, 5, 0.2  # 400 events/s
#: A relay trusts its lease until a quarter of the ttl before it runs out, counted from when its last
#: renewal was sent, and renews every third of it: at 2 s a renewal had 0.8 s to come back, which a
#: relay at load 30 missed again and again (each partition stopped and taken back every few seconds,
#: one takeover 43 s). At 4 s it has 1.7 s; each takeover waits about 2 s longer for the lease to run out.
LEASE_TTL = "4"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats")) as nats:
        yield nats


class FaultyRelay(ConsumerProcess):
    """A consuming relay that kills or stops itself at a commit's step when told (``arm``)."""

    def __init__(self, tmp: Path, name: str, urls: str, ledger: Path) -> None:
        super().__init__(tmp, name, urls, tmp / name,
                         ["--nats-stream", STREAM, "--nats-prefix", PREFIX, "--lease-ttl", LEASE_TTL, "--ack-wait", "1",
                          "--fetch", "8", "--sink", "tests.fence_sink:LedgerSink", "--ledger-db", str(ledger)])
        self.control = tmp / f"{name}.fault"

    def command(self) -> list[str]:
        return [sys.executable, str(ROOT / "tests" / "fence_consumer_proc.py"), str(self.control), "consume"]

    def start(self) -> FaultyRelay:
        self.control.unlink(missing_ok=True)
        super().start()
        return self

    def arm(self, step: str, sig: str) -> None:
        Path(f"{self.control}.hit").unlink(missing_ok=True)
        self.control.write_text(json.dumps({"step": step, "signal": sig}))

    def hit(self) -> dict | None:
        try:
            return json.loads(Path(f"{self.control}.hit").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def stopped(self) -> bool:
        """SIGSTOPped: the kernel says state T."""
        assert self.proc is not None
        try:
            return Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
        except FileNotFoundError:
            return False

    def claims(self) -> list[int]:
        """How often this relay took each partition, from its log."""
        text = self.log.read_text() if self.log.exists() else ""
        return [text.count(f"took partition {k}\n") for k in range(PARTITIONS)]

    def position(self, k: int) -> int:
        return self.stats().get("partitions", {}).get(str(k), {}).get("position", -1)


class Runs:
    """Runs published as a node relay's sink would (chunks of one run's lines, each held until
    JetStream took it), from a thread of their own until ``stop``; ``sent`` is every event."""

    def __init__(self, urls: str) -> None:
        self.urls, self.sent = urls, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._publish()), daemon=True)

    async def _publish(self) -> None:
        import nats
        nc = await nats.connect(self.urls.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = nc.jetstream(timeout=JS_TIMEOUT)
        seq = 0
        try:
            while not self.done.is_set():
                for r in range(RUNS):
                    run = f"run-{r}"
                    for rank in range(RANKS):
                        lines = [encode_line({"v": 1, "run": run, "rank": rank, "local_rank": rank,
                                              "world_size": RANKS, "host": "h", "seq": s, "ts": 1.0 + s,
                                              "type": "metrics", "step": s, "epoch": None, "stage": "rank",
                                              "data": {"step_time": 0.5 + s % 7}}) for s in range(seq, seq + CHUNK)]
                        while True:
                            try:
                                await js.publish(f"{PREFIX}.node.{run}", b"".join(lines), timeout=5,
                                                 headers={"Nats-Msg-Id": f"{run}:{rank}:{seq}"})
                                break
                            except Exception:  # a leader election: the same id again
                                await asyncio.sleep(0.2)
                        for line in lines:
                            event = json.loads(line)
                            self.sent[(run, rank, event["seq"])] = line.rstrip(b"\n")
                seq += CHUNK
                await asyncio.sleep(EVERY)
        finally:
            await nc.close()

    def __enter__(self) -> Runs:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(60)


def read_back(relays: list[FaultyRelay], fresh: FaultyRelay, published: dict, tmp: Path, urls: str) -> None:
    """The three relays' folders read by every viewer (issue 40, section 1): each run whole, each rank
    in sequence order, the node's values and last step (tests/fleet_read_helpers.py); the central
    journal read by relay tail --nats-url, the same; one stopped relay's folder alone: every run it has
    marked stale, and a line per view naming why."""
    tmp.mkdir()
    check_viewers([r.path for r in relays] + [fresh.path], published, tmp, "rank/step_time")
    run0 = sorted((key, line) for key, line in published.items() if key[0] == "run-0")
    tail = relay_cmd("tail", "--nats-url", urls, "--nats-stream", STREAM, "--nats-prefix", PREFIX, "--json",
                     "-n", str(len(run0)), "run-0")
    assert tail.returncode == 0, tail.stderr
    shown = tail.stdout.encode().splitlines()
    assert sorted(shown) == sorted(line for _, line in run0), "relay tail --nats-url: not run-0's lines once each"
    assert in_rank_order([json.loads(line) for line in shown]), "relay tail --nats-url: a rank out of order"
    alone = relay_cmd("runs", "--json", str(relays[0].path))
    assert alone.returncode == 0 and all(run["stale"] for run in json.loads(alone.stdout)), alone.stdout
    notes = [line for line in alone.stderr.splitlines() if "is a stale view of partition" in line]
    assert notes and all(f"{relays[0].name} is not running" in line for line in notes), alone.stderr


def _take_over(victim: FaultyRelay, other: FaultyRelay, step: str, sig: str) -> tuple[int, float]:
    """One fault: ``victim`` killed or stopped at ``step`` of a commit, ``other`` takes the
    partition over and commits it. Returns the partition and the seconds from the fault's arming."""
    wait_for(lambda: victim.held() and other.stats().get("pid") == other.proc.pid, 120,
             f"{victim.name} holds partitions, {other.name} is up")
    start = time.monotonic()
    claims = other.claims()
    victim.arm(step, sig)
    wait_for(lambda: victim.hit() is not None, 120, f"{victim.name} reaches step {step}")
    k = victim.hit()["partition"]
    wait_for(victim.stopped if sig == "STOP" else (lambda: not victim.alive()), 30,
             f"{victim.name} {sig}")
    wait_for(lambda: other.claims()[k] > claims[k] and k in other.held(), 120,
             f"{other.name} takes partition {k} over")
    taken_at = other.position(k)
    wait_for(lambda: other.position(k) > taken_at, 120, f"{other.name} commits partition {k}")
    return k, time.monotonic() - start


def test_killed_or_stopped_at_every_step_of_a_commit_each_event_is_once(cluster, tmp_path):
    create_stream(cluster.urls, STREAM, PREFIX, PARTITIONS, replicas=3)
    began = time.monotonic()
    ledger = tmp_path / "ledger.db"
    relays = [FaultyRelay(tmp_path, name, cluster.urls, ledger).start() for name in ("x", "y")]
    takeovers, rounds = 0, []
    try:
        with Runs(cluster.urls) as runs:
            wait_held(relays, PARTITIONS, 120)
            for i, (step, sig) in enumerate(FAULTS):
                # the victim holds every partition but a just restarted one's, which the victim's faults hand it
                victim, other = relays[i % 2], relays[1 - i % 2]
                k, seconds = _take_over(victim, other, step, sig)
                takeovers += 1
                rounds.append(seconds)
                print(f"takeover {takeovers}: {victim.name} {sig} at {step} of partition {k}, "
                      f"{rounds[-1]:.1f} s", file=sys.stderr)
                if sig == "STOP":
                    victim.proc.send_signal(signal.SIGCONT)
                else:
                    victim.start()
        published = dict(runs.sent)
        wait_for(lambda: all(r.stats().get("pid") == r.proc.pid for r in relays), 120, "the last victim is up again")
        wait_for(lambda: set(published) <= set(central_journal(cluster.urls, STREAM)), 180,
                 "every event in the central journal")
        wait_acknowledged(cluster.urls, STREAM, 120)
        wait_for(lambda: len(rows(str(ledger))) >= len(published), 300, "the ledger sink caught up")
        assert stop_all(relays) == [0, 0]
        central = central_journal(cluster.urls, STREAM)
        twice = {key: len(lines) for key, lines in central.items() if len(lines) > 1}
        assert not twice, f"{len(twice)} events twice in the central journal, e.g. {list(twice.items())[:3]}"
        assert set(central) == set(published), (len(set(published) - set(central)), len(set(central) - set(published)))
        assert all(central[key][0] == line for key, line in published.items())
        for relay in relays:  # each folder a view: a part of the history, nothing in it twice
            view = central_lines(relay.path)
            assert not {key for key, lines in view.items() if len(lines) > 1}, f"{relay.name}'s folder repeats"
            assert set(view) <= set(central)
        refused = sum(relay.log.read_text().count("another relay committed since") for relay in relays)
        fresh = FaultyRelay(tmp_path, "z", cluster.urls, ledger).start()  # an empty folder: the whole history
        wait_held([fresh], PARTITIONS, 60)
        wait_for(lambda: set(central_lines(fresh.path)) == set(published), 120, "the fresh relay's view whole")
        read_back(relays, fresh, published, tmp_path / "viewers", cluster.urls)
        assert stop_all([fresh]) == [0]
        view = central_lines(fresh.path)
        assert all(len(lines) == 1 for lines in view.values())
        held = rows(str(ledger))
        assert {key for key, n in held.items() if n > 1} == set(), "a step twice in the ledger sink"
        assert set(held) == set(published), (len(set(published) - set(held)), len(set(held) - set(published)))
        print(f"fence test: {takeovers} takeovers (each {min(rounds):.1f}-{max(rounds):.1f} s, median "
              f"{sorted(rounds)[len(rounds) // 2]:.1f}), {len(published)} events, 0 duplicated, 0 lost, {refused} "
              f"commits refused by the fence, {time.monotonic() - began:.0f} s")
        assert takeovers == len(FAULTS) >= 20
    finally:
        for relay in relays:
            if relay.alive():
                if relay.stopped():
                    relay.proc.send_signal(signal.SIGCONT)
                relay.kill()
