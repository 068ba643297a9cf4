"""What a user typing the ``relay`` command wrong sees: one line ``relay: error: ...; what to do``
from every subcommand, exit 2, nothing left behind; and ``relay tail -f | head`` ends like GNU
``tail -f | head`` does."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port
from relay.wire.address import BadAddress, check_bind_address, check_connect_address
from watch_helpers import cli_env, event, relay_cmd, write_journal


@pytest.mark.parametrize("args, message", [
    (["tail"], "Missing argument 'PATH'; see 'relay tail --help'"),
    (["tail", "j.jsonl", "-n", "-1"], "Invalid value for '-n' / '--lines': -1 is not in the range x>=0; see 'relay tail --help'"),
    (["plot", "j.jsonl"], "Missing option '--metric'; see 'relay plot --help'"),
    (["status", "--bogus"], "No such option '--bogus'; see 'relay status --help'"),
    (["keygen"], "Missing argument 'DIRECTORY'; see 'relay keygen --help'"),
    (["replay"], "Missing argument 'FILES...'; see 'relay replay --help'"),
    (["serve", "--bogus"], "No such option '--bogus'; see 'relay serve --help'"),
    (["--sink-queue", "0"], "Invalid value for '--sink-queue': 0 is not in the range x>=1; see 'relay serve --help'"),
    (["tial", "x.jsonl"], "no such command 'tial'; did you mean 'tail'?"),
    (["stauts", "relay-logs/"], "no such command 'stauts'; did you mean 'status'?"),
    (["frobnicate"], "no such command 'frobnicate'; commands: serve, tail, runs, plot, status, replay, consume, "
                     "keygen (see 'relay --help')"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"relay: error: {message}\n"
    assert list(tmp_path.iterdir()) == [], "a usage error writes nothing"


@pytest.mark.parametrize("args", [["--help"], ["serve", "--help"], ["tail", "--help"], ["runs", "--help"],
                                  ["plot", "--help"], ["status", "--help"], ["replay", "--help"],
                                  ["consume", "--help"], ["keygen", "--help"]], ids=lambda a: a[0])
def test_help_fits_an_80_column_terminal(args: list[str]) -> None:
    done = relay_cmd(*args, env=cli_env(COLUMNS="80"), timeout=60)
    assert done.returncode == 0, done.stderr
    wide = [line for line in done.stdout.splitlines() if len(line) > 80]
    assert not wide, wide


@pytest.mark.parametrize("address, message", [
    ("tcp://127.0.0.1:99999", "port 99999 is past 65535"),
    ("tcp://127.0.0.1:70000", "port 70000 is past 65535"),
    ("tcp://127.0.0.1:-1", "needs a host and a port"),
    ("tcp://127.0.0.1:http", "needs a host and a port"),
])
def test_ports_out_of_range_are_refused(tmp_path: Path, address: str, message: str) -> None:
    done = relay_cmd("--bind", address, "--path", str(tmp_path / "j"), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("relay: error: ") and message in done.stderr and done.stderr.count("\n") == 1
    with pytest.raises(BadAddress, match=message):
        check_connect_address(address)


def test_wildcard_port_only_where_one_binds() -> None:
    assert check_bind_address("tcp://127.0.0.1:*") == "tcp"
    with pytest.raises(BadAddress, match="needs a host and a port number"):
        check_connect_address("tcp://127.0.0.1:*")
    assert check_connect_address("tcp://127.0.0.1:65535") == "tcp"


def test_an_address_that_cannot_be_bound_says_what_to_do(tmp_path: Path) -> None:
    done = relay_cmd("--bind", f"tcp://192.0.2.1:{free_port()}", "--path", str(tmp_path / "j"), timeout=60)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # no "without encryption" warning for a socket that never listened
    assert lines[0].startswith("relay: error: cannot bind tcp://192.0.2.1:") and "give an address of this machine" in lines[0]


def test_a_sink_that_cannot_open_leaves_no_lock(tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env().items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run([sys.executable, "-m", "relay", "--bind", f"tcp://127.0.0.1:{free_port()}", "--sink",
                           "mlflow"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 2 and "needs --mlflow-tracking-uri" in done.stderr
    assert list(tmp_path.iterdir()) == [], "neither relay-logs/_relay.lock nor an empty relay-logs/"


def test_keygen_says_how_each_certificate_is_used(tmp_path: Path) -> None:
    server = relay_cmd("keygen", str(tmp_path / "keys"))
    assert "relay --curve-cert" in server.stdout and "RELAY_CURVE_SERVER_KEY" in server.stdout
    client = relay_cmd("keygen", str(tmp_path / "clients"), "--name", "node7")
    assert "RELAY_CURVE_SERVER_KEY" not in client.stdout and "--curve-cert" not in client.stdout
    assert f"copy {tmp_path / 'clients' / 'node7.key'} into its --curve-clients directory" in client.stdout
    assert f"RELAY_CURVE_CLIENT_CERT={tmp_path / 'clients' / 'node7.key_secret'}" in client.stdout
    central = relay_cmd("keygen", str(tmp_path / "keys"), "--name", "central", "--role", "relay")
    assert f"relay --curve-cert {tmp_path / 'keys' / 'central.key_secret'}" in central.stdout


def test_follow_into_head_ends_on_a_quiet_journal(tmp_path: Path) -> None:
    """The backlog fits in the pipe, so no write fails: tail notices head is gone while idle."""
    path = tmp_path / "done.jsonl"
    write_journal(path, [event("done", 0, i, 1.7e9 + i, "metrics", {"loss": 1.0}, step=i, stage="train")
                         for i in range(30)])
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", f"'{sys.executable}' -m relay tail -f '{path}' | head -3; "
                                         "echo \"tail exited ${PIPESTATUS[0]}\" >&2"],
                          capture_output=True, text=True, timeout=60, env=cli_env())
    assert len(done.stdout.splitlines()) == 3 and done.stderr == "tail exited 0\n", done.stderr
    assert time.monotonic() - started < 30
