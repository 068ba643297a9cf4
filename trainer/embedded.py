"""The relay started beside the job, and how the ranks of one job agree on who they are
(docs/trainer.md, "The embedded relay (the default)").

A subprocess, not a thread: a sink that stalls or crashes cannot touch the training process. An
``ipc://`` socket in a 0700 directory, not a loopback TCP port, which is open to every local user.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shlex
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
#: The journal's name where JSONL_NAME is another tool's (fms-hf-tuning's file logger writes one
#: too).
OWN_JSONL_NAME = "relay_training_logs.jsonl"
JOURNAL_SINK = "jsonl"  # the journal's name among the relay's sinks
#: Seconds the job waits at its end for the relay's sinks to apply the run (--relay_exit_timeout).
EXIT_TIMEOUT = 300.0
#: Seconds beyond that for the relay to say what is missing and exit, before it is killed.
STOP_GRACE = 30.0
PROGRESS_EVERY = 5.0  # seconds between the job's lines on what the relay waits for
RELAY_LOG_NAME = "relay.log"
SOCKET_NAME = "relay.sock"
#: Unix socket paths are limited to 107 bytes; a longer $TMPDIR falls back to /tmp.
MAX_SOCKET_PATH = 100


class RelayStartError(RuntimeError):
    """The embedded relay did not come up; the message says why and where its log is."""


def default_run_id(run_name: str | None = None) -> str:
    """``--run_name``, else a rendezvous id given to torchrun (``--rdzv_id``), else ``sft-<time>``;
    always followed by a random suffix, so that no two jobs share an id.

    The relay drops events whose ``(run, rank, seq)`` it has already journaled and every job counts
    ``seq`` from 0, so a second job (or an elastic restart, which also gets ``-r<N>``) under a
    reused id would have its events taken for duplicates. Names are for people; ids must be unique,
    as in every tracker's notion of a run name.
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

    def __init__(self, proc: subprocess.Popen[bytes], address: str, log_path: str, workdir: str,
                 journal: str, exit_timeout: float) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path
        self.journal = journal
        self.stats_path = stats_path(journal)
        self.exit_timeout = exit_timeout
        self.run: str | None = None  # the job's run id, for the replay command it may print
        self._workdir = workdir

    @classmethod
    def start(cls, output_dir: str, *, sink_args: list[str] | None = None, timeout: float = 60.0,
              exit_timeout: float = EXIT_TIMEOUT,
              journal_name: str = JSONL_NAME) -> EmbeddedRelay:
        """Start the relay and wait until it has bound and opened its sinks; RelayStartError if not.
        ``exit_timeout``: how long its sinks may take at the end to apply the run (see ``stop``);
        ``journal_name``: the journal's file in ``output_dir`` (``journal_name_in`` picks it)."""
        os.makedirs(output_dir, exist_ok=True)
        workdir = _private_dir()
        ready = os.path.join(workdir, "ready.json")
        journal = os.path.join(output_dir, journal_name)
        cmd = [
            sys.executable, "-m", "relay", "--bind", f"ipc://{os.path.join(workdir, SOCKET_NAME)}",
            "--sink", "jsonl", "--path", journal,
        ]
        cmd += sink_args or []  # the other trackers' sinks (trainer/tracker_flags.py)
        cmd += ["--ready-file", ready, "--watch-pid", str(os.getpid()),
                "--shutdown-timeout", f"{exit_timeout:g}", "--log-level", "info"]
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
                raise RelayStartError(f"embedded relay exited with status {code}: "
                                      f"{_last_line(log_path)} (log: {log_path})")
            address = _read_ready(ready)
            if address:
                log.info("embedded relay pid %d at %s, writing %s", proc.pid, address, journal)
                return cls(proc, address, log_path, workdir, journal, exit_timeout)
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                shutil.rmtree(workdir, ignore_errors=True)
                raise RelayStartError(
                    f"embedded relay not ready after {timeout:g}s (log: {log_path})")
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM, then wait for the relay and its sinks up to ``exit_timeout`` (its
        ``--shutdown-timeout``) plus ``STOP_GRACE``, and kill it past that; what is said meanwhile
        and at the end: docs/trainer.md, "The end of a job". Returns the relay's exit status."""
        started = time.monotonic()
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                self._wait(started, self.exit_timeout + STOP_GRACE)
            code = self.proc.returncode
            if code != 0:
                log.warning("embedded relay exited with status %s: %s (log: %s)", code,
                            _last_line(self.log_path), self.log_path)
            self._say_complete(self.run, time.monotonic() - started)
            return code
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _wait(self, started: float, limit: float) -> None:
        """Wait for the relay to exit, passing on every PROGRESS_EVERY seconds what it waits for."""
        next_line = started + PROGRESS_EVERY
        while True:
            try:
                self.proc.wait(1.0)
                return
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - started > limit:
                log.warning("embedded relay pid %d did not stop within %.0f s; killing it",
                            self.proc.pid, limit)
                self.proc.kill()
                self.proc.wait()
                return
            if now >= next_line:
                next_line = now + PROGRESS_EVERY
                progress = _read_stats(self.stats_path).get("progress")
                if progress:
                    log.info("%s (--relay_exit_timeout)", progress)

    def _say_complete(self, run: str | None, waited: float) -> None:
        """The last word on the trackers: complete, or which lack how many events and the command
        that completes them (as the relay wrote them in its stats; its last progress, if it was
        killed)."""
        stats = _read_stats(self.stats_path)
        sinks = [name for name in stats.get("sinks", {}) if name != JOURNAL_SINK]
        if not sinks:
            return
        lacks = stats.get("behind") or {}
        if not lacks:
            log.info("trackers complete: %s applied the run (%.1f s after training)",
                     ", ".join(sinks), waited)
            return
        command = [relay_executable(), *stats["replay"][1:]]
        if run is not None:
            command[3:3] = ["--run", run]
        sink_stats = stats.get("sinks", {})
        which = ", ".join(_shortfall(name, count, sink_stats.get(name, {}))
                          for name, count in lacks.items())
        log.warning("trackers not complete after %.0f s: %s; the journal has every event: "
                    "complete them with: %s", waited, which, shlex.join(command))


def stats_path(journal: str) -> str:
    """The relay's stats file beside ``journal`` (relay/journal/journal.py ``Journal.sidecar``)."""
    return journal.removesuffix(".jsonl") + "_stats.json"


def journal_name_in(output_dir: str, wanted: str = JSONL_NAME) -> str:
    """``wanted``, unless another tool writes a file of that name in ``output_dir``: then
    OWN_JSONL_NAME, said in one line. Another tool's is a file there that is not a relay journal, or
    fms-hf-tuning's file logger loaded in this process (it appends its own ``training_logs.jsonl``
    to the output dir as the job logs, after the relay has started): the relay never writes into,
    nor replaces, a file it did not make."""
    path = os.path.join(output_dir, wanted)
    if os.path.exists(path):
        if _is_journal(path):
            return wanted
        whose = "a file the relay did not write"
    elif wanted == JSONL_NAME and _FMS_FILE_LOGGER in sys.modules:
        whose = "fms-hf-tuning's file logger's"
    else:
        return wanted
    log.warning("%s in %s is %s; the relay's journal is %s", wanted, output_dir, whose,
             os.path.join(output_dir, OWN_JSONL_NAME))
    return OWN_JSONL_NAME


_FMS_FILE_LOGGER = "tuning.trackers.filelogging_tracker"


def _is_journal(path: str) -> bool:
    """An empty file, or one whose first line is a relay event (every line of a journal is one)."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 16)
    except OSError:
        return False
    if not first.strip():
        return True
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and {"run", "rank", "seq"} <= record.keys()


def _shortfall(name: str, count: int, stats: dict[str, Any]) -> str:
    """What a tracker not complete lacks, in the relay's words (relay/sinkhost/behind.py's
    shortfall: the relay's side, which the training side does not import)."""
    said = [f"{name} lacks {count:,} events"] if count else []
    if stats.get("incomplete_closes"):
        said.append("its close did not complete" if said else f"{name}'s close did not complete")
    return " and ".join(said) or f"{name} did not finish"


def relay_executable() -> str:
    """This environment's ``relay`` (.venv/bin/relay if that is not the one on PATH), as typed."""
    relay = os.path.join(os.path.dirname(sys.executable), "relay")
    if not os.path.exists(relay) or shutil.which("relay") == relay:
        return "relay"
    return near(relay)


def near(path: str) -> str:
    """``path`` relative to the current directory when it lies below it, else as it is."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _read_stats(path: str) -> dict[str, Any]:
    """The relay's stats file, or nothing: replaced whole (atomically), any file is complete."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _private_dir() -> str:
    """A new directory only this user can enter (mkdtemp: 0700), short enough for a socket."""
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
