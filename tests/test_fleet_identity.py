"""A node relay's identity in the fleet tier (issue 27, section 1): unique by construction, kept
beside the journal, and never held by two live relays. The rules without sockets, then the issue's
collision for real: two node relays on one host name and one run, and nothing lost."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import finish, start_publisher, wait_for
from relay.fleet import identity
from relay.fleet.stream import run_token

HOST_A = identity.Claimant("gpu-1", 100, "/var/lib/relay-logs", (64, 1234), "boot-1")


def test_each_journal_folder_makes_its_own_node_once(tmp_path, monkeypatch):
    monkeypatch.setattr(identity.socket, "gethostname", lambda: "pod.cluster.local")  # the name every pod shares
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    first = identity.local_id(a, run_token)
    assert first == identity.local_id(a, run_token), "the id is made once and kept"
    assert first != identity.local_id(b, run_token)
    assert first.startswith("pod_cluster_local-") and run_token(first) == first
    assert json.loads((a / "_relay_nats_node.json").read_text()) == {"node": first, "host": "pod.cluster.local"}
    assert identity.local_id(tmp_path / "one.jsonl", run_token) != first  # a one-file journal: beside it
    assert (tmp_path / "one_nats_node.json").exists()


def test_a_claim_is_taken_over_only_from_this_very_journal_folder():
    from dataclasses import replace
    assert identity.verdict(HOST_A, replace(HOST_A, pid=200)), "this folder's relay, killed: its successor takes over"
    assert not identity.verdict(HOST_A, replace(HOST_A, folder=(64, 999))), "another folder at the same path"
    assert not identity.verdict(HOST_A, replace(HOST_A, host="gpu-2")), "another machine"
    assert not identity.verdict(HOST_A, replace(HOST_A, boot="boot-2")), "a reboot: the old claim waits out its ttl"
    assert not identity.verdict(None, HOST_A), "a key that is not a claim we can read"
    value = HOST_A.value()
    assert identity.read_claimant(value)[0] == HOST_A and identity.read_claimant(b"junk") == (None, None)


def relay_exits(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", "--bind", "tcp://127.0.0.1:*", "--live", "off", *args],
                          capture_output=True, text=True, timeout=90, cwd=cwd)


@pytest.mark.slow  # a server, four relay lifetimes, a consuming relay: ~30 s
@pytest.mark.timeout(300)
def test_two_node_relays_sharing_a_host_name_lose_nothing_and_a_live_node_is_refused(tmp_path, relays):
    """The issue's collision: two node relays without --nats-node on one host name, one run across
    both. Node A journals its ranks first without the sink; B publishes its ranks; then A's sink
    starts on A's journal without a state file, so it resumes after the stream's last message of
    its node: under a shared name that was B's, and A's first bytes were skipped. Each folder has
    its own node now: every event reaches the consuming relay once."""
    pytest.importorskip("nats")
    from fleet_helpers import (
        ConsumerProcess,
        assert_exactly_once,
        node_lines,
        wait_acknowledged,
        wait_complete,
    )
    from nats_helpers import NatsCluster

    a, b = tmp_path / "node-a", tmp_path / "node-b"
    with NatsCluster(tmp_path / "nats", size=1) as server:
        sink = ["--stats-interval", "0.5", "--sink", "nats", "--nats-url", server.urls, "--nats-partitions", "2"]
        node_a = relays(["--path", f"{a}/", "--live", "off"])
        finish_all([start_publisher(node_a.address, "job", rank, 1500, world_size=4) for rank in (0, 1)])
        assert node_a.stop() == 0
        node_b = relays(["--path", f"{b}/", "--live", "off", *sink])
        finish_all([start_publisher(node_b.address, "job", rank, 500, world_size=4) for rank in (2, 3)])
        wait_for(lambda: _published(node_b, b) == 1004, 60, "node B's lines published")
        node_a = relays(["--path", f"{a}/", "--live", "off", *sink])
        consumer = ConsumerProcess(tmp_path, "c", server.urls, tmp_path / "central").start()
        expected = node_lines(a, b)
        assert len(expected) == 2 * 1502 + 2 * 502
        wait_complete(tmp_path / "central", expected, 120)
        wait_acknowledged(server.urls, "RELAY", 60)
        assert_exactly_once(tmp_path / "central", expected)
        nodes = {identity.local_id(folder, run_token) for folder in (a, b)}
        assert len(nodes) == 2

        copy = tmp_path / "copy-of-a"  # a cloned machine's journal, its id file with it
        shutil.copytree(a, copy, ignore=shutil.ignore_patterns("_relay.lock"))
        done = relay_exits(["--path", f"{copy}/", *sink], tmp_path)
        one_line(done, f"node {identity.local_id(a, run_token)} is live in the fleet",
                 f"delete {copy}/_relay_nats_node.json")
        done = relay_exits(["--path", f"{tmp_path / 'named'}/", *sink, "--nats-node", identity.local_id(b, run_token)],
                           tmp_path)
        one_line(done, f"journal {b}", "give this relay another --nats-node")

        node_a.proc.kill()  # killed: its claim is still live for a while, and its own journal takes it over at once
        node_a.proc.wait()
        node_a = relays(["--path", f"{a}/", "--live", "off", *sink])
        finish_all([start_publisher(node_a.address, "job-2", 0, 100)])
        expected = node_lines(a, b)
        wait_complete(tmp_path / "central", expected, 60)
        assert_exactly_once(tmp_path / "central", expected)
        assert consumer.stop() == 0
        for relay in (node_a, node_b):
            assert relay.stop() == 0


def finish_all(pubs: list) -> None:
    for pub in pubs:
        stats = finish(pub, 120)
        assert stats["left"] == 0 and stats["dropped"] == 0, stats


def _published(relay, journal: Path) -> int:
    return relay.stats(journal)["sinks"].get("nats", {}).get("sink", {}).get("published", 0)


def one_line(done: subprocess.CompletedProcess, *says: str) -> None:
    errors = [line for line in done.stderr.splitlines() if line.startswith("relay: error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert all(part in errors[0] for part in says), errors[0]
    assert "Traceback" not in done.stderr, done.stderr
