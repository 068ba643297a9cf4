"""Helper processes the benchmarks start: raw feeders, a raw PULL + orjson writer, and rank hosts
(many real Publishers in one process, each its own rank).

Each prints ``ready`` once set up and waits for a line on stdin before its timed part, so the
parent can start the clock for all of them at once; every loop is bounded in count and time.

    python -m bench.procs feed dealer|push ADDRESS RUN RANK EVENTS
    python -m bench.procs raw-sink OUT_FILE EXPECTED_EVENTS
    python -m bench.procs ranks ADDRESS RUN FIRST COUNT WORLD RATE_HZ SECONDS
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import msgpack
import orjson
import zmq

from relay.wire import auth, encoding
from relay.wire.lines import encode_lines
from sinks.events import ENVELOPE, ROW_FIELDS

FRAME_EVENTS = 512  # what a Publisher puts in one frame at most
DATA = {"loss": 1.234, "grad_norm": 0.56, "learning_rate": 2e-5, "entropy": 1.9, "mean_token_accuracy": 0.61,
        "num_tokens": 123456.0}


def frames(run: str, rank: int, events: int) -> tuple[list[bytes], int]:
    """The frames a Publisher would send (compact batches) for ``events`` metrics events of one rank,
    and the bytes their JSON lines take in a journal (so a reader can tell when all are written)."""
    envelope = {"v": 1, "run": run, "rank": rank, "local_rank": rank % 8, "world_size": 16, "host": "bench"}
    prefix = encoding.compact_prefix(envelope)
    out, size = [], 0
    for start in range(0, events, FRAME_EVENTS):
        rows = [(s, time.time(), "metrics", s, 0.5, "train", DATA) for s in range(start, min(start + FRAME_EVENTS, events))]
        out.append(encoding.compact_frame(prefix, [encoding.encode_row(*row) for row in rows]))
        journaled = [{**envelope, **dict(zip(ROW_FIELDS, row, strict=True))} for row in rows]
        size += len(encode_lines(journaled))  # as the relay writes
    return out, size


def _ready_then_wait(note: str = "") -> None:
    print(f"ready {note}".strip(), flush=True)
    sys.stdin.readline()


def feed(kind: str, address: str, run: str, rank: int, events: int) -> None:
    """Send pre-encoded frames as fast as the socket takes them (DEALER to a relay, PUSH to raw)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER if kind == "dealer" else zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 60_000)  # bounded: close waits until everything is out
    if kind == "dealer":
        auth.secure_client(sock, address)  # as a Publisher does (the user's secret on TCP)
    sock.connect(address)
    blobs, size = frames(run, rank, events)
    _ready_then_wait(str(size))
    for blob in blobs:
        sock.send(blob)
    # Stay connected until the bench is done (it kills us): the relay takes only 64 frames per
    # connection at a time (RCVHWM), and what it had not read yet is gone with the connection.
    sys.stdin.readline()
    sock.close()
    ctx.term()


def raw_sink(out: str, expected: int) -> None:
    """The baseline writer: PULL, msgpack-decode (expanding compact batches as any reader must), one
    orjson line per event, one write per frame; no validation, dedupe, acks or stats."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    print(f"tcp://127.0.0.1:{port}", flush=True)
    written = 0
    deadline = time.monotonic() + 300
    while written < expected and time.monotonic() < deadline:
        if not sock.poll(1000):
            continue
        frame = msgpack.unpackb(sock.recv(), raw=False)
        v, run, rank, local_rank, world_size, host = (frame[k] for k in ENVELOPE)
        events = [{"v": v, "run": run, "rank": rank, "local_rank": local_rank, "world_size": world_size, "host": host,
                   "seq": seq, "ts": ts, "type": kind, "step": step, "epoch": epoch, "stage": stage, "data": data}
                  for seq, ts, kind, step, epoch, stage, data in frame["events"]]
        os.write(fd, b"".join([orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in events]))
        written += len(events)
    os.close(fd)
    sock.close(0)
    ctx.term()
    print(json.dumps({"written": written}), flush=True)


def ranks(address: str, run: str, first: int, count: int, world: int, rate: float, seconds: float) -> None:
    """``count`` real Publishers, ranks first.., each publishing a metrics event ``rate`` times a second
    (spread evenly) for ``seconds``; then all close; prints what they published, dropped, left."""
    from relay.client.publisher import Publisher

    pubs = [Publisher(run, r, local_rank=r % 8, world_size=world, address=address) for r in range(first, first + count)]
    _ready_then_wait()
    total = int(count * rate * seconds)
    period = 1.0 / (count * rate)
    t0 = time.monotonic()
    for i in range(total):
        due = t0 + i * period
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        pubs[i % count].publish("metrics", DATA, step=i // count, epoch=0.5, stage="train")
    behind = time.monotonic() - (t0 + seconds)
    deadline = time.monotonic() + 60  # bounded however many ranks this process hosts
    with ThreadPoolExecutor(32) as pool:
        left = list(pool.map(lambda p: p.close(max(0.1, deadline - time.monotonic())), pubs))
    print(json.dumps({"published": {p.rank: p.stats["published"] for p in pubs},
                      "dropped": sum(p.dropped for p in pubs), "unacked": sum(left), "behind_s": behind}), flush=True)


def start(args: list[str]) -> subprocess.Popen:
    """Start one helper in its own session with pipes; the caller reads ``ready`` and writes ``go``."""
    from bench.common import spawn
    return spawn([sys.executable, "-m", "bench.procs", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def await_ready(procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    """First stdout line of each helper (``ready`` or an address); raises if one died or stalled."""
    lines = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        line = proc.stdout.readline().strip()
        if not line or time.monotonic() > deadline:
            raise RuntimeError(f"helper {proc.args} did not get ready (exit {proc.poll()})")
        lines.append(line)
    return lines


def go(procs: list[subprocess.Popen]) -> None:
    """Release every helper at once."""
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()


def result(proc: subprocess.Popen, timeout: float) -> dict:
    """The JSON last line a helper prints when it is done."""
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"helper {proc.args} exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "feed":
        feed(args[0], args[1], args[2], int(args[3]), int(args[4]))
    elif cmd == "raw-sink":
        raw_sink(args[0], int(args[1]))
    elif cmd == "ranks":
        ranks(args[0], args[1], int(args[2]), int(args[3]), int(args[4]), float(args[5]), float(args[6]))
    else:
        raise SystemExit(f"unknown helper {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
