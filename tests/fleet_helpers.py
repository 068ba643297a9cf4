"""Consuming relays (`relay consume`) as real processes, and what the fleet tests check on them: the
partition journals under one folder holding every node event exactly once, byte for byte, and every
partition's consumer fully acknowledged."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, wait_for
from nats_helpers import JS_TIMEOUT


class ConsumerProcess:
    """A real ``python -m relay consume`` subprocess writing its partitions' journals under ``path``."""

    def __init__(self, tmp: Path, name: str, urls: str, path: Path, extra: list[str] | None = None) -> None:
        self.name, self.urls, self.path = name, urls, path
        self.extra = extra or []
        self.log = tmp / f"consume-{name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def stats_path(self) -> Path:
        return self.path / f"_relay_consume_{self.name}.json"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "relay", "consume"]

    def start(self) -> ConsumerProcess:
        self.stats_path.unlink(missing_ok=True)
        cmd = [*self.command(), "--nats-url", self.urls, "--path", f"{self.path}/", "--name", self.name,
               "--ack-wait", "5", *self.extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        return self

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def held(self) -> set[int]:
        return set(self.stats().get("held", []))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 60) -> int:
        self.terminate()
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def stop_all(consumers: list[ConsumerProcess]) -> list[int]:
    """SIGTERM every live consumer at once (none takes over what another gives back), then their exit codes."""
    live = [c for c in consumers if c.alive()]
    for consumer in live:
        consumer.terminate()
    return [consumer.stop() for consumer in live]


def central_lines(root: Path) -> dict[tuple[str, int, int], list[bytes]]:
    """(run, rank, seq) -> every journal line holding it, over all partition journals under ``root``
    (whole lines only: a relay may still be writing)."""
    found: dict[tuple[str, int, int], list[bytes]] = {}
    for path in sorted(root.glob("p*/*.jsonl")):
        if path.name.startswith("_"):
            continue
        data = path.read_bytes()
        for line in data[:data.rfind(b"\n") + 1].splitlines():
            event = json.loads(line)
            found.setdefault((event["run"], event["rank"], event["seq"]), []).append(line)
    return found


def node_lines(*journals: Path, skip_rank: int | None = None) -> dict[tuple[str, int, int], bytes]:
    """What the consuming relays must hold: every line of the node journals (folders of run files, or
    one file), once each."""
    out: dict[tuple[str, int, int], bytes] = {}
    for journal in journals:
        for path in sorted(journal.glob("*.jsonl")) if journal.is_dir() else [journal]:
            if path.name.startswith("_"):
                continue
            for line in path.read_bytes().splitlines():
                event = json.loads(line)
                key = (event["run"], event["rank"], event["seq"])
                if event["rank"] == skip_rank:
                    continue
                assert key not in out, f"{key} twice in the node journals"
                out[key] = line
    return out


def central_journal(urls: str, stream: str) -> dict[tuple[str, int, int], list[bytes]]:
    """(run, rank, seq) -> every line holding it in the central journal of ``stream`` (relay/fleet/central.py)."""
    from relay.fleet.central import journal_stream
    return stream_events(urls, journal_stream(stream))


def stream_events(urls: str, stream: str) -> dict[tuple[str, int, int], list[bytes]]:
    """(run, rank, seq) -> every journal line holding it in the messages ``stream`` stores."""
    from nats_helpers import read_stream
    found: dict[tuple[str, int, int], list[bytes]] = {}
    for msg in asyncio.run(read_stream(urls, stream)):
        for line in msg.data.splitlines():
            event = json.loads(line)
            found.setdefault((event["run"], event["rank"], event["seq"]), []).append(line)
    return found


def assert_exactly_once_on_own_disks(roots: list[Path], expected: dict[tuple[str, int, int], bytes], urls: str,
                                     stream: str) -> None:
    """Consuming relays each on a folder of its own: every expected line exactly once in the central
    journal, byte for byte, and nothing else; each folder a view of it (no line twice, none other),
    the folders together the whole; one run in one partition."""
    central = central_journal(urls, stream)
    twice = {key: len(lines) for key, lines in central.items() if len(lines) > 1}
    assert not twice, f"duplicated in the central journal: {dict(list(twice.items())[:5])}"
    assert set(central) == set(expected), (f"{len(set(expected) - set(central))} events missing from the central "
                                           f"journal, {len(set(central) - set(expected))} nobody sent")
    differ = [key for key, line in expected.items() if central[key][0] != line]
    assert not differ, f"{len(differ)} lines differ from the node's, e.g. {differ[0]}: {central[differ[0]][0]!r}"
    union: set[tuple[str, int, int]] = set()
    for root in roots:
        view = central_lines(root)
        assert not {key for key, lines in view.items() if len(lines) > 1}, f"{root} holds an event twice"
        assert all(lines[0] == expected.get(key) for key, lines in view.items()), f"{root} holds what nobody sent"
        union |= set(view)
        runs: dict[str, set[str]] = {}
        for path in root.glob("p*/*.jsonl"):
            runs.setdefault(path.stem, set()).add(path.parent.name)
        assert all(len(parts) == 1 for parts in runs.values()), f"a run in two partitions: {runs}"
    assert union == set(expected), f"{len(set(expected) - union)} events in no consuming relay's folder"


def assert_exactly_once(root: Path, expected: dict[tuple[str, int, int], bytes]) -> None:
    """Every expected line exactly once under ``root``, byte for byte, and nothing else; one run in one partition."""
    got = central_lines(root)
    twice = {key: len(lines) for key, lines in got.items() if len(lines) > 1}
    assert not twice, f"duplicated in the consuming relays' journals: {dict(list(twice.items())[:5])}"
    missing = set(expected) - set(got)
    assert not missing, f"{len(missing)} events missing, e.g. {sorted(missing)[:5]}"
    extra = set(got) - set(expected)
    assert not extra, f"{len(extra)} events nobody sent, e.g. {sorted(extra)[:5]}"
    differ = [key for key, line in expected.items() if got[key][0] != line]
    assert not differ, f"{len(differ)} lines differ from the node's, e.g. {differ[0]}: {got[differ[0]][0]!r}"
    runs: dict[str, set[str]] = {}
    for path in root.glob("p*/*.jsonl"):
        runs.setdefault(path.stem, set()).add(path.parent.name)
    assert all(len(parts) == 1 for parts in runs.values()), f"a run in two partitions: {runs}"


def wait_complete(root: Path | list[Path], expected: dict, timeout: float) -> None:
    """Until the folder (or the folders together) hold every expected event."""
    roots = root if isinstance(root, list) else [root]
    wait_for(lambda: set(expected) <= set().union(*(central_lines(r) for r in roots)), timeout,
             f"all {len(expected)} events in the consuming relays' journals")


async def _consumers_state(urls: str, stream: str) -> list[tuple[str, int, int]]:
    import nats
    nc = await nats.connect(urls.split(","), connect_timeout=5)
    try:
        js = nc.jetstream(timeout=JS_TIMEOUT)
        return [(c.name, c.num_pending, c.num_ack_pending) for c in await js.consumers_info(stream)]
    finally:
        await nc.close()


def wait_acknowledged(urls: str, stream: str = "RELAY", timeout: float = 60.0) -> None:
    """Until every partition's durable consumer has nothing pending and nothing unacknowledged."""
    state: list = []

    def done() -> bool:
        nonlocal state
        try:
            state = asyncio.run(_consumers_state(urls, stream))
        except Exception:  # a server restarting: ask again
            return False
        return bool(state) and all(pending == 0 and unacked == 0 for _, pending, unacked in state)
    try:
        wait_for(done, timeout, "every consumer acknowledged")
    except AssertionError:
        raise AssertionError(f"consumers not fully acknowledged: {state}") from None


def wait_held(consumers: list[ConsumerProcess], partitions: int, timeout: float = 60.0) -> None:
    """Until the live consumers hold every partition, each once."""
    def held() -> bool:
        sets = [c.held() for c in consumers if c.alive()]
        return sum(map(len, sets)) == partitions and set().union(*sets) == set(range(partitions))
    wait_for(held, timeout, f"{partitions} partitions held")


async def publish_raw(urls: str, prefix: str, node: str, runs: dict[str, list[bytes]], chunk: int,
                      pause: float = 0.0) -> None:
    """Publish ``runs``' journal lines as a node relay's nats sink would: chunks of one run's lines, a
    deterministic Nats-Msg-Id, each held until JetStream acknowledged it (retried until then)."""
    import nats
    nc = await nats.connect(urls.split(","), connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream(timeout=JS_TIMEOUT)
    try:
        for run, lines in runs.items():
            for start in range(0, len(lines), chunk):
                body = b"".join(line + b"\n" for line in lines[start:start + chunk])
                headers = {"Nats-Msg-Id": f"{node}:{run}:{start}", "Relay-Node": node, "Relay-Run": run,
                           "Relay-Lines": str(len(lines[start:start + chunk]))}
                deadline = time.monotonic() + 60
                while True:
                    try:
                        await js.publish(f"{prefix}.{node}.{run}", body, headers=headers, timeout=2)
                        break
                    except Exception:  # a leader election or NATS down: the same id again
                        assert time.monotonic() < deadline, "JetStream did not take a message within 60 s"
                        await asyncio.sleep(0.2)
                if pause:
                    await asyncio.sleep(pause)
    finally:
        await nc.close()


def create_stream(urls: str, name: str = "RELAY", prefix: str = "relay.events", partitions: int = 4,
                  replicas: int = 1) -> None:
    """The fleet stream as a node relay creates it (relay/fleet/stream.py), made up front. A request NATS
    lost is asked again (core NATS delivers at most once: one sent while a just started cluster's routes
    settle went unanswered for 60 s); the same config again is no error."""
    from nats.errors import TimeoutError as NatsTimeout

    from relay.fleet.stream import stream_config

    async def create() -> None:
        import nats
        nc = await nats.connect(urls.split(","))
        deadline = time.monotonic() + 2 * JS_TIMEOUT
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT / 4)
            while True:
                try:
                    await js.add_stream(stream_config(name, prefix, partitions, replicas, 600, 0))
                    return
                except NatsTimeout:
                    if time.monotonic() > deadline:
                        raise
        finally:
            await nc.close()
    asyncio.run(create())
