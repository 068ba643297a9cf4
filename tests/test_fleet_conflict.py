"""One writer per stream through the fleet tier (relay/fleet/sessions.py): two node relays
publishing to a real nats-server, each with a job under one run id and rank, and a real consuming
relay. Each node relay has one writer and publishes it; the consuming relay keeps the first
session's events, refuses the other node's, says so once in its log and in the view (``relay
runs``: ``conflict``) and counts it (stats, Prometheus). A resumed attempt on the other node and
an elastic restart on the same node continue their streams: no conflict."""
from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("nats")

from conftest import finish, free_port, wait_for
from fleet_helpers import ConsumerProcess, wait_acknowledged
from nats_helpers import NatsCluster
from sinks.events import RELAY_RANK, attempt_base, session_base
from test_one_writer import publisher, runs_status

pytestmark = pytest.mark.timeout(240)


def view(central: Path, run: str, rank: int = 1) -> list[bytes]:
    """The consuming relay's lines of (run, rank), whole lines only, in the order written."""
    out = []
    for path in central.glob(f"p*/{run}.jsonl"):
        data = path.read_bytes()
        lines = data[:data.rfind(b"\n") + 1].splitlines()
        out += [line for line in lines if json.loads(line)["rank"] == rank]
    return out


def node_stream(node: Path, run: str, rank: int = 1) -> list[bytes]:
    lines = (node / f"{run}.jsonl").read_bytes().splitlines()
    return [line for line in lines if json.loads(line)["rank"] == rank]


def published_all(node, folder: Path) -> bool:
    """Whether the node relay's nats sink published every line of its journal."""
    sink = node.stats(folder)["sinks"].get("nats", {}).get("sink", {})
    lines = sum(len(path.read_bytes().splitlines()) for path in folder.glob("*.jsonl"))
    return sink.get("published", 0) >= lines


SAMPLE = re.compile(r'^relay_fleet_partition_refused_total\{[^}]*reason="conflict"[^}]*\} (\S+)$',
                    re.M)


def refused(port: int) -> float:
    """relay_fleet_partition_refused_total{reason="conflict"}, summed over the partitions."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return sum(float(n) for n in SAMPLE.findall(answer.read().decode()))


def start_nodes(relays, urls: str, tmp_path: Path) -> dict:
    """Node relays ``node-a`` and ``node-b``, each publishing its journal to the stream."""
    nodes = {}
    for name in ("node-a", "node-b"):
        node = relays(["--path", f"{tmp_path / name}/", "--sink", "nats", "--nats-url", urls,
                       "--nats-node", name, "--nats-partitions", "2", "--stats-interval", "0.2"],
                      start=False)
        node.log = tmp_path / f"{name}.log"
        nodes[name] = node.start()
    return nodes


def refused_by(consumer: ConsumerProcess) -> int:
    """The lines a consuming relay refused as second writers', as its stats file says now."""
    return sum(p["conflict"] for p in consumer.stats().get("partitions", {}).values())


def conflicts(central: Path) -> list[dict]:
    """The conflict and conflict_ended events of run ``shared`` in a consuming relay's views."""
    return [json.loads(line)["data"] for line in view(central, "shared", RELAY_RANK)
            if b'"event":"conflict' in line]


def test_two_nodes_under_one_run_id_the_central_keeps_one_writer_and_says_conflict(relays,
                                                                                  tmp_path):
    with NatsCluster(tmp_path / "nats", size=1) as server:
        urls = server.url(0)
        nodes = start_nodes(relays, urls, tmp_path)
        central, port = tmp_path / "central", free_port()
        consumer = ConsumerProcess(tmp_path, "c", urls, central, ["--metrics-bind", str(port)])
        consumer.start()
        try:
            check(nodes, consumer, central, port, urls, tmp_path)
        finally:
            if consumer.alive():
                consumer.kill()


def check(nodes: dict, consumer: ConsumerProcess, central: Path, port: int, urls: str,
          tmp_path: Path) -> None:
    a, b = nodes["node-a"].address, nodes["node-b"].address
    first = publisher(a, "shared", 100)
    assert finish(first)["left"] == 0
    wait_for(lambda: len(view(central, "shared")) >= 102, 90, "node a's job in the central view")
    second = publisher(b, "shared", 200)  # its own node takes it: one writer there
    assert finish(second)["left"] == 0
    assert finish(publisher(a, "moved", 50))["left"] == 0
    wait_for(lambda: len(view(central, "moved")) >= 52, 60, "attempt 0 of the moved job, centrally")
    assert finish(publisher(b, "moved", 50, attempt=1))["left"] == 0  # resumed on the other node
    assert finish(publisher(a, "restarted", 50))["left"] == 0
    assert finish(publisher(a, "restarted", 50, restart=1))["left"] == 0  # torchrun restarted it
    for name, node in nodes.items():
        wait_for(lambda node=node, name=name: published_all(node, tmp_path / name), 60,
                 f"{name} published everything")
    wait_for(lambda: len(view(central, "moved")) >= 104 and len(view(central, "restarted")) >= 104,
             60, "the resumed attempt and the restarted rank in the central view")
    wait_acknowledged(urls, "RELAY", 60)
    mine = node_stream(tmp_path / "node-a", "shared")
    assert view(central, "shared") == mine, "node a's events only, as written"
    said = conflicts(central)
    assert said == [{"event": "conflict", "rank": 1, "why": "history", "seq": 0,
                     "writer_pid": first.pid, "writer_host": said[0]["writer_host"],
                     "refused_pid": second.pid, "refused_host": said[0]["refused_host"],
                     "node": "node-b", "session": said[0]["session"]}]
    wait_for(lambda: refused(port) == 202, 30, "Prometheus counts node b's 202 refused events")
    assert refused_by(consumer) == 202
    moved = sorted(json.loads(line)["seq"] for line in view(central, "moved"))
    assert moved == [*range(52), *range(attempt_base(1), attempt_base(1) + 52)]
    restarted = sorted(json.loads(line)["seq"] for line in view(central, "restarted"))
    assert restarted == [*range(52), *range(session_base(0, 1), session_base(0, 1) + 52)]
    assert consumer.stop() == 0
    log = consumer.log.read_text()
    errors = [line for line in log.splitlines() if "refused a second writer" in line]
    assert len(errors) == 1, log[-3000:]
    assert "run shared rank 1: node node-b publishes a process" in errors[0]
    assert runs_status(central, "shared") == "conflict"
    assert runs_status(central, "moved") != "conflict" != runs_status(central, "restarted")
    for node in nodes.values():
        assert node.stop() == 0


def test_a_relay_that_takes_the_partition_over_on_its_own_disk_judges_as_the_last_did(relays,
                                                                                     tmp_path):
    """The judge's memory is the central journal: a consuming relay that takes the partition over
    on an empty folder while node b's second writer still publishes refuses the rest of it without
    saying the conflict again, and lets node b's next attempt of the rank in."""
    with NatsCluster(tmp_path / "nats", size=1) as server:
        urls = server.url(0)
        nodes = start_nodes(relays, urls, tmp_path)
        a, b = nodes["node-a"].address, nodes["node-b"].address
        port = free_port()
        first = ConsumerProcess(tmp_path, "c1", urls, tmp_path / "c1").start()
        then = ConsumerProcess(tmp_path, "c2", urls, tmp_path / "c2", ["--metrics-bind", str(port)])
        try:
            assert finish(publisher(a, "shared", 100))["left"] == 0
            wait_for(lambda: len(view(tmp_path / "c1", "shared")) >= 102, 90,
                     "node a's job, centrally")
            second = publisher(b, "shared", 300, rate=30)  # 10 s: still publishing at the takeover
            wait_for(lambda: refused_by(first) > 0, 60, "c1 refused node b's job")
            assert first.stop() == 0
            then.start()
            assert finish(second)["left"] == 0
            wait_for(lambda: published_all(nodes["node-b"], tmp_path / "node-b"), 60,
                     "node b published all")
            wait_acknowledged(urls, "RELAY", 60)
            before = sum(int(n) for n in re.findall(r"conflict=(\d+)", first.log.read_text()))
            # (the endpoint serves the stats of the last second)
            wait_for(lambda: before + refused(port) >= 302, 30,
                     "every line of node b's job refused, by c1 or c2", lambda: f"c1 {before}")
            assert refused(port) > 0, "c2 refused the rest of node b's job"
            assert view(tmp_path / "c2", "shared") == node_stream(tmp_path / "node-a", "shared")
            assert [c["event"] for c in conflicts(tmp_path / "c2")] == ["conflict"], "said once"
            c2_log = then.log.read_text()
            assert "refused a second writer" not in c2_log and "more events refused" in c2_log
            resumed = publisher(b, "shared", 50, attempt=1)  # node b's job resumed: above
            assert finish(resumed)["left"] == 0
            wait_for(lambda: len(view(tmp_path / "c2", "shared")) >= 154, 60, "attempt 1 taken")
            assert [(c["event"], c["node"]) for c in conflicts(tmp_path / "c2")] == [
                ("conflict", "node-b"), ("conflict_ended", "node-b")]
            assert then.stop() == 0
            assert runs_status(tmp_path / "c2", "shared") == "conflict"
            for node in nodes.values():
                assert node.stop() == 0
        finally:
            for consumer in (first, then):
                if consumer.alive():
                    consumer.kill()
