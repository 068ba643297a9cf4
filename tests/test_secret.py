"""The user's relay secret (relay/wire/secret.py): made once on first use, private, found the same
way by the relay and every client, and refused in one line when it cannot be used."""
from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from relay.wire import secret


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh config folder, as a user's first run finds it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "metrics-relay" / "secret"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_use_makes_a_private_secret_that_every_later_use_finds(config: Path) -> None:
    made = secret.find()
    assert made.source == str(config) and len(made.value) >= 32
    assert _mode(config) == 0o600 and _mode(config.parent) == 0o700
    assert secret.find() == made
    assert [p.name for p in config.parent.iterdir()] == ["secret"], "no temporary file left"


def _find_in(queue: multiprocessing.Queue) -> None:
    queue.put(secret.find().value)


def test_processes_making_it_at_once_agree_on_one(config: Path) -> None:
    """Eight ranks of a first job start together: each links its own whole file, one wins, all read it."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_find_in, args=(queue,)) for _ in range(8)]
    for proc in procs:
        proc.start()
    values = {queue.get(timeout=30) for _ in procs}
    for proc in procs:
        proc.join(30)
    assert values == {config.read_bytes().strip()}


def test_the_environment_names_it_for_other_machines(config: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_SECRET_FILE", str(tmp_path / "shared" / "relay-secret"))
    shared = secret.find()
    assert shared.source == str(tmp_path / "shared" / "relay-secret") and not config.exists()
    monkeypatch.setenv("RELAY_SECRET", "  copied from the relay's machine \n")
    assert secret.find() == secret.Secret(b"copied from the relay's machine", "$RELAY_SECRET")
    assert secret.find(tmp_path / "shared" / "relay-secret") == shared, "the relay's --secret-file comes first"


@pytest.mark.parametrize("spoil, fix", [
    (lambda path: path.chmod(0o644), "chmod 600"),
    (lambda path: path.write_text("short\n"), "remove it to have a new one made"),
    (lambda path: (path.unlink(), path.mkdir()), "not a regular file"),
], ids=["readable-by-others", "too-short", "a-folder"])
def test_a_secret_it_cannot_use_is_one_line_naming_the_fix(config: Path, spoil, fix: str) -> None:
    secret.find()
    spoil(config)
    with pytest.raises(secret.SecretError) as err:
        secret.find()
    assert fix in str(err.value) and str(config) in str(err.value) and "\n" not in str(err.value)


def test_a_secret_behind_a_symbolic_link_is_one_line_naming_the_fix(config: Path, tmp_path: Path) -> None:
    """A link is never followed (it could hand the relay another user's file): a link to a file names
    the file to use; a loop (issue 44: "Too many levels of symbolic links") or a dangling link says so;
    the relay exits 2 with that line, and ``relay status`` says it without address advice."""
    real = secret.find().source
    for name, target in (("loop-a", "loop-b"), ("loop-b", "loop-a"), ("dangling", "gone"), ("link", real)):
        (tmp_path / name).symlink_to(target)
    said = {}
    for name in ("loop-a", "dangling", "link"):
        with pytest.raises(secret.SecretError) as err:
            secret.find(tmp_path / name)
        said[name] = str(err.value)
        assert "\n" not in said[name] and str(tmp_path / name) in said[name]
    assert "is a symbolic link that never reaches a file (a loop, or its target is gone)" in said["loop-a"]
    assert said["dangling"] == said["loop-a"].replace("loop-a", "dangling")
    assert f"is a symbolic link (to {real}), which the relay does not follow; point RELAY_SECRET_FILE at {real}" \
        in said["link"]
    for command in (["--path", str(tmp_path / "j.jsonl"), "--live", "off", "--bind", "tcp://127.0.0.1:0"],
                    ["status", "tcp://127.0.0.1:9"]):
        done = subprocess.run([sys.executable, "-m", "relay", *command], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, RELAY_SECRET_FILE=str(tmp_path / "loop-a")))
        assert done.returncode == 2 and done.stderr.splitlines() == [f"relay: error: {said['loop-a']}"], done.stderr


def test_a_short_secret_in_the_environment_is_refused(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_SECRET", "hunter2")
    with pytest.raises(secret.SecretError, match=r"\$RELAY_SECRET holds 7 characters, fewer than 16"):
        secret.find()


def test_the_relay_refuses_to_start_on_a_secret_it_cannot_use(config: Path, tmp_path: Path) -> None:
    """Exit 2, one line, nothing listening and no journal left behind; an ipc relay needs no secret."""
    secret.find()
    config.chmod(0o640)
    args = [sys.executable, "-m", "relay", "--path", str(tmp_path / "j.jsonl"), "--live", "off"]
    done = subprocess.run([*args, "--bind", "tcp://127.0.0.1:0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"relay: error: the relay secret {config} can be read by other users (mode 640); chmod 600 {config}"]
    assert not (tmp_path / "j.jsonl").exists()


def test_both_sides_derive_the_same_keys_and_another_secret_other_ones() -> None:
    relay_public, _ = secret.curve_keys(b"x" * 32, "relay")
    assert secret.curve_keys(b"x" * 32, "relay")[0] == relay_public
    assert secret.curve_keys(b"y" * 32, "relay")[0] != relay_public
    assert secret.curve_keys(b"x" * 32, "client")[0] != relay_public
