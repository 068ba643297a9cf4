"""The lease bucket as one consuming relay reads it: its member key claimed at start, then every
tick the live members (its own key written first) and each partition's holder.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from relay.fleet.connection import describe
from relay.fleet.identity import Claimant, read_claimant, verdict
from relay.fleet.ownership import Ownership
from relay.fleet.reconcile import Mismatch

log = logging.getLogger("relay.fleet")


def _running(pid: int) -> bool:
    """Whether process ``pid`` of this machine is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


async def claim_name(kv: Any, cfg: Any, ours: Claimant) -> None:
    """Make this relay's member key ``m.<name>``, refusing (Mismatch: one line, exit 2) a name
    a live relay of another folder, or another live process here, holds: two relays under one
    name would share its member key and leases, one holding every partition and the other none.
    A relay killed on this folder is taken over at once; a stopped one deleted its key."""
    from nats.js.errors import KeyWrongLastSequenceError
    try:
        await kv.create(f"m.{cfg.name}", ours.value())
        return
    except KeyWrongLastSequenceError:
        pass
    entry = await kv.get(f"m.{cfg.name}")
    held, written = read_claimant(entry.value)
    age = None if written is None else max(0.0, time.time() - written)
    if held is not None and held.pid != ours.pid and age is not None and age < cfg.ttl \
            and (not verdict(held, ours) or _running(held.pid)):
        raise Mismatch(f"consuming relay name {cfg.name} is live on stream {cfg.stream}: "
                       f"{held.describe()} holds it, renewed {age:.0f} s ago, and two relays "
                       f"under one name would share its partitions' leases (one holding every "
                       f"partition, the other none); give this relay another --name (or none: "
                       f"HOST-PID), or stop that relay first")
    await kv.update(f"m.{cfg.name}", ours.value(), last=entry.revision)


async def read_leases(kv: Any, js: Any, cfg: Any, own: Ownership,
                      claimant: Claimant | None) -> tuple[set[str], dict[int, str | None]]:
    """The live members (writing ours first) and each partition's holder. What cannot be read now
    counts as held by someone: nothing is claimed on a guess."""
    from nats.errors import Error as NatsError
    from nats.js.errors import KeyNotFoundError
    members = {cfg.name}
    leases: dict[int, str | None] = {}
    try:
        if own.leaving:  # gone from the share at once, rather than after its key expires
            await asyncio.wait_for(kv.delete(f"m.{cfg.name}"), cfg.renew)
            members.clear()
        else:
            who = claimant.value() if claimant else b"1"
            await asyncio.wait_for(kv.put(f"m.{cfg.name}", who), cfg.renew)
        info = await asyncio.wait_for(
            js.stream_info(f"KV_{cfg.bucket}", subjects_filter=f"$KV.{cfg.bucket}.m.>"), cfg.renew)
        for subject in info.state.subjects or {}:
            member = subject.split(".", 3)[3]
            if member not in members and await _alive(kv, member, cfg.renew):
                members.add(member)
    except (TimeoutError, NatsError) as exc:
        log.debug("leases: cannot read the members: %s", describe(exc))
        return members, dict.fromkeys(range(own.partitions), "?")
    for k in range(own.partitions):
        if k in own.held:
            continue
        try:
            entry = await asyncio.wait_for(kv.get(f"p{k}"), cfg.renew)
            leases[k] = (entry.value or b"?").decode(errors="replace")
        except KeyNotFoundError:
            leases[k] = None
        except (TimeoutError, NatsError):
            leases[k] = "?"
    return members, leases


async def _alive(kv: Any, member: str, renew: float) -> bool:
    """Whether ``member``'s key holds a value (a relay that stopped deleted it: a marker stays)."""
    from nats.js.errors import KeyNotFoundError
    try:
        await asyncio.wait_for(kv.get(f"m.{member}"), renew)
    except KeyNotFoundError:
        return False
    return True
