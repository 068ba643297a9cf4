"""The wire's validation, this tree's against another's, in one run: ``relay/wire/schema.py`` of a
baseline (a file, e.g. ``git show <commit>:relay/wire/schema.py > /tmp/schema_before.py``) loaded
beside this tree's, both fed the same frames, alternating round by round in one process:

- ingest: every frame through ``take_frame`` and the commit step into a real journal
  (bench/ingest_cpu.py's round), with the relay's ingest reading frames through either schema;
- decode alone, three kinds of frame: compact batches of metrics (the column path), the same
  events as batches of maps (``validate_event`` per event), compact batches of params with nested
  data (the row path).

Each is timed in CPU seconds of this process (one thread; the journal's writes included): on a
shared machine the wall clock counts other processes' turns too.

    python -m bench.schema_cpu --baseline /tmp/schema_before.py [--events N] [--publishers P] [--rounds R]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

import msgpack

from bench.ingest_cpu import _ingest
from bench.procs import frames
from relay.wire import encoding, schema


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_schema", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def _reading_with(module: ModuleType) -> Iterator[None]:
    """The relay's ingest decoding frames with ``module``'s decode for a round (the frames are
    valid, so nothing needs its FrameError)."""
    saved = schema.decode
    schema.decode = module.decode
    try:
        yield
    finally:
        schema.decode = saved


def _decoding(decode: Callable[[bytes], object], blobs: list[bytes]) -> float:
    t0 = time.process_time()
    for blob in blobs:
        decode(blob)
    return time.process_time() - t0


def _workloads(blobs: list[bytes]) -> dict[str, list[bytes]]:
    """The same events as compact batches, as batches of maps, and compact batches of nested params."""
    maps = [encoding.encode_frame(schema.decode_frame(blob)) for blob in blobs]
    envelope = {"v": 1, "run": "bench", "rank": 0, "local_rank": 0, "world_size": 16, "host": "bench"}
    params = {"model": {"layers": 2, "hidden": 64, "dropout": [0.1, 0.0]}, "lr": 2e-5, "name": "tiny"}
    nested = [encoding.compact_frame(encoding.compact_prefix(envelope), [
        encoding.encode_row(start + i, 1.5, "params", None, None, "hparams", params) for i in range(64)])
        for start in range(0, sum(len(msgpack.unpackb(b)["events"]) for b in blobs), 64)]
    return {"compact metrics (column path)": blobs, "batches of maps (validate_event per event)": maps,
            "compact nested params (row path)": nested}


def _line(what: str, events: int, ours: list[float], base: list[float]) -> str:
    ratios = [b / o for o, b in zip(ours, base, strict=True)]
    return (f"{what}: this tree {statistics.median(ours) / events * 1e6:.3f} us/event, baseline "
            f"{statistics.median(base) / events * 1e6:.3f} us/event; this tree's rate / the baseline's, same round: "
            f"median {statistics.median(ratios):.0%} (rounds {', '.join(f'{r:.0%}' for r in ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="another tree's relay/wire/schema.py")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    baseline = _load(args.baseline)
    per = args.events // args.publishers
    groups = [frames("bench", rank, per)[0] for rank in range(args.publishers)]
    blobs = [blob for together in zip(*groups, strict=True) for blob in together]
    peers = [b"peer%d" % rank for rank in range(args.publishers)]
    events = per * args.publishers
    workloads = _workloads(blobs)
    for name, work in workloads.items():  # both take exactly the same events
        if [schema.decode(b).events for b in work[:8]] != [baseline.decode(b).events for b in work[:8]]:
            raise SystemExit(f"{name}: the baseline decodes other events than this tree")
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)  # as the relay's loop sets it
    ours: dict[str, list[float]] = {name: [] for name in ("ingest", *workloads)}
    base: dict[str, list[float]] = {name: [] for name in ours}
    with tempfile.TemporaryDirectory(prefix="bench-schema-cpu-") as folder:
        for turn in range(args.rounds):  # who goes first alternates too
            for which in ((ours, base) if turn % 2 == 0 else (base, ours)):
                decode = baseline.decode if which is base else schema.decode
                with _reading_with(baseline if which is base else schema):
                    t0 = time.process_time()
                    _ingest(blobs, peers, folder)
                    which["ingest"].append(time.process_time() - t0)
                for name, work in workloads.items():
                    which[name].append(_decoding(decode, work))
    print(f"{events:,} events from {args.publishers} publishers, {args.rounds} rounds, baseline {args.baseline}")
    print(_line("ingest (take_frame + commit)", events, ours["ingest"], base["ingest"]))
    for name in workloads:
        print(_line(f"decode, {name}", events, ours[name], base[name]))


if __name__ == "__main__":
    main()
