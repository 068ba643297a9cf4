"""Ingest's own CPU per event, without sockets: the relay's ingest (relay/daemon/ingest.py's
``take_frame`` and the commit step into a real journal) against the raw writer's work
(bench/procs.py ``raw_sink``: msgpack, one dict and one orjson line per event, one write per frame)
on the same frames, alternating round by round in one process. ``--profile`` adds cProfile's view
of one more ingest round, to see where its time goes.

The ingest section (bench/bench_ingest.py) times the same two end to end, sockets and processes
included; this one says how much of the difference is ingest's code.

    python -m bench.ingest_cpu [--events N] [--publishers P] [--rounds R] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import tempfile
import time

import msgpack
import orjson

from bench.procs import frames
from relay.daemon.cross_rank import ClusterConfig
from relay.daemon.ingest import Ingest
from relay.journal.deadletter import DeadLetters
from relay.journal.journal import Journal
from relay.wire import encoding
from sinks.events import ENVELOPE


def _raw(blobs: list[bytes], folder: str) -> float:
    fd = os.open(os.path.join(folder, f"raw{time.monotonic_ns()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    t0 = time.perf_counter()
    for blob in blobs:
        frame = msgpack.unpackb(blob, raw=False)
        v, run, rank, local_rank, world_size, host = (frame[k] for k in ENVELOPE)
        events = [{"v": v, "run": run, "rank": rank, "local_rank": local_rank, "world_size": world_size, "host": host,
                   "seq": seq, "ts": ts, "type": kind, "step": step, "epoch": epoch, "stage": stage, "data": data}
                  for seq, ts, kind, step, epoch, stage, data in frame["events"]]
        os.write(fd, b"".join([orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in events]))
    took = time.perf_counter() - t0
    os.close(fd)
    return took


def _encode_acks(peer: bytes, acks: list[tuple[str, int, int]]) -> None:
    """What the loop does with acks, short of sending them."""
    encoding.encode_ack(acks)


def _ingest(blobs: list[bytes], peers: list[bytes], folder: str, profile: cProfile.Profile | None = None) -> float:
    """Every frame through take_frame, a commit (journal write, acks encoded) every 8 frames."""
    journal = Journal(os.path.join(folder, f"j{time.monotonic_ns()}.jsonl"))
    journal.open()
    ingest = Ingest(journal, DeadLetters(journal.sidecar("_deadletter.jsonl")), time.monotonic(),
                    cluster=ClusterConfig(), send_acks=_encode_acks)
    if profile is not None:
        profile.enable()
    t0 = time.perf_counter()
    for i, blob in enumerate(blobs):
        ingest.take_frame(peers[i % len(peers)], blob, time.monotonic())
        if i % 8 == 7:
            ingest.commit(time.monotonic())
    ingest.commit(time.monotonic())
    took = time.perf_counter() - t0
    if profile is not None:
        profile.disable()
    written = ingest.counters.written
    journal.close()
    ingest.deadletters.close()
    with open(journal.path, "rb") as fh:
        held = sum(1 for _ in fh)
    if written != held:
        raise RuntimeError(f"ingest counted {written} written, the journal holds other lines")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    per = args.events // args.publishers
    groups = [frames("bench", rank, per)[0] for rank in range(args.publishers)]
    # the publishers interleaved
    blobs = [blob for together in zip(*groups, strict=True) for blob in together]
    peers = [b"peer%d" % rank for rank in range(args.publishers)]
    events = per * args.publishers
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)  # as the relay's loop sets it
    with tempfile.TemporaryDirectory(prefix="bench-ingest-cpu-") as folder:
        raw, ours = [], []
        for _ in range(args.rounds):
            raw.append(_raw(blobs, folder))
            ours.append(_ingest(blobs, peers, folder))
        ratios = [r / o for r, o in zip(raw, ours, strict=True)]
        print(f"{events:,} events from {args.publishers} publishers, {args.rounds} rounds: raw writer "
              f"{statistics.median(raw) / events * 1e6:.2f} us/event, ingest {statistics.median(ours) / events * 1e6:.2f} "
              f"us/event; ingest's rate / raw's, same round: median {statistics.median(ratios):.0%} "
              f"(rounds {', '.join(f'{r:.0%}' for r in ratios)})")
        if args.profile:
            profile = cProfile.Profile()
            _ingest(blobs, peers, folder, profile)
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
