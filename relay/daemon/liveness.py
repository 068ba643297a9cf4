"""Whether the relay that left a stats file still runs, so that ``relay status relay-logs/`` never
shows a killed relay's last rates as if it were alive (docs/relay.md, ``relay status``).

The journal's lock (relay/journal/journal.py) is looked up in ``/proc/locks``, never taken, so a
relay starting at that moment is never turned away. A relay on another host (a shared file system)
cannot be judged from here, and is said to be so.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, NamedTuple

from relay.daemon.bounds import alive

LOCKS = Path("/proc/locks")


class Liveness(NamedTuple):
    state: str  # running, stopped (a clean stop: the final stats), killed, or unknown
    since: float | None  # killed: unix time of its last sign of life (stats or journal written)
    note: str  # what to print after the line, without the figures


def lock_file_for(stats_file: Path) -> Path:
    """``relay-logs/_relay_stats.json`` -> ``relay-logs/_relay.lock``; ``j_stats.json`` ->
    ``j.lock``."""
    return stats_file.with_name(stats_file.name.removesuffix("_stats.json") + ".lock")


def lock_held(lock: Path, table: Path = LOCKS) -> bool | None:
    """Whether some process holds a ``flock`` on ``lock``; None when that cannot be told here."""
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return False  # a relay that stopped cleanly removed it; one that serves holds it
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        text = table.read_text()
    except OSError:
        return None
    return any(fields[1] == "FLOCK" and device in fields[5:6]
               for fields in map(str.split, text.splitlines()) if len(fields) > 5)


def last_sign_of_life(stats_file: Path, snap: dict[str, Any]) -> float | None:
    """The latest of the stats' time and the journal's last write: the relay lived until then."""
    times = [snap["ts"]] if isinstance(snap.get("ts"), (int, float)) else []
    stem = stats_file.name.removesuffix("_stats.json")
    try:
        with os.scandir(stats_file.parent) as entries:
            for entry in entries:
                if entry.name.endswith(".jsonl") and (stem == "_relay"
                                                      or entry.name == f"{stem}.jsonl"):
                    times.append(entry.stat().st_mtime)
    except OSError:
        pass  # a folder gone or unreadable: the stats' own time says it
    return max(times, default=None)


def judge(stats_file: Path, snap: dict[str, Any]) -> Liveness:
    """How the relay that wrote ``snap`` (read from ``stats_file``) stands now."""
    host, pid = snap.get("host"), snap.get("pid")
    if isinstance(host, str) and host != socket.gethostname():
        return Liveness("unknown", None, f"written by a relay on {host}: not checked from here")
    held = lock_held(lock_file_for(stats_file))
    pid_lives = alive(pid) if type(pid) is int and pid > 0 else None
    if snap.get("final"):
        if held:
            return Liveness("running", None,
                            "a relay serves this journal again and has written no stats yet")
        return Liveness("stopped", None, "the relay had stopped")
    if held or (held is None and pid_lives):
        if pid_lives is False:  # the lock is another relay's: this one's stats are all there is
            return Liveness("running", None, f"pid {pid} is gone; another relay serves this "
                                             "journal, no stats of its own yet")
        return Liveness("running", None, "")
    if held is None and pid_lives is None:
        return Liveness("unknown", None, "whether its relay runs cannot be told here")
    return Liveness("killed", last_sign_of_life(stats_file, snap), "")
