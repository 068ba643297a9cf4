"""The nats sink: node relays publishing their journals into a real 3-node JetStream cluster (R3
stream), read back through JetStream: every journal line in the stream exactly once, byte for byte,
through a stream leader killed mid-publish, NATS down at start and for 30 s mid-run, and the node
relay killed and restarted; bad URLs and credentials stop the relay with one line and exit 2."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("nats")

from conftest import RelayProcess, finish, start_publisher, wait_for
from nats_helpers import NatsCluster, free_ports, read_stream, stream_lines_or_none

pytestmark = pytest.mark.timeout(300)

SINK = "nats"


@pytest.fixture
def cluster(tmp_path: Path):
    with NatsCluster(tmp_path / "nats") as c:
        yield c


def sink_args(journal: Path, urls: str, *extra: str) -> list[str]:
    return ["--path", f"{journal}/", "--sink", SINK, "--nats-url", urls, "--nats-replicas", "3",
            "--nats-node", journal.name, "--stats-interval", "0.2", *extra]


def journal_lines(journal: Path) -> list[bytes]:
    """Every line of a journal (a file, or a directory's run files), each with its newline."""
    paths = sorted(journal.glob("*.jsonl")) if journal.is_dir() else [journal]
    return [line for path in paths if not path.name.startswith("_")
            for line in path.read_bytes().splitlines(keepends=True)]


def stream_lines(urls: str) -> tuple[list[bytes], list]:
    """Every line in the stream (the message bodies split), and the messages."""
    msgs = asyncio.run(read_stream(urls, "RELAY"))
    return [line for m in msgs for line in m.data.splitlines(keepends=True)], msgs


def published(relay: RelayProcess, journal: Path) -> int:
    return relay.stats(journal)["sinks"].get("nats", {}).get("sink", {}).get("published", 0)


def assert_in_stream_exactly_once(urls: str, *journals: Path) -> list:
    """Each line of the node journals is in the stream once, as written; each message is one run's
    lines, as its headers say. (The consuming relay dedupes by (run, rank, seq) on top.)"""
    lines, msgs = stream_lines(urls)
    expected = [line for journal in journals for line in journal_lines(journal)]
    keys = Counter((e["run"], e["rank"], e["seq"]) for e in map(json.loads, lines))
    assert max(keys.values()) == 1  # counted by (run, rank, seq) too
    assert keys.keys() == {(e["run"], e["rank"], e["seq"]) for e in map(json.loads, expected)}
    twice = {line[:80]: n for line, n in Counter(lines).items() if n > 1}
    assert not twice, f"{len(twice)} lines more than once in the stream: {list(twice.items())[:3]}"
    assert Counter(lines) == Counter(expected), (f"{len(set(expected) - set(lines))} journal lines missing, "
                                                 f"{len(set(lines) - set(expected))} lines not from a journal")
    for m in msgs:
        run = m.headers["Relay-Run"]
        body = m.data.splitlines()
        assert int(m.headers["Relay-Lines"]) == len(body) and all(f'"run":"{run}"'.encode() in x for x in body)
        file, _, end = m.headers["Relay-End"].rpartition(":")
        assert file in (f"{run}.jsonl", *(j.name for j in journals)) and m.headers["Nats-Msg-Id"].endswith(f"-{end}")
        assert m.subject.split(".")[3:] == [m.headers["Relay-Node"], run.replace(".", "_")]
    return msgs


def run_ranks(relay: RelayProcess, run: str, ranks: int, count: int, rate: float = 0) -> list:
    return [start_publisher(relay.address, run, rank, count, world_size=ranks, rate=rate, flush_timeout=120)
            for rank in range(ranks)]


def all_acknowledged(pubs: list) -> None:
    stats = [finish(p, 180) for p in pubs]
    assert all(s["left"] == 0 and s["dropped"] == 0 for s in stats), stats


def test_two_node_relays_publish_every_line_exactly_once(relays, cluster, tmp_path):
    """Two node relays, two publisher processes each, into the R3 stream the first of them creates."""
    dirs = [tmp_path / "node-a", tmp_path / "node-b"]
    nodes = [relays(sink_args(d, cluster.urls)) for d in dirs]
    pubs = [p for i, node in enumerate(nodes) for p in run_ranks(node, f"job.{i}", 2, 1000)]
    all_acknowledged(pubs)
    wait_for(lambda: sum(published(n, d) for n, d in zip(nodes, dirs, strict=True))
             >= sum(len(journal_lines(d)) for d in dirs), 60, "every journal line published")
    for node in nodes:
        assert node.stop() == 0
        errors = [line for line in node.log.read_text().splitlines() if "ERROR" in line]
        assert not errors, errors[:3]  # a fault nothing caused: counted and retried, but a bug
    msgs = assert_in_stream_exactly_once(cluster.urls, *dirs)
    assert len(journal_lines(dirs[0])) >= 2 * 1002 and len(msgs) < 2 * 2004 // 5  # chunks, not a line each


@pytest.mark.slow
def test_stream_leader_killed_mid_publish(relays, cluster, tmp_path):
    journal = tmp_path / "node"
    node = relays(sink_args(journal, cluster.urls))
    pubs = run_ranks(node, "leaderkill", 2, 6000, rate=1000)
    wait_for(lambda: published(node, journal) > 1000, 60, "publishing has begun")
    cluster.kill(cluster.stream_leader("RELAY"))
    all_acknowledged(pubs)
    wait_for(lambda: published(node, journal) >= len(journal_lines(journal)), 90, "every line published")
    assert node.stop() == 0
    assert_in_stream_exactly_once(cluster.urls, journal)


@pytest.mark.slow
def test_nats_down_at_start_and_for_30_s_mid_run(relays, tmp_path):
    """The relay starts with every NATS server down (it warns and listens), publishes once they come
    up, then goes on journaling through 30 s without any, and catches up."""
    cluster = NatsCluster(tmp_path / "nats")
    journal = tmp_path / "node"
    try:
        node = relays(sink_args(journal, cluster.urls))
        pubs = run_ranks(node, "outage", 2, 9000, rate=150)
        time.sleep(3)
        assert published(node, journal) == 0
        cluster.start()
        wait_for(lambda: published(node, journal) > 500, 60, "published once NATS is up")
        cluster.kill_all()
        # what was acknowledged before: counted before the sink saw its connection go, so final in the
        # first stats file (written every 0.2 s) that says it is gone
        wait_for(lambda: node.sink_stats(journal, SINK).get("sink", {}).get("connected") == 0, 60,
                 "the nats sink saw NATS go", node.log_tail)
        at_outage = published(node, journal)
        time.sleep(30)
        assert published(node, journal) == at_outage and len(journal_lines(journal)) > at_outage + 3000
        cluster.start_all()
        all_acknowledged(pubs)
        wait_for(lambda: published(node, journal) >= len(journal_lines(journal)), 90, "caught up")
        assert node.stop() == 0
        assert_in_stream_exactly_once(cluster.urls, journal)
    finally:
        cluster.close()


@pytest.mark.slow
def test_node_relay_killed_and_restarted_resumes_where_acknowledged(relays, cluster, tmp_path):
    """SIGKILL the node relay mid-run, then again after deleting its state file: each restart resumes
    from what the stream acknowledged (its state file and the chunks stored after it, else the stream's
    last message), so the stream holds every line once: the state file lags the stream, and chunks cut
    again from a backlog have new bounds and ids, which JetStream would store again."""
    journal = tmp_path / "node"
    node = relays(sink_args(journal, cluster.urls))
    address = node.address
    pubs = run_ranks(node, "restart", 2, 8000, rate=800)
    for lose_state in (False, True):
        wait_for(lambda node=node: published(node, journal) > 1000, 60, "publishing")
        sink = int(re.findall(r"sink nats open \(pid (\d+)\)", node.log.read_text())[-1])
        node.kill()
        # its sink process dies with it (relay/sinkhost: at once, saving nothing more): only then is the file lost
        wait_for(lambda sink=sink: not running(sink), 30, "the sink process ended")
        if lose_state:
            (journal / "_relay_nats.json").unlink()
        (journal / "_relay_stats.json").unlink(missing_ok=True)
        node = relays(sink_args(journal, cluster.urls), address=address)
    all_acknowledged(pubs)
    wait_for(lambda: len(stream_lines_or_none(cluster.urls) or []) >= len(journal_lines(journal)), 90, "every line in the stream")
    assert node.stop() == 0
    assert "resuming after the stream's last message" in node.log.read_text()  # the restart without a state file
    assert_in_stream_exactly_once(cluster.urls, journal)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_jobs_embedded_relay_publishes_with_the_nats_tracker(cluster, tmp_path):
    """``--tracker nats``: the job's own relay (one journal file for the job) publishes it, no node relay."""
    from trainer.embedded import JSONL_NAME, EmbeddedRelay
    from trainer.tracker_flags import TrackingArguments, sink_args as tracker_sink_args

    out = tmp_path / "job"
    args = tracker_sink_args(["jsonl", "nats"], TrackingArguments(nats_url=cluster.urls, nats_replicas=3), str(out))
    relay = EmbeddedRelay.start(str(out), sink_args=args)
    try:
        pubs = [start_publisher(relay.address, "sft.job", rank, 500, world_size=2) for rank in range(2)]
        all_acknowledged(pubs)
        journal = out / JSONL_NAME
        wait_for(lambda: len(stream_lines_or_none(cluster.urls) or []) >= len(journal_lines(journal)), 60, "journal published")
    finally:
        assert relay.stop() == 0
    assert_in_stream_exactly_once(cluster.urls, journal)


def relay_exits(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", "--path", f"{tmp_path}/j/", "--bind", "tcp://127.0.0.1:0",
                           "--sink", SINK, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, says", [
    (["--nats-url", "http://127.0.0.1:4222"], "is not a NATS server URL"),
    (["--nats-url", "nats://127.0.0.1:4222", "--nats-creds", "/nonexistent.creds"], "no such file"),
    (["--nats-duplicate-window", "soon"], "is not a duration"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, args, says):
    done = relay_exits(tmp_path, *args)
    errors = [line for line in done.stderr.splitlines() if line.startswith("relay: error:")]
    assert done.returncode == 2 and len(errors) == 1 and says in errors[0], done.stderr


def test_credentials_the_server_refuses_exit_2_with_one_line(tmp_path):
    with NatsCluster(tmp_path / "nats", size=1, extra_config="authorization { token: s3cret }") as server:
        done = relay_exits(tmp_path, "--nats-url", server.url(0), "--nats-token", "wrong")
    errors = [line for line in done.stderr.splitlines() if line.startswith("relay: error:")]
    assert done.returncode == 2 and len(errors) == 1 and "refused" in errors[0], done.stderr
    assert "wrong" not in done.stderr


@pytest.mark.slow
def test_a_server_down_at_start_is_not_fatal(relays, tmp_path):
    journal = tmp_path / "node"
    node = relays(sink_args(journal, f"nats://127.0.0.1:{free_ports(1)[0]}"))
    pubs = run_ranks(node, "down", 1, 50)
    all_acknowledged(pubs)  # the relay journals and acknowledges; the sink waits for NATS
    assert node.stop() == 0
    assert "is not reachable now" in node.log.read_text()
