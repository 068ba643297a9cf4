"""Crash consistency (issue 16): SIGKILL a real relay at random points while real publishers write
events of 100 B up to the frame limit, restart it each time, and check the journal at the end.

    python -m bench.crash --kills 200 [--per-round 100] [--runs 2] [--ranks 2] [--rate 10]
                          [--layout dir|file] [--seed 1] [--out DIR] [--json FILE]

The relay is what ``python -m relay`` runs (``relay.cli.main``), on one fixed loopback port, each
in a process of its own forked by one that imported the relay once (bench/relay_forker.py): a
relay's start costs its set-up, not 0.15 CPU-s of imports, and a kill lands in the relay's
binding, recovery or writing, not in its imports. Each rank is a ``bench.crash_rank``
process (a real Publisher) of one of ``--runs`` runs. Each relay lifetime is killed with SIGKILL
at a seeded random point: one in five 0-0.3 s after it was started (while it binds and recovers),
two in five the moment its journal grows after a 0-0.2 s pause (in the middle of a write, often),
the rest 0-0.4 s after it is ready. Then the ranks stop, close (a relay up) and report what
they published and what the relay acknowledged, and the journal must hold, for every rank, each
seq its Publisher handed out exactly once (an acknowledged event is never sent again, so one lost
by a crash or a recovery is missing here), in whole lines that are all events. Exits 1 otherwise.
Kills come in rounds (fresh publishers, a fresh journal, removed once checked): disk stays bounded.
tests/test_crash_consistency.py runs it short; ``make soak`` long (bench/soak.py ``--crash-kills``).
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, free_port, kill_group
from bench.relay_forker import ForkedRelay, RelayForker
from relay.journal.reader import journal_files, read_events

log = logging.getLogger("bench.crash")

TORN = "cut a torn last line"  # what a restarted relay logs when a kill left half a line


class CrashRun:
    """The relay under test, killed and restarted on one address and journal."""

    def __init__(self, out: Path, layout: str, rng: random.Random, forker: RelayForker) -> None:
        self.out, self.forker = out, forker
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.path = out / ("journal" if layout == "dir" else "journal.jsonl")
        self.ready = out / "relay.ready.json"
        self.log = out / "relay.log"
        self.rng = rng
        self.proc: ForkedRelay | None = None
        self.kills = 0
        self.kills_before_ready = 0

    def start(self) -> ForkedRelay:
        self.ready.unlink(missing_ok=True)
        self.proc = self.forker.start(
            ["--bind", self.address, "--sink", "jsonl",
             "--path", f"{self.path}/" if self.path.suffix != ".jsonl" else str(self.path),
             "--ready-file", str(self.ready), "--log-level", "warning"], self.log)
        return self.proc

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"relay exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"relay not ready in {timeout:g} s: {self.log.read_text()[-2000:]}")
            time.sleep(0.01)

    def kill_once(self) -> None:
        """Start a relay and SIGKILL it at a random point of its life: one time in five while it
        starts, two in five as soon as its journal grows (a write of many lines may be under way),
        else after a random pause."""
        proc = self.start()
        draw = self.rng.random()
        if draw < 0.2:
            time.sleep(self.rng.uniform(0.0, 0.3))
            if not self.ready.exists():
                self.kills_before_ready += 1
        elif draw < 0.6:
            self.wait_ready()
            self._await_growth(self.rng.uniform(0.0, 0.2))
        else:
            self.wait_ready()
            time.sleep(self.rng.uniform(0.0, 0.4))
        if proc.poll() is not None:
            raise RuntimeError(f"relay exited {proc.returncode} by itself: {self.log.read_text()[-2000:]}")
        kill_group(proc)
        self.kills += 1

    def _await_growth(self, pause: float, timeout: float = 2.0) -> None:
        """After ``pause``, return the moment the journal's size changes (polled about every 0.2 ms)."""
        time.sleep(pause)
        before = self._size()
        deadline = time.monotonic() + timeout
        while self._size() == before and time.monotonic() < deadline:
            time.sleep(0.0002)

    def _size(self) -> int:
        try:
            return sum(f.stat().st_size for f in journal_files(self.path))
        except FileNotFoundError:  # a file vanished between listing and stat: none does here but the lock
            return -1

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            return -9


def verify(path: Path, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's seqs 0..next_seq-1 once each in the journal, in whole lines that are events."""
    seen: dict[tuple[str, int], collections.Counter[int]] = collections.defaultdict(collections.Counter)
    bad = torn_files = lines = 0
    for file in journal_files(path):
        if not file.read_bytes().endswith(b"\n") and file.stat().st_size:
            torn_files += 1
        bad_lines: list[int] = []
        for event in read_events(file, bad_lines):
            seen[(event["run"], event["rank"])][event["seq"]] += 1
            lines += 1
        bad += len(bad_lines)
    lost = duplicated = extra = acked = expected = 0
    for r in ranks:
        counts = seen.get((r["run"], r["rank"]), collections.Counter())
        n = r.get("next_seq", 0)
        expected += n
        acked += r.get("acked", 0)
        lost += sum(1 for s in range(n) if s not in counts)
        extra += sum(1 for s in counts if s >= n)
        duplicated += sum(c - 1 for c in counts.values())
    return {"expected": expected, "acked": acked, "lines": lines, "lost": lost, "duplicated": duplicated,
            "extra": extra, "bad_lines": bad, "torn_files": torn_files,
            "unacked_at_close": sum(r.get("left", 0) for r in ranks),
            "dropped": sum(r.get("dropped", 0) for r in ranks),
            "unreported_ranks": sum(1 for r in ranks if "next_seq" not in r)}


SUMMED = ("expected", "acked", "lines", "lost", "duplicated", "extra", "bad_lines", "torn_files", "unacked_at_close",
          "dropped", "unreported_ranks", "kills", "kills_before_ready", "torn_tails_cut", "seconds", "journal_bytes")


def run(kills: int, out: Path, *, per_round: int = 100, runs: int = 2, ranks: int = 2, rate: float = 10.0,
        layout: str = "dir", seed: int = 1, stop: threading.Event | None = None) -> dict[str, Any]:
    """``kills`` SIGKILLs in rounds of ``per_round``, each round with fresh publishers and a fresh
    journal (removed once it passed, so a long run needs no more disk than one round); the figures
    summed over the rounds, ``ok`` if every round passed. ``stop`` set: no more kills, the round
    is checked as it stands."""
    total: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    total.update(layout=layout, runs=runs, ranks_per_run=ranks, rate_hz=rate, seed=seed, rounds=0, ok=True,
                 last_exit_code=0)
    done = 0
    while done < kills and not (stop is not None and stop.is_set()):
        where = out / f"round{total['rounds']}"
        figures = run_round(min(per_round, kills - done), where, runs=runs, ranks=ranks, rate=rate, layout=layout,
                            seed=seed + total["rounds"], stop=stop)
        for key in SUMMED:
            total[key] += figures[key]
        total["rounds"] += 1
        total["ok"] = total["ok"] and figures["ok"]
        total["last_exit_code"] = total["last_exit_code"] or figures["last_exit_code"]
        done += figures["kills"]
        log.info("round %d: %s: %s", total["rounds"], "PASS" if figures["ok"] else "FAIL", summary_line(figures))
        if figures["ok"]:
            shutil.rmtree(where, ignore_errors=True)
    total["seconds"] = round(total["seconds"], 1)
    return total


def run_round(kills: int, out: Path, *, runs: int = 2, ranks: int = 2, rate: float = 10.0, layout: str = "dir",
              seed: int = 1, stop: threading.Event | None = None) -> dict[str, Any]:
    """Kill a relay ``kills`` times under ``runs`` x ``ranks`` publishers; the verdict and figures."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    forker = RelayForker()
    crash = CrashRun(out, layout, rng, forker)
    t0 = time.monotonic()
    publishers = []
    for i in range(runs * ranks):
        run_id, rank = f"crash{i // ranks}", i % ranks
        with open(out / f"{run_id}-{rank}.log", "ab") as err:
            publishers.append((run_id, rank, subprocess.Popen(
                [sys.executable, "-m", "bench.crash_rank", crash.address, run_id, str(rank), str(ranks), str(rate),
                 str(seed)], cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)))
    results: list[dict[str, Any]] = []
    try:
        for _ in range(kills):
            if stop is not None and stop.is_set():
                break
            crash.kill_once()
        crash.start()
        crash.wait_ready()
        for _, _, proc in publishers:
            proc.terminate()
        for run_id, rank, proc in publishers:
            try:
                stdout, _ = proc.communicate(timeout=180)
                results.append({"run": run_id, "rank": rank, **json.loads(stdout.strip().splitlines()[-1])})
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                log.error("%s rank %d did not report (exit %s)", run_id, rank, proc.poll())
                results.append({"run": run_id, "rank": rank})
        stopped = crash.stop()
    finally:
        for _, _, proc in publishers:
            kill_group(proc)
        if crash.proc is not None:
            kill_group(crash.proc)
        forker.close()
    text = crash.log.read_text(errors="replace")
    figures = verify(crash.path, results)
    figures.update(kills=crash.kills, kills_before_ready=crash.kills_before_ready, torn_tails_cut=text.count(TORN),
                   last_exit_code=stopped, seconds=round(time.monotonic() - t0, 1), layout=layout, runs=runs,
                   ranks_per_run=ranks, rate_hz=rate, seed=seed,
                   journal_bytes=sum(f.stat().st_size for f in journal_files(crash.path)))
    figures["ok"] = (figures["lost"] == figures["duplicated"] == figures["extra"] == figures["bad_lines"]
                     == figures["torn_files"] == figures["unacked_at_close"] == figures["dropped"]
                     == figures["unreported_ranks"] == 0 and stopped == 0 and figures["acked"] == figures["expected"])
    return figures


def summary_line(figures: dict[str, Any]) -> str:
    """One sentence for a report."""
    rounds = f" in {figures['rounds']} rounds" if figures.get("rounds", 1) > 1 else ""
    return (f"{figures['kills']} SIGKILLs{rounds} ({figures['kills_before_ready']} before the relay was ready; "
            f"{figures['torn_tails_cut']} left a torn line that the next relay cut) in {figures['seconds']:.0f} s, "
            f"{figures['runs']} runs x {figures['ranks_per_run']} ranks, {figures['layout']} layout: "
            f"{figures['acked']:,} events acknowledged, {figures['lines']:,} lines "
            f"({figures['journal_bytes'] / 2**20:,.0f} MiB); lost {figures['lost']}, duplicated "
            f"{figures['duplicated']}, unreadable lines {figures['bad_lines']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--per-round", type=int, default=100, help="kills per round (fresh publishers and journal)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per run")
    parser.add_argument("--rate", type=float, default=10.0, help="events per second per rank")
    parser.add_argument("--layout", choices=("dir", "file"), default="dir")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="output directory (default: a temporary one, removed)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out or Path(tempfile.mkdtemp(prefix="crash-"))
    try:
        figures = run(args.kills, out, per_round=args.per_round, runs=args.runs, ranks=args.ranks, rate=args.rate, layout=args.layout,
                      seed=args.seed)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    log.info("%s: %s", "PASS" if figures["ok"] else "FAIL", summary_line(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
