"""The relay command's errors: one clear line, a meaningful exit code, nothing left half-done."""
from __future__ import annotations

import subprocess
import sys

from conftest import free_port, plugin_env


def run_relay(*args: str, timeout: float = 30, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [l for l in proc.stderr.splitlines() if "error" in l.lower()]
    assert lines, proc.stderr
    return lines[-1]


def test_unknown_sink(tmp_path):
    proc = run_relay("--sink", "nosuch", "--path", str(tmp_path / "x.jsonl"))
    assert proc.returncode == 2
    assert "unknown sink 'nosuch'" in error_line(proc) and "jsonl" in error_line(proc)


def test_unknown_option():
    proc = run_relay("--no-such-flag")
    assert proc.returncode == 2
    assert "No such option" in proc.stderr and "--no-such-flag" in proc.stderr


def test_unwritable_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_relay("--bind", f"tcp://127.0.0.1:{free_port()}", "--path", str(blocker / "sub" / "x.jsonl"))
    assert proc.returncode == 2
    line = error_line(proc)
    assert "cannot write the JSONL journal" in line and "--path" in line


def test_bad_address(tmp_path):
    proc = run_relay("--bind", "udp://nowhere", "--path", str(tmp_path / "x.jsonl"))
    assert proc.returncode == 2
    assert "must look like tcp://HOST:PORT" in error_line(proc)


def test_sink_option_without_its_sink(tmp_path):
    proc = run_relay("--collect-file", "x", "--path", str(tmp_path / "x.jsonl"), env=plugin_env(tmp_path))
    assert proc.returncode == 2
    assert "--collect-file belongs to the collect sink; add --sink collect" in proc.stderr


def test_second_relay_on_same_tcp_address_fails_fast(relays, tmp_path):
    first = relays(["--path", str(tmp_path / "a.jsonl")])
    proc = run_relay("--bind", first.address, "--path", str(tmp_path / "b.jsonl"))
    assert proc.returncode == 3
    assert "already in use" in error_line(proc)
    assert first.proc.poll() is None
    assert first.stop() == 0


def test_second_relay_on_same_ipc_address_fails_fast(relays, tmp_path):
    address = f"ipc://{tmp_path}/relay.sock"
    first = relays(["--path", str(tmp_path / "a.jsonl")], address=address)
    proc = run_relay("--bind", address, "--path", str(tmp_path / "b.jsonl"))
    assert proc.returncode == 3
    assert "already served by another process" in error_line(proc)
    assert first.stop() == 0


def test_second_relay_on_same_journal_fails_fast(relays, tmp_path):
    first = relays(["--path", str(tmp_path / "logs") + "/"])
    proc = run_relay("--bind", f"tcp://127.0.0.1:{free_port()}", "--path", str(tmp_path / "logs") + "/")
    assert proc.returncode == 2
    assert "another relay is already writing" in error_line(proc)
    assert first.stop() == 0


def test_replay_missing_file(tmp_path):
    proc = run_relay("replay", str(tmp_path / "missing.jsonl"), "--sink", "jsonl", "--path", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
