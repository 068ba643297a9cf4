"""``relay consume`` against a real one-node nats-server: usage errors in one line (exit 2), and the
consuming relay's own rules: each line journaled once and byte for byte in its run's partition, a
message delivered again not journaled again, partitions given back at SIGTERM and taken at once.
(The whole tier through its faults: tests/test_fleet_faults.py.)"""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nats")

from conftest import ROOT, free_port, wait_for
from fleet_helpers import (
    ConsumerProcess,
    assert_exactly_once,
    create_stream,
    publish_raw,
    wait_acknowledged,
    wait_complete,
    wait_held,
)
from nats_helpers import JS_TIMEOUT, NatsCluster
from relay.fleet.central import pieces
from relay.fleet.holder import FETCH_BYTES, fetch_size
from relay.wire.lines import encode_line
from test_metrics import check_against_table, scrape

pytestmark = pytest.mark.timeout(120)


def fleet_series_agree(port: int, first: set[int], second: set[int]) -> bool:
    """The second relay's endpoint: each partition's holder, the partitions it consumes, nothing pending."""
    families = scrape(port)
    check_against_table(families)
    if "relay_fleet_partition_held" not in families or "relay_fleet_partition_pending_messages" not in families:
        return False
    holders = {s.labels["partition"]: s.labels["holder"] for s in families["relay_fleet_partition_holder"].samples}
    held = {s.labels["partition"] for s in families["relay_fleet_partition_held"].samples}
    pending = {s.labels["partition"]: s.value for s in families["relay_fleet_partition_pending_messages"].samples}
    return (holders == {**{str(k): "first" for k in first}, **{str(k): "second" for k in second}}
            and held == {str(k) for k in second} and pending == {str(k): 0 for k in second})


def test_the_fetches_of_every_partition_held_stay_within_what_the_server_holds_for_a_client():
    """The server cuts off a client it must hold more than its max_pending for (64 MiB by default),
    and what was on its way comes again only after --ack-wait."""
    mib = 1 << 20
    assert fetch_size(64, 8, mib) == 4 and fetch_size(64, 1, mib) == 32 and fetch_size(64, 1, 64 << 10) == 64
    assert fetch_size(64, 300, 8 * mib) == 1  # never none
    for wanted in (1, 7, 64, 1024):
        for held in range(1, 20):
            for payload in (64 << 10, mib, 8 * mib):
                size = fetch_size(wanted, held, payload)
                assert 1 <= size <= wanted and (size == 1 or size * held * payload <= FETCH_BYTES)


def consume_exits(tmp_path: Path, *args: str, prelude: str = "") -> subprocess.CompletedProcess:
    code = f"{prelude}from relay.cli.main import main; main(prog_name='relay')"
    return subprocess.run([sys.executable, "-c", code, "consume", "--path", f"{tmp_path}/central/", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def one_error(done: subprocess.CompletedProcess, says: str) -> None:
    errors = [line for line in done.stderr.splitlines() if line.startswith("relay: error:")]
    assert done.returncode == 2 and len(errors) == 1 and says in errors[0], done.stderr


@pytest.mark.parametrize("args, says", [
    (["--nats-url", "http://127.0.0.1:4222"], "is not a NATS server URL"),
    (["--nats-url", "nats://127.0.0.1:4222", "--nats-creds", "/nonexistent.creds"], "no such file"),
    (["--nats-prefix", "relay..events"], "is not a subject prefix"),
    (["--path", "/proc/no-journal-here/"], "choose a writable --path"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, args, says):
    one_error(consume_exits(tmp_path, *args), says)


def test_a_missing_package_exits_2_with_the_install_line(tmp_path):
    done = consume_exits(tmp_path, prelude="import sys; sys.modules['nats'] = None; ")
    one_error(done, "pip install 'metrics-relay[nats]'")


def test_credentials_the_server_refuses_exit_2_with_one_line(tmp_path):
    with NatsCluster(tmp_path / "nats", size=1, extra_config="authorization { token: s3cret }") as server:
        done = consume_exits(tmp_path, "--nats-url", server.url(0), "--nats-token", "wrong")
    one_error(done, "refused")
    assert "wrong" not in done.stderr


def lines(run: str, count: int) -> list[bytes]:
    return [encode_line({"v": 1, "run": run, "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": seq,
                         "ts": 1.5 + seq, "type": "metrics", "step": seq, "epoch": None, "stage": "train",
                         "data": {"loss": 1 / (seq + 1), "note": "é"}}).rstrip(b"\n") for seq in range(count)]


@pytest.mark.slow  # over 10 s: two relay processes and a server
def test_each_line_once_a_redelivery_dropped_and_partitions_handed_over_at_sigterm(tmp_path):
    with NatsCluster(tmp_path / "nats", size=1) as server:
        urls = server.url(0)

        create_stream(urls)
        central = tmp_path / "central"
        first = ConsumerProcess(tmp_path, "first", urls, central).start()
        metrics = free_port()
        second = ConsumerProcess(tmp_path, "second", urls, central, ["--metrics-bind", str(metrics)])
        try:
            check_hand_over(urls, central, first, second, tmp_path, metrics)
        finally:
            for consumer in (first, second):
                if consumer.alive():
                    consumer.kill()


def check_hand_over(urls: str, central: Path, first: ConsumerProcess, second: ConsumerProcess, tmp_path: Path,
                    metrics: int) -> None:
    """Each line once, the re-sent chunks dropped, the partitions handed over at SIGTERM; the second
    relay's Prometheus endpoint names each partition's holder."""
    wait_held([first], 4, 60)
    runs = {f"run-{i}": lines(f"run-{i}", 300) for i in range(6)}
    expected = {(run, 0, seq): line for run, got in runs.items() for seq, line in enumerate(got)}
    asyncio.run(publish_raw(urls, "relay.events", "n1", runs, 40))
    wait_complete(central, expected, 60)
    # the same chunks under other message ids: JetStream stores them again, the relay's dedupe drops them
    asyncio.run(publish_raw(urls, "relay.events", "n1-again", runs, 40))
    second.start()
    wait_for(lambda: len(first.held()) == len(second.held()) == 2, 60, "the second relay got its share")
    wait_for(lambda: fleet_series_agree(metrics, first.held(), second.held()), 30, "the endpoint names the holders")
    assert first.stop() == 0
    wait_held([second], 4, 10)  # given back at SIGTERM: taken at once, not after the lease's 10 s
    wait_acknowledged(urls, "RELAY", 60)
    assert_exactly_once(central, expected)
    assert second.stop() == 0
    logs = (tmp_path / "consume-first.log").read_text() + (tmp_path / "consume-second.log").read_text()
    dropped = sum(int(n) for n in re.findall(r"duplicates=(\d+)", logs))  # each partition's, as it stopped
    assert dropped >= len(expected), "the re-sent lines were not dropped by the relay's own dedupe"


@pytest.mark.slow  # over 10 s: a server and three relays one after another
def test_options_that_must_agree_are_one_line_and_those_that_may_change_are_applied(tmp_path):
    """Another relay's --lease-ttl (the lease bucket's) or --nats-prefix (the stream's) stops a
    consuming relay with one line and exit 2, before it takes anything; another --ack-wait and
    --max-ack-pending update the partitions' existing consumers, and the relay says so."""
    with NatsCluster(tmp_path / "nats", size=1) as server:
        urls = server.url(0)

        create_stream(urls, partitions=2)
        first = ConsumerProcess(tmp_path, "first", urls, tmp_path / "first").start()
        try:
            wait_held([first], 2, 60)
            assert first.stop() == 0
            other = ["--nats-url", urls, "--path", f"{tmp_path}/other/"]
            done = consume_exits(tmp_path, *other, "--lease-ttl", "4")
            one_error(done, "--lease-ttl 4 differs from the lease bucket RELAY-leases's 10 s")
            assert "give --lease-ttl 10" in done.stderr and "Traceback" not in done.stderr
            done = consume_exits(tmp_path, *other, "--nats-prefix", "other.events")
            one_error(done, "stream RELAY takes relay.events.>, not other.events.>")
            changed = ConsumerProcess(tmp_path, "changed", urls, tmp_path / "changed",
                                      ["--ack-wait", "7", "--max-ack-pending", "100"]).start()
            wait_held([changed], 2, 60)
            assert changed.stop() == 0
        finally:
            if first.alive():
                first.kill()
        assert [(c.ack_wait, c.max_ack_pending) for c in asyncio.run(_consumers(urls))] == [(7, 100)] * 2
        log = (tmp_path / "consume-changed.log").read_text()
        assert "consumer relay-p0: ack_wait 5 -> 7, max_ack_pending 512 -> 100" in log, log


async def _consumers(urls: str) -> list:
    import nats
    nc = await nats.connect(urls)
    try:
        infos = await nc.jetstream(timeout=JS_TIMEOUT).consumers_info("RELAY")
        return [info.config for info in sorted(infos, key=lambda i: i.name)]
    finally:
        await nc.close()


def test_a_commit_past_max_payload_is_one_atomic_batch_stored_whole_or_not_at_all(tmp_path):
    """The central journal (relay/fleet/central.py) on a server whose messages are at most 8 KiB: a
    commit of 60 KiB goes as one atomic batch, fenced by its first message; a stale one (another relay
    committed since) is refused whole, nothing of it stored; without atomic batches each piece is
    fenced on the one before."""
    from relay.fleet.central import CentralJournal, Fenced

    body = b"\n".join(lines("big", 400)) + b"\n"

    async def commits(url: str) -> None:
        import nats
        nc = await nats.connect(url)
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT)
            central = CentralJournal(nc, js, "RELAY", "relay.events", nc.max_payload, "w")
            await central.ensure(1)
            assert central.atomic
            first = await central.append(0, body, 0)
            assert [b async for _, b in central.read(0, 0)] == pieces(body, central.limit) and first > 8
            with pytest.raises(Fenced):
                await central.append(0, body, first - 1)
            assert await central.last(0) == first
            central.atomic = False  # a server before 2.12: piece by piece, each fenced on the one before
            second = await central.append(0, body, first)
            assert b"".join([b async for _, b in central.read(0, first)]) == body and second == 2 * first
        finally:
            await nc.close()

    with NatsCluster(tmp_path / "nats", size=1, extra_config="max_payload: 8192") as server:
        asyncio.run(commits(server.url(0)))
