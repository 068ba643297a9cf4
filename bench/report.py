"""Turns benchmark sections into docs/benchmarks.md, docs/benchmarks.json and the PNG plots."""
from __future__ import annotations

import contextlib
import datetime
import json
import platform
from pathlib import Path
from typing import Any

from bench.common import Section, machine
from sinks.files import write_atomic

MD, JSON = "benchmarks.md", "benchmarks.json"
PLOTS = {"hotpath": "bench_hotpath.png", "ingest": "bench_ingest.png", "latency": "bench_latency.png",
         "scale": "bench_scale.png"}


#: What changed in the code because of these benchmarks, and what it moved (measured while building
#: this suite on the same shared machine; the tables below are the figures after all of it).
HISTORY = """## What moved the figures

- **One publisher I/O thread per process** (`relay/client/publisher.py`, `_Hub`). Each `Publisher` used to own a
  thread and a ZeroMQ context (plus its I/O thread) waking every 10 ms: 256 idle Publishers in one
  process took 97% of a core, so 1,024 simulated ranks could not even run on 2 cores. Now every
  Publisher of a process shares one thread and one context, the thread sleeps on a wake-up pipe and
  looks at all sockets once per tick, and a rank with nothing to send skips its tick: 256 idle
  Publishers cost 13% of a core. The ack timeout now runs from the send, so an idle spell no longer
  makes the next event look stalled and get resent.
- **Compact batch frames** (`relay/wire/schema.py`, [protocol.md](protocol.md)): the envelope (run, rank,
  host, ...) once per frame, one `[seq, ts, type, step, epoch, stage, data]` row per event; about 40%
  of the bytes of a batch of maps. `publish()` appends a tuple instead of building the event dict:
  2.8 us -> 1.0 us. `RelayCallback.on_log` back to back went from about 8 us to about 3.5 us, which
  moved the hot-path ratios from 160x to over 500x (AimCallback) and from 4.8x to over 15x (file
  callback).
- **Relay ingest** (`relay/daemon/ingest.py`, `relay/journal/journal.py`): each journal line is encoded as its event
  arrives, while the event is still in the CPU cache, instead of 50 ms later at the flush; events are
  kept only when another sink needs them; a compact batch's envelope is validated once; start-up
  objects are frozen out of the cyclic GC and young collections are rarer. One publisher: about
  67,000 -> 110,000 events/s (quieter moments; see the table for this run). At 1,024 ranks its peak
  RSS, which is frames queued in ZeroMQ while it is behind, went from 938 MiB to 120-480 MiB
  (depending on the machine's load).
- **Reused row encoder**: the shared publisher thread packs rows with one msgpack `Packer` instead of
  `packb` per event: 1.1 -> 0.4 us of GIL time per event taken from the training thread.
- **Cached log-key classification** (`trainer/log_stages.py`, `split_logs`): each Trainer log key's
  (stage, name) is looked up once, not prefix-scanned at every log: 3.4 -> 1.5 us per typical log,
  which moved `on_log` from about 5 us to about 3 us and the hot-path ratios to over 300x (AimCallback)
  and over 10x (file callback).
- **Compact batches checked by column and taken whole** (`relay/wire/schema.py` `_columns_ok`,
  `relay/journal/dedupe.py` `take_run`, `relay/journal/journal.py` `encode_lines`). A compact batch's rows are
  validated one rule at a time over all rows, each rule one pass in C (`set(map(type, column))`,
  `min`, `max`; the same rules as the row checks, which still run, to name the problem, for a batch
  that fails or holds nested data). A batch of one rank's gapless, plain events is de-duplicated
  with one comparison and encoded as one chunk of lines. Measured in-process on the bench's frames
  (512 events each): 6.7 -> 2.7 us per event against 1.9 us for the raw writer. Ingest against the
  raw PULL + orjson writer: 49/53/60% -> 82-119% at 1/4/16 publishers.
- **Every other sink in its own process** (`relay/sinkhost/process.py`, `relay/sinkhost/child.py`). As a
  thread, the Aim sink took up to half of the interpreter lock from ingest whenever it worked; once
  ingest was faster, the journal's rate with Aim attached fell to 60-67% of itself. Gating the thread on ingest being idle
  helped only partly (one chunk of Aim's Python work still stalled ingest: 61-108% across rounds).
  Now each sink runs in a child process at nice 19, fed the journal's own lines through a 1 MiB
  pipe, and only while the ingest thread waits for frames; a child that dies is started again.
- **Training benchmark** (`bench/bench_training.py`): whole jobs are now the real two-rank torchrun
  command with a third contender, the same job with Aim's `AimCallback` (`bench/aim_job.py`). The
  interleaved job packs its batches to one fixed shape (the demo rows differ in length, which made a
  step's cost depend on the rows it drew) and adds an A/A mode, a second "off", whose distance from
  the first is the noise floor printed beside the effect.
"""


def meta(command: str, seconds: float, load_before: tuple, load_after: tuple) -> dict[str, Any]:
    """Command, versions, machine and how busy it was: what a reader needs to weigh the figures."""
    from importlib import metadata

    versions = {}
    for name in ("metrics-relay", "aim", "transformers", "torch", "orjson", "psutil"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    cpu = "unknown"
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as info:
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    return {"command": command, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": round(seconds), "machine": {**machine(), "cpu": cpu, **versions},
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "host": platform.node()}


def summary(sections: list[Section]) -> str:
    """Every target of the run in one table."""
    lines = ["## Targets", "", "| section | target | measured | met |", "|---|---|---|---|"]
    for s in sections:
        for t in s.targets:
            lines.append(f"| {s.key} | {t['target']} | {t['shown']} | {'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines)


def outputs(out: Path) -> list[Path]:
    return [out / MD, out / JSON] + sorted(out.glob("bench_*.png"))


def write(out: Path, info: dict[str, Any], sections: list[Section]) -> None:
    """Regenerate the Markdown page and the JSON file completely, and draw the plots."""
    out.mkdir(parents=True, exist_ok=True)
    plots = _plot(out, sections)
    m = info["machine"]
    load = info["load_before"][0], info["load_after"][0]
    head = [
        "# Benchmarks",
        "",
        f"Generated by `{info['command']}` on {info['date']} in {info['seconds']} s "
        "(`make bench` runs the same; every figure below comes from that one run). Each figure is a median "
        "over rounds, with the min .. max spread; every ratio compares contenders measured in the same run, "
        "alternating round by round.",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['platform']}; Python {m['python']}, pyzmq {m['pyzmq']} "
        f"(libzmq {m['libzmq']}), msgpack {m['msgpack']}, " + ", ".join(
            f"{k} {m[k]}" for k in ("orjson", "aim", "transformers", "torch") if k in m) + ".",
        "",
        f"Load average (1 min) {load[0]:.2f} before and {load[1]:.2f} after the run"
        + (": the machine was shared with other work, so absolute figures are noisy; the same-run ratios "
           "are what to read." if max(load) > 0.5 else "."),
        "",
        summary(sections),
        "",
        HISTORY,
    ]
    body = []
    for s in sections:
        body.append(s.render())
        if s.key in plots:
            body.append(f"![{s.title}]({plots[s.key]})")
    (out / MD).write_text("\n\n".join(["\n".join(head), *body]) + "\n")
    payload = {"meta": info, "sections": [{"key": s.key, "title": s.title, "tables": s.tables,
                                           "targets": s.targets, "notes": s.notes, "data": s.data} for s in sections]}
    write_atomic(out / JSON, json.dumps(payload, indent=1, default=str))


def _plot(out: Path, sections: list[Section]) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = {}
    by_key = {s.key: s for s in sections}
    if "hotpath" in by_key:
        rows = next(rows for title, rows in by_key["hotpath"].tables if title.startswith("back to back, wall"))
        fig, ax = plt.subplots(figsize=(7, 3))
        names = [r["name"] for r in rows]
        ax.barh(names, [r["median"] * 1e6 for r in rows],
                xerr=[[(r["median"] - r["min"]) * 1e6 for r in rows], [(r["max"] - r["median"]) * 1e6 for r in rows]])
        ax.set_xscale("log")
        ax.set_xlabel("wall time per on_log call, back to back (us, log scale)")
        ax.invert_yaxis()
        drawn["hotpath"] = _save(fig, out, "hotpath")
    if "ingest" in by_key and by_key["ingest"].data.get("curve"):
        curve = by_key["ingest"].data["curve"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        counts = sorted(curve, key=int)
        for name in next(iter(curve.values())):
            ax.plot([int(n) for n in counts], [curve[n][name] for n in counts], marker="o", label=name)
        _log2_axes(ax, "publisher processes", "events/s written")
        drawn["ingest"] = _save(fig, out, "ingest")
    if "latency" in by_key:
        data = by_key["latency"].data
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for rate, label in (("10", "every 100 ms per rank"), ("100", "every 10 ms per rank (10x)")):
            lat = data.get(rate)
            if lat:
                ax.plot([v * 1e3 for v in lat], [(i + 1) / len(lat) for i in range(len(lat))], label=label)
        ax.axvline(100, color="grey", linestyle="--", linewidth=1, label="target p99")
        ax.set_xlabel("publish() to line in the journal (ms)")
        ax.set_ylabel("fraction of events")
        ax.legend()
        drawn["latency"] = _save(fig, out, "latency")
    if "scale" in by_key:
        points = by_key["scale"].data["points"]
        ranks = [p["ranks"] for p in points]
        fig, (cpu_ax, mem_ax) = plt.subplots(1, 2, figsize=(9, 3.5))
        cpu_ax.plot(ranks, [p["cpu"] for p in points], marker="o", label="% of a core")
        cpu_ax.plot(ranks, [p["cpu_us_per_event"] for p in points], marker="s", label="us per event")
        _log2_axes(cpu_ax, "ranks", "relay CPU")
        for key, label in (("rss_idle", "before any rank"), ("rss_connected", "ranks connected"),
                           ("rss_max", "max while logging")):
            mem_ax.plot(ranks, [p[key] for p in points], marker="o", label=label)
        _log2_axes(mem_ax, "ranks", "relay resident memory (MiB)")
        drawn["scale"] = _save(fig, out, "scale")
    return drawn


def _log2_axes(ax: Any, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.legend()


def _save(fig: Any, out: Path, key: str) -> str:
    fig.tight_layout()
    fig.savefig(out / PLOTS[key], dpi=90)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return PLOTS[key]
