"""Which connection sends each (run, rank) stream: the daemon's to know, beside the dedupe state
(relay/journal/dedupe.py), which knows only seqs. The rules: docs/protocol.md, "A stream belongs to
the session sending it".

The owner is a ZeroMQ routing id (a client's session id, which its reconnections keep,
relay/wire/io_thread.py). While a client is connected no other peer can fill its coming seqs with
forged events or take its acks; which connection sends a stream next follows the order its frames
came in, never the moment the relay learns a connection ended. No socket, no clock: the caller
gives the time.
"""
from __future__ import annotations

Key = tuple[str, int]

#: Seconds after its last frame that an owner the socket still counts as connected (a half-open
#: connection: its host died without closing it) keeps its streams from another connection. A client
#: with events unacknowledged resends within MAX_BACKOFF (30 s, relay/client/send_window.py), so a
#: live one is not silent this long while it has something to send.
OWNER_SILENCE = 60.0


class Owners:
    """Each stream's owner, when it last sent, and the first connection refused it since."""

    def __init__(self) -> None:
        self.owner: dict[Key, bytes] = {}  # each owned stream's connection
        self._seen: dict[Key, float] = {}  # when its owner last sent it (the caller's clock)
        #: the first connection refused it since the owner took it
        self._waiting: dict[Key, bytes] = {}
        self.owned: dict[bytes, set[Key]] = {}  # each live owner's streams

    def of(self, key: Key) -> bytes | None:
        """``key``'s owner; None: no live connection sends it."""
        return self.owner.get(key)

    def foreign(self, key: Key, peer: bytes, now: float) -> bool:
        """Whether another connection owns ``key`` and still counts as live: it has not been found
        gone and has sent for it within OWNER_SILENCE seconds of ``now``."""
        owner = self.owner.get(key)
        return owner is not None and owner != peer and now - self._seen[key] <= OWNER_SILENCE

    def claim(self, key: Key, peer: bytes, now: float) -> bool:
        """Connection ``peer`` sends stream ``key`` at ``now``: it owns it, or no live connection
        does and it takes it (True: new)."""
        self._seen[key] = now
        owner = self.owner.get(key)
        if owner == peer:
            return False
        if owner is not None:
            self._disown(key, owner)
        self.owner[key] = peer
        if self._waiting.get(key) == peer:
            del self._waiting[key]
        self.owned.setdefault(peer, set()).add(key)
        return True

    def refused(self, key: Key, peer: bytes) -> None:
        """``peer`` was refused ``key``: it is next in line, unless another was refused first."""
        self._waiting.setdefault(key, peer)

    def next_in_line(self, key: Key) -> bytes | None:
        """The first connection refused ``key`` since its owner took it, if any."""
        return self._waiting.get(key)

    def out_of_line(self, key: Key) -> None:
        """No one waits for ``key`` any more."""
        self._waiting.pop(key, None)

    def release(self, peer: bytes) -> int:
        """Connection ``peer`` is gone: its streams pass to whoever sends for them next; returns how
        many."""
        keys = self.owned.pop(peer, ())
        for key in keys:
            del self.owner[key]
        return len(keys)

    def release_all(self) -> None:
        """Every connection is gone (the relay dropped them all)."""
        for peer in list(self.owned):
            self.release(peer)

    def forget(self, key: Key) -> None:
        """``key``'s state is forgotten (its run idle, or room made for another)."""
        owner = self.owner.pop(key, None)
        self._seen.pop(key, None)
        self._waiting.pop(key, None)
        if owner is not None:
            self._disown(key, owner)

    def _disown(self, key: Key, owner: bytes) -> None:
        streams = self.owned[owner]
        streams.discard(key)
        if not streams:
            del self.owned[owner]
