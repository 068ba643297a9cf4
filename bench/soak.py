"""The soak (issue 9): ranks publishing at a training job's pace, a hostile client mixed in, and the
relay killed and restarted every few minutes; then the journal is checked event by event.

    python -m bench.soak --seconds 3600 [--ranks 4] [--rate 20] [--restart-every 180] [--out DIR]
                         [--report docs/reliability.md]

Everything is a real process: the relay (``python -m relay``, the program users run, on one fixed
loopback port so the clients find it again after each restart), one ``bench.soak_rank`` process per
rank of one run, and ``bench.soak_hostile``. Every ``--restart-every`` seconds the relay is killed,
SIGKILL and SIGTERM in turn, and started again after a seeded random pause of 0.5-3 s; a relay that
exits when nobody stopped it is logged, counted as an unplanned exit and started again. The relay's
RSS (with its children) is sampled every 2 s.

At the end the hostile client stops, the ranks close (each flushes, then prints its counters), the
relay stops with SIGTERM, and the good run's journal must hold, for every rank, each seq from 0 to
what that rank's Publisher handed out exactly once. Writes OUT/soak.json, OUT/soak_rss.png and
OUT/rss.csv; ``--report`` also writes that Markdown page (with the plot beside it). Exits 1 if any
event was lost, duplicated or dropped by a client, or the relay exited unplanned or uncleanly.
``--crash-kills N`` also runs the crash-consistency check of bench/crash.py beside it, N SIGKILLs
of a second relay (half with a directory journal, half with a single file) under publishers of
events up to the frame limit, and reports it. OUT (a new temporary directory unless ``--out`` says) is kept: an hour leaves about 0.5 GB there,
most of it the hostile client's lines and its one journal file per fresh run id.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import logging
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import crash
from bench.common import ROOT, free_port, kill_group, machine
from bench.soak_hostile import HOST as HOSTILE_HOST, KINDS, KINDS_SENT
from relay.journal.reader import read_events

log = logging.getLogger("bench.soak")

SAMPLE_EVERY = 2.0
STATS_INTERVAL = 5.0
STOP_TIMEOUT = 90.0  # a rank closes within 60 s (bench.soak_rank.CLOSE_TIMEOUT), plus start-up
MiB = 1 << 20


@dataclass
class Lifetime:
    """One relay process, from start to exit."""

    start_s: float
    pid: int
    end_s: float | None = None
    stopped_by: str | None = None  # SIGKILL / SIGTERM (planned), or None: it exited by itself
    exit_code: int | None = None
    pause_s: float | None = None  # down time before the next one started
    stats: dict[str, Any] = field(default_factory=dict)  # its last _relay_stats.json
    log_tail: str = ""  # the end of its log, kept for unplanned exits


class Relay:
    """The relay under test: one address and journal, restarted as often as the soak says."""

    def __init__(self, out: Path, address: str, t0: float) -> None:
        self.out = out
        self.address = address
        self.t0 = t0
        self.journal = out / "journal"
        self.journal.mkdir(parents=True, exist_ok=True)
        self.stats_file = self.journal / "_relay_stats.json"
        self.ready = out / "relay.ready.json"
        self.log = out / "relay.log"
        self.lifetimes: list[Lifetime] = []
        self.proc: subprocess.Popen | None = None
        self._log_start = 0

    def start(self) -> None:
        """Start a relay and wait until it listens; a relay that cannot start ends the soak."""
        for attempt in range(5):
            self.ready.unlink(missing_ok=True)
            self.stats_file.unlink(missing_ok=True)  # so what we read back is this lifetime's
            with open(self.log, "ab") as fh:
                self._log_start = fh.tell()
                fh.write(f"=== soak: relay start {len(self.lifetimes) + 1} at t={self.now():.1f}s\n".encode())
                fh.flush()
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "relay", "--bind", self.address, "--sink", "jsonl",
                     "--path", f"{self.journal}/", "--ready-file", str(self.ready),
                     "--stats-interval", str(STATS_INTERVAL), "--log-level", "info"],
                    cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 60
            while not self.ready.exists() and self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.ready.exists():
                self.lifetimes.append(Lifetime(round(self.now(), 2), self.proc.pid))
                return
            kill_group(self.proc)
            log.error("relay did not start (attempt %d, exit %s): %s", attempt + 1, self.proc.returncode,
                      self.tail())
            time.sleep(1.0)
        raise RuntimeError(f"the relay would not start on {self.address}; see {self.log}")

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 25) -> str:
        """This lifetime's last log lines (a crash's traceback ends up here)."""
        with open(self.log, "rb") as fh:
            fh.seek(self._log_start)
            text = fh.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def read_stats(self) -> dict[str, Any]:
        try:
            return json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, sig: signal.Signals | None) -> Lifetime:
        """Kill the relay with ``sig`` (None: it already exited by itself) and record how it ended."""
        assert self.proc is not None
        life = self.lifetimes[-1]
        life.stats = self.read_stats()
        if sig is not None:
            life.stopped_by = sig.name
            self.proc.send_signal(sig)
        try:
            life.exit_code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            log.error("relay %d ignored %s for 60 s; killing it", self.proc.pid, sig.name if sig else "its exit")
            kill_group(self.proc)
            life.exit_code = self.proc.returncode
        kill_group(self.proc)  # anything it started goes with it
        life.end_s = round(self.now(), 2)
        if sig is not signal.SIGKILL:
            life.stats = self.read_stats() or life.stats  # a clean stop wrote its final counters
        if sig is None or (sig is signal.SIGTERM and life.exit_code != 0):
            life.log_tail = self.tail()
        return life

    def usage(self) -> tuple[int, int] | None:
        """RSS in bytes and open files of the relay and everything it started; None while it is down."""
        if not self.alive:
            return None
        try:
            proc = psutil.Process(self.proc.pid)
            rss, fds = proc.memory_info().rss, proc.num_fds()
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    rss, fds = rss + child.memory_info().rss, fds + child.num_fds()
            return rss, fds
        except psutil.NoSuchProcess:
            return None


class LineCounter:
    """Lines in a growing journal file, counted incrementally (only up to the last newline, as the
    next relay may cut a torn last line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def update(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return self.lines
        end = chunk.rfind(b"\n") + 1
        self.lines += chunk.count(b"\n", 0, end)
        self.offset += end
        return self.lines


class Soak:
    """The processes and the timeline of one soak."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.run_id = f"soak-{datetime.datetime.now():%Y%m%d-%H%M%S}"
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.relay = Relay(out, f"tcp://127.0.0.1:{free_port()}", self.t0)
        self.lines = LineCounter(self.relay.journal / f"{self.run_id}.jsonl")
        self.samples: list[dict[str, Any]] = []
        self.ranks: list[subprocess.Popen] = []
        self.hostile: subprocess.Popen | None = None
        self._next_sample = 0.0
        self.crashes: list[dict[str, Any]] = []  # bench/crash.py's figures, one per layout
        self.crash_error: str | None = None
        self.stop_crashing = threading.Event()  # set when the soak ends early: the crash run checks what it did

    def crash_consistency(self, kills: int) -> None:
        """bench/crash.py beside the soak: ``kills`` SIGKILLs of its own relay, half per layout."""
        for layout, n in (("dir", kills - kills // 2), ("file", kills // 2)):
            if not n:
                continue
            try:
                self.crashes.append(crash.run(n, self.out / f"crash-{layout}", layout=layout, seed=self.args.seed,
                                              stop=self.stop_crashing))
            except (RuntimeError, OSError) as exc:  # a relay that would not start: the soak fails, saying why
                log.exception("crash consistency (%s layout) stopped", layout)
                self.crash_error = f"crash consistency ({layout} layout) stopped: {type(exc).__name__}: {exc}"
                return

    def run(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The whole soak; returns each rank's counters and the hostile client's."""
        args = self.args
        self.relay.start()
        log.info("relay on %s, run %s, %d ranks at %g events/s, hostile at %g frames/s, %s s, output in %s",
                 self.relay.address, self.run_id, args.ranks, args.rate, args.hostile_rate, args.seconds, self.out)
        try:
            self.ranks = [self._spawn("bench.soak_rank", self.relay.address, self.run_id, str(r), str(args.ranks),
                                      str(args.rate), str(args.seed), stderr_name=f"rank{r}.log")
                          for r in range(args.ranks)]
            self.hostile = self._spawn("bench.soak_hostile", self.relay.address, self.run_id, str(args.ranks),
                                       str(args.hostile_rate), str(args.seed),
                                       *[f"--skip={k}" for k in args.skip_kind], stderr_name="hostile.log")
            kill_signals = [signal.SIGKILL, signal.SIGTERM]
            next_restart = args.restart_every
            while self.relay.now() < args.seconds:
                self.supervise()
                if self.relay.now() >= next_restart and self.relay.now() < args.seconds - 1:
                    sig = kill_signals[len([x for x in self.relay.lifetimes if x.stopped_by]) % 2]
                    self.restart(sig)
                    next_restart += args.restart_every
                time.sleep(0.2)
            hostile = self._stop_hostile()
            ranks = self._stop_ranks()
            self.sample()
            final = self.relay.stop(signal.SIGTERM)
            log.info("relay stopped with SIGTERM: exit %s", final.exit_code)
            return ranks, hostile
        finally:
            for proc in [*self.ranks, *([self.hostile] if self.hostile else []), self.relay.proc]:
                if proc is not None and proc.poll() is None:
                    kill_group(proc)

    def _spawn(self, module: str, *argv: str, stderr_name: str) -> subprocess.Popen:
        with open(self.out / stderr_name, "ab") as err:
            return subprocess.Popen([sys.executable, "-m", module, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=err, text=True, start_new_session=True)

    def supervise(self) -> None:
        """Restart a relay that died by itself, and sample on schedule."""
        if not self.relay.alive:
            life = self.relay.stop(None)
            log.error("UNPLANNED relay exit %s at t=%.1f s (pid %d); last log lines:\n%s",
                      life.exit_code, life.end_s, life.pid, life.log_tail)
            self._pause_then_start(life)
        if self.relay.now() >= self._next_sample:
            self.sample()
            self._next_sample = self.relay.now() + SAMPLE_EVERY

    def restart(self, sig: signal.Signals) -> None:
        self.sample()
        life = self.relay.stop(sig)
        log.info("relay %d stopped with %s at t=%.1f s: exit %s", life.pid, sig.name, life.end_s, life.exit_code)
        if sig is signal.SIGTERM and life.exit_code != 0:
            log.error("relay exited %s after SIGTERM (expected 0); last log lines:\n%s", life.exit_code, life.log_tail)
        self._pause_then_start(life)

    def _pause_then_start(self, life: Lifetime) -> None:
        life.pause_s = round(self.rng.uniform(0.5, 3.0), 2)
        time.sleep(life.pause_s)
        self.relay.start()

    def sample(self) -> None:
        usage = self.relay.usage()
        rss, fds = usage or (None, None)
        self.samples.append({"t": round(self.relay.now(), 2), "rss_mib": None if rss is None else round(rss / MiB, 2),
                             "fds": fds, "pid": self.relay.proc.pid if usage else None,
                             "journal_lines": self.lines.update()})

    def _stop_hostile(self) -> dict[str, Any]:
        assert self.hostile is not None
        self.hostile.send_signal(signal.SIGTERM)
        try:
            out, _ = self.hostile.communicate(timeout=30)
            return json.loads(out.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            log.error("the hostile client did not report (exit %s); see hostile.log", self.hostile.poll())
            return {}

    def _stop_ranks(self) -> list[dict[str, Any]]:
        """SIGTERM every rank, then keep the relay up (restarting it if it dies) while they flush."""
        for proc in self.ranks:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while any(p.poll() is None for p in self.ranks) and time.monotonic() < deadline:
            self.supervise()
            time.sleep(0.2)
        results = []
        for rank, proc in enumerate(self.ranks):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                results.append({"rank": rank, "exit_code": proc.returncode, **json.loads(out.strip().splitlines()[-1])})
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                log.error("rank %d did not report (exit %s); see rank%d.log", rank, proc.poll(), rank)
                results.append({"rank": rank, "exit_code": proc.poll()})
        return results


def verify(journal: Path, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The good run's journal against what each rank's Publisher handed out: each seq
    0..next_seq-1 once, nothing else. Lines the hostile client slipped in (its host) are counted
    apart; a (rank, seq) written twice is a duplicate whoever sent it."""
    seqs: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    out_of_order = spoofed = 0
    last: dict[int, int] = {}
    bad_lines: list[int] = []
    everything: collections.Counter[tuple[int, int]] = collections.Counter()
    for event in read_events(journal, bad_lines) if journal.exists() else ():
        rank, seq = event.get("rank"), event.get("seq")
        everything[(rank, seq)] += 1
        if event.get("host") == HOSTILE_HOST:
            spoofed += 1
            continue
        seqs[rank][seq] += 1
        if seq < last.get(rank, -1):
            out_of_order += 1
        last[rank] = seq
    per_rank = []
    for r in ranks:
        seen = seqs.get(r["rank"], collections.Counter())
        expected = r.get("next_seq")
        if expected is None:  # the rank never reported: judge by what is there
            expected = max(seen, default=-1) + 1
        lost = sum(1 for s in range(expected) if s not in seen)
        per_rank.append({"rank": r["rank"], "expected": expected, "journaled": sum(seen.values()),
                         "distinct": len(seen), "lost": lost, "extra": sum(1 for s in seen if s >= expected),
                         "duplicated": sum(n - 1 for n in seen.values())})
    return {
        "per_rank": per_rank,
        "expected": sum(p["expected"] for p in per_rank),
        "journaled": sum(p["journaled"] for p in per_rank),
        "lost": sum(p["lost"] for p in per_rank),
        "extra": sum(p["extra"] for p in per_rank),
        "duplicated": sum(n - 1 for n in everything.values()),
        "out_of_order": out_of_order,
        "spoofed_lines": spoofed,
        "unreadable_lines": len(bad_lines),
    }


def rss_figures(samples: list[dict[str, Any]], lifetimes: list[Lifetime], window: float) -> dict[str, Any]:
    """RSS min/median/max per window, the slope over the whole soak, and each relay's peak."""
    points = [(s["t"], s["rss_mib"]) for s in samples if s["rss_mib"] is not None]
    windows = []
    for start in range(0, int(max((t for t, _ in points), default=0)) + 1, int(window)):
        values = [v for t, v in points if start <= t < start + window]
        if values:
            windows.append({"from_s": start, "to_s": start + int(window), "n": len(values), "min": min(values),
                            "median": statistics.median(values), "max": max(values)})
    slope = statistics.linear_regression([t for t, _ in points], [v for _, v in points]).slope * 3600 \
        if len({t for t, _ in points}) > 1 else 0.0
    peaks = []
    for life in lifetimes:
        mine = [s for s in samples if s["pid"] == life.pid and s["rss_mib"] is not None]
        if mine:
            peaks.append({"pid": life.pid, "start_s": life.start_s, "peak_mib": max(s["rss_mib"] for s in mine),
                          "last_mib": mine[-1]["rss_mib"], "peak_open_files": max(s["fds"] for s in mine)})
    peak_slope = statistics.linear_regression([p["start_s"] for p in peaks], [p["peak_mib"] for p in peaks]).slope \
        * 3600 if len(peaks) > 1 else 0.0
    values = [v for _, v in points]
    fds = [s["fds"] for s in samples if s["fds"] is not None]
    return {"max_open_files": max(fds, default=None), "windows": windows, "slope_mib_per_h": round(slope, 3), "peaks": peaks,
            "peak_slope_mib_per_h": round(peak_slope, 3), "min": min(values, default=None),
            "median": statistics.median(values) if values else None, "max": max(values, default=None),
            "window_s": window}


def summarize(args: argparse.Namespace, soak: Soak, ranks: list[dict[str, Any]], hostile: dict[str, Any],
              wall: float, command: str) -> dict[str, Any]:
    """Every figure of the soak, and the verdict."""
    lifetimes = soak.relay.lifetimes
    check = verify(soak.relay.journal / f"{soak.run_id}.jsonl", ranks)
    rejected: collections.Counter[str] = collections.Counter()
    totals: collections.Counter[str] = collections.Counter()
    for life in lifetimes:
        rejected.update(life.stats.get("rejected", {}))
        for key in ("frames", "events", "written", "duplicates", "reused_run_ids", "deadletter_overflow",
                    "journal_errors", "acks_sent"):
            totals[key] += life.stats.get(key, 0)
    planned = [x for x in lifetimes if x.stopped_by and x is not lifetimes[-1]]
    unplanned = [x for x in lifetimes if x.end_s is not None and x.stopped_by is None]
    unclean = [x for x in lifetimes if x.stopped_by == "SIGTERM" and x.exit_code != 0]
    client = {key: sum(r.get(key, 0) for r in ranks) for key in ("published", "acked", "resent", "dropped", "left")}
    failures = []
    if check["lost"]:
        failures.append(f"{check['lost']} events lost")
    if check["duplicated"]:
        failures.append(f"{check['duplicated']} events journaled twice")
    if check["extra"]:
        failures.append(f"{check['extra']} events journaled that no rank published")
    if client["dropped"] or client["left"]:
        failures.append(f"clients dropped {client['dropped']} and left {client['left']} unacknowledged")
    if unplanned:
        failures.append(f"{len(unplanned)} unplanned relay exits")
    if unclean:
        failures.append(f"{len(unclean)} relay stops by SIGTERM did not exit 0")
    if any(r.get("exit_code") != 0 or "next_seq" not in r for r in ranks):
        failures.append("a rank did not finish cleanly")
    failures += [soak.crash_error] if soak.crash_error else []
    failures += [f"crash consistency ({x['layout']} layout): {crash.summary_line(x)}" for x in soak.crashes if not x["ok"]]
    return {
        "command": command, "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
        "run": soak.run_id, "address": soak.relay.address, "out": str(soak.out), "seed": args.seed,
        "seconds": args.seconds, "wall_s": round(wall, 1), "ranks": args.ranks, "rate_hz": args.rate,
        "restart_every_s": args.restart_every, "hostile_rate_hz": args.hostile_rate, "skipped_kinds": args.skip_kind,
        "client": client, "journal": check, "rank_reports": ranks,
        "restarts": {"planned": len(planned), "sigkill": sum(x.stopped_by == "SIGKILL" for x in planned),
                     "sigterm": sum(x.stopped_by == "SIGTERM" for x in planned), "unplanned": len(unplanned),
                     "unclean_sigterm": len(unclean), "lifetimes": [asdict(x) for x in lifetimes]},
        "relay": {"rejected": dict(rejected.most_common()), "rejected_total": sum(rejected.values()), **totals},
        "hostile": hostile,
        "rss": rss_figures(soak.samples, lifetimes, args.window), "crash": soak.crashes,
        "ok": not failures, "failures": failures,
    }


def plot(summary: dict[str, Any], samples: list[dict[str, Any]], path: Path) -> None:
    """Relay RSS over time, a gap at each restart, and the good run's journal lines on a second axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    minutes = [s["t"] / 60 for s in samples]
    rss = [float("nan") if s["rss_mib"] is None else s["rss_mib"] for s in samples]
    segments: list[tuple[int | None, list[float], list[float]]] = []  # one line per relay process
    for s, m, v in zip(samples, minutes, rss, strict=True):
        if not segments or s["pid"] != segments[-1][0]:
            segments.append((s["pid"], [], []))
        segments[-1][1].append(m)
        segments[-1][2].append(v)
    for _, xs, ys in segments:
        ax.plot(xs, ys, color="tab:blue", linewidth=1.2)
    styles = {"SIGKILL": ("0.55", "--"), "SIGTERM": ("0.55", ":"), None: ("tab:red", "-")}
    for life in summary["restarts"]["lifetimes"][:-1]:
        color, style = styles[life["stopped_by"]]
        ax.axvline(life["end_s"] / 60, color=color, linestyle=style, linewidth=0.8)
    ax.set_xlabel("minutes")
    ax.set_ylabel("relay RSS (MiB)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(minutes, [s["journal_lines"] / 1000 for s in samples], color="tab:green", alpha=0.6, linewidth=1)
    ax2.set_ylabel("good run's journal lines (thousands)", color="tab:green")
    ax2.set_ylim(bottom=0)
    r = summary["restarts"]
    ax.set_title(f"{summary['ranks']} ranks x {summary['rate_hz']:g} ev/s + hostile client, {r['planned']} restarts "
                 f"(dashed SIGKILL, dotted SIGTERM), {r['unplanned']} unplanned exits (red)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}" if isinstance(value, float) else str(value)


def _span(start: int, end: int) -> str:
    return f"{start // 60}-{end // 60} min" if start % 60 == 0 == end % 60 else f"{start}-{end} s"


def report(summary: dict[str, Any], plot_name: str) -> str:
    """docs/reliability.md: the figures of one soak, how it was run, and what each figure means."""
    s, j, c, r, rss, h = (summary, summary["journal"], summary["client"], summary["restarts"], summary["rss"],
                          summary["hostile"])
    m = summary["machine"]
    verdict = "**PASS**: nothing lost, nothing duplicated, no unplanned relay exit" if s["ok"] else \
        "**FAIL**: " + "; ".join(s["failures"])
    parts = [
        "# Reliability: the soak",
        "Regenerated by `python -m bench.soak` (`make soak` runs it for an hour: "
        "`python -m bench.soak --seconds 3600 --report docs/reliability.md`); not part of CI.",
        f"These figures come from\n\n```\n{s['command']}\n```\n\nrun on {s['date']} ({m['cpus']} CPUs, "
        f"Python {m['python']}, pyzmq {m['pyzmq']}, libzmq {m['libzmq']}; {s['wall_s']:.0f} s wall)"
        + ("." if s["seconds"] >= 3600 else "; a short run: `make soak` gives the hour the issue asks for."),
        "**Setup.** Real processes on loopback: the relay (`python -m relay --sink jsonl --path DIR/ "
        f"--stats-interval {STATS_INTERVAL:g}` on one fixed port); {s['ranks']} rank processes of one run, each a "
        f"real `Publisher` sending a training step's metrics {s['rate_hz']:g} times a second (plus per-rank figures "
        "every 10 steps, eval metrics, a params and a checkpoint lifecycle event every 50 steps, now and then a NaN "
        "loss or an infinite grad norm) until told to stop, then closing with a 60 s flush; and a hostile client on "
        f"raw DEALER sockets sending {s['hostile_rate_hz']:g} frames a second of the kinds below, holding the "
        "user's relay secret (a process of the job's own user: without it nothing it sends is read). Every "
        f"{s['restart_every_s']:g} s the relay is killed, SIGKILL and SIGTERM in turn, and started again on the same "
        "address after a random 0.5-3 s pause; a relay that exits by itself is counted as an unplanned exit and "
        "started again. At the end the hostile client stops, the ranks close, the relay stops with SIGTERM, and "
        "the good run's journal is checked line by line against the seqs each rank's Publisher handed out.",
        f"Verdict: {verdict}.",
        "## Events",
        "\n".join([
            "| figure | value |", "|---|---|",
            f"| events published by the ranks (`publish()` calls) | {_cell(c['published'])} |",
            f"| seqs handed out (those, plus the clients' own stats events) | {_cell(j['expected'])} |",
            f"| ranks' lines in the journal | {_cell(j['journaled'])} |",
            f"| **lost** (a seq missing from the journal) | **{_cell(j['lost'])}** |",
            f"| **duplicated** (a (run, rank, seq) written twice) | **{_cell(j['duplicated'])}** |",
            f"| journaled but never published by a rank | {_cell(j['extra'])} |",
            f"| out of seq order within a rank | {_cell(j['out_of_order'])} |",
            f"| dropped by the clients (counted) / unacknowledged at close | {_cell(c['dropped'])} / {_cell(c['left'])} |",
            f"| resent by the clients after restarts | {_cell(c['resent'])} |",
            f"| lines the hostile client got into the good run (spoofed stats, hello, lifecycle) | {_cell(j['spoofed_lines'])} |",
        ]),
        "## Relay restarts",
        f"{r['planned']} planned restarts ({r['sigkill']} SIGKILL, {r['sigterm']} SIGTERM), **{r['unplanned']} "
        f"unplanned exits**, {r['unclean_sigterm']} SIGTERM stops that did not exit 0.",
    ]
    bad = [x for x in r["lifetimes"] if x["end_s"] is not None and (x["stopped_by"] is None or x["log_tail"])]
    if bad:
        rows = ["| at | pid | how | exit | last log line |", "|---|---|---|---|---|"]
        for x in bad:
            last = next((line for line in reversed(x["log_tail"].splitlines()) if line.strip()), "")
            rows.append(f"| {x['end_s']:.0f} s | {x['pid']} | {x['stopped_by'] or 'by itself'} | {x['exit_code']} | "
                        f"`{last[:200]}` |")
        parts.append("\n".join(rows))
    parts += [
        *crash_section(s["crash"]),
        *SINK_DEATH,
        "## Relay RSS",
        f"![relay RSS over time]({plot_name})",
        f"RSS of the relay process and its children, sampled every {SAMPLE_EVERY:g} s; each relay process is its "
        f"own line segment. Over the whole soak: min {_cell(rss['min'])} MiB, median {_cell(rss['median'])} MiB, max "
        f"{_cell(rss['max'])} MiB; least-squares slope **{rss['slope_mib_per_h']:+.2f} MiB/h**; slope of each relay's peak against its "
        f"start time {rss['peak_slope_mib_per_h']:+.2f} MiB/h. Open files of the relay: at most {rss['max_open_files']}.",
        "\n".join(["| window | samples | min MiB | median MiB | max MiB |", "|---|---|---|---|---|"] + [
            f"| {_span(w['from_s'], w['to_s'])} | {w['n']} | {w['min']:.1f} | {w['median']:.1f} | {w['max']:.1f} |"
            for w in rss["windows"]]),
        "## The hostile client",
        "\n".join(["| kind | sent | refused while the relay was down | what it sends |", "|---|---|---|---|"] + [
            f"| `{k}` | {h.get('sent', {}).get(k, 0)} | {h.get('blocked', {}).get(k, 0)} | {KINDS_SENT[k]} |"
            for k in KINDS if k not in s["skipped_kinds"]]),
        "What the relays rejected, by reason (summed over every relay process from its last stats file; a "
        f"SIGKILLed relay's last {STATS_INTERVAL:g} s are missing, so these are lower bounds):",
        "\n".join(["| reason | frames |", "|---|---|"] + [f"| `{k}` | {v:,} |" for k, v in s["relay"]["rejected"].items()]
                  + [f"| total | {s['relay']['rejected_total']:,} |"]),
        f"Acks for the good run that the relay sent to the hostile client (it spoke in a rank's name last): "
        f"{h.get('acks_for_good_run', 0)}, the highest acknowledging up to seq {h.get('max_good_floor_acked', -1):,}. "
        f"Relay counters over all its processes (same caveat): {s['relay'].get('frames', 0):,} frames, "
        f"{s['relay'].get('events', 0):,} events, {s['relay'].get('written', 0):,} written, "
        f"{s['relay'].get('duplicates', 0):,} duplicates dropped, {s['relay'].get('reused_run_ids', 0):,} reused "
        f"run ids reported, {s['relay'].get('deadletter_overflow', 0):,} dead letters only counted, "
        f"{s['relay'].get('journal_errors', 0):,} journal errors.",
        "All figures, every relay process's counters and the RSS samples are in `soak.json` and `rss.csv` in the "
        f"soak's output directory ({s['out']}).",
        EDGES,
        AUTH_SECTION,
    ]
    return "\n\n".join(parts) + "\n"


#: What holds of the relay's sink processes and its trackers' stores; the soak's relay has none, so the
#: slow test tier proves it (tests/test_sink_death.py), and this page says so whatever the soak measured.
SINK_DEATH = [
    "## Sink processes and tracker stores",
    "The soak's relay has no sink process; `tests/test_sink_death.py` (slow tier) has them die with it. One "
    "publisher sends 1,000 metrics over about 100 s while a relay with MLflow (SQLite), Aim and TensorBoard sinks "
    "is started and SIGKILLed 50 times, each at a random moment of its sinks' first seconds (most within 1.5 s of "
    "their processes starting, one in ten within a second after one began setting its store up or writing, "
    "within 10 s), then a last relay lives "
    "(`test_relay_sigkilled_50_times_in_its_first_seconds_every_store_holds_every_value_once`). What holds:",
    "- every sink process of a killed relay, its supervisor and whatever its tool started, was gone within 1 s of "
    "the relay's death (0.11 s at most over the 50 kills, 4 of them while a sink was writing and 1 while one set "
    "its store up; load average 19-20 on 2 cores, 2026-12-04; the test took 235 s);\n"
    "- each store opens with its own client (`MlflowClient`, Aim's `Repo`, TensorBoard's `EventAccumulator`) "
    "and holds every value exactly once: the sinks killed mid-write lost nothing, the next relay's caught up "
    "from the journal;\n"
    "- no set-up was left behind: no temporary, no store moved aside as half made. A set-up killed midway "
    "(MLflow's migrations, Aim's repository) leaves no store under its name and the next one makes it; a store "
    "an older relay left half made is mended (the module's other slow tests).",
    "How: [relay.md](relay.md#a-sinks-process-dies-with-its-relay-and-a-kill-never-breaks-a-store).",
]


#: What holds where the soak does not reach, each claim with the test of `make test` that proves it;
#: written into every report (the soak regenerates this page).
EDGES = """## At the edges: what the tests prove

- **A rank that dies still closes its run.** Rank 1 of a two-rank torchrun job (external relay,
  `--rank-silence 5`) SIGKILLed in its forward pass, backward pass, optimizer step or between
  steps, ten times in a row: each time rank 0's every event, its failed `train_end` and its last
  `stats` included, is in the journal or its spool before torchrun's grace ends, and the relay names
  rank 1 `rank_lost` (`tests/test_rank_death.py`; trainer/stopping.py, relay/daemon/cross_rank.py).
- **What was written is delivered.** A directory journal whose one run's file is on a full disk:
  the other runs' lines go to every sink as they are written, each once, and the rest once the disk
  has room, also to a plugin sink without catch-up
  (`tests/test_relay_core.py::test_lines_journaled_before_a_failed_write_reach_every_sink_once`;
  relay/journal/journal_queue.py's `JournalQueue`, which a consuming relay's partitions use too).
- **Losses add up.** A rank's lines before its last `stats` line number exactly
  `published - dropped`, also when the client dropped its own earlier reports; a restarted relay's
  `client_dropped` holds a rank's journaled report as soon as the rank sends again
  (`tests/test_drop_accounting.py`).
- **A forked child's events are sent or counted.** `os.fork`, `multiprocessing` with fork and a
  DataLoader's workers publish through the parent's Publisher (`tests/test_publisher_fork.py`).
- **A replayed spool is what a live relay would have journaled**, the relay's own cross-rank events
  included (`tests/test_spool_cluster.py`)."""


#: What holds of who may write, beside the soak's figures (issue 25): its tests, not this soak, show it.
AUTH_SECTION = """## Who may write, and stream ownership

Not measured by the soak, whose hostile client holds the user's secret: what holds for peers is
tested in `tests/hostile/` and stated in [security.md](security.md).

- A TCP relay reads nothing from a peer without the user's relay secret: refused at the CURVE
  handshake, counted (`rejected.auth_failed`), logged and dead-lettered once, then once a minute; so
  it can neither pre-claim a run nor forge a rank's stats nor learn run ids, and a client never
  hands events to a squatter on a stopped relay's port
  (`test_local_peer.py::test_without_the_secret_a_peer_can_neither_pre_claim_a_run_nor_forge_a_ranks_stats`,
  `::test_a_wrong_secret_is_refused_counted_dead_lettered_and_said_once_on_each_side`,
  `::test_without_the_secret_a_squatter_on_a_stopped_relays_port_gets_nothing`).
- A client whose handshake failed on a protocol error (a squatter in the clear, a relay started
  `--open`) dials again every 2 s, so it delivers everything once its relay is back (the same test).
- A (run, rank) stream belongs to the session sending it, kept across reconnects; whether its owner
  is still connected is asked of the relay's socket when another connection wants the stream, and
  it passes on in the order frames came. No late socket-monitor report can free a live stream or
  leave a single event journaled and unacknowledged
  (`::test_a_connection_that_took_over_a_closed_ones_stream_keeps_it_whatever_the_relay_learns_when`,
  50 trials on one relay; the code before failed 30 of 50 single-event acks and journaled 2 forgeries
  in one run of the same scenario).
- A client cut off six times in a run reconnects as the same session each time: nothing lost,
  duplicated or refused, no handover (`::test_a_client_whose_connection_drops_is_never_shut_out_of_its_own_stream`)."""


def crash_section(crashes: list[dict[str, Any]]) -> list[str]:
    """The crash-consistency figures of ``--crash-kills``, if it ran."""
    if not crashes:
        return []
    return ["## Crash consistency",
            "Beside the soak, bench/crash.py (`--crash-kills`): a second relay SIGKILLed at random points (one in "
            "five while it starts and recovers, two in five the moment its journal grows, the rest 0-0.4 s after it "
            "is ready) and restarted each time, while "
            "real Publishers (2 runs x 2 ranks, 10 events/s each) send events of 100 B up to the frame limit, one in "
            "four of control characters (the longest lines); in rounds of 100 kills, each with fresh publishers and "
            "journal. Every event a Publisher was told was acknowledged must be in the journal exactly once (it is "
            "never sent again), in whole lines that are all events. The slow test tier runs the same for 200 "
            "kills (`tests/test_crash_consistency.py`).",
            "\n".join(f"- {'PASS' if x['ok'] else '**FAIL**'}: {crash.summary_line(x)}." for x in crashes)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600, help="how long the ranks publish")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="train steps (metrics events) per second per rank")
    parser.add_argument("--restart-every", type=float, default=180.0, help="seconds between relay kills")
    parser.add_argument("--hostile-rate", type=float, default=4.0, help="hostile frames per second")
    parser.add_argument("--skip-kind", action="append", default=[], choices=KINDS,
                        help="leave this hostile kind out (repeatable)")
    parser.add_argument("--window", type=float, default=600.0, help="seconds per RSS window in the report")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="output directory (default: a new temporary one, kept)")
    parser.add_argument("--report", type=Path, help="also write this Markdown page, the plot beside it")
    parser.add_argument("--crash-kills", type=int, default=0,
                        help="also SIGKILL a second relay this many times under large events (bench/crash.py)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks take the processes down
    out = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    soak = Soak(args, out)
    crashing = threading.Thread(target=soak.crash_consistency, args=(args.crash_kills,))
    crashing.start()
    try:
        ranks, hostile = soak.run()
    except BaseException:  # SIGTERM, or the relay would not start: the crash run stops too, then it is raised
        soak.stop_crashing.set()
        raise
    finally:
        crashing.join()
    summary = summarize(args, soak, ranks, hostile, time.monotonic() - started,
                        "python -m bench.soak " + shlex.join(argv))
    (out / "soak.json").write_text(json.dumps({**summary, "samples": soak.samples}, indent=1))
    with open(out / "rss.csv", "w") as fh:
        fh.write("t_s,rss_mib,open_files,pid,journal_lines\n")
        fh.writelines(f"{x['t']},{'' if x['rss_mib'] is None else x['rss_mib']},{x['fds'] or ''},{x['pid'] or ''},"
                      f"{x['journal_lines']}\n" for x in soak.samples)
    plot(summary, soak.samples, out / "soak_rss.png")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "soak_rss.png", args.report.parent / "soak_rss.png")
        args.report.write_text(report(summary, "soak_rss.png"))
    j, c, r = summary["journal"], summary["client"], summary["restarts"]
    print(f"soak {'PASSED' if summary['ok'] else 'FAILED: ' + '; '.join(summary['failures'])}\n"
          f"  published {c['published']:,}, seqs {j['expected']:,}, journaled {j['journaled']:,}, lost {j['lost']}, "
          f"duplicated {j['duplicated']}, client drops {c['dropped']}, left {c['left']}\n"
          f"  restarts {r['planned']} planned, {r['unplanned']} unplanned; hostile frames sent "
          f"{sum(hostile.get('sent', {}).values()):,}, rejected by the relay {summary['relay']['rejected_total']:,}\n"
          f"  RSS {summary['rss']['min']}-{summary['rss']['max']} MiB, slope {summary['rss']['slope_mib_per_h']:+.2f} "
          f"MiB/h\n  output: {out}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
