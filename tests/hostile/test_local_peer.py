"""What a local peer can and cannot do to a relay (docs/security.md), each claim tried for real: a
real relay process, real ZeroMQ sockets, a raw DEALER playing the peer.

A TCP relay takes nothing from a peer without the user's secret (relay/daemon/gate.py): such a peer
can neither pre-claim a run nor forge a rank's stats, learn run ids or stand in for a stopped relay.
A peer holding the secret (a process of the same user) is held to the ownership rules: a (run, rank)
stream belongs to the session sending it, whatever order the relay learns of connections ending
in. Files are the user's alone; drop accounting survives a restart; what ``--open`` gives up is
shown, and that ipc:// in a 0700 directory and explicit CURVE certificates close it too."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
import zmq
from test_relay_hostile import _acked, _connect_as, _event

from conftest import free_port, raw_socket, read_jsonl, wait_for
from relay.client.publisher import Publisher
from relay.daemon.status import STATUS_REQUEST
from relay.wire import encoding, schema, secret
from relay.wire.curve import load_secret
from test_curve import keygen


def _stats(journal: Path) -> dict:
    """The relay's stats file beside ``journal`` (empty until it first writes one)."""
    try:
        return json.loads(journal.with_name(journal.stem + "_stats.json").read_text())
    except FileNotFoundError:
        return {"rejected": {}}


_raw = raw_socket  # a peer holding the user's secret: a process of the job's own user


def _stranger(ctx: zmq.Context, address: str, wrong: bytes | None = None) -> zmq.Socket:
    """A peer without the user's secret: no authentication at all, or CURVE keys of a ``wrong`` secret."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if wrong is not None:
        sock.curve_serverkey = secret.curve_keys(wrong, "relay")[0]
        sock.curve_publickey, sock.curve_secretkey = secret.curve_keys(wrong, "client")
    sock.connect(address)
    return sock


def _acks(sock: zmq.Socket, wait: float) -> list[tuple[str, int, int]]:
    """Every ack the relay sent ``sock`` within ``wait`` seconds."""
    acks = []
    deadline = time.monotonic() + wait
    while sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
        acks.extend(schema.decode_ack(sock.recv()))
    return acks


def _frames(run: str, seqs: range, tag: str) -> list[bytes]:
    return [encoding.encode_frame([_event(run=run, seq=s, data={"i": -1, "who": tag})]) for s in seqs]


def test_forged_events_for_a_live_ranks_coming_seqs_are_refused(relays, tmp_path, zmq_context):
    """The peer reads the run and the next seq off the journal and sends 1,000 forged events for
    them first: while the real client is connected, every one is refused (``not_owner``), never
    acknowledged, and the real events are journaled in their place."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    pub = Publisher("victim", 0, address=relay.address, resend_after=0.5)
    for i in range(100):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.flush(20) == 0
    coming = max(e["seq"] for e in read_jsonl(journal, live=True)) + 1
    ctx = zmq_context
    forger = _raw(ctx, relay.address)
    for frame in _frames("victim", range(coming, coming + 1000), "forger"):
        forger.send(frame)
    wait_for(lambda: _stats(journal)["rejected"].get("not_owner") == 1000, 30, "the forged frames refused")
    for i in range(100, 1100):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.close(20) == 0, pub.stats
    assert _acks(forger, 0.5) == [], "the forger was acknowledged"
    assert relay.stop() == 0
    events = [e for e in read_jsonl(journal) if e["type"] == "metrics"]
    assert [e["data"]["i"] for e in events] == list(range(1100))
    assert not [e for e in events if "who" in e["data"]]
    assert _stats(journal)["rejected"] == {"not_owner": 1000}


def test_a_peer_resending_a_duplicate_cannot_take_a_ranks_acks(relays, tmp_path, zmq_context):
    """Before, acks went to whichever connection sent for a rank last: a peer re-sending one
    duplicate in a loop took them, and the real client's flush waited 20 s for acks it never got."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    pub = Publisher("victim", 0, address=relay.address)
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.flush(20) == 0
    ctx = zmq_context
    thief = _raw(ctx, relay.address)
    stop = threading.Event()
    duplicate = _frames("victim", range(1, 2), "thief")[0]

    def resend() -> None:
        while not stop.is_set():
            thief.send(duplicate)
            time.sleep(0.002)

    sender = threading.Thread(target=resend)
    sender.start()
    try:
        for i in range(1, 500):
            pub.publish("metrics", {"i": i}, step=i)
            if i % 50 == 0:
                time.sleep(0.05)
        started = time.monotonic()
        assert pub.flush(20) == 0, pub.stats
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        sender.join()
    assert _acks(thief, 0.3) == []
    assert pub.close(20) == 0  # (once it is gone, its stream is anyone's: docs/security.md)
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(500))
    assert _stats(journal)["rejected"]["not_owner"] > 0


def test_a_stream_passes_to_the_next_connection_once_its_owner_disconnects(relays, tmp_path, zmq_context):
    """Refused while the owner is connected; taken and acknowledged once it is gone."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    first, second = _raw(ctx, relay.address), _raw(ctx, relay.address)
    for frame in _frames("r", range(10), "first"):
        first.send(frame)
    wait_for(lambda: ("r", 0, 10) in _acks(first, 0.2), 20, "the owner acknowledged")
    for frame in _frames("r", range(10, 20), "second"):
        second.send(frame)
    assert _acks(second, 0.5) == []
    first.close(0)

    def resent_and_acknowledged() -> bool:
        for frame in _frames("r", range(10, 20), "second"):
            second.send(frame)
        return ("r", 0, 20) in _acks(second, 0.2)

    wait_for(resent_and_acknowledged, 20, "the next connection acknowledged")
    assert relay.stop() == 0
    events = read_jsonl(journal)
    # each once, from its sender. In arrival order, not seq order: the socket may still count the owner
    # connected when a resend round's seq 10 comes and no longer when its 11 does (docs/relay.md)
    assert sorted((e["seq"], e["data"]["who"]) for e in events) == [(s, "first" if s < 10 else "second")
                                                                     for s in range(20)]
    stats = _stats(journal)
    assert set(stats["rejected"]) == {"not_owner"} and stats["rejected"]["not_owner"] >= 10
    assert stats["owners_released"] == 1


def test_a_connection_that_took_over_a_closed_ones_stream_keeps_it_whatever_the_relay_learns_when(
        relays, tmp_path, zmq_context):
    """Issue 25's race, 50 times on one relay: A sends one event and closes; B connects (usually on
    A's descriptor), sends and stays; once B's event is journaled, C sends a forged event for B's
    next seq. Before, the relay took A's late disconnection report for B's (12 of 20 trials): it
    freed B's stream, sent B no ack, and journaled and acknowledged C's forgery; and a single event
    from a fresh connection was journaled and never acknowledged (3 of 7). Now, every time: A's
    event acknowledged, B acknowledged and owning its stream, C refused and never acknowledged."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2", "--flush-interval", "0.01"])
    ctx = zmq_context
    trials = 50

    def journaled(run: str, seq: int) -> bool:
        return any(e["run"] == run and e["seq"] == seq for e in read_jsonl(journal, live=True))

    for t in range(trials):
        run = f"race-{t}"
        a = _raw(ctx, relay.address)
        a.send(_frames(run, range(1), "a")[0])
        assert _acked(a, (run, 0, 1), 10), f"trial {t}: a single event from a fresh connection never acknowledged"
        a.close(0)
        b = _raw(ctx, relay.address)
        # (resent while the relay still counts A as connected, as a client resends after its ack timeout)
        wait_for(lambda b=b, run=run: b.send(_frames(run, range(1, 2), "b")[0])
                 or _acked(b, (run, 0, 2), 0.2) or journaled(run, 1),
                 20, f"trial {t}: B's event journaled")
        c = _raw(ctx, relay.address)
        c.send(_frames(run, range(2, 3), "c")[0])
        b.send(_frames(run, range(2, 3), "b")[0])
        assert _acked(b, (run, 0, 3), 10), f"trial {t}: the stream's owner not acknowledged"
        assert _acks(c, 0.05) == [], f"trial {t}: the forger was acknowledged"
        b.close(0)
        c.close(0)
    assert relay.stop() == 0
    got = {(e["run"], e["seq"]): e["data"]["who"] for e in read_jsonl(journal)}
    assert got == {(f"race-{t}", s): who for t in range(trials) for s, who in enumerate("abb")}
    stats = _stats(journal)
    assert set(stats["rejected"]) == {"not_owner"} and stats["rejected"]["not_owner"] >= trials


def test_without_the_secret_a_peer_can_neither_pre_claim_a_run_nor_forge_a_ranks_stats(relays, tmp_path, zmq_context):
    """Issue 25: a local process sent for (run, rank) before the real rank did and so owned it (the
    real rank got 0 of 302 acknowledged, or 302 of 302 over 100 forged lines), and a ``stats`` event
    for a rank that had not started set ``client_dropped`` to 10^12. Without the secret, in the clear
    or with another secret's keys, nothing of it is read: refused, counted, dead-lettered."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    forged = _frames("victim", range(100), "forger") + [encoding.encode_frame([_event(
        run="victim", rank=1, seq=5, type="stats", stage="client", data={"dropped": 10**12, "dropped_upto": 4})])]
    strangers = [_stranger(ctx, relay.address), _stranger(ctx, relay.address, b"another user's secret, not ours")]
    for peer in strangers:
        for frame in forged:
            peer.send(frame)
    wait_for(lambda: _stats(journal)["rejected"].get("auth_failed", 0) >= 4, 30, "the strangers refused")
    pub = Publisher("victim", 0, address=relay.address)
    for i in range(300):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.close(20) == 0 and pub.stats["acked"] == 302, pub.stats
    assert all(_acks(peer, 0.2) == [] for peer in strangers)
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert [e["seq"] for e in events] == list(range(302)) and {e["rank"] for e in events} == {0}
    assert not [e for e in events if "who" in e["data"]]
    stats = _stats(journal)
    assert set(stats["rejected"]) == {"auth_failed"} and stats["client_dropped"] == 0 and stats["events"] == 302
    dead = read_jsonl(journal.with_name("j_deadletter.jsonl"))
    assert {d["reason"] for d in dead} == {"auth_failed"} and {d["size"] for d in dead} == {0}


def test_with_the_secret_a_process_of_the_same_user_can_pre_claim_a_run_and_forge_a_ranks_stats(
        relays, tmp_path, zmq_context):
    """Said plainly in docs/security.md: the secret is the boundary, and a process holding it is the
    user's. It can send for a run before the real rank does (here 100 events, then it leaves) and
    report drops for any rank. What it cannot do (issue 44) is make the real rank believe its events
    were journaled: the real rank is refused as a second writer, told why, acknowledged nothing."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq_context
    peer = _raw(ctx, relay.address)
    for frame in _frames("victim", range(100), "forger"):
        peer.send(frame)
    peer.send(encoding.encode_frame([_event(run="victim", rank=1, seq=5, type="stats", stage="client",
                                            data={"dropped": 10**12, "dropped_upto": 4})]))
    assert _acked(peer, ("victim", 0, 100), 10)
    peer.close(0)
    pub = Publisher("victim", 0, address=relay.address, resend_after=0.5)
    for i in range(300):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.close(3) == 302 and pub.stats["acked"] == 0, pub.stats
    assert relay.stop() == 0
    events = [e for e in read_jsonl(journal) if e["rank"] == 0]
    assert [e["data"].get("who") for e in events] == ["forger"] * 100
    assert _stats(journal)["client_dropped"] == 10**12 and _stats(journal)["rejected"]["conflict"] >= 1
    assert "refused a second writer of run victim rank 0" in relay.log.read_text()


def test_a_wrong_secret_is_refused_counted_dead_lettered_and_said_once_on_each_side(relays, tmp_path, monkeypatch,
                                                                                    caplog):
    """A rank given another secret: every try of its link is refused and counted (auth_failed), the
    relay says so in one log line and one dead letter, the client in one log line naming where its
    secret came from; its events are kept and spooled, none journaled."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    monkeypatch.setenv("RELAY_SECRET", "not the secret the relay holds")
    pub = Publisher("misconfigured", 0, address=relay.address, spool_dir=tmp_path / "spool")
    monkeypatch.delenv("RELAY_SECRET")
    for i in range(10):
        pub.publish("metrics", {"i": i}, step=i)
    wait_for(lambda: _stats(journal)["rejected"].get("auth_failed", 0) >= 4, 30, "several tries refused")
    assert pub.close(1) == pub.stats["spooled"] == 12  # hello, 10 metrics, the closing stats
    assert relay.stop() == 0
    assert not journal.exists() or journal.read_bytes() == b""
    assert relay.log.read_text().count("refused a connection") == 1
    assert [d["reason"] for d in read_jsonl(journal.with_name("j_deadletter.jsonl"))] == ["auth_failed"]
    told = [r.getMessage() for r in caplog.records if "refused the handshake" in r.getMessage()]
    assert len(told) == 1 and "$RELAY_SECRET" in told[0], told


class _Proxy:
    """A TCP proxy between a client and the relay whose connections the test can cut, as a network
    blip would: the client reconnects (a new ZeroMQ identity) while the relay stays up."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        conns, self.conns = self.conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.cuts += 1

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_client_whose_connection_drops_is_never_shut_out_of_its_own_stream(relays, tmp_path):
    """Six cuts while it publishes: each time it reconnects as the same session (its routing id),
    keeps its stream and resends; nothing is lost, duplicated or refused, and the stream never
    changes hands."""
    journal = tmp_path / "j.jsonl"
    port = free_port()
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"], address=f"tcp://127.0.0.1:{port}")
    proxy = _Proxy(port)
    pub = Publisher("blip", 0, address=f"tcp://127.0.0.1:{proxy.port}", resend_after=0.5)
    try:
        for i in range(3000):
            pub.publish("metrics", {"i": i}, step=i)
            if i % 500 == 250:
                time.sleep(0.2)
                proxy.cut()
            time.sleep(0.0005)
        assert pub.close(30) == 0, pub.stats
    finally:
        proxy.close()
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(3000))
    stats = _stats(journal)
    assert stats["rejected"] == {} and stats["owners_released"] == 0, stats  # one session throughout


def test_drop_accounting_stays_exact_across_a_restart_after_a_drop_report(relays, tmp_path):
    """A client drops events while the relay is down and reports it; the relay journals the report,
    then restarts. Before, the restarted relay held its acks at the old gap, so the client dropped
    events that were journaled, and counted them (dropped_unacked 1 -> 6): the journal's rule
    "lines before the last stats line = published - dropped" broke."""
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal)], address=address)
    pub = Publisher("drops", 0, address=address, max_events=5, resend_after=0.3)
    for i in range(3):
        pub.publish("metrics", {"i": i}, step=i)
    assert pub.flush(20) == 0
    relay.kill()
    for i in range(3, 11):
        pub.publish("metrics", {"i": i}, step=i)
        time.sleep(0.05)  # each into the window, which drops the oldest (not the publish queue)
    wait_for(lambda: pub.stats["dropped_unacked"] >= 3, 10, "the client's window overflowing")
    relay.start()
    assert pub.flush(20) == 0, pub.stats
    dropped = pub.stats["dropped"]
    relay.kill()
    relay.start()
    for i in range(11, 21):  # slowly: the window holds them while the client reconnects (up to 2 s)
        pub.publish("metrics", {"i": i}, step=i)
        time.sleep(0.5)
    assert pub.close(20) == 0, pub.stats
    assert relay.stop() == 0
    assert pub.stats["dropped"] == dropped, pub.stats
    events = read_jsonl(journal)
    metrics = [e["data"]["i"] for e in events if e["type"] == "metrics"]
    assert metrics[:3] == [0, 1, 2] and metrics[-10:] == list(range(11, 21)) and metrics == sorted(set(metrics))
    final = [e for e in events if e["type"] == "stats"][-1]["data"]
    assert final["dropped"] == dropped
    assert len(events) - 1 == final["published"] - final["dropped"]  # the lines before the last report


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_journal_stats_and_dead_letters_are_the_users_alone(relays, tmp_path, zmq_context):
    """0600 files and 0700 folders by default; --world-readable keeps the umask's modes."""
    old = os.umask(0o022)
    try:
        for args, files, folders in (([], 0o600, 0o700), (["--world-readable"], 0o644, 0o755)):
            journal = tmp_path / f"runs{len(args)}" / "deep"
            relay = relays(["--path", f"{journal}/", "--stats-interval", "0.2", *args])
            ctx = zmq_context
            raw = _raw(ctx, relay.address)
            raw.send(b"\x93\x01\x02\xc1")  # undecodable: a dead letter
            pub = Publisher("modes", 0, address=relay.address)
            pub.publish("metrics", {"i": 0}, step=0)
            assert pub.close(20) == 0
            wait_for(lambda journal=journal: (journal / "_relay_deadletter.jsonl").exists(), 20,
                     "the dead letter")
            assert relay.stop() == 0
            made = sorted(p.name for p in journal.iterdir())
            assert made == ["_relay_deadletter.jsonl", "_relay_stats.json", "modes.jsonl"], made  # (the lock goes at stop)
            assert {p.name: _mode(p) for p in journal.iterdir()} == dict.fromkeys(made, files)
            assert _mode(journal) == _mode(journal.parent) == folders
    finally:
        os.umask(old)


def test_a_closing_client_spools_into_a_private_file(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"  # no relay: everything is spooled
    pub = Publisher("spooled", 0, address=address, spool_dir=tmp_path / "spool")
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.close(2) > 0
    assert _mode(tmp_path / "spool") == 0o700
    assert _mode(tmp_path / "spool" / "spooled.rank0.spool.jsonl") == 0o600


def _squat(address: str, stop: threading.Event, swallowed: list[int], curve_secret: bytes | None = None) -> None:
    """A peer bound to the relay's address while the relay is down: it acknowledges everything."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    if curve_secret is not None:
        sock.curve_server = True
        sock.curve_secretkey = curve_secret
    sock.bind(address)
    while not stop.is_set():
        if not sock.poll(50):
            continue
        peer, frame = sock.recv_multipart()
        events = schema.decode(frame).events
        swallowed.append(len(events))
        top = max(e["seq"] for e in events) + 1
        sock.send_multipart([peer, encoding.encode_ack([(events[0]["run"], events[0]["rank"], top)])])
    ctx.destroy(linger=0)


def _squatted(relay, address: str, curve_secret: bytes | None, **keys: str) -> tuple[Publisher, list[int]]:
    """A client that published once to ``relay``, then 100 events while a squatter held the address."""
    pub = Publisher("squatted", 0, address=address, resend_after=0.3, **keys)
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.flush(20) == 0
    relay.stop()
    stop, swallowed = threading.Event(), []
    squatter = threading.Thread(target=_squat, args=(address, stop, swallowed, curve_secret))
    squatter.start()
    try:
        for i in range(1, 101):
            pub.publish("metrics", {"i": i}, step=i)
        pub.flush(3)
    finally:
        stop.set()
        squatter.join()
    return pub, swallowed


def test_on_an_open_relay_a_local_peer_can_squat_the_port_of_a_stopped_relay(relays, tmp_path, monkeypatch):
    """Said plainly in docs/security.md: with --open, no ownership rule helps while no relay holds the
    port. A peer that binds it first receives the events and may acknowledge them: the client
    believes they are journaled."""
    monkeypatch.setenv("RELAY_OPEN", "1")
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal), "--open"], address=address)
    pub, swallowed = _squatted(relay, address, None)
    assert pub.unacknowledged == 0, "the squatter's acks were taken for the relay's"
    assert sum(swallowed) >= 100
    assert len(read_jsonl(journal)) == 2  # hello and the first event: the rest are gone
    pub.close(1)


@pytest.mark.parametrize("squatter", ["in the clear", "with another secret"])
def test_without_the_secret_a_squatter_on_a_stopped_relays_port_gets_nothing(relays, tmp_path, squatter):
    """The client holds the secret: a squatter without it, in the clear or with another secret's
    keys, fails the handshake, so it neither reads an event nor acknowledges one; the client keeps
    them for the real relay."""
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal)], address=address)
    wrong = None if squatter == "in the clear" else secret.curve_keys(b"another user's secret, not ours", "relay")[1]
    pub, swallowed = _squatted(relay, address, wrong)
    assert swallowed == [] and pub.unacknowledged == 100
    relay.start()
    assert pub.close(20) == 0
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(101))


def test_with_curve_a_squatter_without_the_relays_secret_key_gets_nothing(relays, tmp_path):
    """Explicit CURVE certificates (relay keygen): the client knows the relay's public key, so a
    squatter with any other key fails the handshake just the same."""
    server_public, server_secret = keygen(tmp_path / "server", "relay")
    _, squat_secret = keygen(tmp_path / "squat", "squat")
    server_key = load_secret(server_secret)[0].decode()
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal), "--curve-cert", str(server_secret)], address=address)
    pub, swallowed = _squatted(relay, address, load_secret(squat_secret)[1], curve_server_key=server_key)
    assert swallowed == [] and pub.unacknowledged == 100
    relay.start()
    assert pub.close(20) == 0
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(101))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_with_ipc_in_a_private_directory_another_user_can_neither_connect_nor_squat(relays, tmp_path):
    """The relay's socket in a 0700 directory: another user (nobody) gets EACCES both connecting
    to it and binding its path while the relay is stopped."""
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    path = folder / "relay.sock"
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal)], address=f"ipc://{path}")
    assert _connect_as(None, str(path)) == 0
    assert _connect_as(65534, str(path)) == 13
    assert relay.stop() == 0
    assert _connect_as(65534, str(path), bind=True) == 13
    assert _connect_as(None, str(tmp_path / "open.sock"), bind=True) == 0



def test_with_curve_clients_a_peer_without_an_allowed_key_cannot_publish(relays, tmp_path, zmq_context):
    """--curve-clients: a local peer that knows the relay's public key but holds no listed client
    key gets nothing journaled or acknowledged, even for a run a real client is sending."""
    _, server_secret = keygen(tmp_path / "server", "relay")
    good_public, good_secret = keygen(tmp_path / "client", "good")
    _, bad_secret = keygen(tmp_path / "other", "bad")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / good_public.name).write_bytes(good_public.read_bytes())
    server_key = load_secret(server_secret)[0]
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--curve-cert", str(server_secret), "--curve-clients", str(allowed)])
    pub = Publisher("secure", 0, address=relay.address, curve_server_key=server_key.decode(),
                    curve_client_cert=str(good_secret))
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.flush(20) == 0
    ctx = zmq_context
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.curve_serverkey = server_key
    peer.curve_publickey, peer.curve_secretkey = load_secret(bad_secret)
    peer.connect(relay.address)
    for frame in _frames("secure", range(2, 12), "peer") + _frames("other-run", range(10), "peer"):
        peer.send(frame)
    assert _acks(peer, 1.0) == []
    pub.publish("metrics", {"i": 1}, step=1)
    assert pub.close(20) == 0
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert {e["run"] for e in events} == {"secure"} and not [e for e in events if "who" in e["data"]]


def test_only_a_peer_holding_the_secret_learns_the_run_ids_from_a_status_request(relays, tmp_path, zmq_context):
    """Run ids are no secret to the user's own processes (``relay status`` answers them); a peer
    without the secret gets no answer at all."""
    import msgpack

    relay = relays(["--path", str(tmp_path / "j.jsonl")])
    pub = Publisher("secret-run", 0, address=relay.address)
    assert pub.flush(20) == 0
    ctx = zmq_context
    stranger = _stranger(ctx, relay.address)
    stranger.send(STATUS_REQUEST)
    peer = _raw(ctx, relay.address)
    peer.send(STATUS_REQUEST)
    assert peer.poll(20_000)
    status = msgpack.unpackb(peer.recv(), raw=False, strict_map_key=False)["status"]
    assert "secret-run" in status["per_run"]
    assert not stranger.poll(500)
    pub.close(5)
    assert relay.stop() == 0
