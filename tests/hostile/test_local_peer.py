"""What a local peer can and cannot do to a relay (docs/security.md), each claim tried for real: a
real relay process, real ZeroMQ sockets, a raw DEALER playing the peer. A (run, rank) stream
belongs to the connection sending it; files are the user's alone; drop accounting survives a
restart; what loopback TCP still allows (squatting the port of a stopped relay) is shown, and that
ipc:// in a 0700 directory and CURVE do not allow it."""
from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
import zmq

from conftest import free_port, read_jsonl, wait_for
from relay.wire import encoding, schema
from relay.client.publisher import Publisher
from relay.wire.curve import load_secret
from test_curve import keygen
from test_relay_hostile import _connect_as, _event


def _stats(journal: Path) -> dict:
    """The relay's stats file beside ``journal`` (empty until it first writes one)."""
    try:
        return json.loads(journal.with_name(journal.stem + "_stats.json").read_text())
    except FileNotFoundError:
        return {"rejected": {}}


def _raw(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
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


def test_forged_events_for_a_live_ranks_coming_seqs_are_refused(relays, tmp_path):
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
    ctx = zmq.Context()
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
    ctx.destroy(linger=0)


def test_a_peer_resending_a_duplicate_cannot_take_a_ranks_acks(relays, tmp_path):
    """Before, acks went to whichever connection sent for a rank last: a peer re-sending one
    duplicate in a loop took them, and the real client's close waited 20 s for acks it never got."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    pub = Publisher("victim", 0, address=relay.address)
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.flush(20) == 0
    ctx = zmq.Context()
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
        assert pub.close(20) == 0, pub.stats
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        sender.join()
    assert _acks(thief, 0.3) == []
    assert relay.stop() == 0
    assert [e["data"]["i"] for e in read_jsonl(journal) if e["type"] == "metrics"] == list(range(500))
    assert _stats(journal)["rejected"]["not_owner"] > 0
    ctx.destroy(linger=0)


def test_a_stream_passes_to_the_next_connection_once_its_owner_disconnects(relays, tmp_path):
    """Refused while the owner is connected; taken and acknowledged as soon as it is gone."""
    journal = tmp_path / "j.jsonl"
    relay = relays(["--path", str(journal), "--stats-interval", "0.2"])
    ctx = zmq.Context()
    first, second = _raw(ctx, relay.address), _raw(ctx, relay.address)
    for frame in _frames("r", range(0, 10), "first"):
        first.send(frame)
    wait_for(lambda: ("r", 0, 10) in _acks(first, 0.2), 20, "the owner acknowledged")
    for frame in _frames("r", range(10, 20), "second"):
        second.send(frame)
    assert _acks(second, 0.5) == []
    first.close(0)
    wait_for(lambda: _stats(journal)["owners_released"] == 1, 20, "the owner's stream released")
    for frame in _frames("r", range(10, 20), "second"):
        second.send(frame)
    wait_for(lambda: ("r", 0, 20) in _acks(second, 0.2), 20, "the next connection acknowledged")
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert [(e["seq"], e["data"]["who"]) for e in events] == [(s, "first" if s < 10 else "second") for s in range(20)]
    assert _stats(journal)["rejected"] == {"not_owner": 10}
    ctx.destroy(linger=0)


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
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.cuts += 1

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_client_whose_connection_drops_is_never_shut_out_of_its_own_stream(relays, tmp_path):
    """Five cuts while it publishes: each time it reconnects under a new identity, takes its stream
    back and resends; nothing is lost, duplicated or refused."""
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
    assert stats["rejected"] == {} and stats["owners_released"] >= 5, stats


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


def test_journal_stats_and_dead_letters_are_the_users_alone(relays, tmp_path):
    """0600 files and 0700 folders by default; --world-readable keeps the umask's modes."""
    old = os.umask(0o022)
    try:
        for args, files, folders in (([], 0o600, 0o700), (["--world-readable"], 0o644, 0o755)):
            journal = tmp_path / f"runs{len(args)}" / "deep"
            relay = relays(["--path", f"{journal}/", "--stats-interval", "0.2", *args])
            ctx = zmq.Context()
            raw = _raw(ctx, relay.address)
            raw.send(b"\x93\x01\x02\xc1")  # undecodable: a dead letter
            pub = Publisher("modes", 0, address=relay.address)
            pub.publish("metrics", {"i": 0}, step=0)
            assert pub.close(20) == 0
            wait_for(lambda: (journal / "_relay_deadletter.jsonl").exists(), 20, "the dead letter")
            assert relay.stop() == 0
            made = sorted(p.name for p in journal.iterdir())
            assert made == ["_relay_deadletter.jsonl", "_relay_stats.json", "modes.jsonl"], made  # (the lock goes at stop)
            assert {p.name: _mode(p) for p in journal.iterdir()} == dict.fromkeys(made, files)
            assert _mode(journal) == _mode(journal.parent) == folders
            ctx.destroy(linger=0)
    finally:
        os.umask(old)


def test_a_closing_client_spools_into_a_private_file(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"  # no relay: everything is spooled
    pub = Publisher("spooled", 0, address=address, spool_dir=tmp_path / "spool")
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.close(2) > 0
    assert _mode(tmp_path / "spool") == 0o700
    assert _mode(tmp_path / "spool" / "spooled.rank0.spool.jsonl") == 0o600


def _squat(address: str, stop: threading.Event, swallowed: list[int],
           curve_secret: bytes | None = None) -> None:
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
        events, first, _ = schema.decode(frame)
        swallowed.append(len(events))
        top = max(e["seq"] for e in events) + 1
        sock.send_multipart([peer, encoding.encode_ack([(events[0]["run"], events[0]["rank"], top)])])
    ctx.destroy(linger=0)


def test_on_loopback_tcp_a_local_peer_can_squat_the_port_of_a_stopped_relay(relays, tmp_path):
    """Said plainly in docs/security.md: no ownership rule helps while no relay holds the port. A
    peer that binds it first receives the events and may acknowledge them: the client believes
    they are journaled. (ipc:// in a 0700 directory and CURVE close this; tests below.)"""
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal)], address=address)
    pub = Publisher("squatted", 0, address=address, resend_after=0.3)
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.flush(20) == 0
    relay.stop()
    stop, swallowed = threading.Event(), []
    squatter = threading.Thread(target=_squat, args=(address, stop, swallowed))
    squatter.start()
    try:
        for i in range(1, 101):
            pub.publish("metrics", {"i": i}, step=i)
        assert pub.flush(20) == 0, "the squatter's acks were taken for the relay's"
    finally:
        stop.set()
        squatter.join()
    assert sum(swallowed) >= 100
    assert len(read_jsonl(journal)) == 2  # hello and the first event: the rest are gone
    pub.close(1)


def test_with_curve_a_squatter_without_the_relays_secret_key_gets_nothing(relays, tmp_path):
    """The client knows the relay's public key: a squatter with any other key fails the handshake,
    so it neither reads an event nor acknowledges one; the client keeps them for the real relay."""
    server_public, server_secret = keygen(tmp_path / "server", "relay")
    _, squat_secret = keygen(tmp_path / "squat", "squat")
    server_key = load_secret(server_secret)[0].decode()
    journal = tmp_path / "j.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    relay = relays(["--path", str(journal), "--curve-cert", str(server_secret)], address=address)
    pub = Publisher("secure", 0, address=address, curve_server_key=server_key, resend_after=0.3)
    pub.publish("metrics", {"i": 0}, step=0)
    assert pub.flush(20) == 0
    relay.stop()
    stop, swallowed = threading.Event(), []
    squatter = threading.Thread(target=_squat, args=(address, stop, swallowed, load_secret(squat_secret)[1]))
    squatter.start()
    try:
        for i in range(1, 101):
            pub.publish("metrics", {"i": i}, step=i)
        assert pub.flush(3) == 100
    finally:
        stop.set()
        squatter.join()
    assert swallowed == []
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



def test_with_curve_clients_a_peer_without_an_allowed_key_cannot_publish(relays, tmp_path):
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
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.curve_serverkey = server_key
    peer.curve_publickey, peer.curve_secretkey = load_secret(bad_secret)
    peer.connect(relay.address)
    for frame in _frames("secure", range(2, 12), "peer") + _frames("other-run", range(0, 10), "peer"):
        peer.send(frame)
    assert _acks(peer, 1.0) == []
    pub.publish("metrics", {"i": 1}, step=1)
    assert pub.close(20) == 0
    assert relay.stop() == 0
    events = read_jsonl(journal)
    assert {e["run"] for e in events} == {"secure"} and not [e for e in events if "who" in e["data"]]
    ctx.destroy(linger=0)


def test_on_loopback_tcp_any_local_peer_learns_the_run_ids_from_a_status_request(relays, tmp_path):
    """Said in docs/security.md: run ids are no secret on a port anyone can connect to."""
    import msgpack

    from relay.daemon.status import STATUS_REQUEST

    relay = relays(["--path", str(tmp_path / "j.jsonl")])
    pub = Publisher("secret-run", 0, address=relay.address)
    assert pub.flush(20) == 0
    ctx = zmq.Context()
    peer = _raw(ctx, relay.address)
    peer.send(STATUS_REQUEST)
    assert peer.poll(20_000)
    status = msgpack.unpackb(peer.recv(), raw=False, strict_map_key=False)["status"]
    assert "secret-run" in status["per_run"]
    pub.close(5)
    assert relay.stop() == 0
    ctx.destroy(linger=0)
