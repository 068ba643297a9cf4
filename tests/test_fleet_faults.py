"""The fleet tier end to end through its faults (issue 18's proof): a real 3-node JetStream cluster
(R3 stream), two node relays with two publisher processes each publishing through the ``nats`` sink,
and two consuming relays (``relay consume``), each on a folder of its own, writing their partition
views and MLflow.

Each scenario kills or stops something mid-run, then checks the same things: every event of the node
journals in the central journal exactly once and byte for byte, each consuming relay's folder a view
of it (no event twice) and the two together whole, one run in one partition,
MLflow holding each step once, the publishers acknowledged by their node relays and every partition's
consumer acknowledged by the consuming relays. A node relay is killed with its nats shipper behind
(the stream holding chunks past its saved position, the journal lines past the stream), and there
the stream itself is read back too: each event stored once. Last, a real two-rank torchrun job
whose embedded relay publishes to the cluster. The cluster is started once for the module; each
scenario has its own stream, subjects, lease bucket, journals and MLflow store, so it checks only
its own.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

pytest.importorskip("nats")
pytest.importorskip("mlflow")

from conftest import finish, free_port, start_publisher, wait_for
from fleet_helpers import (
    ConsumerProcess,
    assert_exactly_once_on_own_disks,
    central_lines,
    node_lines,
    stop_all,
    stream_events,
    wait_acknowledged,
    wait_complete,
    wait_held,
)
from nats_helpers import NatsCluster, last_message, read_stream
from test_sink_mlflow import read_run, template_db  # noqa: F401
from trainer_fixtures import demo_model, launch_flags, seed_flags, trainer_env  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PARTITIONS = 2
#: Events per publisher, and per second: a run lasts COUNT / RATE = 30 s, which is what the faults need (each
#: comes once the consuming relays journaled the first 1000 of 6000 events, NATS is down for 30 s or a server
#: stopped for 20 s while the ranks go on). What a scenario costs grows with the events (the publishers, node
#: relays, servers, consuming relays and their MLflow sinks): the five scenarios cost 159 CPU-s with 3000 at
#: 100/s, 127 with these (docs/development.md, "The fleet and NATS tests").
COUNT = 1500
RATE = 50.0
#: The faults that last a few seconds (a stream leader killed for 5 s, a node relay killed and
#: started again) need no 30 s run: at half the events the run lasts 15 s, and the fault still comes
#: a sixth of the way in, before the ranks are done (``Fleet.wait_first`` asserts it); 3,008 events.
SHORT = COUNT // 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats")) as nats:
        yield nats


class Fleet:
    """One scenario's tier on the shared cluster: its stream, node relays, publishers and consuming relays."""

    def __init__(self, cluster: NatsCluster, tmp: Path, relays, name: str, db: Path, count: int = COUNT) -> None:
        self.cluster, self.tmp, self.relays, self.name, self.count = cluster, tmp, relays, name, count
        self.stream, self.prefix = f"S_{name}", f"{name}.events"
        self.folders = [tmp / f"central-{i}" for i in range(2)]  # each consuming relay's own disk
        self.uri = f"sqlite:///{db}"
        self.node_dirs = [tmp / "node-a", tmp / "node-b"]
        self.nodes: list = []
        self.pubs: list = []
        #: Events the consuming relays journal before a scenario's fault: a sixth of the run's.
        self.first = 2 * count // 3
        stream = ["--nats-stream", self.stream, "--nats-prefix", self.prefix]
        self.consumers = [ConsumerProcess(tmp, f"c{i}", cluster.urls, self.folders[i],
                                          [*stream, "--sink", "mlflow", "--mlflow-tracking-uri", self.uri,
                                           "--mlflow-experiment", "fleet"]) for i in range(2)]
        self.node_args = [*stream, "--no-cluster", "--stats-interval", "1", "--sink", "nats", "--nats-url", cluster.urls,
                          "--nats-partitions", str(PARTITIONS), "--nats-replicas", "3"]

    def runs(self) -> list[str]:
        return [f"{self.name}-{n}" for n in "ab"]

    def start_node(self, i: int, address: str | None = None):
        node = self.relays(["--path", f"{self.node_dirs[i]}/", "--nats-node", f"node-{'ab'[i]}", *self.node_args],
                           address=address)
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)
        return node

    def start(self, consumers: bool = True) -> Fleet:
        for i in range(2):
            self.start_node(i)
        for i, run in enumerate(self.runs()):
            self.pubs += [start_publisher(self.nodes[i].address, run, rank, self.count, world_size=2, rate=RATE,
                                          flush_timeout=300) for rank in range(2)]
        if consumers:
            for consumer in self.consumers:
                consumer.start()
        return self

    def wait_first(self, timeout: float = 120) -> None:
        """Until the consuming relays journaled the run's first sixth; then the ranks must still be
        sending (the node relays have not journaled all they will), or the fault to come would not
        be mid-run."""
        wait_for(lambda: self.journaled() > self.first, timeout,
                 "the consuming relays journaled the first events")
        assert len(node_lines(*self.node_dirs)) < self.events(), "the ranks were done: not mid-run"

    def events(self) -> int:
        """Each rank's hello, its metrics, its closing stats."""
        return 4 * (self.count + 2)

    def journaled(self) -> int:
        return len(set().union(*(central_lines(folder) for folder in self.folders)))

    def check(self) -> None:
        """The scenario's end: everything acknowledged, exactly once, byte for byte, and in MLflow once."""
        stats = [finish(p, 300) for p in self.pubs]
        assert all(s["left"] == 0 and s["dropped"] == 0 for s in stats), stats
        expected = node_lines(*self.node_dirs)
        assert len(expected) == self.events()
        wait_complete(self.folders, expected, 180)
        for node, journal in zip(self.nodes, self.node_dirs, strict=True):
            wait_for(lambda node=node, journal=journal: _nats_sink(node, journal).get("held") == 0,
                     60, "the node's nats sink all acknowledged")
        wait_acknowledged(self.cluster.urls, self.stream, 120)
        assert_exactly_once_on_own_disks(self.folders, expected, self.cluster.urls, self.stream)
        for run in self.runs():
            assert_mlflow_steps(self.uri, run, list(range(self.count)))
        codes = stop_all(self.consumers)
        assert codes and set(codes) == {0}, codes
        for node in self.nodes:
            assert node.stop() == 0


def _nats_sink(node, journal: Path) -> dict:
    """The node relay's nats sink counters, from its stats file."""
    return node.stats(journal)["sinks"].get("nats", {}).get("sink", {})


def _steps(uri: str, run: str) -> list[int] | None:
    """The steps of ``run``'s loss in MLflow, each as often as stored (None while the run is not there)."""
    try:
        view = read_run(uri, run, "fleet")
    except (AssertionError, AttributeError):
        return None
    return sorted(step for step, _, _ in view.history.get("loss", []))


def _loss_rows(uri: str, run: str) -> int:
    """How many loss points of ``run`` the MLflow store holds, counted in its SQLite file: what the
    wait polls, since a read through MLflow's client (``_steps``) costs 0.2 CPU-s or more (3-5 CPU-s
    a scenario when polled every 20 ms); 0 while the run or its tables are not there, or the file is locked."""
    try:
        with closing(sqlite3.connect(f"file:{uri.removeprefix('sqlite:///')}?mode=ro", uri=True, timeout=5)) as db:
            return db.execute("SELECT COUNT(*) FROM metrics m JOIN tags t ON t.run_uuid = m.run_uuid "
                              "WHERE t.key = 'relay.run_id' AND t.value = ? AND m.key = 'loss'", (run,)).fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def assert_mlflow_steps(uri: str, run: str, steps: list[int]) -> None:
    """MLflow holds ``run``'s loss at each of ``steps`` once, read through its own client once the store
    holds as many points (a point stored twice ends the wait early, and fails here)."""
    wait_for(lambda: _loss_rows(uri, run) >= len(steps), 180, f"MLflow holds {len(steps)} loss points of run {run}",
             lambda: f"MLflow holds steps {_steps(uri, run)}")
    assert _steps(uri, run) == steps, f"MLflow's loss steps of run {run} are not {steps[0]}..{steps[-1]} once each"


@pytest.fixture
def fleet(cluster, tmp_path, relays, template_db):
    def make(name: str, count: int = COUNT) -> Fleet:
        db = tmp_path / "mlflow.db"
        shutil.copy(template_db, db)
        return Fleet(cluster, tmp_path, relays, name, db, count)
    made: list[Fleet] = []
    yield lambda *a, **k: made.append(make(*a, **k)) or made[-1]
    for f in made:
        for consumer in f.consumers:
            if consumer.alive():
                consumer.kill()
    for i in range(cluster.size):  # the next scenario gets the whole cluster back
        if i in cluster.stopped:
            cluster.cont(i)
        if cluster.procs[i] is None:
            cluster.start_node(i)
    cluster.wait_ready(60)


def test_stream_leader_killed_mid_run(fleet, cluster):
    f = fleet("leader", count=SHORT).start()
    f.wait_first()
    leader = cluster.stream_leader(f.stream)
    cluster.kill(leader)
    time.sleep(5)
    cluster.restart(leader)
    f.check()


#: Bytes of a node's run file journaled past what the stream holds when the node relay is killed:
#: lines its restarted nats shipper must publish.
PAST_THE_STREAM = 2000


def _saved_position(journal: Path, run: str) -> int:
    """The byte of ``run``'s file up to which the node's nats shipper saved its position (its state
    file, relay/fleet/chunks.py: what JetStream acknowledged, saved twice a second); 0 before."""
    from relay.fleet.chunks import STATE_SUFFIX, positions
    from relay.journal.journal import Journal
    try:
        state = json.loads(Journal(journal).sidecar(STATE_SUFFIX).read_text())
    except FileNotFoundError:
        return 0
    return positions(state).get(run, ("", 0, None))[1]


def _stored_end(f: Fleet, i: int) -> int:
    """The byte of node ``i``'s run file up to which the stream holds it (its last chunk's end)."""
    subject = f"{f.prefix}.*.node-{'ab'[i]}.{f.runs()[i]}"
    msg = asyncio.run(last_message(f.cluster.urls, f.stream, subject))
    return 0 if msg is None else int(msg.headers["Relay-End"].rpartition(":")[2])


def _hold_shipper_behind(f: Fleet, i: int) -> tuple[int, int, int]:
    """SIGSTOP node ``i``'s nats shipper at a moment when the stream holds chunks past its saved
    position (a restarted one must step over them, relay/fleet/resume.py), then wait until the node
    relay journaled lines past what the stream holds (a restarted one must publish them). (saved,
    stored, journaled), in bytes of the run's file."""
    (shipper,) = f.nodes[i].sink_processes()
    journal, run = f.node_dirs[i], f.runs()[i]
    deadline = time.monotonic() + 60
    while True:
        shipper.suspend()
        saved, stored = _saved_position(journal, run), _stored_end(f, i)
        if stored > saved:
            break
        assert time.monotonic() < deadline, f"the stream never held chunks past byte {saved}"
        shipper.resume()
        time.sleep(0.1)
    path = journal / f"{run}.jsonl"
    wait_for(lambda: path.stat().st_size > _stored_end(f, i) + PAST_THE_STREAM, 30,
             "the node relay journaling past what the stream holds")
    return saved, _stored_end(f, i), path.stat().st_size


def _wait_shipped(f: Fleet) -> None:
    """Until the ranks are done and each node's nats shipper saved its position at the end of its
    run's file (a cheap poll: a file read, no request to NATS)."""
    def shipped() -> bool:
        return all(p.poll() is not None for p in f.pubs) and all(
            _saved_position(journal, run) == (journal / f"{run}.jsonl").stat().st_size
            for journal, run in zip(f.node_dirs, f.runs(), strict=True))
    wait_for(shipped, 180, "every line of the node journals acknowledged by the stream")


def assert_stream_once(f: Fleet) -> None:
    """The stream itself holds every event of the node journals once (the consuming relays drop
    what it holds twice, so their journals cannot tell)."""
    stored, expected = stream_events(f.cluster.urls, f.stream), node_lines(*f.node_dirs)
    twice = sorted(key for key, lines in stored.items() if len(lines) > 1)
    assert not twice, f"{len(twice)} events stored twice in stream {f.stream}, e.g. {twice[:3]}"
    missing = set(expected) - set(stored)
    assert not missing, f"{len(missing)} events not in the stream, e.g. {sorted(missing)[:3]}"
    assert set(stored) == set(expected), "the stream holds events no node journaled"


def test_node_relay_killed_mid_run(fleet):
    """The kill lands with the node's nats shipper behind: held (SIGSTOP) just before it, when the
    stream held chunks past the shipper's saved position and the journal lines past the stream. The
    new relay's shipper publishes those lines and steps over those chunks: the stream holds each
    event once."""
    f = fleet("nodekill", count=SHORT).start()
    f.wait_first()
    address = f.nodes[0].address
    saved, stored, journaled = _hold_shipper_behind(f, 0)
    assert saved < stored < journaled, (saved, stored, journaled)
    f.nodes[0].kill()
    print(f"nodekill: killed at bytes saved {saved}, stored {stored}, journaled {journaled}",
          file=sys.stderr)
    time.sleep(1.0)  # its publishers hold what it had not acknowledged, and resend to the new one
    f.start_node(0, address)
    _wait_shipped(f)
    assert_stream_once(f)
    f.check()


def test_consuming_relay_killed_and_the_other_takes_its_partitions(fleet):
    f = fleet("takeover").start()
    wait_held(f.consumers, PARTITIONS, 120)
    f.wait_first()
    victim, other = (f.consumers if f.consumers[0].held() else f.consumers[::-1])
    killed = time.monotonic()
    victim.kill()
    wait_held([other], PARTITIONS, 60)
    print(f"takeover: the other relay holds every partition {time.monotonic() - killed:.1f} s after the kill",
          file=sys.stderr)
    f.check()


def test_nats_down_when_the_nodes_start_and_for_30_s_mid_run(fleet, cluster):
    f = fleet("outage", count=2 * COUNT)  # 60 s: 5 s with NATS down, then up, then down for 30 s
    cluster.kill_all()
    f.start()
    time.sleep(5)  # the ranks publish, the node relays journal, NATS is nowhere
    cluster.start_all(60)
    f.wait_first(180)
    cluster.kill_all()
    time.sleep(30)
    cluster.start_all(60)
    f.check()


def test_one_nats_server_stopped_for_20_s(fleet, cluster):
    f = fleet("sigstop").start()
    f.wait_first()
    leader = cluster.stream_leader(f.stream)
    cluster.stop(leader)  # SIGSTOP: alive, silent, its connections open
    time.sleep(20)
    cluster.cont(leader)
    f.check()


def test_torchrun_job_publishing_to_the_cluster_ends_in_the_central_journal_and_mlflow_once(
        cluster, tmp_path, demo_model, template_db, warm_launcher):
    """A real two-rank job under torchrun's agent with warm ranks (tests/warm_ranks.py: torchrun
    is only its launcher here), whose embedded relay publishes its journal to the cluster (the
    trainer's nats tracker: no node relay), and two consuming relays on the stream it creates."""
    stream, steps = "S_torchrun", 4
    db = tmp_path / "mlflow.db"
    shutil.copy(template_db, db)
    folders = [tmp_path / f"central-{i}" for i in range(2)]
    consumers = [ConsumerProcess(tmp_path, f"c{i}", cluster.urls, folders[i],
                                 ["--nats-stream", stream, "--sink", "mlflow", "--mlflow-tracking-uri",
                                  f"sqlite:///{db}", "--mlflow-experiment", "fleet"]).start() for i in range(2)]
    try:
        out = tmp_path / "out"
        cmd = launch_flags(free_port()) + seed_flags(demo_model, out, steps=steps, eval_steps=None)
        cmd += ["--tracker", "nats", "--nats_url", cluster.urls, "--nats_stream", stream,
                "--nats_replicas", "3"]
        done = warm_launcher.run(cmd, trainer_env(), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        run = json.loads((out / "tracking_run.json").read_text())["run"]
        node = json.loads((out / "training_logs_nats_node.json").read_text())["node"]  # the job's own id
        assert {m.headers["Relay-Node"] for m in asyncio.run(read_stream(cluster.urls, stream))} == {node}
        expected = node_lines(out / "training_logs.jsonl")
        assert {key[0] for key in expected} == {run} and len(expected) > 2 * steps
        wait_complete(folders, expected, 120)
        wait_acknowledged(cluster.urls, stream, 60)
        assert_exactly_once_on_own_disks(folders, expected, cluster.urls, stream)
        assert_mlflow_steps(f"sqlite:///{db}", run, list(range(1, steps + 1)))
        assert stop_all(consumers) == [0, 0]
    finally:
        for consumer in consumers:
            if consumer.alive():
                consumer.kill()
