"""The forward sink: node relays forwarding their journals to a central relay, exactly once end to
end through restarts of either side (real relay processes, real publisher processes, loopback TCP),
and its send window's rules without sockets."""
from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgpack
import orjson
import pytest

from conftest import RelayProcess, finish, free_port, read_jsonl, start_publisher, wait_for
from relay.forward.lines import non_finite
from relay.forward.sender import Forwarder
from relay.forward.window import STALL_S, ForwardWindow
from relay.wire.curve import load_secret
from relay.wire.encoding import array_header
from relay.wire.lines import encode_line
from sinks.events import RELAY_RANK
from test_curve import keygen

pytestmark = pytest.mark.timeout(180)

WARNING = "has acknowledged nothing for"


@pytest.fixture
def relay_at(relays, tmp_path: Path):
    """Factory: relay_at(name, args, address=None) -> a started relay (conftest's ``relays``) whose
    log is NAME.log, so each relay's lines can be read apart."""

    def make(name: str, args: list[str], address: str | None = None) -> RelayProcess:
        relay = relays(args, address=address, start=False)
        relay.log = tmp_path / f"{name}.log"
        return relay.start()

    return make


def journal_events(directory: Path, live: bool = False) -> dict[tuple[str, int, int], list[dict]]:
    """(run, rank, seq) -> every line holding it, over a directory journal's run files. ``live``: a
    relay may be writing, so a last line without its newline yet is not read (at rest, every line is)."""
    found: dict[tuple[str, int, int], list[dict]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        if not path.name.startswith("_"):
            for event in read_jsonl(path, live):
                found.setdefault((event["run"], event["rank"], event["seq"]), []).append(event)
    return found


def count(directory: Path) -> int:
    """Lines of ranks (not the relay's own: a central derives those itself) in a directory journal a
    relay may be writing."""
    return sum(len(lines) for (_, rank, _), lines in journal_events(directory, live=True).items()
               if rank != RELAY_RANK)


def forwardable(*nodes: Path) -> dict[tuple[str, int, int], dict]:
    """What the central must hold: every node's events but the relay's own rank, each once."""
    out = {}
    for node in nodes:
        for key, lines in journal_events(node).items():
            assert len(lines) == 1, f"{key} is {len(lines)} times in the node journal {node}"
            if key[1] != RELAY_RANK:
                out[key] = lines[0]
    return out


def assert_exactly_once(central: Path, *nodes: Path) -> int:
    """The central journal holds each node event exactly once, field for field, and nothing else
    (but what it derived itself, as the relay's own rank)."""
    expected = forwardable(*nodes)
    got = {key: lines for key, lines in journal_events(central).items() if key[1] != RELAY_RANK}
    twice = {key: len(lines) for key, lines in got.items() if len(lines) > 1}
    assert not twice, f"duplicated at the central: {dict(list(twice.items())[:5])}"
    assert got.keys() == expected.keys(), (f"missing at the central: {sorted(expected.keys() - got.keys())[:5]}; "
                                           f"not from a node: {sorted(got.keys() - expected.keys())[:5]}")
    assert all(got[key][0] == event for key, event in expected.items()), "an event changed on the way"
    return len(expected)


def forward_args(journal: Path, central: str, *extra: str) -> list[str]:
    return ["--path", f"{journal}/", "--sink", "forward", "--to", central, "--stats-interval", "0.2", *extra]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def forward_counters(node: RelayProcess, journal: Path) -> dict:
    return node.stats(journal)["sinks"]["forward"].get("sink", {})  # ({} until the first report)


@pytest.mark.slow
def test_two_nodes_into_a_central_killed_and_restarted_mid_run_exactly_once(relay_at, tmp_path):
    """The issue's test: two node relays, two publisher processes each (one four-rank job across
    both nodes), the central relay SIGKILLed mid-run and started again on the same journal."""
    central_dir = tmp_path / "central-journal"
    central = relay_at("central", ["--path", f"{central_dir}/"])
    dirs = [tmp_path / "node-a-journal", tmp_path / "node-b-journal"]
    nodes = [relay_at(f"node-{n}", forward_args(d, central.address))
             for n, d in zip("ab", dirs, strict=True)]
    pubs = [start_publisher(nodes[rank // 2].address, "multinode", rank, 3000, world_size=4, rate=500,
                            flush_timeout=60) for rank in range(4)]
    wait_for(lambda: count(central_dir) > 1000, 60, "the central journaled the first events")
    central.kill()  # SIGKILL: nothing flushed, no acks for what was in flight
    before = count(central_dir)
    time.sleep(1.5)  # the ranks go on publishing; the nodes journal and hold what they forward
    central = relay_at("central", ["--path", f"{central_dir}/"], address=central.address)
    stats = [finish(p, 120) for p in pubs]
    assert all(s["left"] == 0 and s["dropped"] == 0 for s in stats), stats
    total = 4 * 3002  # each rank's hello, 3,000 metrics and its closing stats
    wait_for(lambda: count(central_dir) >= total, 90, "every event reached the central journal")
    for node in nodes:
        assert node.stop() == 0
    assert central.stop() == 0
    assert before < total
    assert assert_exactly_once(central_dir, *dirs) == total
    for node, d in zip(nodes, dirs, strict=True):
        counters = forward_counters(node, d)
        assert counters["acked"] >= 2 * 3002 - counters["skipped_acked"] and counters["held"] == 0, counters


@pytest.mark.slow  # a fault scenario through relay processes
def test_node_relay_killed_mid_run_still_exactly_once(relay_at, tmp_path):
    central_dir, node_dir = tmp_path / "central-journal", tmp_path / "node-journal"
    central = relay_at("central", ["--path", f"{central_dir}/"])
    node = relay_at("node", forward_args(node_dir, central.address))
    pubs = [start_publisher(node.address, "nodecrash", rank, 2000, world_size=2, rate=400, flush_timeout=60)
            for rank in range(2)]
    wait_for(lambda: count(central_dir) > 600, 60, "the central journaled the first events")
    wait_for(lambda: b'"acked": {"' in _read(node_dir / "_relay_forward.json"), 60,
             "the node's forward state keeps what the central acknowledged")
    node.kill()  # its forward sink's process sees the pipe close and finishes; the new one starts over
    time.sleep(1.0)
    node = relay_at("node", forward_args(node_dir, central.address), address=node.address)
    stats = [finish(p, 120) for p in pubs]
    assert all(s["left"] == 0 and s["dropped"] == 0 for s in stats), stats
    wait_for(lambda: count(central_dir) >= 2 * 2002, 60, "every event reached the central journal")
    wait_for(lambda: forward_counters(node, node_dir)["held"] == 0, 30, "the restarted node holds nothing")
    counters = forward_counters(node, node_dir)
    assert node.stop() == 0 and central.stop() == 0
    assert assert_exactly_once(central_dir, node_dir) == 2 * 2002
    assert counters["skipped_acked"] > 0, f"the restarted node sent the whole journal again: {counters}"


@pytest.mark.slow  # a fault scenario through relay processes
def test_central_down_at_start_gets_everything_later(relay_at, tmp_path):
    central_dir, node_dir = tmp_path / "central-journal", tmp_path / "node-journal"
    central_address = f"tcp://127.0.0.1:{free_port()}"
    node_dir.mkdir()
    derived = {"v": 1, "run": "early", "rank": RELAY_RANK, "local_rank": 0, "world_size": 2, "host": "node7",
               "seq": 0, "ts": time.time(), "type": "lifecycle", "step": None, "epoch": None, "stage": "cluster",
               "data": {"event": "rank_lost", "rank": 1, "silent_s": 9.0, "last_step": 3, "marker": "node-only"}}
    (node_dir / "early.jsonl").write_text(json.dumps(derived) + "\n")  # what the node relay derived itself
    node = relay_at("node", forward_args(node_dir, central_address))
    pubs = [start_publisher(node.address, "early", rank, 500, world_size=2) for rank in range(2)]
    assert all(finish(p)["left"] == 0 for p in pubs)  # the node journals with no central anywhere
    wait_for(lambda: WARNING in node.log.read_text(), 30, "the node said the central does not answer")
    central = relay_at("central", ["--path", f"{central_dir}/"], address=central_address)
    wait_for(lambda: count(central_dir) >= 2 * 502, 60, "everything reached the central when it came up")
    wait_for(lambda: "acknowledges again" in node.log.read_text(), 30, "the node said the central answers")
    counters = forward_counters(node, node_dir)
    assert node.stop() == 0 and central.stop() == 0
    assert assert_exactly_once(central_dir, node_dir) == 2 * 502
    assert "node-only" not in (central_dir / "early.jsonl").read_text()
    assert counters["skipped_relay_rank"] >= 1
    assert node.log.read_text().count(WARNING) == 1


@pytest.mark.slow  # a whole fault scenario through relay processes: the full tier
def test_curve_between_nodes(relay_at, tmp_path):
    """A CURVE central admitting one node's certificate: that node's events arrive; a node without
    the key gets nothing in, and says so."""
    _, server_secret = keygen(tmp_path / "keys", "central")
    node_public, node_secret = keygen(tmp_path / "keys", "node7")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(node_public, allowed)
    central_dir = tmp_path / "central-journal"
    central = relay_at("central", ["--path", f"{central_dir}/", "--curve-cert", str(server_secret),
                                   "--curve-clients", str(allowed)])
    key = load_secret(server_secret)[0].decode()
    good_dir, plain_dir = tmp_path / "good-journal", tmp_path / "plain-journal"
    good = relay_at("good", forward_args(good_dir, central.address, "--curve-server-key", key,
                                         "--curve-client-cert", str(node_secret)))
    plain = relay_at("plain", forward_args(plain_dir, central.address))
    for relay, run in ((good, "secure"), (plain, "plaintext")):
        assert finish(start_publisher(relay.address, run, 0, 300))["left"] == 0
    wait_for(lambda: count(central_dir) >= 302, 30, "the node with the key got its events in")
    wait_for(lambda: WARNING in plain.log.read_text(), 30, "the node without the key said so")
    assert good.stop() == 0 and plain.stop() == 0 and central.stop() == 0
    assert {run for run, _, _ in journal_events(central_dir)} == {"secure"}
    assert assert_exactly_once(central_dir, good_dir) == 302
    line = next(line for line in plain.log.read_text().splitlines() if WARNING in line)
    assert central.address in line and "--curve-server-key" in line


@pytest.mark.parametrize("args, says", [
    ([], "--sink forward needs --to tcp://HOST:PORT"),
    (["--to", "central:5557"], "is not an address to forward to"),
    (["--to", "tcp://127.0.0.1:*"], "needs the central relay's port"),
    (["--to", "tcp://127.0.0.1:5557", "--curve-server-key", "not-a-key"], "is not a CURVE public key"),
])
def test_bad_to_is_a_one_line_usage_error(tmp_path, args, says):
    proc = subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}",
                           "--path", f"{tmp_path}/j/", "--sink", "forward", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("relay: error: ") and says in proc.stderr


# -- the window, without sockets ------------------------------------------------------------------


class Wire:
    """A connection taking (prefix, rows) batches, or refusing them while ``up`` is False."""

    def __init__(self) -> None:
        self.up = True
        self.batches: list[tuple[bytes, list[bytes]]] = []

    def __call__(self, prefix: bytes, rows: list[bytes], count: int) -> bool:
        if self.up:
            self.batches.append((prefix, list(rows)))
        return self.up


def filled(seqs: list[int], key=("r", 0), prefix=b"P", max_events: int = 100) -> ForwardWindow:
    window = ForwardWindow(max_events=max_events, max_bytes=1 << 20)
    stream = window.stream(key)
    for seq in seqs:
        window.hold(key, stream, seq, prefix, bytes([seq]))
    return window


def test_window_sends_once_frees_on_ack_and_resends_after_a_loss():
    window, wire = filled([0, 1, 2, 3]), Wire()
    window.pump(0.0, wire)
    window.pump(0.1, wire)
    assert wire.batches == [(b"P", [b"\0", b"\1", b"\2", b"\3"])]  # sent once, not again while in flight
    window.ack(("r", 0), 2, 0.2)
    assert (window.events, window.acked) == (2, 2)
    window.rewind("connection lost")
    window.pump(0.3, wire)
    assert wire.batches[-1] == (b"P", [b"\2", b"\3"]) and window.resent == 2
    window.pump(0.3 + 2.1, wire)  # no ack within resend_after: sent again
    assert wire.batches[-1] == (b"P", [b"\2", b"\3"]) and window.resent == 4
    window.ack(("r", 0), 4, 3.0)
    assert window.events == 0 and not window.active


def test_the_forwarders_rows_are_the_bytes_encode_row_makes():
    """The forwarder packs rows with msgspec (relay/forward/sender.py), in C: byte for byte what the
    wire's own encode_row makes, for every kind of value a journal line can hold."""
    import msgspec

    from relay.wire.encoding import encode_row
    rng, encode = random.Random(3), msgspec.msgpack.Encoder().encode

    def value(depth: int = 0) -> object:
        kinds = [lambda: rng.randrange(-2**63, 2**64), lambda: rng.randrange(-300, 300), lambda: float("nan"),
                 lambda: rng.random() * 10.0 ** rng.randrange(-5, 300), lambda: rng.choice([True, False, None, -0.0]),
                 lambda: "".join(chr(rng.randrange(1, 0x2000)) for _ in range(rng.randrange(0, 300))),
                 lambda: {str(i) * rng.randrange(1, 40): value(depth + 1) for i in range(rng.randrange(0, 20))},
                 lambda: [value(depth + 1) for _ in range(rng.randrange(0, 20))]]
        return rng.choice(kinds[:6] if depth > 2 else kinds)()

    for _ in range(2000):
        row = (rng.randrange(2**63), rng.random() * 1e9, "metrics", rng.choice([None, rng.randrange(2**63)]),
               rng.choice([None, 1.5, 3]), rng.choice([None, "train"]), {f"k{j}": value() for j in range(rng.randrange(8))})
        assert encode(row) == encode_row(*row), row


def test_holding_a_run_of_seqs_at_once_is_holding_each():
    """ForwardWindow.hold_segment (a rank's consecutive seqs packed in one call, as the forwarder reads
    them) leaves the window as hold for each would: the same events held and sent, the same gaps and
    order of streams, through acks that free a segment in part (after a loss) and rewinds."""
    import msgspec
    encode, decode = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder().decode

    def events(stream) -> list[tuple]:
        return [(first + i, prefix, row) for first, count, prefix, rows in stream.held
                for i, row in enumerate(decode(array_header(count) + rows))]

    rng = random.Random(5)
    for _ in range(300):
        one, many = ForwardWindow(max_events=10**6, max_bytes=1 << 30), ForwardWindow(max_events=10**6, max_bytes=1 << 30)
        wires = Wire(), Wire()
        for t in range(rng.randrange(1, 10)):
            key = ("r", rng.randrange(3))
            s1, s2 = one.stream(key, 5), many.stream(key, 5)
            first = s1.expect + rng.choice([0, 0, 0, 3])
            rows = [(first + i, "x" * rng.randrange(9)) for i in range(rng.randrange(1, 40))]
            for i, row in enumerate(rows):
                one.hold(key, s1, first + i, b"P", encode(row))
            many.hold_segment(key, s2, first, len(rows), b"P", encode(rows)[len(array_header(len(rows))):])
            if rng.random() < 0.3:
                one.pump(float(t), wires[0])
                many.pump(float(t), wires[1])
            if rng.random() < 0.4:
                upto = rng.randrange(first, first + len(rows) + 1)
                one.ack(key, upto, float(t))
                many.ack(key, upto, float(t))
            if rng.random() < 0.1:
                one.rewind("lost")
                many.rewind("lost")
        one.pump(99.0, wires[0])
        many.pump(99.0, wires[1])
        assert (one.events, one.acked, one.resent, list(one.active)) == (many.events, many.acked, many.resent, list(many.active))
        assert b"".join(b"".join(r) for _, r in wires[0].batches) == b"".join(b"".join(r) for _, r in wires[1].batches)
        for key, stream in one.streams.items():
            other = many.streams[key]
            assert (events(stream), stream.gaps, stream.expect, stream.acked) == \
                (events(other), other.gaps, other.expect, other.acked)


def test_window_splits_batches_where_the_envelope_changes_and_stops_when_refused():
    window, wire = filled([0, 1]), Wire()
    stream = window.streams[("r", 0)]
    window.hold(("r", 0), stream, 2, b"Q", b"\2")
    window.pump(0.0, wire)
    assert wire.batches == [(b"P", [b"\0", b"\1"]), (b"Q", [b"\2"])]
    other, down = filled([5]), Wire()
    down.up = False
    other.pump(0.0, down)
    assert other.streams[("r", 0)].sent == 0  # nothing counts as sent while the central is away


def test_window_is_bounded_and_an_ack_beyond_what_it_holds_is_a_floor():
    window = filled([0, 1, 2], max_events=3)
    assert not window.room()
    window.ack(("r", 0), 10, 0.0)  # the central had these from an earlier life of this node
    assert window.room() and window.floors() == {("r", 0): 10}


def test_window_releases_events_parked_behind_a_gap_the_node_never_had():
    """Seqs 2..4 are not in the node's journal (the rank dropped them): the central's ack stops at 2
    once its own dedupe lost the rank's loss report (a restart), and would hold 5..7 forever."""
    window, wire = filled([0, 1, 5, 6, 7]), Wire()
    window.pump(0.0, wire)
    window.ack(("r", 0), 2, 0.1)
    assert window.release_stalled(0.1 + STALL_S - 0.5) == []  # not before STALL_S
    assert window.release_stalled(0.1 + STALL_S) == [(("r", 0), 2, 3)]
    assert (window.events, window.unconfirmed, window.floors()) == (0, 3, {("r", 0): 8})


def test_window_releases_events_parked_below_what_the_central_acknowledged_before():
    """A restarted node relay starts from its state file's floor (8); the central, which took the
    rank's loss report from the node's previous connection, acknowledges this one only up to the gap."""
    window, wire = ForwardWindow(max_events=100, max_bytes=1 << 20), Wire()
    stream = window.stream(("r", 0), acked=8)
    for seq in (8, 9):
        window.hold(("r", 0), stream, seq, b"P", bytes([seq]))
    window.pump(0.0, wire)
    window.ack(("r", 0), 2, 0.1)
    assert window.events == 2  # an ack below the floor frees nothing
    assert window.release_stalled(0.1 + STALL_S) == [(("r", 0), 2, 2)]
    assert window.floors() == {("r", 0): 10}


def test_window_does_not_release_what_the_central_simply_has_not_answered():
    window, wire = filled([0, 1, 5, 6]), Wire()
    window.pump(0.0, wire)
    assert window.release_stalled(100.0) == []  # no ack at all: the central may be down
    window.ack(("r", 0), 1, 0.1)
    assert window.release_stalled(100.0) == []  # parked at 1, which the node has and sends again


@pytest.mark.parametrize("layout", ["directory", "file"])
def test_state_file_keeps_what_the_central_acknowledged(relay_at, tmp_path, layout):
    central_dir = tmp_path / "central-journal"
    central = relay_at("central", ["--path", f"{central_dir}/"])
    node_path = tmp_path / ("node-journal" if layout == "directory" else "node.jsonl")
    args = forward_args(node_path, central.address)
    args[1] = f"{node_path}/" if layout == "directory" else str(node_path)
    node = relay_at("node", args)
    assert finish(start_publisher(node.address, "kept", 0, 200))["left"] == 0
    wait_for(lambda: count(central_dir) >= 202, 30, "the central has the run")
    assert node.stop() == 0 and central.stop() == 0
    if layout == "directory":
        state = json.loads((node_path / "_relay_forward.json").read_text())
        assert state["done"] == {"kept": (node_path / "kept.jsonl").stat().st_size}
    else:
        state = json.loads((tmp_path / "node_forward.json").read_text())
        assert state["done"] == {}
    assert state["to"] == central.address and state["acked"] == {"kept": {"0": 202}}
    assert Counter(rank for _, rank, _ in journal_events(central_dir)) == {0: 202}


def test_hand_edited_lines_are_not_forwarded_and_the_rest_arrives_byte_for_byte(relay_at, tmp_path):
    """A node journal the relay did not write alone: lines that are not events are counted and
    logged, never sent (one would make the central refuse a whole batch); every event around them,
    non-finite metrics and nested data included, arrives as the very same line."""
    central_dir, node_dir = tmp_path / "central-journal", tmp_path / "node-journal"
    node_dir.mkdir()

    def event(seq: int, data: dict, **fields) -> dict:
        return {"v": 1, "run": "hand", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": seq,
                "ts": 1.7e9 + seq, "type": "metrics", "step": seq, "epoch": 0.5, "stage": "train", "data": data,
                **fields}

    good = [event(seq, {"loss": 1.0 / (seq + 1)}) for seq in range(1200)]  # more than one chunk of lines
    good[100] = event(100, {"loss": float("nan"), "up": float("inf"), "down": float("-inf")})
    good[700] = event(700, {"config": {"lr": 0.1, "layers": [1, {"n": 2}]}}, type="params")
    short = {"run": "hand", "rank": 1, "seq": 0, "ts": 1.7e9, "type": "metrics", "data": {"x": 1}}  # defaults
    bad = [b"not json at all", b"[1, 2]", orjson.dumps({**event(5000, {}), "v": True}),  # True == 1: same key
           orjson.dumps({**short, "rank": 1.0, "seq": 1}), orjson.dumps({**event(0, {}), "rank": 2, "ts": "soon"}),
           orjson.dumps({**event(0, {}), "rank": 3, "colour": "red"})]
    lines = [encode_line(e) for e in good[:50]] + [orjson.dumps(short) + b"\n", bad[0] + b"\n", bad[1] + b"\n",
                                                   bad[2] + b"\n", bad[3] + b"\n"]
    lines += [encode_line(e) for e in good[50:900]] + [bad[4] + b"\n", bad[5] + b"\n"]
    lines += [encode_line(e) for e in good[900:]]
    (node_dir / "hand.jsonl").write_bytes(b"".join(lines))
    central = relay_at("central", ["--path", f"{central_dir}/"])
    node = relay_at("node", forward_args(node_dir, central.address))
    wait_for(lambda: count(central_dir) >= 1201, 60, "every event reached the central")
    stats = node_dir / "_relay_stats.json"
    wait_for(lambda: stats.exists() and forward_counters(node, node_dir).get("acked") == 1201, 30, "all acknowledged")
    counters = forward_counters(node, node_dir)
    assert node.stop() == 0 and central.stop() == 0
    assert counters["bad_lines"] == len(bad) and counters["forwarded"] == 1201, counters
    assert counters["not_sent"] == counters["errors"] == 0, counters
    central_lines = (central_dir / "hand.jsonl").read_bytes().splitlines(keepends=True)
    assert sorted(line for line in central_lines if b'"rank":0,' in line) == sorted(encode_line(e) for e in good)
    assert [json.loads(line) for line in central_lines if b'"rank":1,' in line] == [
        {"v": 1, "local_rank": 0, "world_size": 1, "host": "", "step": None, "epoch": None, "stage": None, **short}]
    assert node.log.read_text().count("is not an event and is not forwarded") == len(bad)


def test_non_finite_metrics_are_sent_as_the_floats_the_rank_sent(tmp_path):
    """The journal keeps NaN and infinities as strings; the forwarder sends floats, as the rank did,
    so the central's own consumers (its cluster events) see numbers, and its journal the same line."""
    (tmp_path / "nan.jsonl").write_bytes(b"".join(encode_line(
        {"v": 1, "run": "nan", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "seq": seq, "ts": 1.7e9,
         "type": kind, "step": seq, "epoch": None, "stage": "rank", "data": data})
        for seq, (kind, data) in enumerate([("metrics", {"step_time": float("nan"), "up": float("inf")}),
                                            ("lifecycle", {"note": "NaN"}), ("metrics", {"step_time": 0.5})])))
    forwarder = Forwarder(tmp_path, "tcp://127.0.0.1:1", server_key=None, client_cert=None, max_events=100)
    forwarder.notify({"nan"})
    forwarder._read(0.0)  # (reading needs no connection: the rows wait in the window)
    rows = [row for _, count, _, packed in forwarder.window.streams[("nan", 0)].held
            for row in msgpack.unpackb(array_header(count) + packed)]
    assert [row[0] for row in rows] == [0, 1, 2]
    assert math.isnan(rows[0][6]["step_time"]) and rows[0][6]["up"] == math.inf
    assert rows[1][6] == {"note": "NaN"} and rows[2][6] == {"step_time": 0.5}  # only metrics are restored


@pytest.mark.parametrize(("metric", "found"), [(float("nan"), True), (float("inf"), True),
                                               (float("-inf"), True), (0.5, False)])
def test_the_letter_first_look_for_non_finite_metrics_misses_none(metric: float, found: bool) -> None:
    """relay/forward/lines.py looks for the letters N and I before the words: each way the journal
    writes a non-finite metric is still found, in a line that has other capitals too."""
    line = encode_line({"v": 1, "run": "NIGHTLY", "rank": 0, "local_rank": 0, "world_size": 1,
                        "host": "NODE-I", "seq": 0, "ts": 1.7e9, "type": "metrics", "step": 1,
                        "epoch": None, "stage": None, "data": {"Loss": metric}})
    assert non_finite(line) is found, line
