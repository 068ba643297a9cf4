"""The soak's hostile client (bench/soak.py): raw ZeroMQ DEALER sockets, no Publisher, sending a
rotating mix of malformed, extreme and spoofed frames at a low rate until SIGTERM, then what it
sent per kind as one JSON line on stdout.

    python -m bench.soak_hostile ADDRESS GOOD_RUN RANKS RATE_HZ SEED [--skip KIND ...]

Every event it makes carries ``host = HOST``, and the ones it slips into the good run use seqs from
SPOOF_SEQ_BASE up, far above anything a rank reaches, so the soak can tell its lines from the
ranks' and any loss it causes comes from what the relay does with them, not from a seq collision
(which no relay without client authentication could tell apart: that is what CURVE is for).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from relay.wire import auth, encoding, schema
from sinks.events import ENVELOPE

HOST = "soak-hostile"
SPOOF_SEQ_BASE = 1 << 40

#: Each kind and what it sends; the soak prints this beside the counts and the relay's rejections.
KINDS_SENT = {
    "random_bytes": "1 B - 4 KiB of random bytes",
    "truncated": "a valid compact batch of 20 events cut short at a random byte",
    "oversize": "one event of 1.2 MiB (over the 1 MiB frame limit)",
    "over_transport": "one event of 5 MiB (over ZeroMQ's MAXMSGSIZE: the connection is dropped, the relay never sees it)",
    "multipart": "a valid event followed by a second message part",
    "extreme_ints": "data ints 2**63, 2**64-1, -2**63, -1; seq and step 2**63-1, 2**63 or 2**64-1; rank 2**24-2 "
                    "(the largest a client may use)",
    "extreme_floats": "NaN, +-inf, +-1e308, 5e-324 as ts and epoch; non-finite data values",
    "big_strings": "100 KB string values, or a 257-character host",
    "deep_nesting": "data nested 9 levels, or 100,000 levels of msgpack arrays",
    "wrong_types": "one field wrong in turn: seq \"1\", rank -1/True/2**24, world_size 0, unknown type, data list, v 2, "
                   "missing or unknown field, run ids ../../etc/passwd and empty, ts \"now\", bytes values, int keys",
    "compact_bad": "compact batches with short or map rows, no host, no events; or 2,000 tiny valid rows",
    "spoof_stats": "a stats event in a good rank's name claiming dropped_upto 10**12, 2**63, 2**64-2 or 2**64-1",
    "spoof_hello": "a hello in a good rank's name with odd data, at seq 0 or far above",
    "odd_lifecycle": "lifecycle events with odd data (int or nil event, 10 KB), in a good rank's name or a fresh run",
    "fresh_runs": "one batch of 16 events, each under a new run id (one journal file each)",
}
KINDS = tuple(KINDS_SENT)

#: The values spoofed stats events claim as ``dropped_upto`` for a good rank, in rotation.
SPOOF_UPTO = (10**12, 2**63, 2**64 - 2, 2**64 - 1)


class Hostile:
    """Builds one frame (or a multipart message) per call of ``frame(kind)``; seeded, so a soak
    repeats the same sequence of attacks."""

    def __init__(self, good_run: str, ranks: int, seed: int) -> None:
        self.good_run = good_run
        self.ranks = ranks
        self.rng = random.Random(seed)
        self.turn: collections.Counter[str] = collections.Counter()
        self.spoof_seq = SPOOF_SEQ_BASE

    def run_id(self) -> str:
        return f"hostile-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:12]}"

    def event(self, run: str | None = None, **fields: Any) -> dict[str, Any]:
        base = {"v": 1, "run": run or self.run_id(), "rank": 0, "local_rank": 0, "world_size": 1, "host": HOST,
                "seq": self.rng.randrange(1 << 20), "ts": time.time(), "type": "metrics", "step": 1, "epoch": 0.0,
                "stage": "train", "data": {"loss": 1.0}}
        base.update(fields)
        return base

    def spoof(self, **fields: Any) -> dict[str, Any]:
        """An event in one of the good ranks' names, at a seq no rank will reach."""
        self.spoof_seq += 1
        return self.event(self.good_run, rank=self.rng.randrange(self.ranks), world_size=self.ranks,
                          seq=self.spoof_seq, **fields)

    def frame(self, kind: str) -> bytes | list[bytes]:
        n = self.turn[kind]
        self.turn[kind] += 1
        return getattr(self, f"_{kind}")(n)

    # -- one method per kind; ``n`` is how many of that kind came before ---------------------------

    def _random_bytes(self, n: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(1, 4096))

    def _truncated(self, n: int) -> bytes:
        envelope = {k: v for k, v in self.event().items() if k in ENVELOPE}
        rows = [encoding.encode_row(s, time.time(), "metrics", s, 0.1, "train", {"loss": 0.5}) for s in range(20)]
        whole = encoding.compact_frame(encoding.compact_prefix(envelope), rows)
        return whole[: self.rng.randint(1, len(whole) - 1)]

    def _oversize(self, n: int) -> bytes:
        return encoding.encode_event(self.event(data={"blob": "x" * (1200 << 10)}))

    def _over_transport(self, n: int) -> bytes:
        return encoding.encode_event(self.event(data={"blob": "y" * (5 << 20)}))

    def _multipart(self, n: int) -> list[bytes]:
        return [encoding.encode_event(self.event()), b"second part"]

    def _extreme_ints(self, n: int) -> bytes:
        data = {"i63": 2**63, "u64": 2**64 - 1, "neg": -(2**63), "minus_one": -1, "zero": 0}
        big = (2**63 - 1, 2**63, 2**64 - 1)[n % 3]
        return encoding.encode_event(self.event(seq=big, step=big, rank=schema.MAX_RANK - 2,
                                              local_rank=schema.MAX_RANK - 1, world_size=schema.MAX_RANK - 1,
                                              data=data))

    def _extreme_floats(self, n: int) -> bytes:
        odd = (math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324)
        x = odd[n % len(odd)]
        return encoding.encode_event(self.event(ts=x, epoch=odd[(n + 1) % len(odd)],
                                              data={"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "x": x}))

    def _big_strings(self, n: int) -> bytes:
        if n % 3 == 2:
            return encoding.encode_event(self.event(host="h" * (schema.MAX_NAME_LEN + 1)))
        return encoding.encode_event(self.event(data={"s": "x" * 100_000, "u": "\u00e9" * 50_000}))

    def _deep_nesting(self, n: int) -> bytes:
        if n % 2:
            return b"\x91" * 100_000 + b"\xc0"  # [[[[...nil...]]]]: 100,000 levels of msgpack arrays
        data: dict[str, Any] = {"leaf": 1}
        for _ in range(schema.MAX_DEPTH + 1):
            data = {"d": data}
        return encoding.encode_event(self.event(data=data))

    def _wrong_types(self, n: int) -> bytes:
        breakers: list[Callable[[dict], None]] = [
            lambda e: e.update(seq="1"), lambda e: e.update(rank=-1), lambda e: e.update(world_size=0),
            lambda e: e.update(type="bogus"), lambda e: e.update(data=[1, 2]), lambda e: e.update(v=2),
            lambda e: e.pop("host"), lambda e: e.update(evil=1), lambda e: e.update(run="../../etc/passwd"),
            lambda e: e.update(run=""), lambda e: e.update(ts="now"), lambda e: e.update(step=-5),
            lambda e: e.update(stage=123), lambda e: e.update(data={"b": b"\x00\xff"}),
            lambda e: e.update(rank=True), lambda e: e.update(rank=schema.MAX_RANK),
        ]
        event = self.event()
        breakers[n % len(breakers)](event)
        if n % len(breakers) == 0 and n:  # now and then a map with an int key (msgpack strict_map_key)
            return msgpack.packb({1: 2, **event}, use_bin_type=True)
        return encoding.encode_event(event)

    def _compact_bad(self, n: int) -> bytes:
        envelope = {k: v for k, v in self.event().items() if k in ENVELOPE}
        row = [0, time.time(), "metrics", 1, 0.0, "train", {"loss": 1.0}]
        frames = [
            {**envelope, "events": [row, row[:5]]},
            {**envelope, "events": [row, {"seq": 1}]},
            {**{k: v for k, v in envelope.items() if k != "host"}, "events": [row]},
            {**envelope, "events": []},
            {**envelope, "events": [[s, 0.0, "metrics", None, None, None, {}] for s in range(2000)]},
        ]
        return msgpack.packb(frames[n % len(frames)], use_bin_type=True)

    def _spoof_stats(self, n: int) -> bytes:
        upto = SPOOF_UPTO[n % len(SPOOF_UPTO)]
        return encoding.encode_event(self.spoof(type="stats", step=None, epoch=None, stage="client", data={
            "dropped": 2**64 - 1, "dropped_full": 0, "dropped_unacked": 2**63, "dropped_bad": 0,
            "dropped_closed": 0, "dropped_error": 0, "dropped_upto": upto, "published": 2**64 - 1, "resent": -1}))

    def _spoof_hello(self, n: int) -> bytes:
        data = {"pid": -1, "address": "tcp://evil:1" * 20, "max_events": 2**64 - 1, "python": None}
        event = self.spoof(type="hello", step=None, epoch=None, stage=None, data=data)
        if n % 2 == 0:
            event["seq"] = 0
        return encoding.encode_event(event)

    def _odd_lifecycle(self, n: int) -> bytes:
        data = ({"event": 123}, {"event": None, "nested": {"a": [1, {"b": None}]}}, {}, {"event": "x" * 10_000})
        fields = {"type": "lifecycle", "step": None, "stage": None, "data": data[n % len(data)]}
        return encoding.encode_event(self.spoof(**fields) if n % 2 else self.event(**fields))

    def _fresh_runs(self, n: int) -> bytes:
        return encoding.encode_frame([self.event(seq=0) for _ in range(16)])


def serve(address: str, good_run: str, ranks: int, rate: float, seed: int, skip: set[str]) -> dict[str, Any]:
    """Send until SIGTERM; returns the counts. Nothing the relay does (reject, disconnect, vanish)
    ends this loop: sends that ZeroMQ would not take while the relay is down count as blocked."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kinds = [k for k in KINDS if k not in skip]
    hostile = Hostile(good_run, ranks, seed)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # a send while the relay is down fails here, counted as blocked
    sock.setsockopt(zmq.SNDHWM, 100)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    auth.secure_client(sock, address)  # a process of the job's user, holding its secret
    sock.connect(address)
    sent: collections.Counter[str] = collections.Counter()
    blocked: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    acks = {"acks": 0, "acks_for_good_run": 0, "max_good_floor_acked": -1}
    t0 = time.monotonic()
    i = 0
    while not stop.wait(max(0.0, t0 + i / rate - time.monotonic())):
        kind = kinds[i % len(kinds)]
        i += 1
        try:
            msg = hostile.frame(kind)
            if isinstance(msg, list):
                sock.send_multipart(msg, zmq.NOBLOCK)
            else:
                sock.send(msg, zmq.NOBLOCK)
            sent[kind] += 1
        except zmq.Again:
            blocked[kind] += 1
        except Exception:  # noqa: BLE001 - a frame we could not even build is counted, never fatal
            errors[kind] += 1
        _read_acks(sock, good_run, acks)
    sock.close(0)
    ctx.term()
    return {"sent": dict(sent), "blocked": dict(blocked), "errors": dict(errors), **acks}


def _read_acks(sock: zmq.Socket, good_run: str, acks: dict[str, int]) -> None:
    """Drain what the relay sent back; an ack for a good rank here means the relay routed that
    rank's acknowledgement to us because we spoke in its name last."""
    while True:
        try:
            frame = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        acks["acks"] += 1
        try:
            entries = schema.decode_ack(frame)
        except schema.FrameError:
            continue
        for run, _rank, floor in entries:
            if run == good_run:
                acks["acks_for_good_run"] += 1
                acks["max_good_floor_acked"] = max(acks["max_good_floor_acked"], floor)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("good_run")
    parser.add_argument("ranks", type=int)
    parser.add_argument("rate", type=float)
    parser.add_argument("seed", type=int)
    parser.add_argument("--skip", action="append", default=[], choices=KINDS)
    args = parser.parse_args(argv)
    result = serve(args.address, args.good_run, args.ranks, args.rate, args.seed, set(args.skip))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
