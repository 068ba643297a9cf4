"""Which session writes each (run, rank) stream, and whether another session may take it over: the
rule of docs/protocol.md, "One writer per stream" (``judge``: ``live``, ``history``).

No socket, no clock. Kept with the journal, as the dedupe state is, because the node relay
(relay/daemon/) and the consuming relay (relay/fleet/sessions.py) both judge by it.
"""
from __future__ import annotations

from typing import Any, NamedTuple

#: Seconds between the log lines that sum up repeated refusals of second writers (the node
#: relay's, relay/daemon/second_writers.py, and a consuming relay's, relay/fleet/sessions.py).
REFUSED_REPORT_EVERY = 60.0

Key = tuple[str, int]

#: Conflicts remembered as already said (logged, journaled), the oldest forgotten first.
MAX_SAID = 4096
#: New conflicts said at once per stream (each a session refused); past it they are only summed up,
#: so a process sending hellos of ever new sessions cannot fill the log or the journal.
SAID_PER_STREAM = 10
#: Connections remembered as refused per stream, the oldest forgotten first (it is judged anew).
MAX_REFUSED = 64
MAX_SESSION = 64  # characters of a session nonce taken from a hello


class Writer(NamedTuple):
    """Who writes a stream: its session (None: not known) and, when its hello said, pid and host."""

    session: str | None
    pid: int | None = None
    host: str | None = None

    def who(self) -> str:
        """"pid 4242 on host vm", or as much of it as is known."""
        parts = ([f"pid {self.pid}"] if self.pid is not None else []) + \
                ([f"on host {self.host}"] if self.host else [])
        return " ".join(parts) or "pid and host unknown"


class Conflict(NamedTuple):
    """A refused hello: ``why`` live or history, ``writer`` the stream's, ``by`` the refused session
    (its pid and host as its hello says), at ``seq``."""

    key: Key
    why: str
    writer: Writer
    by: Writer
    seq: int

    @property
    def session(self) -> str:
        return self.by.session or ""

    def line(self) -> str:
        """What the refused client says, one line."""
        run, rank = self.key
        return (f"run {run} rank {rank} is written by another process ({self.writer.who()}); "
                "use another --run_name")


def named_session(data: Any) -> str | None:
    """The session a hello's ``data`` names (None: it names none, as an old client's does)."""
    named = data.get("session") if isinstance(data, dict) else None
    return named if isinstance(named, str) and 0 < len(named) <= MAX_SESSION else None


def session_of(data: Any, peer: bytes) -> str:
    """A hello's session: its ``session`` if it names one, else its connection's routing id."""
    return named_session(data) or peer.hex()


def writer_of(data: Any, host: Any, session: str | None) -> Writer:
    """The Writer a hello (its ``data`` and envelope ``host``) names."""
    pid = data.get("pid") if isinstance(data, dict) else None
    return Writer(session, pid if type(pid) is int else None,
                  host if isinstance(host, str) else None)


def judge(writer: Writer | None, session: str, *, live: bool, above: bool) -> str | None:
    """Whether a hello of ``session`` may open a stream ``writer`` writes: None (yes), or why not.
    ``live``: the writer's connection is another and still there; ``above``: the hello's seq is
    above every seq the stream holds."""
    if writer is None or writer.session is None or writer.session == session:
        return None
    if live:
        return "live"
    return None if above else "history"


class Writers:
    """Each stream's writer, the connections refused it, and the conflicts already said."""

    def __init__(self) -> None:
        self.of: dict[Key, Writer] = {}
        #: per stream, the connections refused it and why, until a hello of theirs passes
        self.refused: dict[Key, dict[bytes, Conflict]] = {}
        self._said: dict[tuple[Key, str], None] = {}  # in order of saying
        self._said_of: dict[Key, int] = {}  # how many were said per stream

    def wrote(self, key: Key, writer: Writer) -> None:
        """``writer``'s hello for ``key`` was taken: it writes the stream from now on."""
        self.of[key] = writer

    def wrote_without_hello(self, key: Key, peer: bytes, host: Any) -> None:
        """A connection sent ``key`` events and no writer is known: it is the writer (so a later
        hello that would repeat its seqs is a conflict)."""
        if key not in self.of:
            self.of[key] = Writer(peer.hex(), None, host if isinstance(host, str) else None)

    def recovered(self, key: Key, writer: Writer | None) -> None:
        """What the journal says wrote ``key`` (a run met again), unless known already."""
        if writer is not None:
            self.of.setdefault(key, writer)

    def refuse(self, key: Key, peer: bytes, conflict: Conflict) -> None:
        peers = self.refused.setdefault(key, {})
        peers[peer] = conflict
        if len(peers) > MAX_REFUSED:
            del peers[next(iter(peers))]

    def passed(self, key: Key, peer: bytes) -> None:
        """A hello of ``peer`` for ``key`` was judged fine: it is no longer refused."""
        peers = self.refused.get(key)
        if peers is not None:
            peers.pop(peer, None)
            if not peers:
                del self.refused[key]

    def refusal(self, key: Key, peer: bytes) -> Conflict | None:
        """Why ``peer`` is refused ``key``, if it is."""
        peers = self.refused.get(key)
        return None if peers is None else peers.get(peer)

    def first_time(self, conflict: Conflict) -> bool:
        """Whether this session's conflict over this stream is new (logged and journaled once)."""
        said = (conflict.key, conflict.session)
        if said in self._said or self._said_of.get(conflict.key, 0) >= SAID_PER_STREAM:
            return False
        self._said[said] = None
        self._said_of[conflict.key] = self._said_of.get(conflict.key, 0) + 1
        if len(self._said) > MAX_SAID:
            del self._said[next(iter(self._said))]
        return True

    def gone(self, peer: bytes) -> None:
        """``peer``'s connection is gone: it is refused nothing more (a new one is judged anew)."""
        for key in [key for key, peers in self.refused.items() if peer in peers]:
            self.passed(key, peer)

    def all_gone(self) -> None:
        """Every connection is gone: each is judged anew when it sends."""
        self.refused.clear()

    def forget(self, key: Key) -> None:
        self.of.pop(key, None)
        self.refused.pop(key, None)
        self._said_of.pop(key, None)
