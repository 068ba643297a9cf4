"""The publishing side's fair floor (issue 40 item 4 (a)): what a node relay with the nats sink must
do and nothing more, in one process: a PULL socket takes the frames the publishers send, each
frame's events are appended to a file as journal lines (decoded and encoded in C by the relay's own
codec, the cheapest there is here), and those lines are published by nats-py in chunks of whole
frames, at least CHUNK lines (1,024 here: two frames), INFLIGHT at a time, into an R3 stream, until
every chunk is acknowledged. No dedupe, acknowledgement to the ranks, stats or second process.

    python -m bench.fleet_floor OUT EXPECTED_EVENTS NATS_URLS STREAM PREFIX

Prints the PULL address once its stream exists and its socket listens, then ``acked T CPU`` once
JetStream holds every line: T the ``time.perf_counter()`` of the last acknowledgement
(CLOCK_MONOTONIC, the same in every process here), CPU the seconds of CPU it took since it listened.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time

import zmq
import zmq.asyncio

from relay.wire import schema
from relay.wire.lines import encode_lines

CHUNK = 1000  # lines a message, as the nats sink cuts them
INFLIGHT = 16  # publishes awaiting their ack at once, as bench_fleet's nats-py alone
DEADLINE = 300.0  # seconds the floor waits for its input at most


def frame_lines(blob: bytes) -> tuple[bytes, int]:
    """One frame's events as journal lines, as the node relay's ingest makes them, and how many."""
    frame = schema.decode(blob)
    return encode_lines(frame.records if frame.finite else frame.events, frame.finite), len(frame.records)


async def floor(out: str, expected: int, urls: str, stream: str, prefix: str) -> tuple[float, float]:
    """Run the floor; the perf_counter() of its last acknowledgement, and the CPU seconds it took."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(urls.split(","))
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.PULL)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        js = nc.jetstream(timeout=30)
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.>"], num_replicas=3,
                                         storage=StorageType.FILE))
        print(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}", flush=True)
        cpu = time.process_time()
        window, acks = asyncio.Semaphore(INFLIGHT), list[asyncio.Future[None]]()

        async def publish(i: int, body: bytes) -> None:
            try:
                await js.publish(f"{prefix}.node.run", body, headers={"Nats-Msg-Id": f"floor-{i}"})
            finally:
                window.release()

        pending: list[bytes] = []
        lines = written = 0
        deadline = time.monotonic() + DEADLINE
        while written < expected and time.monotonic() < deadline:
            if not await sock.poll(1000):
                continue
            chunk, events = frame_lines(await sock.recv())
            os.write(fd, chunk)
            written += events
            pending.append(chunk)
            lines += events
            if lines >= CHUNK or written >= expected:
                body, pending, lines = b"".join(pending), [], 0
                await window.acquire()
                acks.append(asyncio.ensure_future(publish(len(acks), body)))
        await asyncio.gather(*acks)
        return time.perf_counter(), time.process_time() - cpu
    finally:
        os.close(fd)
        sock.close(0)
        ctx.term()
        await nc.close()


if __name__ == "__main__":
    out_, expected_, urls_, stream_, prefix_ = sys.argv[1:6]
    acked, took = asyncio.run(floor(out_, int(expected_), urls_, stream_, prefix_))
    print(f"acked {acked} {took}", flush=True)
