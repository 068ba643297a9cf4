"""The journal cut into chunks for NATS: complete lines of one run, the journal's very bytes, named
by their byte range (``Nats-Msg-Id``) and saying where to resume (``Relay-End``); see
docs/sinks/nats.md. No network here: relay/fleet/publisher.py publishes what this cuts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from relay.journal.reader import READ_SIZE, open_listed
from relay.ship.positions import PositionFile
from relay.ship.sources import JournalSources

STATE_SUFFIX = "_nats.json"
_HEAD = b'{"v":1,"run":"'  # how every line the relay writes starts (sinks.events.FIELDS order)


@dataclass
class Chunk:
    """Lines of one run, ``body`` being the journal's bytes from ``start`` to ``end`` of ``file``
    (less any line of another run in a run's own file)."""

    run: str
    file: str
    start: int
    end: int
    body: bytes
    lines: int

    def msg_id(self, node: str) -> str:
        """Deterministic from the chunk's place in the journal: published again, JetStream drops
        it."""
        return f"{node}:{self.run}:{self.file}:{self.start}-{self.end}"

    def headers(self, node: str) -> dict[str, str]:
        return {"Nats-Msg-Id": self.msg_id(node), "Relay-Node": node, "Relay-Run": self.run,
                "Relay-Lines": str(self.lines), "Relay-End": f"{self.file}:{self.end}"}


def run_of(line: bytes) -> str | None:
    """The run of a journal line: read off its head as the relay writes it, else parsed (None: not
    an event)."""
    if line.startswith(_HEAD):
        end = line.find(b'"', len(_HEAD))
        if end > 0:
            return line[len(_HEAD):end].decode("utf-8", "replace")
    try:
        run = orjson.loads(line).get("run")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return run if isinstance(run, str) else None


class ChunkReader(JournalSources):
    """Cuts a journal's new lines into chunks, source by source, keeping each source's position."""

    def __init__(self, journal: Path) -> None:
        super().__init__(journal)
        self.skipped = 0  # lines that are not events, or of another run in a run's file

    def take(self, source: str | None, max_lines: int, max_bytes: int, more: Chunk | None = None,
             stop: int | None = None) -> Chunk | None:
        """The next chunk of ``source``: up to ``max_lines`` lines and ``max_bytes`` bytes (one line
        alone may be longer), of one run, ending at ``stop`` at the latest (a line boundary: where a
        chunk the stream holds starts); or ``more`` grown by what came since (None: nothing new).

        The journal's bytes are read as a block and checked at C speed: when every line of it starts
        with the run's head (as the relay writes lines), the block is the chunk; else it is split
        and each line's run read (a line of another run, or not an event, is skipped in a run's file
        and ends the chunk in the one file)."""
        path = self.file(source)
        if path is None:
            return more
        lines_left = max_lines - (more.lines if more else 0)
        bytes_left = max_bytes - (len(more.body) if more else 0)
        start = self.reader.position(path, source)
        try:
            # replaced by a shorter file: read it afresh (as JournalReader does)
            if path.stat().st_size < start:
                start = 0
        except FileNotFoundError:
            return more
        if stop is not None:
            bytes_left = min(bytes_left, stop - start)
            if bytes_left <= 0:
                return more
        block = _read_lines(path, start, bytes_left if more else max(bytes_left, 1),
                            whole_line=more is None)
        if lines_left <= 0 or not block:
            return more
        if block.count(b"\n") > lines_left:
            cut = -1
            for _ in range(lines_left):
                cut = block.index(b"\n", cut + 1)
            block = block[:cut + 1]
        run = more.run if more else source or run_of(block[:block.index(b"\n")])
        head = _HEAD + run.encode() + b'"' if run is not None else None
        if head is not None and block.startswith(head) \
                and block.count(b"\n" + head) == block.count(b"\n") - 1:
            body, used, lines = block, len(block), block.count(b"\n")
        else:
            body, used, lines, run = self._sort(block, source, run)
        self.reader.seek(path, source, start + used)
        if not lines or run is None:
            return more if more else (
                self.take(source, max_lines, max_bytes, stop=stop) if used else None)
        if more:
            return Chunk(run, path.name, more.start, start + used, more.body + body,
                         more.lines + lines)
        return Chunk(run, path.name, start, start + used, body, lines)

    def _sort(self, block: bytes, source: str | None,
              run: str | None) -> tuple[bytes, int, int, str | None]:
        """(body, bytes used, lines, run) of a block whose lines are not all of one run, line by
        line."""
        kept: list[bytes] = []
        used = 0
        for line in block.split(b"\n")[:-1]:
            line_run = run_of(line) if line.strip() else None
            if line_run is not None and source is None and run is not None and line_run != run:
                break  # the one file: the next run's lines start the next chunk
            used += len(line) + 1
            if line_run is None or (source is not None and line_run != source):
                # not an event, or another run's line: never sent
                self.skipped += bool(line.strip())
                continue
            run = line_run
            kept.append(line + b"\n")
        return b"".join(kept), used, len(kept), run


def _read_lines(path: Path, start: int, limit: int, whole_line: bool) -> bytes:
    """The complete lines of ``path`` from ``start``, at most ``limit`` bytes; with ``whole_line``,
    a first line longer than ``limit`` whole. Empty when no complete line is there (yet)."""
    fh = open_listed(path)
    if fh is None:
        return b""
    with fh:
        fh.seek(start)
        block = fh.read(limit)
        end = block.rfind(b"\n") + 1
        if end or not whole_line or len(block) < limit:
            return block[:end]
        while True:  # a first line longer than the limit: read on to its end
            more = fh.read(READ_SIZE)
            if not more:
                return b""
            newline = more.find(b"\n")
            if newline >= 0:
                return block + more[:newline + 1]
            block += more


# (file name, offset acknowledged, floor: relay/fleet/resume.py)
Position = tuple[str, int, "int | None"]


def position_file(journal: Path, target: dict[str, str]) -> PositionFile:
    """The state file: each source's acknowledged position, with the stream sequence a restart
    looks for chunks stored after (relay/fleet/resume.py; None in files older than that), for the
    stream, prefix and node ``target`` names (another stream or node: everything is published
    again)."""
    return PositionFile(journal, STATE_SUFFIX, {"target": target})


def positions(state: dict[str, Any]) -> dict[str, Position]:
    """source key ("" for the one file) -> (file name, offset, floor), of the state file."""
    return {str(k): (str(v[0]), int(v[1]), None if len(v) < 3 or v[2] is None else int(v[2]))
            for k, v in state["sources"].items()}


def source_key(source: str | None) -> str:
    return source or ""


def key_source(key: str) -> str | None:
    return key or None
