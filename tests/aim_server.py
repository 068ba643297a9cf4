"""A real ``aim server`` on loopback, for the tests that write to a remote Aim repository
(``aim://127.0.0.1:PORT``) and read it back through Aim's API."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port


@pytest.fixture
def aim_server(tmp_path: Path):
    """A real `aim server` on loopback, started by the test when it wants it up."""
    aim = shutil.which("aim", path=str(Path(sys.executable).parent)) or shutil.which("aim")
    repo, port = tmp_path / "served", free_port()
    repo.mkdir()
    subprocess.run([aim, "init"], cwd=repo, check=True, capture_output=True, timeout=300)  # Aim and its migrations

    class Server:
        proc: subprocess.Popen | None = None
        url = f"aim://127.0.0.1:{port}"
        path = repo

        def start(self) -> None:
            # `aim server` execs uvicorn as a child: its own session lets stop() end both.
            self.proc = subprocess.Popen([aim, "server", "--repo", str(repo), "--host", "127.0.0.1", "--port", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 60
            while not listening(port):
                assert self.proc.poll() is None and time.monotonic() < deadline, "aim server did not start"
                time.sleep(0.2)

        def stop(self) -> None:
            if self.proc is None or self.proc.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(20)
            deadline = time.monotonic() + 20
            while listening(port):
                assert time.monotonic() < deadline, "aim server still listening"
                time.sleep(0.1)

    server = Server()
    try:
        yield server
    finally:
        server.stop()


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def index_like_aim_up(path: Path) -> None:
    """`aim up` indexes the runs a remote server wrote; the test does the same before reading."""
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    repo = Repo(str(path))
    for run_hash in repo.list_all_runs():
        RepoIndexManager.get_index_manager(repo).index(run_hash)
