"""Relay core: the cost of one publish() against a raw msgpack + ZeroMQ send, and relay ingest
events/s into the JSONL journal.

    python -m bench.bench_core [--quick]
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import zmq

from bench import procs
from bench.common import RelayRun, Sample, alternate, free_port, machine, table
from relay.client.publisher import Publisher
from relay.journal.journal import Journal
from relay.wire import auth

LOG = {"loss": 1.234, "grad_norm": 0.56, "learning_rate": 2e-5, "epoch": 0.5, "entropy": 1.9,
       "mean_token_accuracy": 0.61, "num_tokens": 123456.0}


def publish_cost(calls: int, rounds: int) -> list[dict]:
    """Per-call wall time of publish() (relay up, relay down) and of the raw floor, alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        relay = RelayRun(Path(tmp), ["--path", f"{tmp}/j/"])
        up = Publisher("bench-up", 0, address=relay.address)
        down = Publisher("bench-down", 0, address=f"tcp://127.0.0.1:{free_port()}", max_events=10_000)
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        auth.secure_client(raw, relay.address)
        raw.connect(relay.address)
        host = socket.gethostname()
        state = {"seq": 0, "step": 0}

        def raw_send() -> float:
            start = time.perf_counter()
            for _ in range(calls):
                state["seq"] += 1
                ev = {"v": 1, "run": "bench-raw", "rank": 0, "local_rank": 0, "world_size": 1, "host": host,
                      "seq": state["seq"], "ts": time.time(), "type": "metrics", "step": state["step"],
                      "epoch": 0.5, "stage": "train", "data": LOG}
                # (try, not contextlib.suppress: the timed floor, suppress() adds ~0.25 us a call)
                try:  # noqa: SIM105
                    raw.send(msgpack.packb(ev), zmq.NOBLOCK)
                except zmq.Again:
                    pass
            return (time.perf_counter() - start) / calls

        def ours(pub: Publisher) -> float:
            start = time.perf_counter()
            for step in range(calls):
                pub.publish("metrics", LOG, step=step, epoch=0.5, stage="train")
            elapsed = (time.perf_counter() - start) / calls
            pub.flush(10) if pub is up else None
            return elapsed

        for _ in range(2):  # warm up, and fill the relay-down buffer so drops are on the path
            raw_send(), ours(up), ours(down)
        samples = alternate({"raw msgpack.packb + zmq send": raw_send, "publish(), relay up": lambda: ours(up),
                             "publish(), relay down": lambda: ours(down)}, rounds, "s")
        assert down.dropped > 0
        up.close(5)
        down.close(0.1)
        raw.close(0)
        ctx.term()
        relay.stop()
    base = samples["raw msgpack.packb + zmq send"]
    return [base.row(), samples["publish(), relay up"].row(base), samples["publish(), relay down"].row(base)]


def ingest_rate(events: int, rounds: int) -> list[dict]:
    """Events/s a relay writes to JSONL, fed pre-encoded batches by a raw DEALER socket."""
    sample = Sample("relay ingest into JSONL", "events/s")
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            journal = Path(tmp) / "j.jsonl"
            relay = RelayRun(Path(tmp), ["--path", str(journal), "--stats-interval", "0.1"])
            stats_path = Journal(journal).sidecar("_stats.json")
            frames, _ = procs.frames(f"ingest{r}", 0, events)  # what a Publisher sends: compact batches
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.SNDHWM, 0)
            auth.secure_client(sock, relay.address)
            sock.connect(relay.address)
            time.sleep(0.2)
            t0 = time.perf_counter()
            for frame in frames:
                sock.send(frame)
            written = 0
            while written < events:
                time.sleep(0.01)
                try:
                    written = json.loads(stats_path.read_text())["written"]
                except (FileNotFoundError, json.JSONDecodeError, KeyError):
                    continue
            sample.values.append(events / (time.perf_counter() - t0))
            sock.close(0)
            ctx.term()
            relay.stop()
    return [sample.row()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = parser.parse_args(argv)
    calls, rounds, events, ingest_rounds = (200, 3, 5_000, 1) if args.quick else (5_000, 15, 300_000, 5)
    publish = publish_cost(calls, rounds)
    ingest = ingest_rate(events, ingest_rounds)
    print(table(publish, f"publish() cost per call ({calls} calls x {rounds} rounds)"))
    print()
    print(table(ingest, f"relay ingest, {events} events per round"))
    result = {"machine": machine(), "publish": publish, "ingest": ingest}
    print(json.dumps(result), file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
