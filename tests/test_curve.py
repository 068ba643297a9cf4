"""CURVE: only clients that know the relay's key (and, if restricted, hold an allowed certificate)
get events in; everyone else is kept out without disturbing the relay."""
from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import read_jsonl
from relay.client.publisher import Publisher
from relay.wire.curve import load_secret


def keygen(directory, name):
    out = subprocess.run([sys.executable, "-m", "relay", "keygen", str(directory), "--name", name],
                         capture_output=True, text=True, check=True, timeout=30)
    assert "public key:" in out.stdout
    return directory / f"{name}.key", directory / f"{name}.key_secret"


def test_curve_relay_accepts_only_authorised_clients(relays, tmp_path):
    _, server_secret = keygen(tmp_path / "server", "relay")
    good_public, good_secret = keygen(tmp_path / "client", "good")
    _, bad_secret = keygen(tmp_path / "other", "bad")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(good_public, allowed)
    server_key = load_secret(server_secret)[0].decode()
    journal = tmp_path / "c.jsonl"
    relay = relays(["--path", str(journal), "--curve-cert", str(server_secret), "--curve-clients", str(allowed)])

    good = Publisher("secure", 0, address=relay.address, curve_server_key=server_key,
                     curve_client_cert=str(good_secret))
    stranger = Publisher("intruder", 0, address=relay.address, curve_server_key=server_key,
                         curve_client_cert=str(bad_secret))
    plain = Publisher("plaintext", 0, address=relay.address)
    for i in range(20):
        for pub in (good, stranger, plain):
            pub.publish("metrics", {"i": i}, step=i, stage="train")
    assert good.close(10) == 0
    assert stranger.close(1) > 0 and plain.close(1) > 0
    assert relay.stop() == 0
    runs = {ev["run"] for ev in read_jsonl(journal)}
    assert runs == {"secure"}
    assert [ev["data"]["i"] for ev in read_jsonl(journal) if ev["type"] == "metrics"] == list(range(20))


def test_bad_certificate_is_a_usage_error(tmp_path):
    bogus = tmp_path / "bogus.key_secret"
    bogus.write_text("not a certificate")
    proc = subprocess.run([sys.executable, "-m", "relay", "--bind", "tcp://127.0.0.1:0", "--curve-cert", str(bogus),
                           "--path", str(tmp_path / "x.jsonl")], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "CURVE certificate" in proc.stderr or "secret key" in proc.stderr
