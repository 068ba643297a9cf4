"""relay/fleet/connection.py and stream.py against real nats-servers: options checked in one line,
credentials the server refuses told from a server that is down, the missing package named with its
install line, the stream's run partitions, and tests/nats_helpers.py's cluster doing what it says."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nats")

import ports
from nats_helpers import JS_TIMEOUT, NatsCluster, free_ports, read_stream
from relay.fleet import connection, stream
from relay.fleet.connection import settings_from_options
from relay.fleet.loop_thread import LoopThread
from sinks.base import SinkError


@pytest.mark.parametrize("kwargs, says", [
    ({"nats_url": "http://127.0.0.1:4222"}, "is not a NATS server URL"),
    ({"nats_url": "nats://host:port"}, "is not a NATS server URL"),
    ({"nats_url": "nats://a:1,nats://:2"}, "is not a NATS server URL"),
    ({"nats_url": " , "}, "--nats-url is empty"),
    ({"nats_password": "x"}, "--nats-password needs --nats-user"),
    ({"nats_user": "u", "nats_token": "t"}, "two ways to authenticate"),
    ({"nats_creds": "/nonexistent.creds"}, "--nats-creds /nonexistent.creds: no such file"),
    ({"nats_tls_cert": __file__}, "go together"),
])
def test_bad_options_are_one_line_errors(kwargs: dict, says: str) -> None:
    with pytest.raises(SinkError) as err:
        settings_from_options(**kwargs)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_settings_hide_the_password_and_take_several_servers(tmp_path: Path) -> None:
    seed = tmp_path / "user.nk"
    seed.write_text("SUAEXAMPLE\n")
    s = settings_from_options(nats_url="nats://u:secret@127.0.0.1:4222, tls://h2:4223", nats_nkey=str(seed))
    assert s.servers == ["nats://u:secret@127.0.0.1:4222", "tls://h2:4223"]
    assert "secret" not in s.display and s.wants_tls
    assert connection.connect_kwargs(settings_from_options(nats_user="u", nats_password="p"))["password"] == "p"
    seed.write_text("not a seed")
    with pytest.raises(SinkError, match="not a user nkey seed"):
        settings_from_options(nats_nkey=str(seed))


def test_a_missing_package_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    connection.check_package()
    monkeypatch.setitem(sys.modules, "nats", None)
    with pytest.raises(SinkError, match=r"pip install 'metrics-relay\[nats\]'"):
        connection.check_package()


def test_probe_tells_refused_credentials_from_a_server_that_is_down(tmp_path: Path) -> None:
    loop = LoopThread()
    try:
        with NatsCluster(tmp_path, size=1,
                         extra_config="authorization { user: relay, password: right }") as server:
            good = settings_from_options(nats_url=server.url(0), nats_user="relay", nats_password="right")
            assert loop.run(connection.probe(good), 10) is None
            in_url = settings_from_options(nats_url=server.url(0).replace("//", "//relay:right@"))
            assert loop.run(connection.probe(in_url), 10) is None
            bad = settings_from_options(nats_url=server.url(0), nats_user="relay", nats_password="wrong")
            with pytest.raises(SinkError) as err:
                loop.run(connection.probe(bad), 10)
            assert "refused" in str(err.value) and "wrong" not in str(err.value) and "\n" not in str(err.value)
        down = settings_from_options(nats_url=f"nats://127.0.0.1:{free_ports(1)[0]}")
        assert loop.run(connection.probe(down, timeout=1), 10)  # the reason, not an error: it may come up
    finally:
        loop.stop()


def test_the_stream_keeps_each_run_on_one_partition(tmp_path: Path) -> None:
    """A real 3-node cluster, the R3 stream created by ensure_stream (and found, not recreated, the
    second time): every message of a run is stored under one partition, and a partition's filter reads it."""
    runs = ["run-a", "run/b.2", "r c", "x"] * 3
    with NatsCluster(tmp_path) as cluster:
        async def publish() -> None:
            settings = settings_from_options(nats_url=cluster.urls)
            nc = await connection.connect(settings, retry_forever=False)
            js = nc.jetstream(timeout=JS_TIMEOUT)
            config = stream.stream_config("RELAY", "relay.events", 8, 3, 600, 0)
            assert (await stream.ensure_stream(js, config))[1] is True
            assert (await stream.ensure_stream(js, config))[1] is False
            await asyncio.get_running_loop().run_in_executor(None, cluster.stream_leader, "RELAY")
            for i, run in enumerate(runs):
                await js.publish(stream.publish_subject("relay.events", "node.1", run), str(i).encode())
            await nc.close()

        asyncio.run(publish())
        stored = asyncio.run(read_stream(cluster.urls, "RELAY"))
        assert [m.data for m in stored] == [str(i).encode() for i in range(len(runs))]
        partition = {}
        for m in stored:
            prefix1, prefix2, k, node, token = m.subject.split(".")
            assert (prefix1, prefix2, node) == ("relay", "events", "node_1") and 0 <= int(k) < 8
            assert partition.setdefault(token, k) == k
        assert set(partition) == {"run-a", "run_b_2", "r_c", "x"}
        k = partition["run-a"]
        again = asyncio.run(read_stream(cluster.urls, "RELAY", stream.partition_filter("relay.events", int(k))))
        assert {m.subject.split(".")[-1] for m in again} == {t for t, p in partition.items() if p == k}


@pytest.mark.slow
def test_cluster_helper_kills_stops_and_restarts_the_stream_leader(tmp_path: Path) -> None:
    with NatsCluster(tmp_path) as cluster:
        async def create() -> None:
            nc = await connection.connect(settings_from_options(nats_url=cluster.urls), retry_forever=False)
            await stream.ensure_stream(nc.jetstream(timeout=JS_TIMEOUT), stream.stream_config("S", "s", 2, 3, 60, 0))
            await nc.close()

        asyncio.run(create())
        leader = cluster.stream_leader("S")
        cluster.kill(leader)
        assert cluster.stream_leader("S") != leader  # a new election, the meta leader's too when it was the one killed
        cluster.restart(leader)
        assert len(cluster.alive()) == 3
        cluster.stop(0)
        assert cluster.alive() == [1, 2]
        cluster.cont(0)
        cluster.wait_ready()


def claimed_elsewhere(picked: set[int]) -> set[int]:
    """Those of ``picked`` whose claim another process cannot take now (tests/ports.py's flock files)."""
    code = ("import fcntl, os, sys\n"
            "for port in sys.argv[1:]:\n"
            "    fd = os.open(os.path.join(os.environ['CLAIMS'], port), os.O_RDWR | os.O_CREAT)\n"
            "    try:\n"
            "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "    except BlockingIOError:\n"
            "        print(port)\n")
    out = subprocess.run([sys.executable, "-c", code, *map(str, picked)], capture_output=True, text=True,
                         check=True, env={"CLAIMS": str(ports.CLAIMS), "PATH": ""}).stdout
    return set(map(int, out.split()))


def test_a_clusters_ports_are_claimed_until_it_closes(tmp_path: Path) -> None:
    """Its nodes are restarted on their ports, so none is ephemeral, and none is given up when the test that
    started a module's cluster ends (tests/ports.py): another test process cannot take one meanwhile."""
    cluster = NatsCluster(tmp_path)  # (not started: only its ports)
    mine = {*cluster.client_ports, *cluster.cluster_ports, *cluster.http_ports}
    first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert len(mine) == 9 and all(ports.LOW <= port < first for port in mine)
    ports.release()  # the test's own claims, as when the test that started a module's cluster ends
    assert claimed_elsewhere(mine) == mine
    cluster.close()
    assert not claimed_elsewhere(mine)
