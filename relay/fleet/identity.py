"""A node relay's identity in the fleet tier: unique by construction and never held by two live
relays (docs/sinks/nats.md, "One node, one relay").

A claim found from this journal folder (same machine, boot and folder, whose lock this relay
holds) is a killed predecessor's and is taken over at once. ``verdict`` has no sockets;
``NodeClaim`` runs it on the sink's loop, ``check_live`` once before the relay listens.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from relay.fleet import connection
from relay.journal.journal import Journal
from sinks.base import SinkError
from sinks.files import write_atomic

log = logging.getLogger(__name__)

ID_SUFFIX = "_nats_node.json"
# seconds a node's key outlives its last renewal (the bucket's max age, when a relay creates it)
NODE_TTL = 15.0
HOST_CHARS = 40  # of the host name, in the id
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def bucket_name(stream: str) -> str:
    return f"{stream}-nodes"


def node_key(node: str) -> str:
    return f"n.{node}"


def id_file(journal: Path) -> Path:
    return Journal(journal).sidecar(ID_SUFFIX)


def local_id(journal: Path, token: Any) -> str:
    """This journal's node id: read from beside the journal, or made now (``<host>-<16 hex>``) and
    kept there. ``token`` makes a subject token of a name (relay/fleet/stream.py's run_token)."""
    path = id_file(journal)
    try:
        node = json.loads(path.read_text())["node"]
        if isinstance(node, str) and node and token(node) == node:
            return node
        log.warning("%s holds no usable node id: making a new one", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("cannot read the node id in %s (%s): making a new one", path, exc)
    node = f"{token(socket.gethostname())[:HOST_CHARS]}-{secrets.token_hex(8)}"
    try:
        write_atomic(path, json.dumps({"node": node, "host": socket.gethostname()}))
    except OSError as exc:
        raise SinkError(f"cannot keep the node id beside the journal, in {path}: {exc.strerror}; "
                        "choose a writable --path") from None
    log.info("this journal's node id is %s (kept in %s)", node, path)
    return node


@dataclass(frozen=True)
class Claimant:
    """Who claims a node: the relay's machine (host, boot), process and journal folder (its path and
    its device and inode, which tell one folder from another of the same path)."""

    host: str
    pid: int
    path: str
    folder: tuple[int, int]
    boot: str

    @classmethod
    def here(cls, journal: Path, pid: int) -> Claimant:
        folder = journal if Journal(journal).directory else journal.parent
        st = os.stat(folder)
        try:
            boot = _BOOT_ID.read_text().strip()
        except OSError:
            boot = ""
        return cls(socket.gethostname(), pid, str(folder.resolve()), (st.st_dev, st.st_ino), boot)

    def value(self) -> bytes:
        return json.dumps({**asdict(self), "ts": round(time.time(), 3)}).encode()

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, journal {self.path}"


def read_claimant(value: bytes | None) -> tuple[Claimant | None, float | None]:
    """The claimant a key holds (None: not one of ours, or empty) and when it wrote it (unix
    time)."""
    try:
        data = json.loads(value or b"")
        return (Claimant(str(data["host"]), int(data["pid"]), str(data["path"]),
                         tuple(data["folder"]), str(data["boot"])), float(data["ts"]))
    except (ValueError, KeyError, TypeError):
        return None, None


def verdict(held: Claimant | None, ours: Claimant) -> bool:
    """Whether a node key held by ``held`` (None: by no one we can read, or nobody) may be taken by
    ``ours``: only when it is this very journal folder's claim, on this machine since its boot. The
    relay asking holds that folder's lock, so the relay that wrote the claim has stopped (or is
    this relay, whose sink process takes its parent's claim over)."""
    return held is not None \
        and (held.host, held.boot, tuple(held.folder)) == (ours.host, ours.boot, tuple(ours.folder))


def refusal(node: str, held: Claimant | None, age: float | None, id_file: Path | None) -> str:
    """The one line a relay refused ``node`` says; ``id_file``: where this journal keeps the node
    (None: the node is --nats-node's)."""
    who = held.describe() if held else "another relay"
    ago = f", renewed {age:.0f} s ago" if age is not None else ""
    mend = (f"this journal folder was copied from that one: delete {id_file} to give it its own "
            "node id" if id_file else
            "give this relay another --nats-node (or none: each journal folder has its own id)")
    return (f"node {node} is live in the fleet: {who} holds it{ago}, and two relays under one node "
            f"would mix their positions in the stream; {mend}, or stop that relay first")


async def bucket(js: Any, stream: str, replicas: int, create: bool) -> Any | None:
    """The nodes' KV bucket, created when missing if ``create`` (None: missing and not created).
    An existing bucket is used as it is (its max age is the ttl)."""
    from nats.js.api import StorageType
    from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
    name = bucket_name(stream)
    try:
        return await js.key_value(name)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            return None
    try:
        return await js.create_key_value(bucket=name, ttl=NODE_TTL, history=1, replicas=replicas,
                                         storage=StorageType.FILE)
    except BadRequestError:  # another relay created it meanwhile (with its own replicas)
        return await js.key_value(name)


async def read_claim(kv: Any, node: str) -> tuple[Claimant | None, int, float | None]:
    """(who holds ``node``, the key's revision, seconds since its last write); revision 0:
    nobody."""
    from nats.js.errors import KeyDeletedError, KeyNotFoundError
    try:
        entry = await kv.get(node_key(node))
    except (KeyNotFoundError, KeyDeletedError):
        return None, 0, None
    held, written = read_claimant(entry.value)
    return held, entry.revision or 0, None if written is None else max(0.0, time.time() - written)


async def check_live(settings: connection.NatsSettings, stream: str, node: str, ours: Claimant,
                     kept: Path | None, timeout: float = 5.0) -> None:
    """Before the relay listens: SinkError (one line, exit 2) if another journal folder's relay
    holds ``node`` live. Nothing to check when NATS or the bucket is not there yet (the sink's claim
    decides then)."""
    try:
        nc = await connection.connect(settings, retry_forever=False, timeout=timeout)
    except connection.failures() as exc:  # down or refused: probe() reported which
        log.debug("node check: %s", connection.describe(exc))
        return
    try:
        js = nc.jetstream(timeout=timeout)
        kv = await asyncio.wait_for(bucket(js, stream, 1, create=False), timeout)
        if kv is None:
            return
        held, revision, age = await asyncio.wait_for(read_claim(kv, node), timeout)
        if revision and not verdict(held, ours):
            raise SinkError(refusal(node, held, age, kept))
    except SinkError:
        raise
    except connection.failures() as exc:  # JetStream not answering: the sink's claim decides later
        log.debug("node check: %s", connection.describe(exc))
    finally:
        await nc.close()


class NodeClaim:
    """This relay's hold on its node, kept on the sink's loop: ``valid(now)`` says whether it may
    publish. ``hold()`` claims and renews until cancelled; when another journal folder's relay holds
    the node it logs an error (counted) and tries again every renewal until the key is free."""

    def __init__(self, node: str, stream: str, replicas: int, ours: Claimant, kept: Path | None,
                 on_error: Any) -> None:
        self.node, self.stream, self.replicas = node, stream, replicas
        self.ours, self.kept = ours, kept
        self.on_error = on_error  # called with a message when the node is held elsewhere
        self.ttl = NODE_TTL
        self.revision = 0
        self.sent: float | None = None  # when the last create or renewal that worked was sent
        self.refused = False

    def use_replicas(self, replicas: int) -> None:
        """The stream has ``replicas`` (as it exists): the node's key bucket gets as many."""
        self.replicas = replicas

    def valid(self, now: float) -> bool:
        """Whether the key is surely still ours at ``now`` (a third of the ttl to spare)."""
        return self.sent is not None and now < self.sent + self.ttl * 2 / 3

    async def wait(self) -> None:
        """Until the claim is valid."""
        while not self.valid(time.monotonic()):
            await asyncio.sleep(0.1)

    async def hold(self, js: Any) -> None:
        kv = None
        while True:
            try:
                if kv is None:
                    kv = await bucket(js, self.stream, self.replicas, create=True)
                    self.ttl = await _ttl(kv) or NODE_TTL
                await self._renew(kv)
            except connection.failures() as exc:
                log.debug("node %s: claim not renewed now: %s", self.node, connection.describe(exc))
            await asyncio.sleep(self.ttl / 5)

    async def _renew(self, kv: Any) -> None:
        from nats.js.errors import KeyWrongLastSequenceError
        sent = time.monotonic()
        if self.revision:
            try:
                self.revision = await kv.update(node_key(self.node), self.ours.value(),
                                                last=self.revision)
                self.sent = sent
                return
            except KeyWrongLastSequenceError:  # expired while NATS was away, or taken: look again
                self.revision, self.sent = 0, None
        held, revision, age = await read_claim(kv, self.node)
        if revision and not verdict(held, self.ours):
            if not self.refused:
                self.refused = True
                self.on_error(refusal(self.node, held, age, self.kept)
                              + "; publishing nothing until it is free")
            return
        try:
            key, value = node_key(self.node), self.ours.value()
            self.revision = await (kv.update(key, value, last=revision) if revision
                                   else kv.create(key, value))
        except KeyWrongLastSequenceError:  # another relay wrote it between the read and the write
            return
        self.sent = sent
        if self.refused:
            log.info("node %s is this relay's again: publishing", self.node)
            self.refused = False

    async def release(self, js: Any) -> None:
        """Delete the key (a relay that stops), so a relay on another journal may take the name at
        once."""
        if not self.revision:
            return
        try:
            kv = await bucket(js, self.stream, self.replicas, create=False)
            if kv is not None:
                await asyncio.wait_for(kv.delete(node_key(self.node), last=self.revision), 2.0)
        except connection.failures() as exc:  # it expires anyway
            log.debug("node %s: claim not deleted: %s", self.node, connection.describe(exc))


async def _ttl(kv: Any) -> float | None:
    status = await kv.status()
    ttl = getattr(status, "ttl", None)
    return float(ttl) if ttl else None
