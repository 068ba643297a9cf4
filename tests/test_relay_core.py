"""End-to-end behaviour of the relay core: real relay processes, real publishers, real sockets."""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import msgpack
import pytest
import zmq

from conftest import (
    finish,
    free_port,
    line_count,
    plugin_env,
    raw_socket,
    read_jsonl,
    start_publisher,
    wait_for,
)
from relay.client.publisher import Publisher
from relay.wire import encoding, schema
from sinks.events import from_json_metrics


def assert_exactly_once(events: list[dict], expected: dict[tuple[str, int], int]) -> None:
    """Every (run, rank) has metrics i = 0..n-1 exactly once and in order, with seqs unique."""
    seqs: dict[tuple[str, int], list[int]] = defaultdict(list)
    values: dict[tuple[str, int], list[int]] = defaultdict(list)
    for ev in events:
        key = (ev["run"], ev["rank"])
        seqs[key].append(ev["seq"])
        if ev["type"] == "metrics":
            values[key].append(ev["data"]["i"])
    assert set(values) == set(expected)
    for key, n in expected.items():
        assert values[key] == list(range(n)), f"{key}: lost, duplicated or reordered events"
        assert len(seqs[key]) == len(set(seqs[key])), f"{key}: duplicate seq"
        assert seqs[key] == sorted(seqs[key]), f"{key}: seq order broken"


def test_four_publisher_processes_exactly_once(relays, tmp_path):
    out = tmp_path / "logs"
    relay = relays(["--path", f"{out}/"])
    procs = [start_publisher(relay.address, "job-a" if r % 2 else "job-b", r, 1500, world_size=4) for r in range(4)]
    stats = [finish(p) for p in procs]
    assert all(s["left"] == 0 and s["dropped"] == 0 for s in stats)
    assert relay.stop() == 0
    events = read_jsonl(out / "job-a.jsonl") + read_jsonl(out / "job-b.jsonl")
    assert_exactly_once(events, {("job-b", 0): 1500, ("job-a", 1): 1500, ("job-b", 2): 1500, ("job-a", 3): 1500})
    assert all(ev["world_size"] == 4 for ev in events)
    counters = relay.stats(out)
    assert counters["written"] == len(events) and counters["rejected_total"] == 0


def test_sigkill_midstream_and_restart_loses_nothing(relays, tmp_path):
    journal = tmp_path / "journal.jsonl"
    relay = relays(["--path", str(journal)])
    address = relay.address
    procs = [start_publisher(address, "crashy", r, 3000, world_size=2, rate=1500, flush_timeout=60) for r in range(2)]
    wait_for(lambda: line_count(journal) > 0, 30, "the first relay journaled something")
    relay.kill()  # SIGKILL: no flush, no goodbye
    written_before = len(read_jsonl(journal))
    assert 0 < written_before < 6000
    time.sleep(1.0)  # the publishers keep publishing, with no relay
    relay2 = relays(["--path", str(journal)], address=address)
    stats = [finish(p) for p in procs]
    assert all(s["left"] == 0 for s in stats), stats
    assert relay2.stop() == 0
    assert_exactly_once(read_jsonl(journal), {("crashy", 0): 3000, ("crashy", 1): 3000})


def test_publish_without_relay_never_blocks_and_counts_overflow(relays, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher("offline", 0, address=address, max_events=200)
    took = []
    for i in range(1000):  # a publish() that waited for the relay would hang here (no relay yet)
        start = time.perf_counter()
        pub.publish("metrics", {"i": i}, step=i, stage="train")
        took.append(time.perf_counter() - start)
    # The median, not the slowest: on a loaded machine one call in a thousand is descheduled for a time
    # slice or more (15.5 ms at load 16-21, a run of make test-loaded), which says nothing of publish().
    assert statistics.median(took) < 0.001, f"median publish() {statistics.median(took) * 1e3:.3f} ms, slowest {max(took) * 1e3:.2f}"
    wait_for(lambda: pub.dropped >= 800 - 1, 10, "the bounded buffer overflowed")  # on the background thread
    journal = tmp_path / "late.jsonl"
    relay = relays(["--path", str(journal)], address=address)
    assert pub.close(30) == 0
    assert relay.stop() == 0
    events = read_jsonl(journal)
    metrics = [ev["data"]["i"] for ev in events if ev["type"] == "metrics"]
    assert metrics == list(range(1000 - len(metrics), 1000)), "the newest events survive, in order"
    assert len(metrics) >= 150
    reports = [ev["data"] for ev in events if ev["type"] == "stats"]
    assert reports and reports[-1]["dropped"] == pub.dropped
    assert len(metrics) + reports[-1]["dropped"] == 1001  # 1000 metrics + the hello: all accounted for
    assert relay.stats(journal)["client_dropped"] == pub.dropped


def _raw_event(**over) -> dict:
    ev = {"v": 1, "run": "raw", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": 0,
          "ts": time.time(), "type": "metrics", "step": 0, "epoch": None, "stage": "train", "data": {"x": 1.0}}
    ev.update(over)
    return ev


def _deep(levels: int) -> dict:
    d: dict = {"leaf": 1}
    for _ in range(levels):
        d = {"n": d}
    return d


def test_malformed_frames_are_rejected_with_reasons_and_valid_ones_survive(relays, tmp_path, zmq_context):
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    ctx.setsockopt(zmq.LINGER, 0)  # the hostile frame below is never delivered: don't wait for it at exit
    raw = raw_socket(ctx, relay.address)
    pub = Publisher("good", 0, address=relay.address)
    bad_utf8 = b"\x81\xa4data\xa2\xff\xfe"  # {"data": <str with invalid UTF-8>}
    bad_frames = {
        "undecodable": b"\x93\x01\x02\xc1",  # an array whose third item is the never-used byte 0xc1
        "not_event": msgpack.packb(42),
        "missing_field": msgpack.packb({"v": 1, "run": "raw"}),
        "bad_version": msgpack.packb(_raw_event(v=99)),
        "bad_type": msgpack.packb(_raw_event(rank="zero")),
        "too_deep": msgpack.packb(_raw_event(data=_deep(20))),
        "oversize": msgpack.packb(_raw_event(data={"blob": "x" * (schema.MAX_FRAME_BYTES + 10)})),
        "bad_utf8": bad_utf8,
        "bad_run": msgpack.packb(_raw_event(run="../../etc/passwd")),
        "name_too_long": msgpack.packb(_raw_event(data={"k" * 300: 1})),
    }
    for i, frame in enumerate(bad_frames.values()):
        pub.publish("metrics", {"i": i}, step=i, stage="train")
        raw.send(frame)
    noise = os.urandom(64)  # random bytes: whichever rule they break, it is recorded as such
    with pytest.raises(schema.FrameError) as noise_reason:
        schema.decode_frame(noise)
    raw.send(noise)
    raw.send_multipart([b"two", b"parts"])
    hostile = raw_socket(ctx, relay.address)  # beyond the transport bound ZeroMQ drops this connection
    hostile.send(b"\x00" * (schema.MAX_TRANSPORT_BYTES + 1))
    raw.send(encoding.encode_frame([_raw_event(seq=0, data={"ok": 1.0})]))
    for i in range(len(bad_frames), len(bad_frames) + 50):
        pub.publish("metrics", {"i": i}, step=i, stage="train")
    assert pub.close(20) == 0
    expected = dict.fromkeys(bad_frames, 1) | {"multipart": 1}
    expected[noise_reason.value.reason] = expected.get(noise_reason.value.reason, 0) + 1
    # the raw socket's last frame is a good one: once it is journaled, every frame before it was judged
    wait_for(lambda: any(e["run"] == "raw" for e in read_jsonl(journal, live=True)), 30, "the raw good frame")
    wait_for(lambda: sum(relay.stats(journal)["rejected"].values()) >= sum(expected.values()), 30,
             "every bad frame counted in the stats")
    assert relay.proc.poll() is None, "relay must survive bad input"
    assert relay.stop() == 0
    counters = relay.stats(journal)
    assert counters["rejected"] == expected
    dead = read_jsonl(journal.with_name("j_deadletter.jsonl"))
    assert sorted(d["reason"] for d in dead) == sorted(r for r, n in expected.items() for _ in range(n))
    assert all(d["detail"] and d["frame_b64"] is not None for d in dead)
    events = read_jsonl(journal)
    assert [e["data"]["i"] for e in events if e["run"] == "good" and e["type"] == "metrics"] == list(range(60))
    assert [e["data"] for e in events if e["run"] == "raw"] == [{"ok": 1.0}]


def test_non_finite_values_survive_as_valid_json(relays, tmp_path):
    journal = tmp_path / "nan.jsonl"
    relay = relays(["--path", str(journal)])
    pub = Publisher("nanrun", 0, address=relay.address)
    pub.publish("metrics", {"loss": math.nan, "grad_norm": math.inf, "lr": -math.inf, "ok": 0.5,
                            "nested": {"x": math.nan}}, step=1, stage="train")
    assert pub.close(10) == 0
    assert relay.stop() == 0

    def no_constants(token: str) -> None:
        raise AssertionError(f"invalid JSON token {token}")

    lines = [json.loads(line, parse_constant=no_constants) for line in journal.read_text().splitlines()]
    data = [ev["data"] for ev in lines if ev["type"] == "metrics"][0]
    assert data == {"loss": "NaN", "grad_norm": "Infinity", "lr": "-Infinity", "ok": 0.5, "nested": {"x": "NaN"}}
    back = from_json_metrics(data)
    assert math.isnan(back["loss"]) and back["grad_norm"] == math.inf and back["lr"] == -math.inf
    if shutil.which("jq"):
        out = subprocess.run(["jq", "-c", "select(.type == \"metrics\") | .data.loss", str(journal)],
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == '"NaN"'


def test_failing_plugin_sink_is_isolated_and_counted(relays, tmp_path):
    env = plugin_env(tmp_path)
    journal = tmp_path / "iso.jsonl"
    collected = tmp_path / "collected.jsonl"
    relay = relays(["--sink", "explode", "--sink", "collect", "--path", str(journal),  # journal implied
                    "--collect-file", str(collected), "--stats-interval", "0.2", "--shutdown-timeout", "5"], env=env)
    finish(start_publisher(relay.address, "iso", 0, 2000))
    # other sinks write while ingest is idle, not only at shutdown (a wait: the sink processes' start-up
    # alone took over 10 s on a loaded machine), and the failing one has failed by then
    wait_for(lambda: line_count(collected) >= 2000, 120, "the collect sink has every event")
    wait_for(lambda: relay.stats(journal)["sinks"]["explode"]["errors"] >= 1, 120, "the explode sink failed")
    assert relay.stop() == 0
    assert_exactly_once(read_jsonl(journal), {("iso", 0): 2000})
    assert len(read_jsonl(collected)) == len(read_jsonl(journal))
    sinks = relay.stats(journal)["sinks"]
    assert sinks["explode"]["written"] == 0
    # retried with exponential backoff from 0.1 s, not at the rate batches arrive (every 50 ms)
    assert 1 <= sinks["explode"]["errors"] <= 12, sinks["explode"]
    assert sinks["collect"]["errors"] == 0 and sinks["collect"]["written"] == sinks["jsonl"]["written"]
    assert "this sink always fails" in relay.log.read_text()
    # at shutdown: the sink that never took a batch is named, with every event of the journal lacking
    stats = relay.stats(journal)
    assert sinks["collect"]["complete"] and not sinks["explode"]["complete"]
    assert stats["behind"] == {"explode": len(read_jsonl(journal))}
    assert stats["replay"] == ["relay", "replay", str(journal), "--sink", "explode"]


def _received(relay, journal: Path) -> int:
    try:
        return relay.stats(journal)["events"]
    except (FileNotFoundError, ValueError):
        return 0


def test_sigterm_flushes_and_exits_zero(relays, tmp_path):
    journal = tmp_path / "t.jsonl"
    relay = relays(["--path", str(journal), "--flush-interval", "5", "--stats-interval", "0.1"])
    pub = Publisher("term", 0, address=relay.address)
    for i in range(100):
        pub.publish("metrics", {"i": i}, step=i, stage="train")
    # received, not yet flushed (5 s interval)
    wait_for(lambda: _received(relay, journal) >= 101, 10, "the relay received every event")
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(100))
    assert "final:" in relay.log.read_text()
    pub.close(0.5)


def test_ipc_address_and_ack_after_restart_without_duplicates(relays, tmp_path):
    journal = tmp_path / "ipc.jsonl"
    address = f"ipc://{tmp_path}/r.sock"
    relay = relays(["--path", str(journal)], address=address)
    pub = Publisher("ipcrun", 1, world_size=2, address=address)
    for i in range(10):
        pub.publish("metrics", {"i": i}, step=i, stage="train")
    assert pub.flush(10) == 0
    assert relay.stop() == 0
    for i in range(10, 20):
        pub.publish("metrics", {"i": i}, step=i, stage="train")
    relay = relays(["--path", str(journal)], address=address)
    assert pub.close(20) == 0
    assert relay.stop() == 0
    assert_exactly_once(read_jsonl(journal), {("ipcrun", 1): 20})


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_idle_run_is_forgotten_and_rebuilt_from_journal(relays, tmp_path, layout, zmq_context):
    path = tmp_path / ("one.jsonl" if layout == "file" else "logs")
    relay = relays(["--path", str(path) + ("/" if layout == "dir" else ""), "--forget-after", "1",
                    "--stats-interval", "0.2"])
    events = [_raw_event(run="idle", seq=s, data={"i": s}) for s in range(10)]
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    raw.send(encoding.encode_frame(events[:6]))
    wait_for(lambda: "run idle idle for" in relay.log.read_text(), 15, "the silent run was forgotten")
    raw.send(encoding.encode_frame(events))  # a late resend of everything, plus new ones
    assert schema.decode_ack(raw.recv())[0][2] in (6, 10)
    journal = path if layout == "file" else path / "idle.jsonl"
    wait_for(lambda: line_count(journal) >= 10, 10, "the new events journaled")
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal)] == list(range(10))
    assert relay.stats(path)["duplicates"] == 6


EXIT_SCRIPT = """
import sys
from relay.client.publisher import Publisher
pub = Publisher("exitrun", 0, address=sys.argv[1])
for i in range(50):
    pub.publish("metrics", {"i": i}, step=i, stage="train")
"""


def test_forgotten_close_still_flushes_at_exit_or_warns(relays, tmp_path):
    journal = tmp_path / "exit.jsonl"
    relay = relays(["--path", str(journal)])
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, relay.address], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(50))
    env = dict(os.environ, RELAY_EXIT_FLUSH_TIMEOUT="0.5")
    nobody = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, nobody], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0
    assert "52 events of run exitrun rank 0 were never acknowledged" in done.stderr


def test_replay_into_a_journal_is_idempotent(relays, tmp_path):
    source = tmp_path / "src.jsonl"
    relay = relays(["--path", str(source)])
    finish(start_publisher(relay.address, "rp", 0, 300))
    finish(start_publisher(relay.address, "rp", 1, 300))
    assert relay.stop() == 0
    target = tmp_path / "copy"
    for new in (604, 0):  # the second time the target holds them all: read, and nothing new
        done = subprocess.run([sys.executable, "-m", "relay", "replay", str(source), "--sink", "jsonl",
                               "--path", f"{target}/"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"read 604 events from 1 files: {new} new in the journal {target}, {604 - new} it held already" \
            in done.stderr
    assert sorted(map(json.dumps, read_jsonl(target / "rp.jsonl"))) == sorted(map(json.dumps, read_jsonl(source)))


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB tmpfs, so the journal can run out of space for real (needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_full_disk_holds_acks_then_recovers_without_loss_or_torn_lines(relays, tmp_path, tiny_disk):
    journal = tiny_disk / "full.jsonl"
    filler = tiny_disk / "filler"
    filler.write_bytes(b"x" * (1024 * 1024 - 16 * 1024))  # leaves ~16 KiB: room for a few dozen lines
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    proc = start_publisher(relay.address, "disk", 0, 2000, flush_timeout=60)
    deadline = time.monotonic() + 30
    while "journal write failed" not in relay.log.read_text():
        assert time.monotonic() < deadline, "the journal never failed"
        time.sleep(0.2)
    assert proc.poll() is None, "the client must still be waiting for acks"
    filler.unlink()
    stats = finish(proc)
    assert stats["left"] == 0 and stats["dropped"] == 0
    assert relay.stop() == 0
    assert_exactly_once(read_jsonl(journal), {("disk", 0): 2000})
    assert relay.stats(journal)["journal_errors"] >= 1


def test_reused_run_id_is_refused_not_silently_merged(relays, tmp_path):
    """A second job under a run id the journal holds: refused, never acknowledged, counted and logged
    as an error (tests/test_one_writer.py has the rest: what the client says, relay runs)."""
    journal = tmp_path / "reuse.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    finish(start_publisher(relay.address, "same-id", 0, 20))
    second = finish(start_publisher(relay.address, "same-id", 0, 20, flush_timeout=3))
    assert second["acked"] == 0 and second["left"] == 22  # its hello, 20 metrics, its closing stats
    assert relay.stop() == 0
    assert relay.stats(journal)["rejected"]["conflict"] >= 1
    assert "refused a second writer of run same-id rank 0" in relay.log.read_text()




def test_only_a_lost_connection_makes_the_publisher_resend():
    """Resends follow a lost connection (or a stalled ack), never the connection coming up: on the
    way up nothing was sent (ZMQ_IMMEDIATE), so rewinding then only sent every publisher's first
    frame twice. Real sockets, real monitor events."""
    ctx = zmq.Context()
    relay_side, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = relay_side.bind_to_random_port("tcp://127.0.0.1")
    monitor = client.get_monitor_socket()  # every event, as a test of the filter in _read_monitor
    try:
        client.connect(f"tcp://127.0.0.1:{port}")
        # A frame through the connection: its handshake is done, so its monitor events (connect
        # delayed, connected, handshake succeeded) were all queued on the monitor before it was sent.
        client.send(b"up")
        assert relay_side.poll(10_000) and relay_side.recv_multipart()[1] == b"up"
        assert Publisher._read_monitor(monitor) is False
        relay_side.close(0)
        wait_for(lambda: Publisher._read_monitor(monitor), 10, "the lost connection seen on the monitor")
    finally:
        client.disable_monitor()
        monitor.close(0)
        client.close(0)
        relay_side.close(0)
        ctx.term()


def test_lines_journaled_before_a_failed_write_reach_every_sink_once(relays, tmp_path, tiny_disk):
    """A directory journal where one run's file is on a full disk (a file of a 1 MiB tmpfs bound over
    it): each commit writes run a's lines and fails on run b's. Run a's lines go to the sinks as they
    are written, b's once the disk has room; a plugin sink without catch-up (``collect``) gets every
    journaled line exactly once (relay/journal/journal_queue.py's JournalQueue)."""
    journal, collected = tmp_path / "journal", tmp_path / "collected.jsonl"
    journal.mkdir()
    (journal / "b.jsonl").touch()
    (tiny_disk / "b.jsonl").touch()
    filler = tiny_disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as fh:  # full to its last block
        while True:
            fh.write(b"x" * 4096)
    if subprocess.run(["mount", "--bind", str(tiny_disk / "b.jsonl"), str(journal / "b.jsonl")]).returncode:
        pytest.skip("cannot bind-mount a file here")
    try:
        relay = relays(["--path", f"{journal}/", "--sink", "collect", "--collect-file", str(collected),
                        "--stats-interval", "0.2"], env=plugin_env(tmp_path))
        b = start_publisher(relay.address, "b", 0, 300, flush_timeout=60)
        a = start_publisher(relay.address, "a", 0, 600, rate=300, flush_timeout=60)
        wait_for(lambda: "journal write failed" in relay.log.read_text() and line_count(journal / "a.jsonl") >= 300,
                 60, "run a journaled while run b's file is full")
        assert line_count(journal / "b.jsonl") == 0 and b.poll() is None, "b waits for its acks"
        filler.unlink()
        assert finish(a)["left"] == 0 and finish(b)["left"] == 0
        wait_for(lambda: line_count(collected) >= 900, 60, "the sink has every journaled line")
        assert relay.stop() == 0
        journaled = read_jsonl(journal / "a.jsonl") + read_jsonl(journal / "b.jsonl")
    finally:
        subprocess.run(["umount", str(journal / "b.jsonl")], check=False)
    assert_exactly_once(journaled, {("a", 0): 600, ("b", 0): 300})
    got = sorted((e["run"], e["rank"], e["seq"]) for e in read_jsonl(collected))
    assert got == sorted((e["run"], e["rank"], e["seq"]) for e in journaled), "each journaled line once"
    stats = relay.stats(journal / "")
    assert stats["journal_errors"] >= 1 and stats["sinks"]["collect"]["written"] == stats["sinks"]["jsonl"]["written"] == len(journaled)
