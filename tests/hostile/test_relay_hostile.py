"""Hostile input over real sockets against a real relay: each class of issue 9 either is handled
or rejected with a counted reason, the relay stays up with bounded memory, and a good publisher
running beside the attack still has every event journaled exactly once and acknowledged. The
attackers here hold the user's relay secret (a process of the job's own user, or one that stole
it): without it nothing they send gets past the handshake (tests/hostile/test_local_peer.py)."""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import zmq

from conftest import ROOT, raw_socket, read_jsonl, wait_for
from relay.client.publisher import Publisher
from relay.daemon.bounds import RunBudget
from relay.wire import encoding, schema
from sinks.events import ENVELOPE, EVENT_TYPES, FIELDS, RELAY_RANK

EDGE_INTS = [0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
EDGE_FLOATS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0]
EDGE_OTHERS = ["", "x" * 200_000, True, None, [], {}, [[[]]], {"a": {"b": [1, {"c": None}]}}, b"\x00\xff"]
EDGES = EDGE_INTS + EDGE_FLOATS + EDGE_OTHERS


def _event(**over: object) -> dict:
    event = {"v": 1, "run": "hostile", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": 0,
             "ts": time.time(), "type": "metrics", "step": 1, "epoch": 0.5, "stage": "train", "data": {"x": 1.0}}
    event.update(over)
    return event


def _hostile_frames() -> list[bytes]:
    """Every envelope field and every event type's data at the edges of its type."""
    frames = []
    seq = iter(range(10**6))
    for field in FIELDS:
        if field in ("v", "run"):
            continue  # covered by the malformed-frame test; here, runs stay apart by rank
        for value in EDGES:
            frames.append(encoding.encode_frame([_event(**{"rank": 1, "seq": next(seq), field: value})]))
    for kind in sorted(EVENT_TYPES):
        for value in EDGES:
            for key in ("dropped", "dropped_upto", "event", "status", "x"):
                frames.append(encoding.encode_frame([_event(rank=2, seq=next(seq), type=kind, data={key: value})]))
    # The stats event that stopped the relay: its floor went past what an ack can carry.
    frames.append(encoding.encode_frame([_event(rank=3, seq=5, type="stats", data={"dropped_upto": 2**64 - 1})]))
    frames.append(encoding.encode_frame([_event(rank=3, seq=2**63 - 1, type="stats", data={"dropped_upto": 2**63 - 2})]))
    frames.append(encoding.encode_frame([_event(rank=3, seq=2**64 - 1)]))
    return frames


def _acked(sock: zmq.Socket, ack: tuple[str, int, int], wait: float) -> bool:
    """Whether the relay sends ``sock`` the ack ``ack`` within ``wait`` seconds (returns once it does).
    The relay reads a connection's frames in order: the ack of a last frame says it read the others."""
    deadline = time.monotonic() + wait
    while sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
        if ack in schema.decode_ack(sock.recv()):
            return True
    return False


def _stats(journal: Path) -> dict:
    """The relay's stats file beside ``journal`` (for a folder of runs: ``folder / "_relay.jsonl"``),
    no counters until it first writes one."""
    try:
        return json.loads(journal.with_name(journal.stem + "_stats.json").read_text())
    except FileNotFoundError:
        return {"rejected": {}, "frames": 0}


def test_extreme_values_never_stop_the_relay_and_every_reader_survives_the_journal(relays, tmp_path, zmq_context):
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    pub = Publisher("good", 0, address=relay.address)
    frames = _hostile_frames()
    for i, frame in enumerate(frames):
        raw.send(frame)
        if i % 50 == 0:
            pub.publish("metrics", {"i": i}, step=i, stage="train")
    raw.send(encoding.encode_frame([_event(run="read", seq=0)]))  # its ack: the relay read every frame before it
    assert _acked(raw, ("read", 0, 1), 120), relay.log.read_text()[-3000:]
    assert pub.close(20) == 0, pub.stats
    assert relay.proc.poll() is None, relay.log.read_text()[-3000:]
    assert relay.stop() == 0
    counters = _stats(journal)
    events = read_jsonl(journal)
    hostile = [e for e in events if e["run"] == "hostile"]
    # One event per hostile frame: each was journaled, rejected with a reason, or a duplicate.
    assert len(hostile) + counters["rejected_total"] + counters["duplicates"] == len(frames)
    assert "internal_error" not in counters["rejected"], counters["rejected"]
    assert counters["rejected"]["bad_value"] > 0 and counters["rejected"]["bad_type"] > 0
    for event in hostile:  # what was taken is what every reader can read
        assert 0 <= event["ts"] <= schema.MAX_TS and 0 <= event["seq"] <= schema.MAX_SEQ
    good = [e["data"]["i"] for e in events if e["run"] == "good" and e["type"] == "metrics"]
    assert good == list(range(0, len(frames), 50))

    tail = subprocess.run([sys.executable, "-m", "relay", "tail", "-n", "100000", str(journal)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == len(events), tail.stderr[-2000:]
    copy = tmp_path / "replayed.jsonl"
    replay = subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", "jsonl",
                             "--path", str(copy)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert read_jsonl(copy) == events
    aim = subprocess.run([sys.executable, "-m", "relay", "replay", str(journal), "--sink", "aim",
                          "--repo", str(tmp_path / "aim")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert aim.returncode == 0 and f"read {len(events)} events from 1 files: replayed into aim" in aim.stderr, aim.stderr[-3000:]


def test_an_unforeseen_error_in_one_frame_is_dead_lettered_and_ingest_goes_on(relays, tmp_path, zmq_context):
    """A run whose journal file cannot be read (here: it is a directory) makes the relay's journal
    scan raise inside ingest: the frame is counted as internal_error and kept, the relay goes on."""
    journal = tmp_path / "journal"
    (journal / "broken.jsonl").mkdir(parents=True)
    relay = relays(["--path", f"{journal}/", "--stats-interval", "0.2"])
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    raw.send(encoding.encode_frame([_event(run="broken")]))
    pub = Publisher("good", 0, address=relay.address)
    for i in range(100):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.close(20) == 0
    wait_for(lambda: _stats(journal / "_relay.jsonl")["rejected"], 120, "the relay read the broken run's frame")
    assert relay.stop() == 0
    counters = json.loads((journal / "_relay_stats.json").read_text())
    assert counters["rejected"] == {"internal_error": 1}
    dead = read_jsonl(journal / "_relay_deadletter.jsonl")
    assert dead[0]["reason"] == "internal_error" and "IsADirectoryError" in dead[0]["detail"]
    assert "Traceback" in relay.log.read_text()
    assert len([e for e in read_jsonl(journal / "good.jsonl") if e["type"] == "metrics"]) == 100


def _rss_mib(proc: subprocess.Popen) -> float:
    return psutil.Process(proc.pid).memory_info().rss / 2**20


@pytest.mark.parametrize("mode", ["open", "secret"])
def test_a_message_is_bounded_as_a_whole_not_part_by_part(relays, tmp_path, monkeypatch, mode, zmq_context):
    """Parts of at most MAXMSGSIZE each, but as many as the peer likes: ZeroMQ would buffer gigabytes.
    The relay drops every connection past --max-memory; the good publisher resends and loses nothing.
    Four rounds of 400 MiB on an --open relay; one on a relay as it runs by default, whose rebound
    socket must take the secret's clients back (encrypting 400 MiB costs the attacker seconds)."""
    if mode == "open":
        monkeypatch.setenv("RELAY_OPEN", "1")
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2", "--max-memory", "192"])
    pub = Publisher("good", 0, address=relay.address)
    peak = [0.0]
    sampling = True

    def sample() -> None:
        while sampling:
            peak[0] = max(peak[0], _rss_mib(relay.proc))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    ctx = zmq_context
    ctx.setsockopt(zmq.LINGER, 0)
    part = b"\x00" * (1 << 20)
    rounds = 4 if mode == "open" else 1
    stats = journal.with_name("j_stats.json")
    try:
        for round_ in range(rounds):  # 400 MiB offered each, against a 192 MiB ceiling
            attacker = raw_socket(ctx, relay.address, SNDHWM=0)
            for _ in range(399):
                attacker.send(part, zmq.SNDMORE)
            attacker.send(part)
            for i in range(50):
                pub.publish("metrics", {"i": round_ * 50 + i}, step=round_ * 50 + i)
            wait_for(lambda round_=round_: json.loads(stats.read_text())["memory_resets"] > round_
                     if stats.exists() else False, 60, "every connection dropped")
            attacker.close(0)
        small = raw_socket(ctx, relay.address)
        small.send_multipart([b"two", b"parts"])
        assert pub.close(30) == 0, pub.stats
    finally:
        sampling = False
        sampler.join()
    assert relay.proc.poll() is None, relay.log.read_text()[-3000:]
    assert relay.stop() == 0
    counters = _stats(journal)
    assert counters["memory_resets"] >= rounds
    assert counters["rejected"].get("multipart", 0) >= 1
    assert peak[0] < 192 + 200, f"relay RSS peaked at {peak[0]:.0f} MiB"
    got = [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"]
    assert sorted(got) == list(range(rounds * 50)) and len(got) == len(set(got))


def _open_files(proc: subprocess.Popen) -> int:
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def test_thousands_of_run_ids_neither_exhaust_files_nor_starve_other_clients(relays, tmp_path, zmq_context):
    journal = tmp_path / "runs"
    relay = relays(["--path", f"{journal}/", "--stats-interval", "0.2", "--run-rate", "100000",
                    "--max-runs", "500"])
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    pub = Publisher("good", 0, address=relay.address)
    most_files = 0
    for i in range(3000):
        raw.send(encoding.encode_frame([_event(run=f"flood-{i}", seq=0)]))
        if i % 100 == 0:
            pub.publish("metrics", {"i": i // 100}, step=i)
            most_files = max(most_files, _open_files(relay.proc))
    assert pub.close(30) == 0, pub.stats
    wait_for(lambda: len(list(journal.glob("flood-*.jsonl"))) == 3000, 30)  # the raw frames are not acked
    most_files = max(most_files, _open_files(relay.proc))
    assert relay.stop() == 0
    counters = json.loads((journal / "_relay_stats.json").read_text())
    assert counters["runs_evicted"] >= 2500 - 1, counters
    assert most_files < 128 + 64, most_files
    assert len(list(journal.glob("flood-*.jsonl"))) == 3000
    assert len([e for e in read_jsonl(journal / "good.jsonl") if e["type"] == "metrics"]) == 30


def test_a_flood_of_new_runs_from_one_peer_is_refused_and_counted(relays, tmp_path, zmq_context):
    journal = tmp_path / "runs"
    relay = relays(["--path", f"{journal}/", "--stats-interval", "0.2", "--run-rate", "20"])
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    began = time.monotonic()
    for i in range(500):
        raw.send(encoding.encode_frame([_event(run=f"flood-{i}", seq=0)]))
    # Sent is not received: on a busy machine the handshake alone can outlast the rest of the test.
    wait_for(lambda: _stats(journal / "_relay.jsonl")["frames"] >= 500, 120, "the relay read the 500 frames",
             lambda: str(_stats(journal / "_relay.jsonl")))
    refilled = (time.monotonic() - began) * 20 / 60  # at most: the relay met them all within this time
    pub = Publisher("good", 0, address=relay.address)  # its own connection, its own budget
    for i in range(20):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.close(20) == 0
    assert relay.stop() == 0
    counters = json.loads((journal / "_relay_stats.json").read_text())
    refused = counters["rejected"].get("run_rate", 0)
    assert 500 - 20 - refilled <= refused <= 500 - 20, (counters["rejected"], refilled)  # a burst of 20, and the refill
    assert len(list(journal.glob("flood-*.jsonl"))) == 500 - refused
    assert Counter(d["reason"] for d in read_jsonl(journal / "_relay_deadletter.jsonl")) == {"run_rate": refused}


def test_a_connections_budget_of_new_runs_refills_at_its_rate_a_minute():
    """The flood above meets the burst; the refill, which a busy machine stretches, is the bucket's own
    (clock-free, milliseconds)."""
    budget = RunBudget(20)
    assert [budget.admit(b"a", 1, 100.0) for _ in range(21)] == [True] * 20 + [False]
    assert budget.admit(b"b", 20, 100.0)  # each connection its own
    assert not budget.admit(b"a", 1, 102.9) and budget.admit(b"a", 1, 103.0)  # one run per 3 s
    assert not budget.admit(b"a", 2, 106.0)  # one by 106 s: a frame starting two is refused and takes none
    assert budget.admit(b"a", 2, 109.0)
    assert not budget.admit(b"a", 21, 10_000.0) and budget.admit(b"a", 20, 10_000.0)  # never more than the rate


@pytest.mark.parametrize("claimed", [10**12, 2**63 - 1])
def test_a_spoofed_drop_report_cannot_make_the_relay_discard_real_events(relays, tmp_path, claimed, zmq_context):
    """Another connection claims the real rank dropped everything up to ``claimed``. Before, the
    relay moved the rank's floor there and threw the real events away as duplicates."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    pub = Publisher("victim", 0, address=relay.address, resend_after=0.5)
    for i in range(100):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.flush(20) == 0
    ctx = zmq_context
    spoof = raw_socket(ctx, relay.address)
    spoof.send(encoding.encode_frame([_event(run="victim", rank=0, seq=claimed, type="stats", stage="client",
                                           data={"dropped": claimed, "dropped_upto": claimed - 1})]))
    # The spoof is read (and refused: the rank is another live connection's) before the real events go on.
    wait_for(lambda: _stats(journal)["rejected"].get("not_owner"), 60, "the spoofed report read", relay.log_tail)
    for i in range(100, 300):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.close(20) == 0, pub.stats
    assert relay.stop() == 0
    events = [e for e in read_jsonl(journal) if e["run"] == "victim"]
    assert [e["data"]["i"] for e in events if e["type"] == "metrics"] == list(range(300))
    seqs = [e["seq"] for e in events if e["seq"] != claimed]
    assert seqs == list(range(len(seqs))), "every real event exactly once, in order"
    assert _stats(journal)["rejected"] == {"not_owner": 1}


def test_no_client_may_publish_as_the_relay(relays, tmp_path, zmq_context):
    """RELAY_RANK numbers the relay's own events: a frame claiming it, in any form, is rejected whole
    (``reserved_rank``), so it can neither collide with nor pose as what the relay derives."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    raw = raw_socket(ctx, relay.address)
    spoofed = _event(run="shared", rank=RELAY_RANK, world_size=2, stage="cluster", data={"slowest_rank": 1})
    row = encoding.encode_row(1, time.time(), "metrics", 1, None, "cluster", {"slowest_rank": 1})
    frames = [encoding.encode_frame([spoofed]),
              encoding.compact_frame(encoding.compact_prefix({k: spoofed[k] for k in ENVELOPE}), [row]),
              encoding.encode_frame([_event(run="shared", rank=0, world_size=2, seq=1000), spoofed])]
    for frame in frames:
        raw.send(frame)
    stats = journal.with_name("j_stats.json")
    wait_for(lambda: stats.exists() and relay.stats(journal)["rejected"].get("reserved_rank") == len(frames), 30,
             "the frames rejected")
    pubs = [Publisher("shared", rank, world_size=2, address=relay.address) for rank in (0, 1)]
    for pub in pubs:
        pub.publish("metrics", {"step_time": 0.1}, step=1, stage="rank")
    assert all(pub.close(20) == 0 for pub in pubs)
    assert relay.stop() == 0
    assert relay.stats(journal)["rejected"] == {"reserved_rank": len(frames)}
    events = read_jsonl(journal)
    ours = [e for e in events if e["rank"] == RELAY_RANK]
    assert [(e["seq"], e["type"], e["host"]) for e in ours] == [(0, "metrics", socket.gethostname())]
    assert ours[0]["data"]["ranks"] == 2 and not [e for e in events if e["seq"] == 1000]
    dead = read_jsonl(journal.with_name("j_deadletter.jsonl"))
    assert [d["reason"] for d in dead] == ["reserved_rank"] * len(frames)


def test_a_genuine_drop_report_still_moves_the_floor_for_its_own_connection():
    """The same claim made by the connection that dropped the events: acks go on past the gap."""
    from relay.journal.dedupe import RankState

    state = RankState()
    assert all(state.take(s, b"real") for s in range(5))
    assert state.take(9, b"real") and state.floor == 5
    state.skip_to(9, b"real")  # it dropped 5..8 before they were ever sent
    assert state.floor == 10 and state.ack_for(b"real") == 10
    assert not state.take(6, b"real"), "its own claim: a late 6 from it is a duplicate"
    assert state.take(6, b"other"), "another connection's 6 was never seen: taken"
    assert not state.take(6, b"other") and state.ack_for(b"other") == 5
    assert state.take(5, b"other") and state.ack_for(b"other") == 7
    assert not state.take(5, b"other") and not state.take(6, b"third"), "taken once, then duplicates for anyone"


def _connect_as(uid: int | None, path: str, bind: bool = False) -> int:
    """Connect to (or ``bind``) a unix socket from a forked child running as ``uid``: 0 if it could,
    else errno."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(path) if bind else sock.connect(path)
        except OSError as exc:
            code = exc.errno or 1
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_embedded_relay_socket_is_private_to_the_job_user(tmp_path):
    """The embedded relay listens on an ipc socket in a 0700 directory: another user cannot connect."""
    from trainer.embedded import EmbeddedRelay

    relay = EmbeddedRelay.start(str(tmp_path / "out"))
    try:
        assert relay.address.startswith("ipc://")
        path = relay.address[len("ipc://"):]
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        assert _connect_as(None, path) == 0
        if os.geteuid() == 0:
            assert _connect_as(65534, path) == 13, "another user (nobody) reached the job's relay"
    finally:
        assert relay.stop() == 0
