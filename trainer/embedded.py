"""The relay started beside the job, and how the ranks of one job agree on who they are.

Global rank 0 runs the ordinary ``relay`` program as a subprocess (not a thread: a sink that
stalls or crashes cannot touch the training process), listening on an ``ipc://`` socket inside a
fresh 0700 directory, and tells the other ranks the run id and address over ``torch.distributed``.
Only the job's own user can reach that socket, so no other process on the node can write into
the job's run or spoof its ranks (a loopback TCP port is open to every local user). The relay
watches rank 0's pid, so a crashed job never leaves it behind.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

log = logging.getLogger(__name__)

JSONL_NAME = "training_logs.jsonl"
RELAY_LOG_NAME = "relay.log"
SOCKET_NAME = "relay.sock"
#: Unix socket paths are limited to 107 bytes; a longer $TMPDIR falls back to /tmp.
MAX_SOCKET_PATH = 100


class RelayStartError(RuntimeError):
    """The embedded relay did not come up; the message says why and where its log is."""


def default_run_id(run_name: str | None = None) -> str:
    """``--run_name``, else a rendezvous id given to torchrun (``--rdzv_id``), else ``sft-<time>``; always followed by a
    random suffix, so that no two jobs share an id.

    The relay drops events whose ``(run, rank, seq)`` it has already journaled and every job counts
    ``seq`` from 0, so a second job (or an elastic restart, which also gets ``-r<N>``) under a reused
    id would have its events taken for duplicates. Names are for people; ids must be unique, as in
    every tracker's notion of a run name.
    """
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_name:
        base = run_name
    elif elastic and elastic != "none" and not _made_up(elastic):
        base = re.sub(r"[^A-Za-z0-9._-]", "-", elastic).lstrip("._-") or "run"
    else:
        base = time.strftime("sft-%Y%m%d-%H%M%S")
    run_id = f"{base[:110]}-{secrets.token_hex(3)}"
    return f"{run_id}-r{restart}" if restart else run_id


def _made_up(rdzv_id: str) -> bool:
    """A UUID: the rendezvous id torchrun makes up when none is given (``--standalone``, or no
    ``--rdzv_id``); a name nobody chose, so the run id is based on the time instead."""
    try:
        uuid.UUID(rdzv_id)
    except ValueError:
        return False
    return True


def agree(value: Any) -> Any:
    """Return global rank 0's ``value`` on every rank (identity when not distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class EmbeddedRelay:
    """A ``relay`` subprocess writing ``<output_dir>/training_logs.jsonl`` (plus Aim when asked)."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, log_path: str, workdir: str) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path
        self._workdir = workdir

    @classmethod
    def start(cls, output_dir: str, *, sink_args: list[str] | None = None, timeout: float = 60.0) -> "EmbeddedRelay":
        """Start the relay and wait until it has bound and opened its sinks; RelayStartError if not."""
        os.makedirs(output_dir, exist_ok=True)
        workdir = _private_dir()
        ready = os.path.join(workdir, "ready.json")
        cmd = [
            sys.executable, "-m", "relay", "--bind", f"ipc://{os.path.join(workdir, SOCKET_NAME)}",
            "--sink", "jsonl", "--path", os.path.join(output_dir, JSONL_NAME),
        ]
        cmd += sink_args or []  # the other trackers' sinks (trainer/tracker_flags.py)
        cmd += ["--ready-file", ready, "--watch-pid", str(os.getpid()), "--log-level", "info"]
        log_path = os.path.join(output_dir, RELAY_LOG_NAME)
        with open(log_path, "ab") as log_file:
            # Own session: a Ctrl-C in the terminal must not stop the relay before the ranks flush.
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                    start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                shutil.rmtree(workdir, ignore_errors=True)
                raise RelayStartError(f"embedded relay exited with status {code}: {_last_line(log_path)} "
                                      f"(log: {log_path})")
            address = _read_ready(ready)
            if address:
                log.info("embedded relay pid %d at %s, writing %s", proc.pid, address,
                         os.path.join(output_dir, JSONL_NAME))
                return cls(proc, address, log_path, workdir)
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                shutil.rmtree(workdir, ignore_errors=True)
                raise RelayStartError(f"embedded relay not ready after {timeout:g}s (log: {log_path})")
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the relay flushes its sinks and exits 0); SIGKILL after ``timeout``. Returns the status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("embedded relay pid %d did not stop within %gs; killing it", self.proc.pid, timeout)
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
            if code != 0:
                log.warning("embedded relay exited with status %s: %s (log: %s)", code,
                            _last_line(self.log_path), self.log_path)
            return code
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)


def _private_dir() -> str:
    """A new directory only this user can enter (mkdtemp makes it 0700), short enough for a socket."""
    workdir = tempfile.mkdtemp(prefix="metrics-relay-")
    if len(os.path.join(workdir, SOCKET_NAME)) > MAX_SOCKET_PATH:
        os.rmdir(workdir)
        workdir = tempfile.mkdtemp(prefix="metrics-relay-", dir="/tmp")
    return workdir


def _read_ready(path: str) -> str | None:
    """The relay writes the ready file atomically, so any file there is complete."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)["address"]
    except FileNotFoundError:
        return None


def _last_line(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [line.strip() for line in fh if line.strip()]
    return lines[-1] if lines else "(no output)"
