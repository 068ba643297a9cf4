"""A consuming relay's options against the stream, the durable consumers and the lease bucket as
they exist: what every consuming relay must agree on is one line and exit 2, what may differ is
applied (docs/deployment.md, "Options the consuming relays share").

``--lease-ttl`` must agree because a relay with another ttl would take a partition its holder
still trusts.
"""
from __future__ import annotations

import logging
from typing import Any

from relay.fleet.stream import partition_filter

log = logging.getLogger("relay.fleet")

MAX_WAITING = 64  # pull requests a partition's consumer keeps waiting


class Mismatch(Exception):
    """An option that must agree across the consuming relays differs from what exists: one line."""


def consumer_config(cfg: Any, k: int) -> Any:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    durable = f"{cfg.durable}-p{k}"
    return ConsumerConfig(name=durable, durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                          deliver_policy=DeliverPolicy.ALL, max_ack_pending=cfg.max_ack_pending,
                          ack_wait=cfg.ack_wait, max_waiting=MAX_WAITING,
                          filter_subject=partition_filter(cfg.prefix, k))


def check_stream(info: Any, cfg: Any) -> None:
    """The stream must take ``<prefix>.>``."""
    subjects = info.config.subjects or []
    if f"{cfg.prefix}.>" not in subjects:
        taken = ', '.join(subjects) or 'no subjects'
        raise Mismatch(f"stream {cfg.stream} takes {taken}, not {cfg.prefix}.>: give "
                       f"the --nats-prefix its node relays publish with, or another --nats-stream")


async def lease_bucket(js: Any, cfg: Any, replicas: int) -> Any:
    """The leases' KV bucket, created with ``--lease-ttl`` when missing; Mismatch if it exists with
    another ttl."""
    from nats.js.api import StorageType
    from nats.js.errors import BadRequestError, BucketNotFoundError
    try:
        kv = await js.key_value(cfg.bucket)
    except BucketNotFoundError:
        try:
            return await js.create_key_value(bucket=cfg.bucket, ttl=cfg.ttl, history=1,
                                             replicas=replicas, storage=StorageType.FILE)
        except BadRequestError:  # another relay created it meanwhile: checked below like any
            kv = await js.key_value(cfg.bucket)
    ttl = (await kv.status()).ttl or 0.0
    if abs(ttl - cfg.ttl) > 1e-3:
        raise Mismatch(f"--lease-ttl {cfg.ttl:g} differs from the lease bucket {cfg.bucket}'s "
                       f"{ttl:g} s, which every consuming relay of stream {cfg.stream} uses: give "
                       f"--lease-ttl {ttl:g}, or to change it stop them all and delete the bucket "
                       f"(nats kv del {cfg.bucket})")
    return kv


async def update_consumers(js: Any, cfg: Any, partitions: int) -> None:
    """Each partition's existing durable consumer: Mismatch if it filters another prefix's subjects;
    updated when its ack wait or max ack pending differ from this relay's options."""
    from nats.js.errors import NotFoundError
    for k in range(partitions):
        want = consumer_config(cfg, k)
        try:
            have = (await js.consumer_info(cfg.stream, want.durable_name)).config
        except NotFoundError:
            continue  # made with these options when a relay first takes the partition
        if have.filter_subject != want.filter_subject:
            raise Mismatch(f"consumer {want.durable_name} of stream {cfg.stream} takes "
                           f"{have.filter_subject}, not {want.filter_subject}: give the stream's "
                           f"--nats-prefix")
        changed = [f"{name} {old:g} -> {new:g}" for name, old, new in
                   (("ack_wait", have.ack_wait or 0.0, cfg.ack_wait),
                    ("max_ack_pending", have.max_ack_pending or 0, cfg.max_ack_pending))
                   if abs(old - new) > 1e-3]
        if changed:
            # an existing durable: JetStream updates it
            await js.add_consumer(cfg.stream, config=want)
            log.info("consumer %s: %s (this relay's --ack-wait / --max-ack-pending)",
                     want.durable_name, ", ".join(changed))


async def bind_consumer(js: Any, cfg: Any, k: int) -> Any:
    """Partition ``k``'s durable pull consumer, created with this relay's options when missing."""
    want = consumer_config(cfg, k)
    return await js.pull_subscribe(want.filter_subject, durable=want.durable_name,
                                   stream=cfg.stream, config=want,
                                   pending_msgs_limit=cfg.fetch * 4)
