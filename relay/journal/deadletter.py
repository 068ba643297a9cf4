"""What could not be taken, with its reason, kept in a bounded JSONL file next to the journal.

The relay's own file holds rejected frames: a malformed frame is never silently thrown away, it is
counted by reason and its first bytes are kept here for inspection. Each sink but the journal has
one too, for the events it refused for good (``sinks.base.PermanentError``), each with its journal
line. Once a file reaches its bound, further entries are only counted. A sink's file is also the
record of what it refused: its next process reads it (``refused_events``) so that reading a run back
from the journal does not dead-letter an event a second time.
"""
from __future__ import annotations

import base64
import logging
import os
import time
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

KEEP_BYTES = 64 << 10

#: An event as the dead-letter file names it: (run, rank, seq), unique in a journal.
EventKey = tuple[str, int, int]


class DeadLetters:
    def __init__(self, path: Path, max_bytes: int = 16 << 20) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._size = 0

    def add(self, reason: str, detail: str, frame: bytes, peer: bytes) -> bool:
        """Record one rejected frame; False when it could not be kept (bound reached, disk full)
        and only the count remains."""
        return self._keep(orjson.dumps({
            "ts": time.time(), "reason": reason, "detail": detail[:1024], "peer": peer.hex(),
            "size": len(frame), "frame_b64": base64.b64encode(frame[:KEEP_BYTES]).decode(),
            "truncated": len(frame) > KEEP_BYTES,
        }) + b"\n")

    def add_event(self, reason: str, detail: str, line: bytes) -> bool:
        """Record one event a sink refused, ``line`` its journal line (kept whole, as JSON under
        ``event``); False when it could not be kept."""
        head = orjson.dumps({"ts": time.time(), "reason": reason, "detail": detail[:1024]})
        return self._keep(head[:-1] + b',"event":' + line.rstrip(b"\n") + b"}\n")

    def refused_events(self) -> set[EventKey]:
        """The (run, rank, seq) of every event this file holds (``add_event``). A line it cannot
        read (cut by a kill) names nothing: that event is refused and kept again, never skipped
        unkept."""
        keys: set[EventKey] = set()
        try:
            with open(self.path, "rb") as fh:
                for line in fh:
                    try:
                        key = event_key(orjson.loads(line).get("event"))
                    except (orjson.JSONDecodeError, AttributeError):
                        continue
                    if key is not None:
                        keys.add(key)
        except FileNotFoundError:
            pass
        except OSError as exc:  # what it holds is refused and kept again: counted twice, never lost
            log.warning("cannot read dead letters in %s: %s", self.path, exc.strerror)
        return keys

    def _keep(self, line: bytes) -> bool:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self._size = os.fstat(self._fd).st_size
            if self._size + len(line) > self.max_bytes:
                return False
            os.write(self._fd, line)
        except OSError as exc:
            log.warning("cannot write dead letter to %s: %s", self.path, exc.strerror)
            return False
        self._size += len(line)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def event_key(event: object) -> EventKey | None:
    """``event``'s (run, rank, seq); None for what has no such key."""
    if not isinstance(event, dict):
        return None
    run, rank, seq = event.get("run"), event.get("rank"), event.get("seq")
    if type(run) is str and type(rank) is int and type(seq) is int:
        return run, rank, seq
    return None
