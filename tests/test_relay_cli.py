"""The relay command's errors: one clear line, a meaningful exit code, nothing left half-done."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, finish, free_port, line_count, plugin_env, read_jsonl, start_publisher
from relay.wire.lines import encode_line
from watch_helpers import cli_env


def run_relay(*args: str, timeout: float = 30, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
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


def test_replay_into_a_journal_it_cannot_write(relays, tmp_path):
    """The journal's own errors (JournalError) are usage errors in replay too: one line, exit 2,
    whether the folder cannot be made or a relay holds the journal."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(encode_line({"v": 1, "run": "r", "rank": 0, "local_rank": 0, "world_size": 1, "host": "h",
                                    "seq": 0, "ts": 1.0, "type": "metrics", "step": 1, "epoch": None,
                                    "stage": "train", "data": {"loss": 1.0}}))
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_relay("replay", str(source), "--sink", "jsonl", "--path", str(blocker / "sub") + "/")
    assert proc.returncode == 2
    assert error_line(proc).startswith("relay: error: cannot write the JSONL journal at ")
    first = relays(["--path", str(tmp_path / "logs") + "/"])
    proc = run_relay("replay", str(source), "--sink", "jsonl", "--path", str(tmp_path / "logs") + "/")
    assert proc.returncode == 2
    assert error_line(proc).startswith("relay: error: another relay is already writing ")
    assert first.stop() == 0
    assert not list((tmp_path / "logs").glob("r.jsonl"))


def imported_modules(proc: subprocess.CompletedProcess) -> set[str]:
    """Module names from ``python -X importtime`` output (stderr)."""
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_tail_keygen_and_help_import_no_sink_plugin(tmp_path):
    env = plugin_env(tmp_path)  # installed plugins: the throwaway ones, and the repository's own
    journal = tmp_path / "j.jsonl"
    journal.write_bytes(encode_line({"run": "r", "rank": 0, "seq": 0, "ts": 1.0, "type": "metrics",
                                     "step": 1, "stage": "train", "data": {"loss": float("nan")}}))
    for args in (["keygen", str(tmp_path / "keys")], ["tail", str(journal)], ["--help"], ["replay", "--help"],
                 ["serve", "--help"]):  # which lists every installed sink, read from source, not imported
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "relay", *args], capture_output=True,
                              text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        modules = imported_modules(proc)
        assert "relay.cli.main" in modules
        plugins = {m for m in modules if m.startswith(("throwaway_sinks", "aim", "mlflow", "wandb", "clearml"))
                   or m.startswith("sinks.") and m not in ("sinks.base", "sinks.events", "sinks.files", "sinks.registry", "sinks.preflight")}
        assert not plugins, (args, sorted(plugins))
    assert "loss=NaN" in subprocess.run([sys.executable, "-m", "relay", "tail", str(journal)], capture_output=True,
                                        text=True, timeout=60).stdout


def test_serve_help_describes_a_plugin_whose_package_raises_at_import(tmp_path):
    """Help runs no plugin code: a sink in a package whose ``__init__`` raises is still described
    (``find_spec("pkg.mod")`` would run ``pkg`` and say only "cannot be read: RuntimeError")."""
    site = tmp_path / "site"
    info = site / "boom_sinks-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boom-sinks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[metrics_relay.sinks]\nboom = boom_sinks.sink:Boom\n")
    (site / "boom_sinks").mkdir()
    (site / "boom_sinks" / "__init__.py").write_text("raise RuntimeError('run for help')\n")
    (site / "boom_sinks" / "sink.py").write_text('class Boom:\n    """Write nowhere. Really."""\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = run_relay("serve", "--help", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "boom" in proc.stdout and "Write nowhere." in proc.stdout, proc.stdout


def test_a_sink_named_by_import_path(tmp_path):
    env = plugin_env(tmp_path)
    journal, out = tmp_path / "j.jsonl", tmp_path / "out.jsonl"
    journal.write_bytes(b"".join(encode_line({"run": "r", "rank": 0, "seq": s, "ts": 1.0, "type": "metrics",
                                              "step": s, "stage": "train", "data": {"i": s}}) for s in range(5)))
    proc = run_relay("replay", str(journal), "--sink", "throwaway_sinks:Collect", "--collect-file", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "read 5 events from 1 files: replayed into collect" in proc.stderr
    assert [e["seq"] for e in read_jsonl(out)] == list(range(5))
    for sink, message in (("no_such_module:Sink", "no module named 'no_such_module'"),
                          ("json:NoSuchClass", "module json has no 'NoSuchClass'"),
                          ("json:JSONDecoder", "is not a sinks.base.Sink subclass")):
        proc = run_relay("--sink", sink, "--path", str(tmp_path / "x.jsonl"), env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("relay: error: ") and message in proc.stderr, \
            proc.stderr


def test_sink_options_show_with_their_sink(tmp_path):
    env = plugin_env(tmp_path)
    assert "--collect-file" not in run_relay("--help", env=env).stdout
    assert "--collect-file" not in run_relay("serve", "--help", env=env).stdout
    shown = run_relay("--sink", "collect", "--help", env=env).stdout
    assert "--collect-file" in shown and "[collect sink]" in shown and "--path" in shown
    proc = run_relay("replay", str(tmp_path), "--sink", "collect", "--path", str(tmp_path / "o.jsonl"), env=env)
    assert proc.returncode == 2 and "--path belongs to the jsonl sink; add --sink jsonl" in proc.stderr


def _no_ipv6_loopback() -> str | None:
    """Why this machine cannot listen on ::1 (None: it can)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        return f"this machine has no IPv6 loopback to bind: {exc}"
    return None


def test_serve_publish_and_status_on_ipv6_loopback(relays, tmp_path):
    why = _no_ipv6_loopback()
    if why:
        pytest.skip(why)
    journal = tmp_path / "logs"
    relay = relays(["--path", f"{journal}/"], address="tcp://[::1]:*")
    assert relay.address.startswith("tcp://[::1]:"), relay.address
    assert finish(start_publisher(relay.address, "v6", 0, 50))["left"] == 0
    assert line_count(journal / "v6.jsonl") >= 51  # its hello and the 50 events
    status = run_relay("status", relay.address, env=cli_env())  # (no $COLUMNS: the whole line)
    assert status.returncode == 0 and "1 run: v6 " in status.stdout, status.stderr
    assert relay.stop() == 0


def test_serve_help_describes_each_sink_and_says_which_are_not_installed():
    """As in an editable install (the checkout not on sys.path, its packages found by the import
    system), and with aim missing: each built-in sink's docstring, and the command that installs aim."""
    code = ("import sys; from relay.cli import main; "
            f"sys.path[:] = [p for p in sys.path if p not in ('', '.', {str(ROOT)!r})]; "
            "sys.modules['aim'] = None; "  # what a missing package looks like to the import system
            "main(['serve', '--help'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT.parent, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    listed: dict[str, str] = {}
    for line in done.stdout.split("Installed sinks", 1)[1].splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("   "):  # "  name  text", then wrapped text
            name, text = line.split(None, 1)
            listed[name] = text
        elif line.strip():
            listed[name] += " " + line.strip()
    assert "(no description)" not in done.stdout, listed
    assert listed["aim"] == ("Write relay events into an Aim repository, local (a path) or remote (aim://host:port). "
                             "[not installed: pip install './[aim]' in the metrics-relay checkout]")
    assert listed["mlflow"].startswith("Write relay events into MLflow") and "not installed" not in listed["mlflow"]
    assert listed["forward"] == "Forward every event of this relay's journal to a central relay."

