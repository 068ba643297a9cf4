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


def test_two_nodes_under_one_run_id_the_central_keeps_one_writer_and_says_conflict(relays,
                                                                                  tmp_path):
    with NatsCluster(tmp_path / "nats", size=1) as server:
        urls = server.url(0)
        nodes = {}
        for name in ("node-a", "node-b"):
            node = relays(["--path", f"{tmp_path / name}/", "--sink", "nats", "--nats-url", urls,
                           "--nats-node", name, "--nats-partitions", "2",
                           "--stats-interval", "0.2"], start=False)
            node.log = tmp_path / f"{name}.log"
            nodes[name] = node.start()
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
        wait_for(lambda: published_all(node, tmp_path / name), 60, f"{name} published everything")
    wait_for(lambda: len(view(central, "moved")) >= 104 and len(view(central, "restarted")) >= 104,
             60, "the resumed attempt and the restarted rank in the central view")
    wait_acknowledged(urls, "RELAY", 60)
    mine = node_stream(tmp_path / "node-a", "shared")
    assert view(central, "shared") == mine, "node a's events only, as written"
    said = [json.loads(line)["data"] for line in view(central, "shared", RELAY_RANK)
            if b'"event":"conflict"' in line]
    assert said == [{"event": "conflict", "rank": 1, "why": "history", "seq": 0,
                     "writer_pid": first.pid, "writer_host": said[0]["writer_host"],
                     "refused_pid": second.pid, "refused_host": said[0]["refused_host"],
                     "node": "node-b", "session": said[0]["session"]}]
    wait_for(lambda: refused(port) == 202, 30, "Prometheus counts node b's 202 refused events")
    assert sum(p["conflict"] for p in consumer.stats()["partitions"].values()) == 202
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
